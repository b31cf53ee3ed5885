package memstore

import (
	"math"
	"time"
)

// sweeper calls SweepNow every interval until Close.
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

// SweepNow visits every shard in turn and, at a clock reading taken while
// it holds the shard's lock, drops the shard's full buckets (a full bucket
// decides exactly as a missing one, so nothing is lost) and its request
// IDs whose TTL has ended. It returns the number of buckets dropped. The
// background sweeper calls it every SweepInterval; call it directly to
// sweep at a moment of your choosing (tests, or a store whose sweeper is
// off).
//
// A sweep also raises each shard's floor to its reading, whether it
// dropped anything or not; so does an insert at MaxKeys that reclaims or
// evicts a bucket. A bucket created afterwards is stamped no earlier than
// the floor, even by a take that read the clock before the sweep and
// locked the shard after it: a full bucket is the same as a missing one
// only from the moment it is full, and recreating it at the older reading
// would hand out a burst it did not have then.
func (s *Store) SweepNow() int {
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.clock()
		if sh.minFull.Load() <= now {
			removed += s.sweep(sh, now)
		}
		sh.raiseFloor(now)
		s.expireIDs(sh, now)
		sh.mu.Unlock()
	}
	return removed
}

// sweep drops every bucket of sh (locked by the caller) that is full at
// now, sets the shard's bound on the next full bucket exactly, and returns
// how many it dropped.
func (s *Store) sweep(sh *shard, now int64) int {
	removed := 0
	next := int64(math.MaxInt64)
	// Backwards, so the entry that drop moves into a gap was already seen.
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
	// Every bucket has just been seen: the inserts' scan starts over.
	sh.scanAt, sh.scanMin = 0, math.MaxInt64
	s.dropped(sh, now, removed)
	return removed
}

// scan continues the inserts' incremental reclaim scan of sh (locked by
// the caller) for at most *budget buckets, drops those full at now but
// the pinned ones, and returns how many it dropped. Once the scan has
// passed the last entry, every bucket of the shard has been seen or
// decided (noteFullAt) since it started, so the least full-at tick among
// them becomes the shard's bound, and the scan starts over.
func (s *Store) scan(sh *shard, now int64, budget *int, pins []pin) int {
	removed := 0
	for *budget > 0 {
		if sh.scanAt >= len(sh.table.entries) {
			sh.minFull.Store(sh.scanMin)
			sh.scanAt, sh.scanMin = 0, math.MaxInt64
			break
		}
		*budget--
		sh.examined++
		e := &sh.table.entries[sh.scanAt]
		if full := e.plan.plan.FullAt(e.state); full <= now && !pinned(pins, e) {
			s.drop(sh, sh.scanAt) // the last entry moves here, to be seen next
			removed++
		} else {
			sh.scanMin = min(sh.scanMin, full)
			sh.scanAt++
		}
	}
	s.dropped(sh, now, removed)
	return removed
}

// dropped accounts for n full buckets of sh dropped at now.
func (s *Store) dropped(sh *shard, now int64, n int) {
	if n > 0 {
		sh.raiseFloor(now)
		s.keys.Add(int64(-n))
		s.reclaimed.Add(uint64(n))
	}
}

// drop deletes the bucket at idx of sh's table (sh locked by the caller).
// The table moves its last entry into the gap; if that takes an entry the
// scan has not seen yet to a place it has passed, the entry's full-at tick
// joins the scan's minimum.
func (s *Store) drop(sh *shard, idx int) {
	t := &sh.table
	e := &t.entries[idx]
	sh.release(e.plan)
	if last := len(t.entries) - 1; idx < sh.scanAt && last >= sh.scanAt {
		m := &t.entries[last]
		sh.scanMin = min(sh.scanMin, m.plan.plan.FullAt(m.state))
	}
	t.remove(idx, tag(s.rehash(e), s.shardBits), s.shardBits, s.rehash)
	sh.scanAt = min(sh.scanAt, len(t.entries))
}

// raiseFloor raises sh's floor (sh locked by the caller) to t if t is
// later.
func (sh *shard) raiseFloor(t int64) {
	if t > sh.floor {
		sh.floor = t
	}
}
