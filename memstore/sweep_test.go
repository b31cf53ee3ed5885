package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// The background sweeper drops full buckets and expired request IDs, and
// Close stops it.
func TestSweeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, memstore.Options{SweepInterval: time.Second, RequestIDTTL: 2 * time.Second})
		ctx := context.Background()
		for i := range 100 {
			r := sluice.Request{Policy: "test", Key: fmt.Sprint("k", i), Cost: 10, Limit: perSecond10, RequestID: "x"}
			if _, err := s.Take(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if st := s.Stats(); st.Buckets != 100 || st.RequestIDs != 100 {
			t.Fatalf("Stats() = %+v, want 100 buckets and IDs", st)
		}
		// Empty buckets are full after 1s; the sweep at 1s sees them
		// exactly full, the IDs go at 2s.
		time.Sleep(1500 * time.Millisecond)
		if st := s.Stats(); st.Buckets != 0 || st.Reclaimed != 100 || st.RequestIDs != 100 {
			t.Fatalf("after 1.5s Stats() = %+v, want 0 buckets, 100 reclaimed, 100 IDs", st)
		}
		time.Sleep(time.Second)
		if st := s.Stats(); st.RequestIDs != 0 {
			t.Fatalf("after 2.5s Stats() = %+v, want 0 IDs", st)
		}
		s.Close()
		synctest.Wait() // the sweeper goroutine has exited
	})
}

// hookClock is a manual clock that can run an action inside one reading:
// the reading is taken, the clock moves and the action runs, and only then
// is the reading returned, as when a take has read the clock and is still
// waiting for its shard's lock while a sweep runs.
type hookClock struct {
	mu   sync.Mutex
	now  time.Time
	hook func()
}

func (c *hookClock) Now() time.Time {
	c.mu.Lock()
	now, hook := c.now, c.hook
	c.hook = nil
	c.mu.Unlock()
	if hook != nil {
		hook()
	}
	return now
}

func (c *hookClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// During makes the next reading t, and runs action in it with the clock at
// later.
func (c *hookClock) During(t, later time.Time, action func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
	c.hook = func() {
		c.Set(later)
		action()
	}
}

// Something dropped from a shard at a reading (a sweep, or a bucket
// reclaimed or evicted to make room) is never recreated at an older
// reading: a take that read the clock before the drop gets the bucket at
// the drop's time, or it could take a burst the bucket did not have.
//
// The bucket "k" (10 tokens, 10/s) is drained at t=0 and is full again at
// 1s. A take of 10 reads t=1ns; before it locks the shard, the bucket is
// dropped at 1s. Recreated at 1ns it would grant 10 tokens 1ns after the
// first 10, and 8 more at 1s.
func TestDropRaisesFloor(t *testing.T) {
	const sec = time.Second
	base := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) time.Time { return base.Add(d) }
	tests := []struct {
		name    string
		options memstore.Options
		// setup runs at t=0 after "k" is drained.
		setup func(t *testing.T, s *memstore.Store)
		// drop runs inside the take's reading of 1ns, with the clock at
		// dropAt.
		drop   func(t *testing.T, s *memstore.Store)
		dropAt time.Duration
		// The take of 10 at 1ns is decided at the drop's time: allowed,
		// with ResetAfter counted from 1ns.
		want sluice.Decision
		// A take of 1 at dropAt finds the bucket the late take drained.
		wantNext sluice.Decision
	}{
		{
			name:     "sweep",
			options:  memstore.Options{},
			drop:     func(t *testing.T, s *memstore.Store) { s.SweepNow() },
			dropAt:   sec,
			want:     sluice.Decision{Allowed: true, ResetAfter: 2*sec - 1, Limit: perSecond10},
			wantNext: sluice.Decision{RetryAfter: 100 * time.Millisecond, ResetAfter: sec, Limit: perSecond10},
		},
		{
			name:    "reclaim at MaxKeys",
			options: memstore.Options{MaxKeys: 2},
			setup: func(t *testing.T, s *memstore.Store) {
				mustTake(t, s, "x", 1)
			},
			drop:     func(t *testing.T, s *memstore.Store) { mustTake(t, s, "new", 1) },
			dropAt:   sec,
			want:     sluice.Decision{Allowed: true, ResetAfter: 2*sec - 1, Limit: perSecond10},
			wantNext: sluice.Decision{RetryAfter: 100 * time.Millisecond, ResetAfter: sec, Limit: perSecond10},
		},
		{
			// Eviction drops a bucket before it is full (which may grant
			// one extra burst), but not back to an older time.
			name:     "evict at MaxKeys",
			options:  memstore.Options{MaxKeys: 1, Overflow: memstore.EvictLRU},
			drop:     func(t *testing.T, s *memstore.Store) { mustTake(t, s, "new", 1) },
			dropAt:   sec / 2,
			want:     sluice.Decision{Allowed: true, ResetAfter: 3*sec/2 - 1, Limit: perSecond10},
			wantNext: sluice.Decision{RetryAfter: 100 * time.Millisecond, ResetAfter: sec, Limit: perSecond10},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &hookClock{now: base}
			o := tt.options
			o.Now, o.Shards, o.SweepInterval = clk.Now, 1, -1
			s := newStore(t, o)
			ctx := context.Background()
			mustTake(t, s, "k", 10)
			if tt.setup != nil {
				tt.setup(t, s)
			}
			clk.During(at(1), at(tt.dropAt), func() { tt.drop(t, s) })
			r := sluice.Request{Policy: "test", Key: "k", Cost: 10, Limit: perSecond10}
			if got, err := s.Take(ctx, r); err != nil || got != tt.want {
				t.Fatalf("Take(k, 10) reading 1ns, dropped at %v before it locked = %+v, %v; want %+v", tt.dropAt, got, err, tt.want)
			}
			r.Cost = 1
			if got, err := s.Take(ctx, r); err != nil || got != tt.wantNext {
				t.Fatalf("Take(k, 1) at %v = %+v, %v; want %+v", tt.dropAt, got, err, tt.wantNext)
			}
		})
	}
}

