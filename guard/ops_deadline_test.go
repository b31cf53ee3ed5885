package guard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
)

// checkFailed checks the outcome of an operation the store failed to
// decide, with a cause wrapping want: a degraded decision whose cause
// (from rec) wraps want, or for Refund and Reset an error wrapping
// sluice.ErrUnavailable and want.
func checkFailed(t *testing.T, op guard.Op, res result, rec *recorder, want error) {
	t.Helper()
	switch op {
	case guard.OpRefund, guard.OpReset:
		if !errors.Is(res.err, sluice.ErrUnavailable) || !errors.Is(res.err, want) || res.d != (sluice.Decision{}) {
			t.Errorf("%v = %+v; want an error wrapping sluice.ErrUnavailable and %v", op, res, want)
		}
	default:
		if res.err != nil || !res.degraded() {
			t.Errorf("%v = %+v; want a degraded decision", op, res)
		}
		if d := rec.lastDegraded(); d.Op != op || !errors.Is(d.Cause, want) {
			t.Errorf("%v: Degraded hook got %+v, want op %v and a cause wrapping %v", op, d, op, want)
		}
	}
}

// TestOpsDeadline: every operation against a store that does not answer
// is given exactly the timeout (on the bubble's clock); then the failure
// mode decides, or Refund and Reset fail, with a cause wrapping ErrTimeout
// and the store's context.DeadlineExceeded.
func TestOpsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFlakyOps(time.Now)
		f.set(nil, true)
		var rec recorder
		g := mustNew(t, f, guard.Options{FailureMode: guard.FailClosed, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: rec.hooks()})
		for _, op := range allOps {
			start := time.Now()
			res := do(t.Context(), g, op, req)
			if took := time.Since(start); took != guard.DefaultTimeout {
				t.Errorf("%v against a store that never answers took %v, want %v", op, took, guard.DefaultTimeout)
			}
			checkFailed(t, op, res, &rec, guard.ErrTimeout)
			checkFailed(t, op, res, &rec, context.DeadlineExceeded)
			if res.allowed() {
				t.Errorf("%v = %+v, want no allow from FailClosed", op, res)
			}
			if c := rec.calls[len(rec.calls)-1]; c.Op != op || c.Took != guard.DefaultTimeout || !errors.Is(c.Err, guard.ErrTimeout) {
				t.Errorf("%v: StoreCall hook got %+v, want Took %v and an ErrTimeout", op, c, guard.DefaultTimeout)
			}
		}
	})
}

// TestOpsStoreIgnoringContext: a store that ignores its context and hangs
// is given exactly the timeout for every operation; the abandoned calls of
// all operations count towards MaxStalled, beyond which every operation is
// answered at once without the store, with a cause wrapping ErrStalled.
func TestOpsStoreIgnoringContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &deaf{hang: 5 * time.Second}
		var rec recorder
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailOpen, MaxStalled: len(newOps), ConsecutiveFailures: -1, FailurePercent: -1, Hooks: rec.hooks()})
		for _, op := range newOps {
			start := time.Now()
			res := do(t.Context(), g, op, req)
			if took := time.Since(start); took != guard.DefaultTimeout {
				t.Errorf("%v against a store that ignores its context took %v, want %v", op, took, guard.DefaultTimeout)
			}
			checkFailed(t, op, res, &rec, guard.ErrTimeout)
		}
		if s := g.Status(); s.Stalled != int64(len(newOps)) {
			t.Fatalf("Status().Stalled = %d, want %d", s.Stalled, len(newOps))
		}
		for _, op := range allOps {
			start := time.Now()
			res := do(t.Context(), g, op, req)
			if took := time.Since(start); took != 0 {
				t.Errorf("%v with %d calls stalled took %v, want an immediate answer", op, len(newOps), took)
			}
			checkFailed(t, op, res, &rec, guard.ErrStalled)
		}
		if n := st.calls.Load(); n != int64(len(newOps)) {
			t.Errorf("%d store calls, want %d (none while the calls were stalled)", n, len(newOps))
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := st.running.Load(); n != 0 {
			t.Errorf("%d store calls still running 5s later, want 0", n)
		}
	})
}

