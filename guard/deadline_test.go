package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
)

// deaf is a store that ignores its context entirely: every call sleeps for
// hang, then decides (allowed). It counts the calls that reach it and those
// still running.
type deaf struct {
	hang           time.Duration
	calls, running atomic.Int64
}

func (s *deaf) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	s.calls.Add(1)
	s.running.Add(1)
	defer s.running.Add(-1)
	time.Sleep(s.hang)
	return sluice.Decision{Allowed: true}, nil
}

func (s *deaf) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

// socketTimeout is the error of a read whose socket deadline passed, as the
// net package reports it.
type socketTimeout struct{}

func (socketTimeout) Error() string   { return "read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout" }
func (socketTimeout) Timeout() bool   { return true }
func (socketTimeout) Temporary() bool { return true }

// socketlike is a store that never gets a reply and fails the way a client
// with socket deadlines taken from the context does (go-redis with
// ContextTimeoutEnabled): at the context's deadline, with an i/o timeout,
// whether or not the context's own timer has fired yet. Without a deadline
// it waits for the context to end.
type socketlike struct{ calls atomic.Int64 }

func (s *socketlike) Take(ctx context.Context, _ sluice.Request) (sluice.Decision, error) {
	s.calls.Add(1)
	dl, ok := ctx.Deadline()
	if !ok {
		<-ctx.Done()
		return sluice.Decision{}, ctx.Err()
	}
	time.Sleep(time.Until(dl))
	return sluice.Decision{}, fmt.Errorf("socketlike: %w", socketTimeout{})
}

func (s *socketlike) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

// lagging is a caller's context whose Done closes a moment (lag) after the
// deadline it reports, as a context's timer may fire a moment after a
// socket deadline set from it: the race is made certain.
type lagging struct {
	context.Context
	deadline time.Time
}

func (c lagging) Deadline() (time.Time, bool) { return c.deadline, true }

func withLaggingTimeout(parent context.Context, d, lag time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d+lag)
	return lagging{ctx, time.Now().Add(d)}, cancel
}

var req = sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}

// TestStoreIgnoringContext: a store that ignores its context and hangs for
// 5s is given exactly the timeout (on the bubble's clock); then the failure
// mode decides, with a cause wrapping ErrTimeout. The abandoned call ends
// on its own later.
func TestStoreIgnoringContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &deaf{hang: 5 * time.Second}
		var rec recorder
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailClosed, Hooks: rec.hooks()})
		for _, op := range []guard.Op{guard.OpTake, guard.OpPeek} {
			start := time.Now()
			var (
				d   sluice.Decision
				err error
			)
			if op == guard.OpTake {
				d, err = g.Take(t.Context(), req)
			} else {
				d, err = g.Peek(t.Context(), req)
			}
			if took := time.Since(start); took != guard.DefaultTimeout {
				t.Errorf("%v against a store that ignores its context took %v, want %v", op, took, guard.DefaultTimeout)
			}
			if err != nil || d.Allowed || !d.Degraded {
				t.Errorf("%v = %+v, %v; want a degraded denial", op, d, err)
			}
			if cause := rec.lastDegraded().Cause; !errors.Is(cause, guard.ErrTimeout) {
				t.Errorf("%v: cause %v, want one wrapping ErrTimeout", op, cause)
			}
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := st.running.Load(); n != 0 {
			t.Errorf("%d store calls still running 5s later, want 0", n)
		}
	})
}

// TestGuardDeadlineCause: when the guard's deadline is the earlier one,
// every failure at it is a timeout whose cause wraps ErrTimeout, also when
// the store's own socket deadline fires before the context's timer.
func TestGuardDeadlineCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &socketlike{}
		var rec recorder
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailOpen, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: rec.hooks()})
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour) // later than the guard's
		defer cancel()
		const n = 40
		var wrong int
		for range n {
			start := time.Now()
			d, err := g.Take(ctx, req)
			if took := time.Since(start); took != guard.DefaultTimeout {
				t.Errorf("Take took %v, want %v", took, guard.DefaultTimeout)
			}
			if err != nil || !d.Degraded {
				t.Fatalf("Take = %+v, %v; want a degraded decision", d, err)
			}
			if cause := rec.lastDegraded().Cause; !errors.Is(cause, guard.ErrTimeout) {
				wrong++
				if wrong == 1 {
					t.Errorf("cause %v, want one wrapping ErrTimeout", cause)
				}
			}
		}
		if wrong > 0 {
			t.Errorf("%d of %d causes of the guard's timeouts do not wrap ErrTimeout", wrong, n)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, c := range rec.calls {
			if !errors.Is(c.Err, guard.ErrTimeout) {
				t.Errorf("StoreCall hook got %+v, want an error wrapping ErrTimeout", c)
				break
			}
		}
	})
}

