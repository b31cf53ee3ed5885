package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
)

// silentListener accepts TCP connections on loopback and reads them, but
// never answers: a Redis that hangs. It is closed when t ends.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestDeadlineWhenRedisNeverAnswers: against a server that accepts
// connections and never answers, a decision with a 50 ms deadline returns
// by it (plus a little scheduling), with an error that says the store is
// unavailable and that the deadline passed, for a standalone and a Cluster
// client in the configuration docs/redis.md gives, batched or not, one
// caller or eight at once.
func TestDeadlineWhenRedisNeverAnswers(t *testing.T) {
	const deadline, slack = 50 * time.Millisecond, 20 * time.Millisecond
	addr := silentListener(t)
	clients := map[string]Client{
		"standalone": redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}),
		"cluster":    redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}),
	}
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	for name, c := range clients {
		t.Cleanup(func() { c.(interface{ Close() error }).Close() })
		for _, batch := range batchModes {
			for _, callers := range []int{1, 8} {
				t.Run(fmt.Sprintf("%s/batch=%d/callers=%d", name, batch, callers), func(t *testing.T) {
					s, err := New(c, Options{Batch: batch})
					if err != nil {
						t.Fatal(err)
					}
					var wg sync.WaitGroup
					for i := range callers {
						wg.Go(func() {
							ctx, cancel := context.WithTimeout(t.Context(), deadline)
							defer cancel()
							start := time.Now()
							d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("k", i), Cost: 1, Limit: l})
							took := time.Since(start)
							if err == nil || took > deadline+slack {
								t.Errorf("Take with a %v deadline against a Redis that never answers = %+v, %v after %v; want an error within %v",
									deadline, d, err, took, deadline+slack)
							}
							if !sluice.IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) {
								t.Errorf("Take error %v; want one wrapping sluice.ErrUnavailable and context.DeadlineExceeded", err)
							}
						})
					}
					wg.Wait()
				})
			}
		}
	}
}

// TestNewRefusesClientsWithoutDeadlines: a go-redis client of any kind
// (standalone, Cluster, Ring, Sentinel failover, universal, or a type that
// embeds one) whose ContextTimeoutEnabled is false ignores the caller's
// deadline on its sockets, so New refuses it naming the option; the same
// client with the option set is accepted. A client New cannot inspect is
// accepted.
func TestNewRefusesClientsWithoutDeadlines(t *testing.T) {
	const addr = "127.0.0.1:1" // nothing listens; New does no I/O
	type wrapped struct{ *redis.Client }
	clients := func(enabled bool) map[string]Client {
		return map[string]Client{
			"client":  redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: enabled}),
			"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: enabled}),
			"ring":    redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: enabled}),
			"failover": redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr},
				ContextTimeoutEnabled: enabled}),
			"failover cluster": redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr},
				ContextTimeoutEnabled: enabled}),
			"universal": redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, ContextTimeoutEnabled: enabled}),
			"universal cluster": redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr, addr},
				ContextTimeoutEnabled: enabled}),
			"embedded": wrapped{redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: enabled})},
		}
	}
	for name, c := range clients(false) {
		t.Cleanup(func() { c.(interface{ Close() error }).Close() })
		s, err := New(c, Options{})
		if !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
			t.Errorf("New(%s (%T) with ContextTimeoutEnabled false) = %v, %v; want an error wrapping %v that names ContextTimeoutEnabled",
				name, c, s, err, sluice.ErrInvalidOption)
		}
	}
	for name, c := range clients(true) {
		t.Cleanup(func() { c.(interface{ Close() error }).Close() })
		if _, err := New(c, Options{}); err != nil {
			t.Errorf("New(%s (%T) with ContextTimeoutEnabled true) = %v; want a store", name, c, err)
		}
	}
	plain := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { plain.Close() })
	if _, err := New(processOnly{plain}, Options{Batch: 1}); err != nil {
		t.Errorf("New(a client it cannot inspect) = %v; want a store", err)
	}
}

// offline returns a client of a port nothing listens on, in the
// configuration New accepts, closed when t ends: for tests of what New and
// the Go checks do without I/O.
func offline(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}