// A sweep that drops nothing still raises the floor of the shards it
// visits: a bucket created by a take whose reading is older than the sweep
// is stamped at the sweep's reading, as the conformance model does.
func TestSweepNowRaisesFloorOfEmptyShards(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	clk := &hookClock{now: base}
	s := newStore(t, memstore.Options{Now: clk.Now, SweepInterval: -1})
	clk.During(base, base.Add(time.Second), func() {
		if n := s.SweepNow(); n != 0 {
			t.Errorf("SweepNow() = %d of an empty store, want 0", n)
		}
	})
	r := sluice.Request{Policy: "test", Key: "k", Cost: 10, Limit: perSecond10}
	want := sluice.Decision{Allowed: true, ResetAfter: 2 * time.Second, Limit: perSecond10}
	if got, err := s.Take(context.Background(), r); err != nil || got != want {
		t.Fatalf("Take(k, 10) reading t=0 after SweepNow at 1s = %+v, %v; want %+v", got, err, want)
	}
}

// A take racing with sweeps in another goroutine: the take reads t=½s of a
// bucket drained at 0 (5 tokens then), the clock moves to 1s (the bucket is
// full) and sweeps run while the take waits. The take is either decided on
// the bucket (denied) or, if a sweep dropped it, on a new bucket at the
// sweep's 1s (allowed, ResetAfter 1.5s from ½s); never on a full bucket at
// ½s.
func TestSweepRaceCannotMint(t *testing.T) {
	const sec = time.Second
	base := time.Unix(1_700_000_000, 0)
	var cur atomic.Int64 // nanoseconds after base
	var armed, stop atomic.Bool
	start, done := make(chan struct{}), make(chan struct{})
	now := func() time.Time {
		v := cur.Load()
		if armed.CompareAndSwap(true, false) {
			// The take's reading: move the clock on, start the sweeper
			// and let it in before the take locks the shard.
			cur.Store(v + int64(sec/2))
			start <- struct{}{}
			runtime.Gosched()
		}
		return base.Add(time.Duration(v))
	}
	s := newStore(t, memstore.Options{Now: now, Shards: 1, SweepInterval: -1})
	ctx := context.Background()
	go func() {
		for range start {
			for !stop.Load() {
				s.SweepNow()
			}
			done <- struct{}{}
		}
	}()
	defer close(start)
	raced := 0
	for round := range 500 {
		t0 := int64(round) * int64(4*sec)
		cur.Store(t0)
		r := sluice.Request{Policy: "test", Key: fmt.Sprint("k", round), Cost: 10, Limit: perSecond10}
		if d, err := s.Take(ctx, r); err != nil || !d.Allowed {
			t.Fatalf("round %d: Take(%+v) = %+v, %v; want allowed", round, r, d, err)
		}
		cur.Store(t0 + int64(sec/2))
		stop.Store(false)
		armed.Store(true)
		d, err := s.Take(ctx, r)
		stop.Store(true)
		<-done
		denied := sluice.Decision{Remaining: 5, RetryAfter: sec / 2, ResetAfter: sec / 2, Limit: perSecond10}
		atFloor := sluice.Decision{Allowed: true, ResetAfter: 3 * sec / 2, Limit: perSecond10}
		switch {
		case err != nil:
			t.Fatalf("round %d: Take error %v", round, err)
		case d == atFloor:
			raced++
		case d != denied:
			t.Fatalf("round %d: Take(%+v) reading ½s with sweeps at 1s = %+v; want %+v or %+v", round, r, d, denied, atFloor)
		}
	}
	t.Logf("%d of 500 takes found their bucket swept", raced)
}

func mustTake(t *testing.T, s *memstore.Store, key string, cost int64) sluice.Decision {
	t.Helper()
	r := sluice.Request{Policy: "test", Key: key, Cost: cost, Limit: perSecond10}
	d, err := s.Take(context.Background(), r)
	if err != nil || !d.Allowed {
		t.Fatalf("Take(%+v) = %+v, %v; want allowed", r, d, err)
	}
	return d
}
