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
	//		Addr:       "127.0.0.1:6379",
	//		MaxRetries: -1, // a reply lost after the script ran must not charge twice
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
			panic(err) // Redis unreachable: apply the service's failure policy
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter.Round(100*time.Millisecond))
	}

	// A limit whose exact arithmetic does not fit Lua's numbers is refused.
	huge := sluice.Limit{Capacity: 1 << 40, Rate: sluice.Every(time.Hour)}
	_, err = store.Take(ctx, sluice.Request{Policy: "api", Key: "user-42", Cost: 1, Limit: huge})
	fmt.Println(errors.Is(err, sluice.ErrInvalidLimit), redisstore.CheckLimit(huge) != nil)
	// Output:
	// true 6 0s
	// true 2 0s
	// false 2 1s
	// true true
}

// exampleClient returns a client of the tests' Redis server with the
// example's keys deleted.
func exampleClient() *redis.Client {
	o, err := redistest.Find()
	if err != nil {
		panic(err)
	}
	o.MaxRetries = -1
	c := redis.NewClient(o)
	ctx := context.Background()
	iter := c.Scan(ctx, 0, "example:*", 100).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
	return c
}
