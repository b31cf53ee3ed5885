package main

import (
	"fmt"
	"time"

	"github.com/gubernator-io/gubernator/v2"

	"github.com/sluicehq/sluice"
)

// gubernatorLimit is what every gubernator request item asks for.
type gubernatorLimit struct {
	algorithm gubernator.Algorithm
	limit     int64
	burst     int64
	duration  time.Duration // a whole number of milliseconds
}

// String describes g as its request items give it.
func (g gubernatorLimit) String() string {
	return fmt.Sprintf("%v limit %d burst %d duration %dms", g.algorithm, g.limit, g.burst, g.duration.Milliseconds())
}

// maxGubernatorDuration bounds the duration of the gubernator limit: the
// time a sluice bucket takes to refill from empty, which is also how long
// gubernator keeps an idle key.
const maxGubernatorDuration = 366 * 24 * time.Hour

// gubernatorShape returns the gubernator limit closest to the sluice limit
// l under algorithm ("leaky" or "token").
//
// A sluice bucket holds at most l.Capacity tokens and refills
// continuously at l.Rate. Gubernator's LEAKY_BUCKET is that shape: burst
// is the capacity, and it refills ("leaks") continuously at limit tokens
// per duration, keeping the fraction. Its item expires duration after
// its last hit, and a new one starts full; with limit = capacity and
// duration the time to refill from empty (capacity / rate), an expired
// bucket would have been full again anyway, so the expiry changes no
// decision. "100 10/s" is LEAKY_BUCKET limit 100 burst 100 duration
// 10000ms. The only loss is rounding duration to a whole millisecond.
//
// Its TOKEN_BUCKET with the same limit and duration is not the shape: it
// allows limit hits, and then none until duration after the bucket was
// created, when it is full again at once — a fixed window of 100 per
// 10 s, which at a window's edge allows twice the burst. It is offered
// to compare the cost of gubernator's two algorithms, not their
// decisions.
func gubernatorShape(l sluice.Limit, algorithm string) (gubernatorLimit, error) {
	if err := l.Validate(); err != nil {
		return gubernatorLimit{}, err
	}
	if l.Rate.Tokens == 0 {
		return gubernatorLimit{}, fmt.Errorf("%w: %v never refills, which gubernator's limits cannot say: want a rate above 0", sluice.ErrInvalidLimit, l)
	}
	// The time to refill from empty, rounded to the millisecond.
	refill := float64(l.Capacity) * float64(l.Rate.Period) / float64(l.Rate.Tokens)
	ms := int64(refill/float64(time.Millisecond) + 0.5)
	if ms < 1 || time.Duration(ms)*time.Millisecond > maxGubernatorDuration {
		return gubernatorLimit{}, fmt.Errorf("%w: %v refills from empty in %v; gubernator's duration wants 1ms to %v", sluice.ErrInvalidLimit, l, time.Duration(refill), maxGubernatorDuration)
	}
	g := gubernatorLimit{limit: l.Capacity, burst: l.Capacity, duration: time.Duration(ms) * time.Millisecond}
	switch algorithm {
	case "leaky":
		g.algorithm = gubernator.Algorithm_LEAKY_BUCKET
	case "token":
		g.algorithm = gubernator.Algorithm_TOKEN_BUCKET
		g.burst = 0 // TOKEN_BUCKET has no burst
	default:
		return gubernatorLimit{}, fmt.Errorf("-algorithm %q: want leaky or token", algorithm)
	}
	return g, nil
}
