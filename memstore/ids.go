package memstore

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

// The request-ID memory of a shard: the first allowed decision of each
// (policy, key, request ID), with its expiry, in a map plus a FIFO queue in
// the order the IDs were remembered. Every ID has the same TTL, so the
// queue's head is the oldest ID and, up to clock readings taken out of
// order, the first to expire. A shard holds at most its share of
// MaxRequestIDs; when that is full it forgets its oldest ID early rather
// than refuse anyone (see Options.MaxRequestIDs).

// idKey is what a request ID is scoped by.
type idKey struct{ policy, key, id string }

// idRecord is a remembered decision.
type idRecord struct {
	cost     int64
	decision sluice.Decision
	expires  int64
	// refunded reports that a Refund with the ID has undone the take; a
	// later one is a replay.
	refunded bool
}

// idQueued is a queue entry: the ID and the expiry of the record it was
// queued with (a later record under the same ID has a later expiry).
type idQueued struct {
	k       idKey
	expires int64
}

// idMemory is one shard's remembered request IDs, guarded by the shard's
// lock.
type idMemory struct {
	records map[idKey]*idRecord // nil until the first ID
	queue   []idQueued
	head    int
	max     int // this shard's share of MaxRequestIDs
}

// replay looks r's request ID up in sh (locked by the caller). It reports
// whether a remembered decision answered r, writing it to *d with Replayed
// set, or returns ErrRequestIDConflict if the ID was first used with
// another cost or limit. An expired record is forgotten.
func (s *Store) replay(sh *shard, r *sluice.Request, now int64, d *sluice.Decision) (bool, error) {
	k := idKey{r.Policy, r.Key, r.RequestID}
	rec := sh.ids.records[k]
	if rec == nil {
		return false, nil
	}
	if now >= rec.expires {
		// Its queue entry stays until it reaches the head; popID then
		// sees that the record it names is gone.
		delete(sh.ids.records, k)
		s.ids.Add(-1)
		return false, nil
	}
	if rec.cost != r.Cost || rec.decision.Limit != r.Limit {
		return false, fmt.Errorf("%w: request ID %q of policy %q was first used for this key with cost %d and limit %v, now cost %d and limit %v",
			sluice.ErrRequestIDConflict, r.RequestID, r.Policy, rec.cost, rec.decision.Limit, r.Cost, r.Limit)
	}
	*d = rec.decision
	d.Replayed = true
	return true, nil
}

// remember records the allowed decision d of r in sh (locked by the
// caller). If the shard's share is full once expired IDs are gone, it
// forgets the oldest ID early and counts it.
func (s *Store) remember(sh *shard, r *sluice.Request, now int64, d *sluice.Decision) {
	m := &sh.ids
	s.expireIDs(sh, now)
	for len(m.records) >= m.max && m.head < len(m.queue) {
		if s.popID(sh) {
			s.idsEvicted.Add(1)
		}
	}
	if m.records == nil {
		m.records = make(map[idKey]*idRecord)
	}
	// One new allocation holds the three strings (none is empty, so the
	// concatenation copies), and the record keeps none of the caller's
	// memory alive.
	all := r.Policy + r.Key + r.RequestID
	np, nk := len(r.Policy), len(r.Policy)+len(r.Key)
	k := idKey{all[:np], all[np:nk], all[nk:]}
	exp := satAdd(now, s.idTTL)
	m.records[k] = &idRecord{cost: r.Cost, decision: *d, expires: exp}
	m.queue = append(m.queue, idQueued{k: k, expires: exp})
	s.ids.Add(1)
}

// expireIDs forgets the request IDs at the head of sh's queue whose time is
// up at now, and compacts the queue once half of it is spent.
func (s *Store) expireIDs(sh *shard, now int64) {
	m := &sh.ids
	for m.head < len(m.queue) && m.queue[m.head].expires <= now {
		s.popID(sh)
	}
	if m.head > 0 && m.head*2 >= len(m.queue) {
		n := copy(m.queue, m.queue[m.head:])
		clear(m.queue[n:])
		m.queue = m.queue[:n]
		m.head = 0
	}
}

// popID removes the queue head and its record if the record is the one
// queued (not a later one under the same ID, nor one already forgotten);
// it reports whether it removed a record.
func (s *Store) popID(sh *shard) bool {
	m := &sh.ids
	q := m.queue[m.head]
	m.queue[m.head] = idQueued{}
	m.head++
	if rec := m.records[q.k]; rec != nil && rec.expires == q.expires {
		delete(m.records, q.k)
		s.ids.Add(-1)
		return true
	}
	return false
}
