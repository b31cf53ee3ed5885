package pgstore

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
	"pgregory.net/rapid"
)

// TestCreatedDecision: the decision Go computes for a bucket that a take
// created with the plain insert, stamped at its time or at a later sweep
// floor, is the model's for a take of a new key after a sweep at the
// floor, for limits of every size that the insert-first path takes
// (smallPlan), costs from 1 to the capacity, and times across the whole
// range of µs, where the gap from the take's time to the floor and the
// refill time can exceed what a time.Duration holds.
func TestCreatedDecision(t *testing.T) {
	// The edges that random draws reach only rarely: a gap from now to the
	// floor that does not fit in 64 bits, or that fits but is longer than
	// a time.Duration, or just short of it.
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	for _, c := range []struct{ now, floor int64 }{
		{math.MinInt64, 1 << 62},
		{-9223372036854777, math.MaxInt64},
		{0, maxWaitMicros},
		{0, maxWaitMicros - 100_000},
		{0, maxWaitMicros - 100_001},
		{-1, math.MaxInt64},
	} {
		checkCreated(t, l, 1, c.now, c.floor)
	}
	rapid.Check(t, func(rt *rapid.T) {
		capacity := rapid.OneOf(rapid.Int64Range(1, 1000), rapid.Int64Range(1, 1<<62)).Draw(rt, "capacity")
		tokens := rapid.OneOf(rapid.Int64Range(0, 1000), rapid.Int64Range(0, math.MaxInt64)).Draw(rt, "tokens")
		period := time.Duration(rapid.OneOf(rapid.Int64Range(1, 1e6), rapid.Int64Range(1, math.MaxInt64/int64(time.Microsecond))).Draw(rt, "period µs")) * time.Microsecond
		l := sluice.Limit{Capacity: capacity, Rate: sluice.Rate{Tokens: tokens, Period: period}}
		if l.Validate() != nil {
			rt.Skip("invalid limit")
		}
		p, err := plan(l)
		if err != nil || !smallPlan(l, p) {
			rt.Skip("not taken by the insert-first path")
		}
		cost := rapid.OneOf(rapid.Int64Range(1, min(capacity, 10)), rapid.Int64Range(1, capacity)).Draw(rt, "cost")
		if (sluice.Request{Policy: "p", Key: "k", Cost: cost, Limit: l}).Validate() != nil {
			rt.Skip("invalid request")
		}
		now := rapid.OneOf(rapid.Int64Range(-1e6, 1e6), rapid.Int64()).Draw(rt, "now")
		near := rapid.Int64Range(-1e6, 1e6).Draw(rt, "floor - now")
		floor := rapid.OneOf(rapid.Just(satAdd(now, near)), rapid.Int64()).Draw(rt, "floor")

		checkCreated(rt, l, cost, now, floor)
	})
}

// checkCreated compares createdDecision for a take of cost under l that
// created its bucket at now, after a sweep at floor, with the model's.
func checkCreated(t interface {
	Helper()
	Fatalf(string, ...any)
}, l sluice.Limit, cost, now, floor int64) {
	t.Helper()
	p, err := plan(l)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	r := sluice.Request{Policy: "p", Key: "k", Cost: cost, Limit: l}
	m := sluicetest.NewModel(time.Microsecond, sluice.KeepTokens, time.Minute)
	m.Sweep(floor)
	want, err := m.Take(now, r)
	if err != nil {
		t.Fatalf("model: %v", err)
	}
	c, ok := createReset(p, cost)
	if got := createdDecision(r, now, max(now, floor), c, ok); got != want {
		t.Fatalf("createdDecision of %d at %d, floor %d = %+v; the model says %+v", cost, now, floor, got, want)
	}
}

// satAdd is a + b, saturated at the int64 bounds.
func satAdd(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}
