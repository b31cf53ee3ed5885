package bucket_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Plan is the exact transition every store implements: 10 tokens a second
// for 150ms is exactly 1.5 tokens, and the wait for the second is exactly
// 50ms.
func ExamplePlan() {
	p, err := bucket.NewPlan(sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}, time.Nanosecond)
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
