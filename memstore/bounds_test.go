package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// clock is a manual clock for tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newStore returns a store built with o, closed when tb ends.
func newStore(tb testing.TB, o memstore.Options) *memstore.Store {
	tb.Helper()
	s, err := memstore.New(o)
	if err != nil {
		tb.Fatalf("memstore.New(%+v) error %v", o, err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

var perSecond10 = sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}

func take(t *testing.T, s *memstore.Store, key string, cost int64) (sluice.Decision, error) {
	t.Helper()
	return s.Take(context.Background(), sluice.Request{Policy: "test", Key: key, Cost: cost, Limit: perSecond10})
}

func TestRefuseNewAtMaxKeys(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, MaxKeys: 100, SweepInterval: -1})
	for i := range 100 {
		if _, err := take(t, s, fmt.Sprint("k", i), 1); err != nil {
			t.Fatalf("Take(k%d) error %v, want nil", i, err)
		}
	}
	_, err := take(t, s, "one-too-many", 1)
	if !errors.Is(err, sluice.ErrTooManyKeys) {
		t.Fatalf("Take(new key at MaxKeys) error %v, want ErrTooManyKeys", err)
	}
	// Existing keys are still decided.
	if d, err := take(t, s, "k7", 1); err != nil || !d.Allowed || d.Remaining != 8 {
		t.Fatalf("Take(k7) = %+v, %v; want allowed with 8 remaining", d, err)
	}
	if st := s.Stats(); st.Buckets != 100 || st.Refused != 1 || st.Evicted != 0 {
		t.Fatalf("Stats() = %+v, want 100 buckets, 1 refused, 0 evicted", st)
	}
	// 100ms refills one token: every bucket but k7 is full again, so
	// reclaimable at no loss, and new keys fit.
	clk.Advance(100 * time.Millisecond)
	for i := range 50 {
		if _, err := take(t, s, fmt.Sprint("new", i), 1); err != nil {
			t.Fatalf("Take(new%d) after refill error %v, want nil", i, err)
		}
	}
	st := s.Stats()
	if st.Buckets > 100 || st.Reclaimed == 0 {
		t.Fatalf("Stats() = %+v, want at most 100 buckets and some reclaimed", st)
	}
	// k7 was not full (8 of 10 after 100ms is 9): its state survived.
	if d, err := take(t, s, "k7", 1); err != nil || d.Remaining != 8 {
		t.Fatalf("Take(k7) = %+v, %v; want 8 remaining (state kept)", d, err)
	}
}

func TestEvictLRUAtMaxKeys(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, MaxKeys: 64, Overflow: memstore.EvictLRU, SweepInterval: -1, Shards: 4})
	for i := range 1000 {
		clk.Advance(time.Microsecond)
		if _, err := take(t, s, fmt.Sprint("k", i), 5); err != nil {
			t.Fatalf("Take(k%d) error %v, want nil", i, err)
		}
		if n := s.Stats().Buckets; n > 64 {
			t.Fatalf("after %d keys Stats().Buckets = %d, want <= 64", i+1, n)
		}
	}
	st := s.Stats()
	if st.Buckets != 64 || st.Evicted != 1000-64 || st.Refused != 0 {
		t.Fatalf("Stats() = %+v, want 64 buckets, %d evicted, 0 refused", st, 1000-64)
	}
	// The most recent key is not evicted by the next insert: the sample
	// prefers the oldest stamps, and the newest has the newest.
	if d, err := take(t, s, "k999", 5); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Take(k999, 5) = %+v, %v; want allowed with 0 remaining (bucket kept at 5)", d, err)
	}
}

// An attacker flooding distinct keys never grows the store past MaxKeys,
// whichever policy.
func TestFloodStaysBounded(t *testing.T) {
	for _, policy := range []memstore.Overflow{memstore.RefuseNew, memstore.EvictLRU} {
		t.Run(policy.String(), func(t *testing.T) {
			clk := newClock()
			s := newStore(t, memstore.Options{Now: clk.Now, MaxKeys: 1000, Overflow: policy, SweepInterval: -1})
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := range 25_000 {
						_, err := s.Take(context.Background(), sluice.Request{Policy: "test", Key: fmt.Sprint(w, "/", i), Cost: 1, Limit: perSecond10})
						if err != nil && !errors.Is(err, sluice.ErrTooManyKeys) {
							t.Errorf("Take error %v, want nil or ErrTooManyKeys", err)
							return
						}
					}
				})
			}
			wg.Wait()
			if st := s.Stats(); st.Buckets > 1000 || st.Buckets < 900 {
				t.Fatalf("Stats() = %+v, want between 900 and 1000 buckets", st)
			}
		})
	}
}

