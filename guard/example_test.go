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
