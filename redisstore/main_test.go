package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/faultproxy"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The tests run against real Redis servers only (see internal/redistest):
// SLUICE_REDIS_URL or redis://127.0.0.1:6379/15, else a private
// redis-server, and a private three-master cluster they start and stop.
func TestMain(m *testing.M) { redistest.Main(m) }

// client is what the tests need of a standalone or cluster client.
type client interface {
	Client
	redis.Cmdable
}

// batchModes are the Options.Batch values the topology tests run with:
// one round trip per decision (1), and pipelines of up to 64.
var batchModes = []int{1, 64}

// topologies returns the clients the topology-independent tests run on: the
// standalone server, and the private cluster unless -short.
func topologies(t *testing.T) map[string]client {
	t.Helper()
	m := map[string]client{"standalone": redistest.Client(t)}
	if !testing.Short() {
		m["cluster"] = redistest.ClusterClient(t)
	}
	return m
}

// newPrefix returns a key prefix no other test uses and deletes its keys
// when t ends.
func newPrefix(t testing.TB, c client) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	prefix := "sluicetest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		if err := deleteKeys(context.Background(), c, prefix); err != nil {
			t.Errorf("deleting the keys of %q: %v", prefix, err)
		}
	})
	return prefix
}

// newStore returns a Store with a fresh prefix on c.
func newStore(t testing.TB, c client, o Options) *Store {
	t.Helper()
	o.Prefix = newPrefix(t, c)
	s, err := New(c, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// forEachNode calls fn with a client of every master c has: c itself if it
// is not a cluster client.
func forEachNode(ctx context.Context, c client, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n) })
	}
	return fn(ctx, c)
}

// scanKeys returns every live key that starts with prefix, on every node.
func scanKeys(ctx context.Context, c client, prefix string) ([]string, error) {
	var (
		keys []string
		mu   = make(chan struct{}, 1)
	)
	err := forEachNode(ctx, c, func(ctx context.Context, n redis.Cmdable) error {
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var mine []string
		for iter.Next(ctx) {
			mine = append(mine, iter.Val())
		}
		mu <- struct{}{}
		keys = append(keys, mine...)
		<-mu
		return iter.Err()
	})
	return keys, err
}

// deleteKeys deletes every key that starts with prefix, one key per command
// (keys of a cluster node may lie in different slots).
func deleteKeys(ctx context.Context, c client, prefix string) error {
	return forEachNode(ctx, c, func(ctx context.Context, n redis.Cmdable) error {
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		pipe := n.Pipeline()
		for iter.Next(ctx) {
			pipe.Unlink(ctx, iter.Val())
			if pipe.Len() >= 1000 {
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		_, err := pipe.Exec(ctx)
		return err
	})
}

// testPolicy is the policy of the tests' requests.
const testPolicy = "test"

// checkLimit is Store.CheckLimit, which does not depend on the store.
var checkLimit = new(Store).CheckLimit

// proxied returns a fault proxy in front of the standalone test server and
// a client that connects through it, both closed when t ends. o, if not
// nil, changes the client's options before it is made.
func proxied(t *testing.T, o func(*redis.Options)) (*faultproxy.Proxy, *redis.Client) {
	t.Helper()
	p, err := faultproxy.New(redistest.Options(t).Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	opts := redistest.Options(t)
	opts.Addr = p.Addr()
	if o != nil {
		o(opts)
	}
	via := redis.NewClient(opts)
	t.Cleanup(func() { via.Close() })
	return p, via
}