// TestOpsCallerDeadlineFirst: when the caller's deadline is the earlier
// one, every operation gets the caller's context error, is not degraded
// and does not count for the breaker; also when the store's socket
// deadline fires before the caller's context's timer does.
func TestOpsCallerDeadlineFirst(t *testing.T) {
	for _, tt := range []struct {
		name  string
		store sluice.Operator
	}{
		{"socket deadline", &socketlike{}},
		{"store ignoring its context", &deaf{hang: time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var rec recorder
				g := mustNew(t, tt.store, guard.Options{FailureMode: guard.FailOpen, Timeout: 250 * time.Millisecond, ConsecutiveFailures: 1, Hooks: rec.hooks()})
				for _, op := range newOps {
					for range 5 {
						ctx, cancel := withLaggingTimeout(t.Context(), 20*time.Millisecond, time.Millisecond)
						start := time.Now()
						res := do(ctx, g, op, req)
						took := time.Since(start)
						cancel()
						if !errors.Is(res.err, context.DeadlineExceeded) || res.degraded() || res.allowed() {
							t.Errorf("%v with the caller's 20ms deadline first = %+v after %v; want context.DeadlineExceeded", op, res, took)
						}
						if took > 21*time.Millisecond {
							t.Errorf("%v with the caller's 20ms deadline first took %v", op, took)
						}
					}
				}
				if st := g.Status(); st.State != guard.BreakerClosed || st.LastError != nil {
					t.Errorf("Status() = %+v after the callers' deadlines, want closed and no store error", st)
				}
				if len(rec.degraded) != 0 {
					t.Errorf("Degraded hook called %d times, want 0", len(rec.degraded))
				}
				time.Sleep(time.Second) // let the abandoned calls end
			})
		})
	}
}

// TestOpsCallerCancels: a caller that cancels while the store hangs gets
// context.Canceled at once, for every operation; nothing is degraded or
// counted. A caller whose context has already ended is answered with its
// error without calling the store.
func TestOpsCallerCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &deaf{hang: time.Second}
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailOpen, ConsecutiveFailures: 1})
		for _, op := range newOps {
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(10*time.Millisecond, cancel)
			start := time.Now()
			res := do(ctx, g, op, req)
			if took := time.Since(start); !errors.Is(res.err, context.Canceled) || res.degraded() || took != 10*time.Millisecond {
				t.Errorf("%v canceled after 10ms = %+v after %v; want context.Canceled after 10ms", op, res, took)
			}
			calls := st.calls.Load()
			if res := do(ctx, g, op, req); !errors.Is(res.err, context.Canceled) || st.calls.Load() != calls {
				t.Errorf("%v with a canceled context = %+v; want context.Canceled without a store call", op, res)
			}
		}
		if s := g.Status(); s.State != guard.BreakerClosed || s.LastError != nil {
			t.Errorf("Status() = %+v after canceled calls, want closed and no store error", s)
		}
		time.Sleep(time.Second)
	})
}

// opSeer is an Operator that records the context each call got; it
// reports itself NonBlocking if nonBlocking is set.
type opSeer struct {
	sluice.Operator
	nonBlocking bool
	mu          sync.Mutex
	seen        []context.Context
}

func (s *opSeer) NonBlocking() bool { return s.nonBlocking }

func (s *opSeer) see(ctx context.Context) {
	s.mu.Lock()
	s.seen = append(s.seen, ctx)
	s.mu.Unlock()
}

func (s *opSeer) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	s.see(ctx)
	return s.Operator.TakeAll(ctx, rs)
}

func (s *opSeer) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	s.see(ctx)
	return s.Operator.Drain(ctx, r)
}

func (s *opSeer) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	s.see(ctx)
	return s.Operator.Refund(ctx, r)
}

func (s *opSeer) Reset(ctx context.Context, policy, key string) error {
	s.see(ctx)
	return s.Operator.Reset(ctx, policy, key)
}

