package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
)

// Client is what a Store needs of a go-redis client. *redis.Client,
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient
// satisfy it. See the package documentation for the configuration the
// store requires and the one it advises.
type Client interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// checkClient refuses a go-redis client that cannot keep a caller's
// deadline: without ContextTimeoutEnabled go-redis reads and writes its
// sockets under its own ReadTimeout and WriteTimeout (5 s by default),
// whatever the context says, so a Redis that accepts connections and never
// answers holds every decision for seconds. It recognises the clients of
// go-redis by their Options method (which a type embedding one has too);
// a client without one cannot be checked and is accepted.
func checkClient(c Client) error {
	var enabled bool
	switch c := c.(type) {
	case interface{ Options() *redis.Options }: // Client, failover Client, UniversalClient of one server
		enabled = c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.ClusterOptions }: // ClusterClient, failover ClusterClient
		enabled = c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.RingOptions }:
		enabled = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !enabled {
		return fmt.Errorf("%w: redisstore: the client's ContextTimeoutEnabled is false, so go-redis would ignore each caller's deadline and wait out its ReadTimeout (5s by default) on a Redis that does not answer; set ContextTimeoutEnabled: true in its options (docs/redis.md, \"Client settings\")",
			sluice.ErrInvalidOption)
	}
	return nil
}