// TestCallerDeadlineFirst: when the caller's deadline is the earlier one,
// a call that fails at it gets the caller's context error, is not
// degraded, and does not count for the breaker; also when the store's
// socket deadline fires before the caller's context's timer does.
func TestCallerDeadlineFirst(t *testing.T) {
	for _, tt := range []struct {
		name  string
		store sluice.Store
	}{
		{"socket deadline", &socketlike{}},
		{"store ignoring its context", &deaf{hang: time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var rec recorder
				g := mustNew(t, tt.store, guard.Options{FailureMode: guard.FailOpen, Timeout: 250 * time.Millisecond, ConsecutiveFailures: 1, Hooks: rec.hooks()})
				const n = 20
				var degraded int
				for range n {
					ctx, cancel := withLaggingTimeout(t.Context(), 20*time.Millisecond, time.Millisecond)
					start := time.Now()
					d, err := g.Take(ctx, req)
					took := time.Since(start)
					cancel()
					if d.Degraded {
						degraded++
					}
					if !errors.Is(err, context.DeadlineExceeded) || d != (sluice.Decision{}) {
						t.Errorf("Take with the caller's 20ms deadline first = %+v, %v after %v; want context.DeadlineExceeded", d, err, took)
					}
					if took > 21*time.Millisecond {
						t.Errorf("Take with the caller's 20ms deadline first took %v", took)
					}
				}
				if degraded > 0 {
					t.Errorf("%d of %d calls past the caller's deadline were degraded, want 0", degraded, n)
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

// doneless is a caller's context with a deadline but no Done channel (it
// never reports its end): the guard keeps the deadline itself.
type doneless struct {
	context.Context
	deadline time.Time
}

func (c doneless) Deadline() (time.Time, bool) { return c.deadline, true }
func (doneless) Done() <-chan struct{}         { return nil }
func (doneless) Err() error                    { return nil }

// TestCallerDeadlineWithoutDone: a caller's deadline is kept even if its
// context never closes a Done channel.
func TestCallerDeadlineWithoutDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := mustNew(t, &deaf{hang: time.Second}, guard.Options{Timeout: 250 * time.Millisecond})
		ctx := doneless{context.Background(), time.Now().Add(20 * time.Millisecond)}
		start := time.Now()
		d, err := g.Take(ctx, req)
		if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d.Degraded || took != 20*time.Millisecond {
			t.Errorf("Take with a 20ms deadline and no Done channel = %+v, %v after %v; want context.DeadlineExceeded after 20ms", d, err, took)
		}
		time.Sleep(time.Second)
	})
}

// TestCallerCancels: a caller that cancels while the store hangs gets
// context.Canceled at once; nothing is degraded or counted.
func TestCallerCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &deaf{hang: time.Second}
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailOpen, ConsecutiveFailures: 1})
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(10*time.Millisecond, cancel)
		start := time.Now()
		d, err := g.Take(ctx, req)
		if took := time.Since(start); !errors.Is(err, context.Canceled) || d.Degraded || took != 10*time.Millisecond {
			t.Errorf("Take canceled after 10ms = %+v, %v after %v; want context.Canceled after 10ms", d, err, took)
		}
		if st := g.Status(); st.State != guard.BreakerClosed || st.LastError != nil {
			t.Errorf("Status() = %+v after a canceled call, want closed and no store error", st)
		}
		time.Sleep(time.Second)
	})
}