func TestRequestIDs(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, RequestIDTTL: time.Minute, SweepInterval: -1})
	ctx := context.Background()
	r := sluice.Request{Policy: "test", Key: "a", Cost: 4, Limit: perSecond10, RequestID: "req-1"}
	first, err := s.Take(ctx, r)
	if err != nil || !first.Allowed || first.Remaining != 6 {
		t.Fatalf("Take(%+v) = %+v, %v; want allowed, 6 remaining", r, first, err)
	}
	clk.Advance(time.Second)
	again, err := s.Take(ctx, r)
	want := first
	want.Replayed = true
	if err != nil || again != want {
		t.Fatalf("retry Take(%+v) = %+v, %v; want %+v", r, again, err, want)
	}
	if d, _ := s.Peek(ctx, sluice.Request{Policy: "test", Key: "a", Cost: 1, Limit: perSecond10}); d.Remaining != 10 {
		t.Fatalf("Peek after replay Remaining = %d, want 10 (refilled, replay consumed nothing)", d.Remaining)
	}
	conflict := r
	conflict.Cost = 5
	if _, err := s.Take(ctx, conflict); !errors.Is(err, sluice.ErrRequestIDConflict) {
		t.Fatalf("Take(same ID, other cost) error %v, want ErrRequestIDConflict", err)
	}
	// Request IDs are scoped by key.
	other := r
	other.Key = "b"
	if d, err := s.Take(ctx, other); err != nil || d.Replayed {
		t.Fatalf("Take(same ID, other key) = %+v, %v; want a fresh decision", d, err)
	}
	// After the TTL the ID is forgotten and decides afresh.
	clk.Advance(time.Minute)
	if d, err := s.Take(ctx, r); err != nil || d.Replayed || d.Remaining != 6 {
		t.Fatalf("Take after TTL = %+v, %v; want a fresh decision with 6 remaining", d, err)
	}
	if st := s.Stats(); st.RequestIDs != 2 {
		t.Fatalf("Stats().RequestIDs = %d, want 2 (one expired and replaced, one for key b)", st.RequestIDs)
	}
}

func TestRequestIDMemoryBounded(t *testing.T) {
	for _, policy := range []memstore.Overflow{memstore.RefuseNew, memstore.EvictLRU} {
		t.Run(policy.String(), func(t *testing.T) {
			clk := newClock()
			s := newStore(t, memstore.Options{Now: clk.Now, MaxRequestIDs: 16, Shards: 1, Overflow: policy, SweepInterval: -1})
			ctx := context.Background()
			var refused int
			for i := range 100 {
				_, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: sluice.Limit{Capacity: 1000, Rate: sluice.PerSecond(1)}, RequestID: fmt.Sprint(i)})
				switch {
				case errors.Is(err, sluice.ErrTooManyKeys):
					refused++
				case err != nil:
					t.Fatalf("Take error %v", err)
				}
				if n := s.Stats().RequestIDs; n > 16 {
					t.Fatalf("Stats().RequestIDs = %d, want <= 16", n)
				}
			}
			st := s.Stats()
			switch policy {
			case memstore.RefuseNew:
				if refused != 84 || st.Refused != 84 {
					t.Fatalf("refused %d (Stats %+v), want 84", refused, st)
				}
				// A refused request consumed nothing: 16 taken.
				if d, _ := s.Peek(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: sluice.Limit{Capacity: 1000, Rate: sluice.PerSecond(1)}}); d.Remaining != 1000-16 {
					t.Fatalf("Remaining = %d, want %d", d.Remaining, 1000-16)
				}
			case memstore.EvictLRU:
				if refused != 0 || st.EvictedRequestIDs != 84 {
					t.Fatalf("refused %d, Stats %+v; want 0 refused, 84 IDs evicted", refused, st)
				}
			}
		})
	}
}

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

func TestLimitChangeLowersCapacity(t *testing.T) {
	clk := newClock()
	for _, policy := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		t.Run(policy.String(), func(t *testing.T) {
			s := newStore(t, memstore.Options{Now: clk.Now, OnLimitChange: policy, SweepInterval: -1})
			ctx := context.Background()
			big := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}
			small := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
			if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 50, Limit: big}); err != nil {
				t.Fatal(err)
			}
			d, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: small})
			want := map[sluice.Conversion]int64{sluice.KeepTokens: 9, sluice.ScaleTokens: 4, sluice.ResetTokens: 9}[policy]
			if err != nil || !d.Allowed || d.Remaining != want || d.Limit != small {
				t.Fatalf("Take under lowered limit = %+v, %v; want allowed, %d remaining, limit %v", d, err, want, small)
			}
		})
	}
}

func TestCanceledContext(t *testing.T) {
	s := newStore(t, memstore.Options{SweepInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: perSecond10}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take(canceled ctx) error %v, want context.Canceled", err)
	}
	if st := s.Stats(); st.Buckets != 0 {
		t.Fatalf("Stats().Buckets = %d after a canceled Take, want 0", st.Buckets)
	}
}
