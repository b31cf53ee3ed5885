package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
)

// unreachable stands for a shared store whose server is down.
type unreachable struct{}

var errRefused = errors.New("redisstore: dial tcp 127.0.0.1:6379: connect: connection refused")

func (unreachable) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errRefused
}

func (unreachable) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errRefused
}

func (unreachable) TakeAll(context.Context, []sluice.Request) (sluice.MultiDecision, error) {
	return sluice.MultiDecision{}, errRefused
}

func (unreachable) Drain(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errRefused
}

func (unreachable) Refund(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errRefused
}

func (unreachable) Reset(context.Context, string, string) error { return errRefused }

// With the store down, FailLocal decides against a local bucket holding a
// quarter of the limit (four instances share the store); every such
// decision is marked degraded and its cause goes to the hook.
func Example() {
	store, err := guard.New(unreachable{}, guard.Options{
		FailureMode:  guard.FailLocal,
		LocalDivisor: 4,
		Hooks: guard.Hooks{
			Degraded: func(ctx context.Context, d guard.Degradation) {
				fmt.Println("  cause:", d.Cause)
			},
		},
	})
	if err != nil {
		panic(err)
	}
	limit := sluice.Limit{Capacity: 8, Rate: sluice.PerSecond(4)}
	for range 3 {
		d, err := store.Take(context.Background(), sluice.Request{Policy: "test", Key: "user-1", Cost: 1, Limit: limit})
		fmt.Println(d.Allowed, d.Degraded, d.Remaining, d.Limit, err)
	}
	// Output:
	//   cause: redisstore: dial tcp 127.0.0.1:6379: connect: connection refused
	// true true 1 2 1/s <nil>
	//   cause: redisstore: dial tcp 127.0.0.1:6379: connect: connection refused
	// true true 0 2 1/s <nil>
	//   cause: redisstore: dial tcp 127.0.0.1:6379: connect: connection refused
	// false true 0 2 1/s <nil>
}

// status is how a service answers a decision: a bad parameter is the
// caller's bug, a degraded denial is an outage (503), and only a denial
// by the store is a quota denial (429).
func status(d sluice.Decision, err error) int {
	switch {
	case err != nil:
		return http.StatusBadRequest
	case !d.Allowed && d.Degraded:
		return http.StatusServiceUnavailable
	case !d.Allowed:
		return http.StatusTooManyRequests
	}
	return http.StatusOK
}

// A degraded denial and a quota denial look alike only if one forgets
// Degraded.
func Example_status() {
	limit := sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Minute)}
	req := sluice.Request{Policy: "test", Key: "user-1", Cost: 1, Limit: limit}
	ctx := context.Background()

	mem, err := memstore.New(memstore.Options{})
	if err != nil {
		panic(err)
	}
	defer mem.Close()
	healthy, err := guard.New(mem, guard.Options{FailureMode: guard.FailClosed})
	if err != nil {
		panic(err)
	}
	fmt.Println(status(healthy.Take(ctx, req)))
	fmt.Println(status(healthy.Take(ctx, req)))

	down, err := guard.New(unreachable{}, guard.Options{FailureMode: guard.FailClosed})
	if err != nil {
		panic(err)
	}
	fmt.Println(status(down.Take(ctx, req)))
	fmt.Println(status(down.Take(ctx, sluice.Request{Policy: "test", Key: "user-1", Cost: 2, Limit: limit})))
	// Output:
	// 200
	// 429
	// 503
	// 400
}

// Charges made after the fact with the store down: a degraded drain was not
// recorded by the store (under FailOpen it took nothing: Taken 0), so a
// caller that must account for every token keeps what it owes, to drain
// it again once the store is back. A
// refund is never degraded: no failure mode gives tokens back in the
// store's place.
func Example_drain() {
	store, err := guard.New(unreachable{}, guard.Options{FailureMode: guard.FailOpen})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	limit := sluice.Limit{Capacity: 1 << 20, Rate: sluice.PerSecond(1 << 16)}
	var owed int64
	for _, sent := range []int64{1500, 64000} {
		r := sluice.Request{Policy: "bytes", Key: "tenant-1", Cost: sent, Limit: limit}
		d, err := store.Drain(ctx, r)
		if err == nil && d.Degraded {
			owed += r.Cost // not recorded by the store, whatever Taken says
		}
		fmt.Println(d.Allowed, d.Taken, d.Degraded, err)
	}
	fmt.Println("owed:", owed)
	_, err = store.Refund(ctx, sluice.Request{Policy: "bytes", Key: "tenant-1", Cost: 500, Limit: limit})
	fmt.Println(errors.Is(err, sluice.ErrUnavailable))
	// Output:
	// true 0 true <nil>
	// true 0 true <nil>
	// owed: 65500
	// true
}
