package httplimit_test

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
)

// modelStore is the reference model behind a mutex, on a clock the test
// controls: a sluice.Operator whose decisions are the contract's by
// definition. (It stands in for memstore until memstore implements
// TakeAll.)
type modelStore struct {
	mu    sync.Mutex
	m     *sluicetest.Model
	clock *sluicetest.Clock
	epoch time.Time
}

var _ sluice.Operator = (*modelStore)(nil)

func newModelStore(clock *sluicetest.Clock) *modelStore {
	return &modelStore{m: sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, 5*time.Minute), clock: clock, epoch: clock.Now()}
}

func (s *modelStore) now() int64 { return int64(s.clock.Now().Sub(s.epoch)) }

func (s *modelStore) Take(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Take(s.now(), r)
}

func (s *modelStore) Peek(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Peek(s.now(), r)
}

func (s *modelStore) TakeAll(_ context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.TakeAll(s.now(), rs)
}

func (s *modelStore) Drain(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Drain(s.now(), r)
}

func (s *modelStore) Refund(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Refund(s.now(), r)
}

func (s *modelStore) Reset(_ context.Context, policy, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Reset(s.now(), policy, key)
}