// TestMaxStalled: calls left running by a store that ignores its context
// are bounded. While MaxStalled of them run, decisions are degraded at once
// with a cause wrapping ErrStalled, without calling the store, and counted;
// once they end, the store is called again.
func TestMaxStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &deaf{hang: time.Second}
		var rec recorder
		g := mustNew(t, st, guard.Options{FailureMode: guard.FailOpen, MaxStalled: 3, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: rec.hooks()})
		for i := range 3 {
			if d, err := g.Take(t.Context(), req); err != nil || !d.Degraded || !errors.Is(rec.lastDegraded().Cause, guard.ErrTimeout) {
				t.Fatalf("take %d = %+v, %v (cause %v); want degraded by a timeout", i, d, err, rec.lastDegraded().Cause)
			}
		}
		for range 5 {
			start := time.Now()
			d, err := g.Take(t.Context(), req)
			if took := time.Since(start); err != nil || !d.Degraded || !d.Allowed || took != 0 {
				t.Fatalf("Take with 3 calls stalled = %+v, %v after %v; want an immediate degraded allow", d, err, took)
			}
			if cause := rec.lastDegraded().Cause; !errors.Is(cause, guard.ErrStalled) {
				t.Fatalf("cause %v, want one wrapping ErrStalled", cause)
			}
		}
		if n := st.calls.Load(); n != 3 {
			t.Errorf("%d store calls, want 3 (none while 3 were stalled)", n)
		}
		if s := g.Status(); s.Stalled != 3 || s.Skipped != 5 || s.State != guard.BreakerClosed {
			t.Errorf("Status() = %+v; want 3 stalled, 5 skipped, the breaker closed", s)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if s := g.Status(); s.Stalled != 0 {
			t.Errorf("Status().Stalled = %d once the store returned, want 0", s.Stalled)
		}
		st.hang = 0
		if d, err := g.Take(t.Context(), req); err != nil || d.Degraded || st.calls.Load() != 4 {
			t.Errorf("Take once the stalled calls ended = %+v, %v (%d store calls); want the store's decision", d, err, st.calls.Load())
		}
	})
}

// seer is a memstore that records the context each call got; it reports
// itself NonBlocking if nonBlocking is set.
type seer struct {
	sluice.Store
	nonBlocking bool
	seen        context.Context
}

func (s *seer) NonBlocking() bool { return s.nonBlocking }

func (s *seer) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	s.seen = ctx
	return s.Store.Take(ctx, r)
}

// TestNonBlocking: a store that reports itself NonBlocking is called with
// the caller's context as it is (on the caller's goroutine, no deadline
// added); any other store gets the guard's deadline.
func TestNonBlocking(t *testing.T) {
	for _, nonBlocking := range []bool{true, false} {
		s := &seer{Store: newMemstore(t, memstore.Options{}), nonBlocking: nonBlocking}
		g := mustNew(t, s, guard.Options{})
		ctx := context.WithValue(t.Context(), ctxKey{}, "caller")
		if d, err := g.Take(ctx, req); err != nil || !d.Allowed || d.Degraded {
			t.Fatalf("NonBlocking() %v: Take = %+v, %v; want the store's allow", nonBlocking, d, err)
		}
		_, hasDeadline := s.seen.Deadline()
		if got := s.seen.Value(ctxKey{}); got != "caller" {
			t.Errorf("NonBlocking() %v: the store saw context value %v, want the caller's", nonBlocking, got)
		}
		if nonBlocking && (hasDeadline || s.seen != ctx) {
			t.Errorf("NonBlocking store: got a context with deadline %v, want the caller's context itself", hasDeadline)
		}
		if !nonBlocking && !hasDeadline {
			t.Errorf("store that may block: got no deadline, want the guard's")
		}
	}
}

// checkStalledDrain checks that the calls g abandoned end once the client
// under them is closed.
func checkStalledDrain(t *testing.T, g *guard.Store, closeClient func() error) {
	t.Helper()
	closeClient()
	deadline := time.Now().Add(5 * time.Second)
	for g.Status().Stalled > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := g.Status().Stalled; n > 0 {
		t.Errorf("%d store calls still running 5s after the client was closed, want 0", n)
	}
}
