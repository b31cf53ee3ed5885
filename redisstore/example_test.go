package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

func Example() {
	ctx := context.Background()
	// In a program:
	//
	//	client := redis.NewClient(&redis.Options{
	//		Addr:                  "127.0.0.1:6379",
	//		ContextTimeoutEnabled: true,                   // required: the caller's deadline bounds each call
	//		MaxRetries:            -1,                     // no retries for other commands on this client
	//		DialerRetries:         1,                      // one dial attempt, not 5 with 100 ms pauses
	//		DialTimeout:           200 * time.Millisecond, // a dial without a deadline
	//		ReadTimeout:           time.Second,            // bounds batched pipelines, which have no deadline
	//		WriteTimeout:          time.Second,
	//	})
	//
	// Here, the tests' server.
	client := exampleClient()
	defer client.Close()

	// Every instance of the service with the same prefix shares the buckets;
	// time comes from Redis TIME.
	store, err := redisstore.New(client, redisstore.Options{Prefix: "example:"})
	if err != nil {
		panic(err)
	}
	limit := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	for range 3 {
		d, err := store.Take(ctx, sluice.Request{Policy: "api", Key: "user-42", Cost: 4, Limit: limit})
		if err != nil {
			panic(err) // sluice.IsUnavailable(err): apply the service's failure policy
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter.Round(100*time.Millisecond))
	}

	// A limit whose exact arithmetic does not fit Lua's numbers is refused
	// when a limiter is built, and by every call.
	huge := sluice.Limit{Capacity: 1 << 40, Rate: sluice.Every(time.Hour)}
	_, err = sluice.NewLimiter(store, "api", huge)
	fmt.Println(errors.Is(err, sluice.ErrInvalidLimit), store.CheckLimit(huge) != nil)
	// Output:
	// true 6 0s
	// true 2 0s
	// false 2 1s
	// true true
}

// A go-redis client that does not honour the caller's deadline is refused.
func ExampleNew_refused() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", MaxRetries: -1})
	defer client.Close()
	_, err := redisstore.New(client, redisstore.Options{})
	fmt.Println(errors.Is(err, sluice.ErrInvalidOption))
	// Output:
	// true
}

// exampleClient returns a client of the tests' Redis server with the
// example's keys deleted.
func exampleClient() *redis.Client {
	o, err := redistest.Find()
	if err != nil {
		panic(err)
	}
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(o)
	ctx := context.Background()
	iter := c.Scan(ctx, 0, "example:*", 100).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
	return c
}
