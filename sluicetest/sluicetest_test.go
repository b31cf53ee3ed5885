package sluicetest

import (
	"context"
	"fmt"
	"math/bits"
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
	now := s.ticks() // before the lock, as a sharded store reads it
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Take(now, r)
}

func (s *modelStore) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Peek(s.ticks(), r)
}

func (s *modelStore) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.MultiDecision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.TakeAll(s.ticks(), rs)
}

func (s *modelStore) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Drain(s.ticks(), r)
}

func (s *modelStore) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Refund(s.ticks(), r)
}

func (s *modelStore) Reset(ctx context.Context, policy, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Reset(s.ticks(), policy, key)
}

var _ sluice.Operator = (*modelStore)(nil)

// sweep drops what the model's Sweep drops, at the store's current tick.
func (s *modelStore) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m.Sweep(s.ticks())
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
				Sweep:          func(st sluice.Store) { st.(*modelStore).sweep() },
			})
		})
	}
}

// refusingStore is a modelStore that refuses the limits refuse names, as a
// store with narrower integers does.
type refusingStore struct {
	*modelStore
	refuse func(sluice.Limit) error
}

func (s refusingStore) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.refuse(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	return s.modelStore.Take(ctx, r)
}

func (s refusingStore) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.refuse(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	return s.modelStore.Peek(ctx, r)
}

func (s refusingStore) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := sluice.ValidateAll(rs); err != nil {
		return sluice.MultiDecision{}, err
	}
	for _, r := range rs {
		if err := s.refuse(r.Limit); err != nil {
			return sluice.MultiDecision{}, err
		}
	}
	return s.modelStore.TakeAll(ctx, rs)
}

func (s refusingStore) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.refuse(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	return s.modelStore.Drain(ctx, r)
}

func (s refusingStore) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.refuse(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	return s.modelStore.Refund(ctx, r)
}

// TestRunRefusingStore runs the suite against a store that refuses limits
// whose capacity times period in ticks is 2^46 or more: Suite.Supports
// makes the suite expect the refusals and skip the cases that need them.
func TestRunRefusingStore(t *testing.T) {
	tick := time.Microsecond
	refuse := func(l sluice.Limit) error {
		if l.Rate.Period%tick != 0 {
			return fmt.Errorf("%w: period %v is not whole microseconds", sluice.ErrInvalidLimit, l.Rate.Period)
		}
		if hi, lo := bits.Mul64(uint64(l.Capacity), uint64(l.Rate.Period/tick)); hi != 0 || lo >= 1<<46 {
			return fmt.Errorf("%w: capacity × period is 2^46 or more", sluice.ErrInvalidLimit)
		}
		return nil
	}
	Run(t, Suite{
		New: func(t *testing.T, o StoreOptions) sluice.Store {
			return refusingStore{newModelStore(tick, o), refuse}
		},
		Tick:           tick,
		Supports:       refuse,
		Workers:        8,
		TakesPerWorker: 2000,
	})
}
