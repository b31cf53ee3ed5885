package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

func Example() {
	// A clock the example controls; by default the store reads the
	// monotonic clock.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store, err := memstore.New(memstore.Options{
		Now:      func() time.Time { return now },
		MaxKeys:  100_000,
		Overflow: memstore.RefuseNew,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ctx := context.Background()
	limit := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, 2*time.Second)}

	d, _ := store.Take(ctx, sluice.Request{Policy: "api", Key: "10.0.0.1", Cost: 5, Limit: limit})
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = store.Take(ctx, sluice.Request{Policy: "api", Key: "10.0.0.1", Cost: 1, Limit: limit})
	fmt.Println(d.Allowed, d.RetryAfter)
	now = now.Add(2 * time.Second)
	d, _ = store.Take(ctx, sluice.Request{Policy: "api", Key: "10.0.0.1", Cost: 1, Limit: limit})
	fmt.Println(d.Allowed, d.Remaining)

	_, err = store.Take(ctx, sluice.Request{Policy: "api", Key: "10.0.0.1", Cost: 6, Limit: limit})
	fmt.Println(errors.Is(err, sluice.ErrInvalidCost), err)
	// Output:
	// true 0 10s
	// false 2s
	// true 0
	// true sluice: invalid cost: cost 6 is outside [1, 5] (the capacity)
}

// A retried request with the same ID gets the first decision back and
// consumes nothing.
func ExampleStore_Take_requestID() {
	store, err := memstore.New(memstore.Options{RequestIDTTL: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ctx := context.Background()
	r := sluice.Request{Policy: "payments", Key: "acct-7", Cost: 3, Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(0)}, RequestID: "charge-981"}
	for range 2 {
		d, _ := store.Take(ctx, r)
		fmt.Println(d.Allowed, d.Remaining, d.Replayed)
	}
	// Output:
	// true 7 false
	// true 7 true
}

// A request charged to a burst limit and a daily quota at once: both are
// charged, or neither is.
func ExampleStore_TakeAll() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ctx := context.Background()
	rs := []sluice.Request{
		{Policy: "burst", Key: "user-1", Cost: 1, Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}},
		{Policy: "daily", Key: "user-1", Cost: 1, Limit: sluice.Limit{Capacity: 3, Rate: sluice.Per(3, 24*time.Hour)}},
	}
	for range 4 {
		md, _ := store.TakeAll(ctx, rs)
		fmt.Println(md.Allowed, md.Parts[0].Remaining, md.Parts[1].Remaining, md.Denied)
	}
	// Output:
	// true 4 2 -1
	// true 3 1 -1
	// true 2 0 -1
	// false 2 0 1
}

// A take undone by its request ID: the refund gives the tokens back once,
// and its retry gives nothing.
func ExampleStore_Refund() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ctx := context.Background()
	r := sluice.Request{Policy: "exports", Key: "acct-7", Cost: 4, Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(0)}, RequestID: "job-3"}
	d, _ := store.Take(ctx, r)
	fmt.Println(d.Allowed, d.Remaining)
	for range 2 {
		d, _ = store.Refund(ctx, r)
		fmt.Println(d.Remaining, d.Taken, d.Replayed)
	}
	// Output:
	// true 6
	// 10 -4 false
	// 10 0 true
}

// Tokens a model generated are known only once the answer is written: the
// request was allowed on an estimate, and the real count is drained
// afterwards. A drain takes what is there, down to zero (Allowed says
// whether all of it was), and the next request waits for the refill.
func ExampleStore_Drain() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	ctx := context.Background()
	tokens := sluice.Limit{Capacity: 10000, Rate: sluice.Per(10000, time.Minute)}
	est := sluice.Request{Policy: "llm-tokens", Key: "team-a", Cost: 500, Limit: tokens}
	d, _ := store.Take(ctx, est) // the estimate, before the call
	fmt.Println(d.Allowed, d.Remaining)
	// The answer used 12,000 tokens: 11,500 more than the estimate.
	d, _ = store.Drain(ctx, sluice.Request{Policy: "llm-tokens", Key: "team-a", Cost: 11500, Limit: tokens})
	fmt.Println(d.Allowed, d.Taken, d.Remaining)
	d, _ = store.Take(ctx, est)
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 9500
	// false 9500 0
	// false 3s
}
