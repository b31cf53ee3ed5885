package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// TestConcurrentOneKeyDatabaseClock floods one key from 64 goroutines (64
// connections) with 100 takes each, on the database clock, under a limit
// of capacity 1,000 refilling 1 token an hour: during the test less than
// one token refills, so exactly 1,000 takes are allowed, each seeing a
// different Remaining. It runs with takes in shared transactions (the
// default) and without (Options.Batch 1).
func TestConcurrentOneKeyDatabaseClock(t *testing.T) {
	for _, first := range []bool{false, true} {
		for _, batch := range []int{0, 1} {
			t.Run(fmt.Sprintf("insert first %v batch %d", first, batch), func(t *testing.T) { testConcurrentOneKey(t, first, batch) })
		}
	}
}

// testConcurrentOneKey is TestConcurrentOneKeyDatabaseClock with every
// take trying the insert of a new bucket first, or none
// (docs/postgres.md, "Takes of new keys"): the workers' first takes all
// find the key missing and race to create it.
func testConcurrentOneKey(t *testing.T, insertFirst bool, batch int) {
	const workers, takes = 64, 100
	s := newStore(t, pgstore.Options{
		Batch: batch,
		// Exactness, not latency, is under test: the hot key's queue may
		// wait for many commits on a busy machine.
		StatementTimeout: time.Minute,
		LockTimeout:      time.Minute,
	})
	pgstore.SetInsertFirst(s, insertFirst)
	l := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1, time.Hour)}
	ctx := context.Background()
	var (
		mu        sync.Mutex
		remaining []int64
		errs      []error
		wg        sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			var rem []int64
			for range takes {
				d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "hot", Cost: 1, Limit: l})
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if d.Allowed {
					rem = append(rem, d.Remaining)
				}
			}
			mu.Lock()
			remaining = append(remaining, rem...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		t.Fatalf("Take(%q, 1) failed %d times, first: %v", "hot", len(errs), errs[0])
	}
	st := s.Stats()
	t.Logf("%d×%d takes in %v (%.0f/s), %d in %d shared transactions", workers, takes, elapsed, workers*takes/elapsed.Seconds(), st.SharedTakes, st.SharedTransactions)
	if shared := st.SharedTakes > 0; shared != (batch != 1) {
		t.Fatalf("Stats() = %+v with Batch %d; want shared takes only with batching", st, batch)
	}
	if elapsed > 30*time.Minute {
		t.Fatalf("the test took %v: more than one token may have refilled", elapsed)
	}
	if got, want := len(remaining), 1000; got != want {
		t.Fatalf("%d×%d concurrent Take(%q, 1) allowed %d, want %d", workers, takes, "hot", got, want)
	}
	slices.Sort(remaining)
	for i, r := range remaining {
		if r != int64(i) {
			t.Fatalf("allowed takes saw Remaining %d twice or not at all", i)
		}
	}
	d, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "hot", Cost: 1, Limit: l})
	if err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("Peek(%q) = %+v, %v; want a denial with 0 remaining", "hot", d, err)
	}
}

// TestConcurrentRequestIDNewKey: many callers send the same request ID at
// once for a key that has no bucket yet. Exactly one of them is decided,
// the others get its decision replayed, and the cost is taken once.
func TestConcurrentRequestIDNewKey(t *testing.T) {
	const callers, keys = 16, 20
	s := newStore(t, pgstore.Options{StatementTimeout: time.Minute, LockTimeout: time.Minute})
	l := sluice.Limit{Capacity: 100, Rate: sluice.Per(1, time.Hour)}
	ctx := context.Background()
	for k := range keys {
		key := "new" + strconv.Itoa(k)
		r := sluice.Request{Policy: testPolicy, Key: key, Cost: 7, Limit: l, RequestID: "same"}
		ds := make([]sluice.Decision, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() { ds[i], errs[i] = s.Take(ctx, r) })
		}
		wg.Wait()
		var first []sluice.Decision
		for i, d := range ds {
			if errs[i] != nil {
				t.Fatalf("Take(%q, ID %q): %v", key, r.RequestID, errs[i])
			}
			if !d.Replayed {
				first = append(first, d)
			}
		}
		if len(first) != 1 {
			t.Fatalf("key %q: %d of %d concurrent takes with one request ID were decided, want 1", key, len(first), callers)
		}
		for _, d := range ds {
			d.Replayed = false
			if d != first[0] {
				t.Fatalf("key %q: a replay %+v differs from the decision %+v", key, d, first[0])
			}
		}
		if d, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l}); err != nil || d.Remaining != 93 {
			t.Fatalf("Peek(%q) = %+v, %v; want 93 remaining (the cost taken once)", key, d, err)
		}
	}
}