// TestOpsNonBlocking: a store that reports itself NonBlocking is called
// with the caller's context as it is for every operation; any other store
// gets the guard's deadline.
func TestOpsNonBlocking(t *testing.T) {
	for _, nonBlocking := range []bool{true, false} {
		c := newClock()
		s := &opSeer{Operator: newModelStore(c.Now), nonBlocking: nonBlocking}
		g := mustNew(t, s, guard.Options{Now: c.Now})
		ctx := context.WithValue(t.Context(), ctxKey{}, "caller")
		for _, op := range newOps {
			if res := do(ctx, g, op, req); res.err != nil || res.degraded() {
				t.Fatalf("NonBlocking() %v: %v = %+v; want the store's answer", nonBlocking, op, res)
			}
		}
		if len(s.seen) != len(newOps) {
			t.Fatalf("NonBlocking() %v: the store saw %d calls, want %d", nonBlocking, len(s.seen), len(newOps))
		}
		for i, seen := range s.seen {
			_, hasDeadline := seen.Deadline()
			if got := seen.Value(ctxKey{}); got != "caller" {
				t.Errorf("NonBlocking() %v: %v saw context value %v, want the caller's", nonBlocking, newOps[i], got)
			}
			if nonBlocking && (hasDeadline || seen != ctx) {
				t.Errorf("NonBlocking store: %v got a context with deadline %v, want the caller's context itself", newOps[i], hasDeadline)
			}
			if !nonBlocking && !hasDeadline {
				t.Errorf("store that may block: %v got no deadline, want the guard's", newOps[i])
			}
		}
	}
}

// lateReader is a store whose TakeAll reads its requests only after hang,
// and records them.
type lateReader struct {
	takeOnly
	hang time.Duration
	mu   sync.Mutex
	saw  []string
}

func (s *lateReader) TakeAll(_ context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	time.Sleep(s.hang)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		s.saw = append(s.saw, r.Key)
	}
	return sluice.MultiDecision{Allowed: true, Denied: -1, Parts: make([]sluice.Decision, len(rs))}, nil
}

func (s *lateReader) Drain(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, nil
}

func (s *lateReader) Refund(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, nil
}

func (s *lateReader) Reset(context.Context, string, string) error { return nil }

// TestTakeAllAbandoned: a caller may reuse its slice of requests as soon
// as TakeAll returns, even if the guard abandoned the store's call, which
// goes on reading them.
func TestTakeAllAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &lateReader{hang: time.Second}
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailOpen})
		rs := []sluice.Request{req, second(req)}
		if md, err := g.TakeAll(t.Context(), rs); err != nil || !md.Degraded {
			t.Fatalf("TakeAll against a store that hangs = %+v, %v; want a degraded decision", md, err)
		}
		rs[0].Key, rs[1].Key = "reused", "reused"
		time.Sleep(time.Second)
		synctest.Wait()
		st.mu.Lock()
		defer st.mu.Unlock()
		if len(st.saw) != 2 || st.saw[0] != req.Key || st.saw[1] != req.Key {
			t.Errorf("the abandoned TakeAll read keys %q, want the caller's %q twice", st.saw, req.Key)
		}
	})
}

// TestOpsPanic: a store that panics in an operation raises the panic on
// the caller's goroutine, as for Take.
func TestOpsPanic(t *testing.T) {
	for _, op := range newOps {
		g := mustNew(t, panicOps{&takeOnly{}}, guard.Options{})
		func() {
			defer func() {
				if v := recover(); v != "store bug" {
					t.Errorf("%v: recovered %v, want the store's panic", op, v)
				}
			}()
			do(t.Context(), g, op, req)
			t.Errorf("%v: the store's panic did not reach the caller", op)
		}()
		if s := g.Status(); s.Stalled != 0 {
			t.Errorf("%v: %d calls stalled after a panic, want 0", op, s.Stalled)
		}
	}
}

// panicOps panics in every operation beyond Take and Peek.
type panicOps struct{ *takeOnly }

func (panicOps) TakeAll(context.Context, []sluice.Request) (sluice.MultiDecision, error) {
	panic("store bug")
}
func (panicOps) Drain(context.Context, sluice.Request) (sluice.Decision, error) { panic("store bug") }
func (panicOps) Refund(context.Context, sluice.Request) (sluice.Decision, error) {
	panic("store bug")
}
func (panicOps) Reset(context.Context, string, string) error { panic("store bug") }
