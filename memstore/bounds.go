package memstore

import (
	"fmt"

	"github.com/sluicehq/sluice"
)

// Stats are counters of a Store's memory bounds and limit changes. Read
// them with Store.Stats.
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
	// Refused counts requests failed with ErrTooManyKeys.
	Refused uint64
	// EvictedRequestIDs counts request IDs forgotten before their TTL
	// because their shard's share of MaxRequestIDs was full; a late retry
	// of one is decided afresh.
	EvictedRequestIDs uint64
	// Conversions counts takes (and buckets of multi-takes, drains and
	// refunds) that found their bucket stored under another limit than the
	// request's and converted it (OnLimitChange).
	// A count that keeps growing means that callers disagree on a policy's
	// limit, for example two processes with different configs.
	Conversions uint64
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
		Conversions:       s.conversions.Load(),
	}
}

// Bounds on the work of one insert at MaxKeys, so that a flood of new keys
// into a full store costs each of them a bounded time under its shard's
// lock, whatever MaxKeys and the number of shards.
const (
	// reclaimBudget is the most buckets an insert examines looking for a
	// full one to reclaim.
	reclaimBudget = 32
	// reclaimShards is the most shards besides its own an insert looks in
	// for a bucket to reclaim or evict.
	reclaimShards = 8
	// evictSample is how many buckets EvictLRU compares to pick a victim.
	evictSample = 8
	// evictTries is the most buckets one insert evicts (more than one
	// only when concurrent inserts take the room it made).
	evictTries = 4
)

// reserveKey makes room for one new bucket in sh (locked by the caller):
// under MaxKeys it counts it; at MaxKeys it reclaims full buckets, then
// applies the overflow policy, never to a pinned bucket of sh (the other
// buckets of a multi-take). The count never exceeds MaxKeys.
func (s *Store) reserveKey(sh *shard, now int64, pins []pin) error {
	budget, evictions := reclaimBudget, 0
	for {
		c := s.keys.Load()
		if c < s.maxKeys {
			if s.keys.CompareAndSwap(c, c+1) {
				return nil
			}
			continue
		}
		if s.reclaim(sh, now, &budget, pins) {
			continue
		}
		if s.overflow == EvictLRU && evictions < evictTries && s.evict(sh, now, pins) {
			evictions++
			continue
		}
		s.refused.Add(1)
		return fmt.Errorf("%w: the store holds its maximum of %d buckets and the insert found none full to reclaim (overflow policy %v)", sluice.ErrTooManyKeys, s.maxKeys, s.overflow)
	}
}

// reclaim drops buckets full at now, examining at most *budget of them:
// first in sh (locked by the caller) if its bound on the next full bucket
// has passed, keeping its pinned buckets, then in up to reclaimShards
// other shards whose bound has passed and whose lock is free, taken in
// turn from a store-wide cursor so that successive inserts visit every
// shard. It reports whether it dropped any. It can miss full buckets of
// shards it did not visit: the sweeper drops those.
//
// Only sh can hold pinned buckets: a multi-take pins buckets only in
// shards it has locked, whose TryLock fails.
func (s *Store) reclaim(sh *shard, now int64, budget *int, pins []pin) bool {
	if sh.minFull.Load() <= now && s.scan(sh, now, budget, pins) > 0 {
		return true
	}
	probes := uint64(min(reclaimShards, len(s.shards)-1))
	start := s.cursor.Add(probes) - probes
	for i := range probes {
		if *budget <= 0 {
			break
		}
		o := &s.shards[(start+i)&s.mask]
		if o == sh || o.minFull.Load() > now || !o.mu.TryLock() {
			continue
		}
		n := s.scan(o, now, budget, nil)
		o.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// evict drops the least recently used of a sample of buckets, from sh if
// it has any but its pinned ones, else from one of up to reclaimShards
// other shards whose lock is free. It reports whether it dropped one.
func (s *Store) evict(sh *shard, now int64, pins []pin) bool {
	if s.evictFrom(sh, now, pins) {
		return true
	}
	probes := uint64(min(reclaimShards, len(s.shards)-1))
	start := s.cursor.Add(probes) - probes
	for i := range probes {
		o := &s.shards[(start+i)&s.mask]
		if o == sh || !o.mu.TryLock() {
			continue
		}
		ok := s.evictFrom(o, now, nil)
		o.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// evictFrom drops the bucket with the oldest stamp among a random sample
// of sh's buckets that are not pinned (sh locked by the caller). The
// shard's floor rises to now, or to the bucket's stamp if that is later,
// so that its key comes back full but not at an earlier time.
func (s *Store) evictFrom(sh *shard, now int64, pins []pin) bool {
	idx := sh.table.oldest(evictSample, pins)
	if idx < 0 {
		return false
	}
	sh.raiseFloor(max(now, sh.table.entries[idx].state.Stamp))
	s.drop(sh, idx)
	s.keys.Add(-1)
	s.evicted.Add(1)
	return true
}
