package memstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// clock is a manual clock for tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newStore returns a store built with o, closed when tb ends.
func newStore(tb testing.TB, o memstore.Options) *memstore.Store {
	tb.Helper()
	s, err := memstore.New(o)
	if err != nil {
		tb.Fatalf("memstore.New(%+v) error %v", o, err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

var perSecond10 = sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}

func take(t *testing.T, s *memstore.Store, key string, cost int64) (sluice.Decision, error) {
	t.Helper()
	return s.Take(context.Background(), sluice.Request{Policy: "test", Key: key, Cost: cost, Limit: perSecond10})
}
