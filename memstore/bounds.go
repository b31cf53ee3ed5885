package memstore

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice"
)

// Stats are counters of a Store's memory bounds. Read them with Store.Stats.
type Stats struct {
	// Buckets is the number of buckets held now.
	Buckets int64
	// RequestIDs is the number of request IDs remembered now.
	RequestIDs int64
	// Reclaimed counts full buckets dropped; dropping one loses nothing.
	Reclaimed uint64
	// Evicted counts buckets dropped before they were full (EvictLRU); each
	// may have granted its key up to one extra burst.
	Evicted uint64
	// Refused counts requests failed with ErrTooManyKeys (RefuseNew).
	Refused uint64
	// EvictedRequestIDs counts request IDs forgotten before their TTL
	// (EvictLRU with the request-ID memory full).
	EvictedRequestIDs uint64
}

// Stats returns the current counters. It is safe to call concurrently.
func (s *Store) Stats() Stats {
	return Stats{
		Buckets:           s.keys.Load(),
		RequestIDs:        s.ids.Load(),
		Reclaimed:         s.reclaimed.Load(),
		Evicted:           s.evicted.Load(),
		Refused:           s.refused.Load(),
		EvictedRequestIDs: s.idsEvicted.Load(),
	}
}

// evictSample is how many buckets EvictLRU compares to pick a victim.
const evictSample = 8

// reserveKey makes room for one new bucket in sh (locked by the caller):
// under MaxKeys it counts it; at MaxKeys it reclaims full buckets (of sh,
// then of any other shard it can lock without waiting), then applies the
// overflow policy.
func (s *Store) reserveKey(sh *shard, now int64) error {
	for {
		c := s.keys.Load()
		if c < s.maxKeys {
			if s.keys.CompareAndSwap(c, c+1) {
				return nil
			}
			continue
		}
		if s.reclaim(sh, now) {
			continue
		}
		if s.overflow == EvictLRU && s.evict(sh) {
			continue
		}
		s.refused.Add(1)
		return fmt.Errorf("%w: the store holds its maximum of %d buckets and none is full (overflow policy %v)", sluice.ErrTooManyKeys, s.maxKeys, s.overflow)
	}
}

// reclaim drops the full buckets of sh, or failing that of another shard
// that has some and is not busy. It reports whether it dropped any.
func (s *Store) reclaim(sh *shard, now int64) bool {
	if sh.minFull.Load() <= now && s.sweep(sh, now) > 0 {
		return true
	}
	for i := range s.shards {
		o := &s.shards[i]
		if o == sh || o.minFull.Load() > now || !o.mu.TryLock() {
			continue
		}
		n := s.sweep(o, now)
		o.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// sweep drops the full buckets of sh (locked by the caller), recomputes its
// minFull bound, and returns how many it dropped.
func (s *Store) sweep(sh *shard, now int64) int {
	removed := 0
	next := int64(math.MaxInt64)
	// Backwards, so the entry remove moves into a gap was already seen.
	for idx := len(sh.table.entries) - 1; idx >= 0; idx-- {
		e := &sh.table.entries[idx]
		full := e.plan.plan.FullAt(e.state)
		if full <= now {
			s.drop(sh, idx)
			removed++
		} else if full < next {
			next = full
		}
	}
	sh.minFull.Store(next)
	if removed > 0 {
		s.keys.Add(int64(-removed))
		s.reclaimed.Add(uint64(removed))
	}
	return removed
}

// drop deletes the bucket at idx of sh's table.
func (s *Store) drop(sh *shard, idx int) {
	e := &sh.table.entries[idx]
	sh.release(e.plan)
	sh.table.remove(idx, tag(s.hash(e.key), s.shardBits), s.shardBits, s.hash)
}

// evict drops the least recently used of a sample of buckets, from sh if it
// has any, else from another shard it can lock without waiting. It reports
// whether it dropped one.
func (s *Store) evict(sh *shard) bool {
	if s.evictFrom(sh) {
		return true
	}
	for i := range s.shards {
		o := &s.shards[i]
		if o == sh || !o.mu.TryLock() {
			continue
		}
		ok := s.evictFrom(o)
		o.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// evictFrom deletes the bucket with the oldest stamp among a random sample
// of sh's buckets.
func (s *Store) evictFrom(sh *shard) bool {
	idx := sh.table.oldest(evictSample)
	if idx < 0 {
		return false
	}
	s.drop(sh, idx)
	s.keys.Add(-1)
	s.evicted.Add(1)
	return true
}

// reserveID makes room for one request ID in sh (locked by the caller).
func (s *Store) reserveID(sh *shard, now int64) error {
	s.expireIDs(sh, now)
	if len(sh.ids) >= s.idsPer {
		if s.overflow != EvictLRU {
			s.refused.Add(1)
			return fmt.Errorf("%w: the store remembers its maximum of %d request IDs in this shard and none has expired (overflow policy %v)", sluice.ErrTooManyKeys, s.idsPer, s.overflow)
		}
		for len(sh.ids) >= s.idsPer && sh.head < len(sh.queue) {
			if s.popID(sh) {
				s.idsEvicted.Add(1)
			}
		}
	}
	s.ids.Add(1)
	return nil
}

// expireIDs forgets the request IDs at the head of sh's queue whose time is
// up.
func (s *Store) expireIDs(sh *shard, now int64) {
	for sh.head < len(sh.queue) && sh.queue[sh.head].expires <= now {
		s.popID(sh)
	}
	if sh.head > 0 && sh.head*2 >= len(sh.queue) {
		n := copy(sh.queue, sh.queue[sh.head:])
		clear(sh.queue[n:])
		sh.queue = sh.queue[:n]
		sh.head = 0
	}
}

// popID removes the queue head and its record if the record is the one
// queued (not a later one under the same ID); it reports whether it did.
func (s *Store) popID(sh *shard) bool {
	q := sh.queue[sh.head]
	sh.queue[sh.head] = idQueued{}
	sh.head++
	if rec := sh.ids[q.k]; rec != nil && rec.expires == q.expires {
		delete(sh.ids, q.k)
		s.ids.Add(-1)
		return true
	}
	return false
}

// sweeper drops full buckets and expired request IDs every interval until
// Close.
func (s *Store) sweeper(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.SweepNow()
		}
	}
}

// SweepNow drops every full bucket and expired request ID now, one shard at
// a time, and returns the number of buckets dropped. The background sweeper
// calls it every SweepInterval.
func (s *Store) SweepNow() int {
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		now := s.clock()
		sh.mu.Lock()
		if sh.minFull.Load() <= now {
			removed += s.sweep(sh, now)
		}
		s.expireIDs(sh, now)
		sh.mu.Unlock()
	}
	return removed
}
