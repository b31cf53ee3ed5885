package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// A Limiter binds a store to one limit: here a burst of 3 and one token
// every minute for each key.
func ExampleLimiter() {
	store := memstore.New(memstore.Options{})
	defer store.Close()
	lim, err := sluice.NewLimiter(store, sluice.Limit{Capacity: 3, Rate: sluice.Every(time.Minute)})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 4 {
		d, err := lim.Allow(ctx, "user-42")
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.Remaining)
	}
	// Output:
	// true 2
	// true 1
	// true 0
	// false 0
}

// Limits have a short text form for configuration files and flags.
func ExampleParseLimit() {
	l, err := sluice.ParseLimit("100 10/s")
	if err != nil {
		panic(err)
	}
	fmt.Println(l.Capacity, l.Rate.Tokens, l.Rate.Period, l)

	_, err = sluice.ParseLimit("0 10/s")
	fmt.Println(err)
	// Output:
	// 100 10 1s 100 10/s
	// sluice: invalid limit: capacity 0 is outside [1, 1099511627776]
}

// Plan is the exact transition every store implements: 10 tokens a second
// for 150ms is exactly 1.5 tokens, and the wait for the second is exactly
// 50ms.
func ExamplePlan() {
	p, err := sluice.NewPlan(sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}, time.Nanosecond)
	if err != nil {
		panic(err)
	}
	var d sluice.Decision
	s := p.Full(0)
	p.Take(&s, 0, 10, &d) // empty the bucket at t=0
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	p.Take(&s, int64(150*time.Millisecond), 2, &d)
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	p.Take(&s, int64(150*time.Millisecond), 1, &d)
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	// Output:
	// true 0 1s
	// false 1 50ms
	// true 0 950ms
}

// A bucket that never refills denies with RetryAfter == Never once empty:
// waiting cannot help.
func ExampleNever() {
	store := memstore.New(memstore.Options{})
	defer store.Close()
	ctx := context.Background()
	oneTime := sluice.Limit{Capacity: 1, Rate: sluice.Rate{Tokens: 0, Period: time.Second}}
	for range 2 {
		d, _ := store.Take(ctx, sluice.Request{Key: "invite-code", Cost: 1, Limit: oneTime})
		fmt.Println(d.Allowed, d.RetryAfter == sluice.Never)
	}
	// Output:
	// true false
	// false true
}
