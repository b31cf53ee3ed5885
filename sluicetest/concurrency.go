package sluicetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// testConcurrentOneKey floods one key from many goroutines with the clock
// frozen: exactly the capacity is allowed, each allowed take sees a distinct
// Remaining (the takes were one at a time), and after the clock moves so
// that half the capacity refills, exactly that half more is allowed.
func (s Suite) testConcurrentOneKey(t *testing.T) {
	c := NewClock(start)
	st := s.New(t, StoreOptions{Now: c.Now, RequestIDTTL: time.Minute})
	l := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1000, time.Hour)}
	s.skipRefused(t, l)
	ctx := t.Context()

	flood := func(want int64) {
		t.Helper()
		var (
			mu        sync.Mutex
			remaining []int64
			errs      []error
			wg        sync.WaitGroup
		)
		for range s.Workers {
			wg.Go(func() {
				var rem []int64
				var err error
				for range s.TakesPerWorker {
					d, e := st.Take(ctx, req("k", 1, l))
					if e != nil {
						err = e
						break
					}
					if d.Allowed {
						rem = append(rem, d.Remaining)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				remaining = append(remaining, rem...)
				if err != nil {
					errs = append(errs, err)
				}
			})
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("Take(%q, 1) failed %d times, first: %v", "k", len(errs), errs[0])
		}
		if got := int64(len(remaining)); got != want {
			t.Fatalf("%d×%d concurrent Take(%q, 1) allowed %d, want %d", s.Workers, s.TakesPerWorker, "k", got, want)
		}
		slices.Sort(remaining)
		for i, r := range remaining {
			if r != int64(i) {
				t.Fatalf("allowed takes saw Remaining %d twice or not at all (sorted: ...%v...)", i, remaining[max(0, i-3):min(len(remaining), i+3)])
			}
		}
	}

	flood(1000)
	c.Advance(30 * time.Minute) // 500 tokens
	flood(500)
	d, err := st.Peek(ctx, req("k", 1, l))
	if want := deny(0, 3600*time.Millisecond, time.Hour, l); err != nil || d != want {
		t.Fatalf("Peek(%q, %v) = %+v, %v; want %+v", "k", l, d, err, want)
	}
}

// testConcurrentKeys runs random takes on several keys from many goroutines
// with the clock frozen, some with request IDs that several goroutines send
// at once: per key, the cost allowed (replays not counted) plus what remains
// is the capacity, and each request ID was decided exactly once.
func (s Suite) testConcurrentKeys(t *testing.T) {
	c := NewClock(start)
	st := s.New(t, StoreOptions{Now: c.Now, RequestIDTTL: time.Hour})
	ctx := t.Context()
	const keys, ids = 8, 32
	limits := make([]sluice.Limit, keys)
	for i := range limits {
		limits[i] = sluice.Limit{Capacity: 50 * int64(i+1), Rate: sluice.Per(int64(i), time.Hour)}
	}
	s.skipRefused(t, limits...)
	takes := max(100, s.TakesPerWorker/4)

	type idKey struct{ key, id int }
	var (
		mu      sync.Mutex
		allowed [keys]int64
		decided = make(map[idKey][]sluice.Decision)
		errs    []error
		wg      sync.WaitGroup
	)
	for w := range s.Workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var mine [keys]int64
			byID := make(map[idKey][]sluice.Decision)
			var err error
			for range takes {
				k := rng.IntN(keys)
				r := sluice.Request{Policy: testPolicy, Key: fmt.Sprint("key", k), Cost: 1 + rng.Int64N(3), Limit: limits[k]}
				var ik idKey
				if rng.IntN(4) == 0 {
					ik = idKey{k, rng.IntN(ids)}
					r.RequestID = fmt.Sprint("id", ik.id)
					r.Cost = 1 + int64(ik.id%3) // one cost per ID: no conflicts
				}
				d, e := st.Take(ctx, r)
				if e != nil {
					err = fmt.Errorf("Take(%s): %w", describe(r), e)
					break
				}
				if d.Allowed && !d.Replayed {
					mine[k] += r.Cost
				}
				if r.RequestID != "" {
					byID[ik] = append(byID[ik], d)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for k := range mine {
				allowed[k] += mine[k]
			}
			for ik, ds := range byID {
				decided[ik] = append(decided[ik], ds...)
			}
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d workers failed, first: %v", len(errs), errs[0])
	}
	for k, l := range limits {
		key := fmt.Sprint("key", k)
		d, err := st.Peek(ctx, req(key, 1, l))
		if err != nil {
			t.Fatalf("Peek(%q, %v): %v", key, l, err)
		}
		if allowed[k]+d.Remaining != l.Capacity {
			t.Errorf("key %q: allowed %d and %d remain, want a total of %d (the capacity)", key, allowed[k], d.Remaining, l.Capacity)
		}
	}
	// An ID is allowed afresh at most once; denials are not remembered, so
	// they may repeat until one is allowed; every replay is of the allowed
	// decision and comes after it.
	for ik, ds := range decided {
		var first []sluice.Decision
		for _, d := range ds {
			switch {
			case d.Replayed && !d.Allowed:
				t.Errorf("key%d, request ID id%d: a denial was replayed: %+v", ik.key, ik.id, d)
			case !d.Replayed && d.Allowed:
				first = append(first, d)
			}
		}
		if len(first) > 1 {
			t.Errorf("key%d, request ID id%d: allowed %d times, want at most once (decisions: %+v)", ik.key, ik.id, len(first), ds)
			continue
		}
		for _, d := range ds {
			if d.Replayed {
				if len(first) == 0 {
					t.Errorf("key%d, request ID id%d: replayed %+v, but was never allowed", ik.key, ik.id, d)
					continue
				}
				d.Replayed = false
				if d != first[0] {
					t.Errorf("key%d, request ID id%d: replay %+v differs from the decision %+v", ik.key, ik.id, d, first[0])
				}
			}
		}
	}
}

// skipRefused skips t if the store refuses one of limits (Suite.Supports).
func (s Suite) skipRefused(t *testing.T, limits ...sluice.Limit) {
	t.Helper()
	if s.Supports == nil {
		return
	}
	for _, l := range limits {
		if err := s.Supports(l); err != nil {
			t.Skipf("the store refuses limit %v, which this test needs: %v", l, err)
		}
	}
}
