package sluicetest_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

// The model at explicit instants: 10 tokens a second for 150ms is exactly
// 1.5 tokens.
func ExampleModel() {
	m := sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	ms := int64(time.Millisecond) // ticks of 1ns

	d, _ := m.Take(0, sluice.Request{Policy: "api", Key: "k", Cost: 10, Limit: l})
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = m.Peek(150*ms, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: l})
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = m.Take(150*ms, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: l})
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter, m.Level("api", "k").RatString())
	d, _ = m.Take(150*ms, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: l})
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 0 1s
	// true 1 850ms
	// true 0 950ms 1/2
	// false 50ms
}

// A Clock moves only when told to, backwards too.
func ExampleClock() {
	c := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c.Advance(90 * time.Minute)
	fmt.Println(c.Now().Format(time.TimeOnly))
	c.Advance(-time.Hour)
	fmt.Println(c.Now().Format(time.TimeOnly))
	// Output:
	// 01:30:00
	// 00:30:00
}
