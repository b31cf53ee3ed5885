package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// A Limiter binds a store to one policy and one limit: here the "comments"
// quota, a burst of 3 and one token every minute for each key.
func ExampleLimiter() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	lim, err := sluice.NewLimiter(store, "comments", sluice.Limit{Capacity: 3, Rate: sluice.Every(time.Minute)})
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

// A bucket that never refills denies with RetryAfter == Never once empty:
// waiting cannot help.
func ExampleNever() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	oneTime := sluice.Limit{Capacity: 1, Rate: sluice.Rate{Tokens: 0, Period: time.Second}}
	for range 2 {
		d, _ := store.Take(ctx, sluice.Request{Policy: "invites", Key: "invite-code", Cost: 1, Limit: oneTime})
		fmt.Println(d.Allowed, d.RetryAfter == sluice.Never)
	}
	// Output:
	// true false
	// false true
}

// Two policies never share a bucket: a per-second burst and a daily quota
// on the same user are decided apart.
func ExampleRequest_policy() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	burst := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}
	daily := sluice.Limit{Capacity: 2, Rate: sluice.Per(2, 24*time.Hour)}
	for range 3 {
		b, _ := store.Take(ctx, sluice.Request{Policy: "burst", Key: "user-42", Cost: 1, Limit: burst})
		d, _ := store.Take(ctx, sluice.Request{Policy: "daily", Key: "user-42", Cost: 1, Limit: daily})
		fmt.Println(b.Allowed, b.Remaining, d.Allowed, d.Remaining)
	}
	// Output:
	// true 4 true 1
	// true 3 true 0
	// true 2 false 0
}

// Wait sleeps until the bucket has the tokens, for work that should be
// slowed down rather than refused: a batch job calling a partner's API,
// here at 50 calls a second after a burst of 1.
func ExampleLimiter_Wait() {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	lim, err := sluice.NewLimiter(store, "partner-api", sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(50)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	begin := time.Now()
	for range 6 {
		if _, err := lim.Wait(ctx, "batch-job", 1); err != nil {
			panic(err)
		}
	}
	// One call at once, five more at 20 ms intervals.
	fmt.Println(time.Since(begin) >= 100*time.Millisecond)

	// A wait that cannot end before the deadline is refused at once: a
	// quota of one call a minute, spent, under a deadline of a second.
	perMinute, err := sluice.NewLimiter(store, "partner-api-slow", sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)})
	if err != nil {
		panic(err)
	}
	if _, err := perMinute.Wait(ctx, "batch-job", 1); err != nil {
		panic(err)
	}
	second, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := perMinute.Wait(second, "batch-job", 1)
	fmt.Println(errors.Is(err, sluice.ErrWaitTooLong), d.RetryAfter > 59*time.Second)
	// Output:
	// true
	// true true
}
