package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// At MaxKeys a new key is refused unless a full bucket can be reclaimed.
// An insert looks in its own shard and a few others (bounded work), so with
// 4 shards it sees them all.
func TestRefuseNewAtMaxKeys(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, MaxKeys: 100, SweepInterval: -1, Shards: 4})
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

// With more shards than one insert visits, an insert at MaxKeys may miss
// the full buckets of other shards; a sweep drops them all.
func TestSweepNowMakesRoomAtMaxKeys(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, MaxKeys: 100, SweepInterval: -1, Shards: 1024, MaxRequestIDs: 1024})
	for i := range 100 {
		mustTake(t, s, fmt.Sprint("k", i), 1)
	}
	clk.Advance(100 * time.Millisecond) // all full again
	if n := s.SweepNow(); n != 100 {
		t.Fatalf("SweepNow() = %d, want 100", n)
	}
	for i := range 100 {
		mustTake(t, s, fmt.Sprint("new", i), 1)
	}
	if st := s.Stats(); st.Buckets != 100 || st.Reclaimed != 100 || st.Refused != 0 {
		t.Fatalf("Stats() = %+v, want 100 buckets, 100 reclaimed, 0 refused", st)
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
