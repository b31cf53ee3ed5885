package sluicetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// modelStore is a sluice.Store made of a Model behind a mutex: the suite
// must pass against its own reference.
type modelStore struct {
	mu    sync.Mutex
	m     *Model
	now   func() time.Time
	epoch time.Time
	tick  time.Duration
}

func newModelStore(tick time.Duration, o StoreOptions) *modelStore {
	return &modelStore{
		m:     NewModel(tick, o.OnLimitChange, o.RequestIDTTL),
		now:   o.Now,
		epoch: o.Now(),
		tick:  tick,
	}
}

func (s *modelStore) ticks() int64 { return int64(s.now().Sub(s.epoch) / s.tick) }

func (s *modelStore) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Take(s.ticks(), r)
}

func (s *modelStore) Peek(ctx context.Context, key string, l sluice.Limit) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Peek(s.ticks(), key, l)
}

func TestRunModelStore(t *testing.T) {
	for _, tick := range []time.Duration{time.Nanosecond, time.Microsecond} {
		t.Run(tick.String(), func(t *testing.T) {
			Run(t, Suite{
				New: func(t *testing.T, o StoreOptions) sluice.Store {
					return newModelStore(tick, o)
				},
				Tick:           tick,
				Workers:        8,
				TakesPerWorker: 2000,
			})
		})
	}
}
