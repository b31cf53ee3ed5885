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
// created with the plain insert is the model's for a take of a new key,
// after a sweep no later than the take (a later one sends the take to the
// function), for limits of every size that the insert-first path takes
// (smallPlan), costs from 1 to the capacity, and times across the whole
// range of µs, with refill times on both sides of what a time.Duration
// holds.
func TestCreatedDecision(t *testing.T) {
	// The edges: one token every 366 days makes 291 tokens the longest
	// refill a time.Duration holds, and 292 one it does not.
	slow := sluice.Limit{Capacity: 100_000, Rate: sluice.Rate{Tokens: 1, Period: sluice.MaxPeriod}}
	for _, cost := range []int64{1, 291, 292, 100_000} {
		checkCreated(t, slow, cost, 0, math.MinInt64)
		checkCreated(t, slow, cost, math.MaxInt64, math.MaxInt64)
		checkCreated(t, slow, cost, math.MinInt64, math.MinInt64)
	}
	never := sluice.Limit{Capacity: 10, Rate: sluice.Rate{Tokens: 0, Period: time.Second}}
	checkCreated(t, never, 1, 0, -1)
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
		floor := rapid.OneOf(rapid.Just(now), rapid.Int64Range(math.MinInt64, now)).Draw(rt, "floor")
		checkCreated(rt, l, cost, now, floor)
	})
}

// checkCreated compares createdDecision for a take of cost under l that
// created its bucket at now, after a sweep at floor <= now, with the
// model's.
func checkCreated(t interface {
	Helper()
	Fatalf(string, ...any)
}, l sluice.Limit, cost, now, floor int64) {
	t.Helper()
	p, err := plan(l)
	if err != nil || !smallPlan(l, p) {
		t.Fatalf("plan of %v: %v, small %v; want a limit of the insert-first path", l, err, err == nil && smallPlan(l, p))
	}
	r := sluice.Request{Policy: "p", Key: "k", Cost: cost, Limit: l}
	m := sluicetest.NewModel(time.Microsecond, sluice.KeepTokens, time.Minute)
	m.Sweep(floor)
	want, err := m.Take(now, r)
	if err != nil {
		t.Fatalf("model: %v", err)
	}
	c, ok := createReset(p, cost)
	if got := createdDecision(r, c, ok); got != want {
		t.Fatalf("createdDecision of %d under %v at %d, floor %d = %+v; the model says %+v", cost, l, now, floor, got, want)
	}
}
