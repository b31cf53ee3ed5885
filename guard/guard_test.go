package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// newClock returns a manual clock at 2026-01-01 UTC.
func newClock() *sluicetest.Clock {
	return sluicetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// flaky is a memstore that fails on command: while err is set, every call
// returns it without deciding; while block is set, every call waits for
// its context to end. It counts the calls that reach it.
type flaky struct {
	next  sluice.Store
	calls atomic.Int64

	mu    sync.Mutex
	err   error
	block bool
}

var errDown = errors.New("store down")

func newFlaky(t *testing.T, now func() time.Time) *flaky {
	return &flaky{next: newMemstore(t, memstore.Options{Now: now})}
}

// newMemstore returns a memstore without a sweeper, closed when t ends.
func newMemstore(t testing.TB, o memstore.Options) *memstore.Store {
	t.Helper()
	o.SweepInterval = -1
	s, err := memstore.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mustNew returns guard.New(store, o), failing t on an error.
func mustNew(t testing.TB, store sluice.Store, o guard.Options) *guard.Store {
	t.Helper()
	g, err := guard.New(store, o)
	if err != nil {
		t.Fatalf("guard.New(%+v): %v", o, err)
	}
	return g
}

func (f *flaky) set(err error, block bool) {
	f.mu.Lock()
	f.err, f.block = err, block
	f.mu.Unlock()
}

func (f *flaky) fail(ctx context.Context) error {
	f.calls.Add(1)
	f.mu.Lock()
	err, block := f.err, f.block
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return fmt.Errorf("flaky: %w", ctx.Err())
	}
	return err
}

func (f *flaky) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Decision{}, err
	}
	return f.next.Take(ctx, r)
}

func (f *flaky) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Decision{}, err
	}
	return f.next.Peek(ctx, r)
}

// recorder keeps what the hooks report.
type recorder struct {
	mu          sync.Mutex
	changes     []string
	degraded    []guard.Degradation
	calls       []guard.Call
	contextSeen []any
}

type ctxKey struct{}

func (r *recorder) hooks() guard.Hooks {
	return guard.Hooks{
		StoreCall: func(ctx context.Context, c guard.Call) {
			r.mu.Lock()
			r.calls = append(r.calls, c)
			r.mu.Unlock()
		},
		Degraded: func(ctx context.Context, d guard.Degradation) {
			r.mu.Lock()
			r.degraded = append(r.degraded, d)
			r.contextSeen = append(r.contextSeen, ctx.Value(ctxKey{}))
			r.mu.Unlock()
		},
		BreakerChange: func(from, to guard.BreakerState) {
			r.mu.Lock()
			r.changes = append(r.changes, from.String()+"→"+to.String())
			r.mu.Unlock()
		},
	}
}

func (r *recorder) lastDegraded() guard.Degradation {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.degraded) == 0 {
		return guard.Degradation{}
	}
	return r.degraded[len(r.degraded)-1]
}

var limit = sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)}

// TestConformance: in front of a healthy store the guard is invisible; it
// passes the suite every store passes.
func TestConformance(t *testing.T) {
	sluicetest.Run(t, sluicetest.Suite{
		New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
			s := newMemstore(t, memstore.Options{
				Now:           o.Now,
				OnLimitChange: o.OnLimitChange,
				RequestIDTTL:  o.RequestIDTTL,
			})
			return mustNew(t, s, guard.Options{Now: o.Now, Timeout: time.Minute})
		},
		// The store's own concurrency is memstore's tests' business; a
		// tenth of the default load still races every path of the guard.
		TakesPerWorker: 1000,
	})
}

// TestBadParametersStayErrors: bad parameters are errors wrapping the
// sluice sentinels under every failure mode, with the store up or down; the
// store is not called and the breaker does not count them.
func TestBadParametersStayErrors(t *testing.T) {
	long := strings.Repeat("k", sluice.MaxKeyLen+1)
	tests := []struct {
		name string
		r    sluice.Request
		want error
	}{
		{"empty policy", sluice.Request{Key: "k", Cost: 1, Limit: limit}, sluice.ErrInvalidPolicy},
		{"policy with a space", sluice.Request{Policy: "a b", Key: "k", Cost: 1, Limit: limit}, sluice.ErrInvalidPolicy},
		{"empty key", sluice.Request{Policy: "test", Key: "", Cost: 1, Limit: limit}, sluice.ErrInvalidKey},
		{"long key", sluice.Request{Policy: "test", Key: long, Cost: 1, Limit: limit}, sluice.ErrInvalidKey},
		{"zero cost", sluice.Request{Policy: "test", Key: "k", Cost: 0, Limit: limit}, sluice.ErrInvalidCost},
		{"cost above capacity", sluice.Request{Policy: "test", Key: "k", Cost: 11, Limit: limit}, sluice.ErrInvalidCost},
		{"zero limit", sluice.Request{Policy: "test", Key: "k", Cost: 1}, sluice.ErrInvalidLimit},
		{"long request ID", sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit, RequestID: long}, sluice.ErrInvalidRequestID},
	}
	for _, mode := range []guard.FailureMode{guard.FailLocal, guard.FailClosed, guard.FailOpen} {
		for _, down := range []bool{false, true} {
			for _, tt := range tests {
				t.Run(fmt.Sprintf("%v/down=%v/%s", mode, down, tt.name), func(t *testing.T) {
					c := newClock()
					f := newFlaky(t, c.Now)
					if down {
						f.set(errDown, false)
					}
					var rec recorder
					g := mustNew(t, f, guard.Options{FailureMode: mode, Now: c.Now, ConsecutiveFailures: 1, Hooks: rec.hooks()})
					for range 3 {
						d, err := g.Take(t.Context(), tt.r)
						if !errors.Is(err, tt.want) || d != (sluice.Decision{}) {
							t.Fatalf("Take(%+v) = %+v, %v; want the zero decision and an error wrapping %v", tt.r, d, err, tt.want)
						}
					}
					if tt.r.Cost == 1 && tt.r.RequestID == "" { // Peek has no cost or request ID to get wrong
						if d, err := g.Peek(t.Context(), tt.r); !errors.Is(err, tt.want) || d != (sluice.Decision{}) {
							t.Fatalf("Peek(%+v) = %+v, %v; want an error wrapping %v", tt.r, d, err, tt.want)
						}
					}
					if n := f.calls.Load(); n != 0 {
						t.Errorf("the store was called %d times, want 0", n)
					}
					if st := g.Status().State; st != guard.BreakerClosed {
						t.Errorf("breaker %v after bad parameters, want closed", st)
					}
				})
			}
		}
	}
}

// TestStoreAnswersAreNotFailures: an error by which the store answers (a
// request-ID conflict, a limit the store refuses, a full table, a store
// not set up for Sluice) is returned as it is, never degraded, and counts
// as a success for the breaker.
func TestStoreAnswersAreNotFailures(t *testing.T) {
	for _, want := range []error{sluice.ErrRequestIDConflict, sluice.ErrInvalidLimit, sluice.ErrTooManyKeys, sluice.ErrMisconfigured} {
		t.Run(want.Error(), func(t *testing.T) {
			c := newClock()
			f := newFlaky(t, c.Now)
			f.set(fmt.Errorf("store says: %w", want), false)
			g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, Now: c.Now, ConsecutiveFailures: 1})
			for range 5 {
				d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
				if !errors.Is(err, want) || d.Degraded {
					t.Fatalf("Take = %+v, %v; want an error wrapping %v", d, err, want)
				}
			}
			if st := g.Status().State; st != guard.BreakerClosed {
				t.Errorf("breaker %v, want closed", st)
			}
		})
	}
}

// TestFailureModes: with the store failing, each mode decides, marks the
// decision degraded, returns no error, and reports the cause to the hook
// with the caller's context.
func TestFailureModes(t *testing.T) {
	local := guard.LocalLimit(limit, 3) // capacity 3, 4 tokens every 3s
	tests := []struct {
		mode guard.FailureMode
		want []sluice.Decision // four takes of cost 1 in a row
	}{
		{guard.FailOpen, []sluice.Decision{
			{Allowed: true, Limit: limit, Degraded: true},
			{Allowed: true, Limit: limit, Degraded: true},
			{Allowed: true, Limit: limit, Degraded: true},
			{Allowed: true, Limit: limit, Degraded: true},
		}},
		{guard.FailClosed, []sluice.Decision{
			{RetryAfter: guard.DefaultProbeInterval, Limit: limit, Degraded: true},
			{RetryAfter: guard.DefaultProbeInterval, Limit: limit, Degraded: true},
			{RetryAfter: guard.DefaultProbeInterval, Limit: limit, Degraded: true},
			{RetryAfter: guard.DefaultProbeInterval, Limit: limit, Degraded: true},
		}},
		{guard.FailLocal, []sluice.Decision{
			{Allowed: true, Remaining: 2, ResetAfter: 750 * time.Millisecond, Limit: local, Degraded: true},
			{Allowed: true, Remaining: 1, ResetAfter: 1500 * time.Millisecond, Limit: local, Degraded: true},
			{Allowed: true, Remaining: 0, ResetAfter: 2250 * time.Millisecond, Limit: local, Degraded: true},
			{RetryAfter: 750 * time.Millisecond, ResetAfter: 2250 * time.Millisecond, Limit: local, Degraded: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			c := newClock()
			f := newFlaky(t, c.Now)
			f.set(errDown, false)
			var rec recorder
			g := mustNew(t, f, guard.Options{FailureMode: tt.mode, LocalDivisor: 3, Now: c.Now, Hooks: rec.hooks()})
			ctx := context.WithValue(t.Context(), ctxKey{}, "request-1")
			for i, want := range tt.want {
				got, err := g.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
				if err != nil {
					t.Fatalf("take %d: Take = %+v, %v; want no error", i, got, err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("take %d: Take(k, 1) = %+v, want %+v (-want +got):\n%s", i, got, want, diff)
				}
				d := rec.lastDegraded()
				if !errors.Is(d.Cause, errDown) || d.FailureMode != tt.mode || d.Allowed != got.Allowed || d.Op != guard.OpTake {
					t.Fatalf("take %d: Degraded hook got %+v; want cause %v, mode %v, allowed %v", i, d, errDown, tt.mode, got.Allowed)
				}
			}
			if got := rec.contextSeen[0]; got != "request-1" {
				t.Errorf("the Degraded hook saw context value %v, want the caller's %q", got, "request-1")
			}
		})
	}
}

// TestLocalBudget: over an outage of T, FailLocal allows a key at most
// C/N + (r/N)·T, exactly, and a cost above the local capacity is denied
// (degraded), never an error.
func TestLocalBudget(t *testing.T) {
	c := newClock()
	f := newFlaky(t, c.Now)
	f.set(errDown, false)
	l := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(40)}
	g := mustNew(t, f, guard.Options{FailureMode: guard.FailLocal, LocalDivisor: 4, Now: c.Now})
	allowed := 0
	for range 300 { // 3s at 100 takes a second
		d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l})
		if err != nil || !d.Degraded {
			t.Fatalf("Take = %+v, %v; want a degraded decision", d, err)
		}
		if d.Allowed {
			allowed++
		}
		c.Advance(10 * time.Millisecond)
	}
	// 25 + 10/s × 2.99s (the last take is at 2.99s) = 54.9 → 54.
	if allowed != 54 {
		t.Errorf("FailLocal with divisor 4 allowed %d of 300 takes of limit %v over 2.99s, want 54", allowed, l)
	}
	d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k2", Cost: 26, Limit: l})
	if err != nil || d.Allowed || !d.Degraded {
		t.Errorf("Take(cost 26 > local capacity 25) = %+v, %v; want a degraded denial", d, err)
	}
}

func TestLocalLimit(t *testing.T) {
	tests := []struct {
		l    sluice.Limit
		n    int64
		want sluice.Limit
	}{
		{limit, 1, limit},
		{limit, 0, limit},
		{sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}, 4, sluice.Limit{Capacity: 2, Rate: sluice.Per(5, 2*time.Second)}},
		{sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(40)}, 4, sluice.Limit{Capacity: 25, Rate: sluice.PerSecond(10)}},
		{sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(1)}, 5, sluice.Limit{Capacity: 1, Rate: sluice.Per(1, 5*time.Second)}},
		{sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(0)}, 3, sluice.Limit{Capacity: 33, Rate: sluice.PerSecond(0)}},
		// 1 token every 200 days over 2 would need a 400-day period:
		// rounded down to floor(1/2) = 0 tokens every 200 days.
		{sluice.Limit{Capacity: 10, Rate: sluice.Per(1, 200*24*time.Hour)}, 2, sluice.Limit{Capacity: 5, Rate: sluice.Per(0, 200*24*time.Hour)}},
		{sluice.Limit{Capacity: 10, Rate: sluice.Per(7, 200*24*time.Hour)}, 2, sluice.Limit{Capacity: 5, Rate: sluice.Per(3, 200*24*time.Hour)}},
		{sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Per(sluice.MaxTokens, time.Nanosecond)}, 1 << 20, sluice.Limit{Capacity: 1 << 20, Rate: sluice.Per(1<<20, time.Nanosecond)}},
		{sluice.Limit{}, 4, sluice.Limit{}},
	}
	for _, tt := range tests {
		got := guard.LocalLimit(tt.l, tt.n)
		if got != tt.want {
			t.Errorf("LocalLimit(%v, %d) = %v, want %v", tt.l, tt.n, got, tt.want)
		}
		if tt.l.Validate() == nil {
			if err := got.Validate(); err != nil {
				t.Errorf("LocalLimit(%v, %d) = %v, invalid: %v", tt.l, tt.n, got, err)
			}
		}
	}
}

// TestBreakerConsecutive walks the breaker through its states on a manual
// clock: 5 failures in a row open it, calls are then answered without the
// store, one probe goes through every 500ms, and a successful probe closes
// it.
func TestBreakerConsecutive(t *testing.T) {
	c := newClock()
	f := newFlaky(t, c.Now)
	var rec recorder
	g := mustNew(t, f, guard.Options{FailureMode: guard.FailClosed, Now: c.Now, Hooks: rec.hooks()})
	take := func() sluice.Decision {
		t.Helper()
		d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		return d
	}
	f.set(errDown, false)
	for i := range 4 {
		take()
		if st := g.Status().State; st != guard.BreakerClosed {
			t.Fatalf("breaker %v after %d failures, want closed", st, i+1)
		}
	}
	take()
	st := g.Status()
	if st.State != guard.BreakerOpen || !errors.Is(st.LastError, errDown) || !st.Since.Equal(c.Now()) {
		t.Fatalf("Status() after 5 failures = %+v, want open since now, last error %v", st, errDown)
	}
	steps := []struct {
		advance   time.Duration
		storeUp   bool
		wantCalls int64 // store calls so far
		wantState guard.BreakerState
		wantStore bool // the decision came from the store
	}{
		{0, false, 5, guard.BreakerOpen, false},
		{499 * time.Millisecond, false, 5, guard.BreakerOpen, false},
		{1 * time.Millisecond, false, 6, guard.BreakerOpen, false}, // the probe, failing
		{0, true, 6, guard.BreakerOpen, false},                     // up, but not probed yet
		{499 * time.Millisecond, true, 6, guard.BreakerOpen, false},
		{1 * time.Millisecond, true, 7, guard.BreakerClosed, true}, // the probe, succeeding
		{0, true, 8, guard.BreakerClosed, true},
	}
	for i, s := range steps {
		c.Advance(s.advance)
		if s.storeUp {
			f.set(nil, false)
		}
		d := take()
		if got := f.calls.Load(); got != s.wantCalls {
			t.Fatalf("step %d: %d store calls, want %d", i, got, s.wantCalls)
		}
		if got := g.Status().State; got != s.wantState {
			t.Fatalf("step %d: breaker %v, want %v", i, got, s.wantState)
		}
		if d.Degraded == s.wantStore {
			t.Fatalf("step %d: Take = %+v; want degraded %v", i, d, !s.wantStore)
		}
		if !s.wantStore {
			if cause := rec.lastDegraded().Cause; i != 2 && !errors.Is(cause, guard.ErrBreakerOpen) {
				t.Fatalf("step %d: cause %v, want one wrapping ErrBreakerOpen", i, cause)
			} else if !errors.Is(cause, errDown) {
				t.Fatalf("step %d: cause %v, want one wrapping the store's error", i, cause)
			}
		}
	}
	want := []string{"closed→open", "open→half-open", "half-open→open", "open→half-open", "half-open→closed"}
	if diff := cmp.Diff(want, rec.changes); diff != "" {
		t.Errorf("breaker changes = %q, want %q", rec.changes, want)
	}
	var probes int
	for _, call := range rec.calls {
		if call.Probe {
			probes++
		}
	}
	if probes != 2 {
		t.Errorf("%d calls reported as probes, want 2", probes)
	}
}

// TestBreakerRatio: half the calls of the window failing opens the breaker
// once MinCalls were made, though never 5 in a row; failures older than the
// window do not count.
func TestBreakerRatio(t *testing.T) {
	tests := []struct {
		name     string
		pattern  string        // calls in order: f fails, s succeeds
		gap      time.Duration // between calls
		wantOpen bool
	}{
		{"half of ten", "fsfsfsfsfs", 10 * time.Millisecond, false}, // the 10th call succeeds: 5/10 judged at the 9th (9 < MinCalls)
		{"half of ten ending on a failure", "sfsfsfsfsf", 10 * time.Millisecond, true},
		{"below the ratio", "fssfssfssfssf", 10 * time.Millisecond, false},
		{"too few calls", "ffffsssf", 10 * time.Millisecond, false},
		{"spread beyond the window", "sfsfsfsfsf", 200 * time.Millisecond, false}, // at most 5 calls per second
		{"four in a row, twice", "ffffsffff", 10 * time.Millisecond, false},
		{"five in a row", "sssssssssssssssfffff", 10 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			f := newFlaky(t, c.Now)
			g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, Now: c.Now})
			for _, call := range tt.pattern {
				if call == 'f' {
					f.set(errDown, false)
				} else {
					f.set(nil, false)
				}
				if _, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(100)}}); err != nil {
					t.Fatal(err)
				}
				c.Advance(tt.gap)
			}
			if got := g.Status().State == guard.BreakerOpen; got != tt.wantOpen {
				t.Errorf("after %q %v apart: open %v, want %v", tt.pattern, tt.gap, got, tt.wantOpen)
			}
		})
	}
}

// TestDeadline: a store that does not answer is given exactly the timeout
// (on the bubble's fake clock), then the failure mode decides, with a cause
// wrapping ErrTimeout.
func TestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFlaky(t, nil)
		f.set(nil, true)
		var rec recorder
		g := mustNew(t, f, guard.Options{FailureMode: guard.FailClosed, Hooks: rec.hooks()})
		start := time.Now()
		d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
		if took := time.Since(start); took != guard.DefaultTimeout {
			t.Errorf("Take against a store that never answers took %v, want %v", took, guard.DefaultTimeout)
		}
		if err != nil || d.Allowed || !d.Degraded {
			t.Fatalf("Take = %+v, %v; want a degraded denial", d, err)
		}
		cause := rec.lastDegraded().Cause
		if !errors.Is(cause, guard.ErrTimeout) || !errors.Is(cause, context.DeadlineExceeded) {
			t.Errorf("cause %v, want one wrapping ErrTimeout and the store's context.DeadlineExceeded", cause)
		}
		if got := rec.calls[0]; got.Took != guard.DefaultTimeout || !errors.Is(got.Err, guard.ErrTimeout) {
			t.Errorf("StoreCall hook got %+v, want Took %v and an ErrTimeout", got, guard.DefaultTimeout)
		}

		// A caller's deadline shorter than the timeout is the caller's:
		// its error is returned, nothing is degraded or counted.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		for range 10 {
			d, err = g.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
			if !errors.Is(err, context.DeadlineExceeded) || d.Degraded {
				t.Fatalf("Take past the caller's deadline = %+v, %v; want its error", d, err)
			}
		}
		if st := g.Status().State; st != guard.BreakerClosed {
			t.Errorf("breaker %v after the caller's deadlines, want closed", st)
		}
	})
}

// TestOneProbe: while the probe is with a slow store, every other call is
// answered by the failure mode at once; the store sees one call.
func TestOneProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFlaky(t, nil)
		f.set(errDown, false)
		g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, ConsecutiveFailures: 1})
		req := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}
		g.Take(t.Context(), req) // opens the breaker
		time.Sleep(guard.DefaultProbeInterval)
		f.set(nil, true) // the store now hangs
		calls := f.calls.Load()
		var probeDone atomic.Bool
		go func() {
			g.Take(t.Context(), req)
			probeDone.Store(true)
		}()
		synctest.Wait() // the probe is blocked in the store
		if st := g.Status().State; st != guard.BreakerHalfOpen {
			t.Fatalf("breaker %v while the probe waits, want half-open", st)
		}
		for range 100 {
			start := time.Now()
			d, err := g.Take(t.Context(), req)
			if err != nil || !d.Allowed || !d.Degraded || time.Since(start) != 0 {
				t.Fatalf("Take during the probe = %+v, %v after %v; want an immediate degraded allow", d, err, time.Since(start))
			}
		}
		if got := f.calls.Load() - calls; got != 1 {
			t.Errorf("%d store calls during the probe, want 1", got)
		}
		time.Sleep(guard.DefaultTimeout)
		synctest.Wait()
		if !probeDone.Load() || g.Status().State != guard.BreakerOpen {
			t.Errorf("after the probe timed out: done %v, breaker %v; want done, open", probeDone.Load(), g.Status().State)
		}
	})
}

// TestCanceledProbe: a probe whose caller gives up neither opens nor closes
// the breaker; the next call probes at once.
func TestCanceledProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFlaky(t, nil)
		f.set(errDown, false)
		g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, ConsecutiveFailures: 1})
		req := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}
		g.Take(t.Context(), req)
		time.Sleep(guard.DefaultProbeInterval)
		f.set(nil, true)
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			time.Sleep(time.Millisecond)
			cancel()
		}()
		if _, err := g.Take(ctx, req); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled probe: %v, want context.Canceled", err)
		}
		if st := g.Status().State; st != guard.BreakerOpen {
			t.Fatalf("breaker %v after a canceled probe, want open", st)
		}
		f.set(nil, false)
		if d, err := g.Take(t.Context(), req); err != nil || d.Degraded {
			t.Fatalf("next Take = %+v, %v; want the store's decision (it probes at once)", d, err)
		}
	})
}

// TestPanickingProbe: a store that panics during the probe does not leave
// the breaker half-open.
func TestPanickingProbe(t *testing.T) {
	c := newClock()
	f := newFlaky(t, c.Now)
	f.set(errDown, false)
	g := mustNew(t, panicky{f}, guard.Options{FailureMode: guard.FailOpen, ConsecutiveFailures: 1, Now: c.Now})
	req := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}
	g.Take(t.Context(), req)
	c.Advance(guard.DefaultProbeInterval)
	f.set(errPanic, false)
	func() {
		defer func() { recover() }()
		g.Take(t.Context(), req)
		t.Fatal("the store's panic did not reach the caller")
	}()
	if st := g.Status().State; st != guard.BreakerOpen {
		t.Fatalf("breaker %v after a panicking probe, want open", st)
	}
	f.set(nil, false)
	if d, err := g.Take(t.Context(), req); err != nil || d.Degraded {
		t.Fatalf("next Take = %+v, %v; want the store's decision", d, err)
	}
}

var errPanic = errors.New("panic")

// panicky panics where flaky would return errPanic.
type panicky struct{ *flaky }

func (p panicky) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	d, err := p.flaky.Take(ctx, r)
	if errors.Is(err, errPanic) {
		panic("store bug")
	}
	return d, err
}

// TestPeek: a degraded Peek answers by the failure mode and consumes nothing.
func TestPeek(t *testing.T) {
	tests := []struct {
		mode guard.FailureMode
		want sluice.Decision
	}{
		{guard.FailOpen, sluice.Decision{Allowed: true, Limit: limit, Degraded: true}},
		{guard.FailClosed, sluice.Decision{RetryAfter: guard.DefaultProbeInterval, Limit: limit, Degraded: true}},
		{guard.FailLocal, sluice.Decision{Allowed: true, Remaining: 5, Limit: guard.LocalLimit(limit, 2), Degraded: true}},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			c := newClock()
			f := newFlaky(t, c.Now)
			f.set(errDown, false)
			g := mustNew(t, f, guard.Options{FailureMode: tt.mode, LocalDivisor: 2, Now: c.Now})
			for range 3 {
				got, err := g.Peek(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
				if err != nil || got != tt.want {
					t.Fatalf("Peek = %+v, %v; want %+v", got, err, tt.want)
				}
			}
			if st := g.LocalStats(); st.Buckets != 0 {
				t.Errorf("Peek created %d local buckets, want 0", st.Buckets)
			}
		})
	}
}

// TestLocalRequestIDs: during an outage a retried request ID replays the
// local decision and consumes nothing.
func TestLocalRequestIDs(t *testing.T) {
	c := newClock()
	f := newFlaky(t, c.Now)
	f.set(errDown, false)
	g := mustNew(t, f, guard.Options{Now: c.Now})
	r := sluice.Request{Policy: "test", Key: "k", Cost: 4, Limit: limit, RequestID: "r1"}
	first, err := g.Take(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	again, err := g.Take(t.Context(), r)
	want := first
	want.Replayed = true
	if err != nil || again != want {
		t.Fatalf("retried Take = %+v, %v; want %+v", again, err, want)
	}
	r.Cost = 5
	if _, err := g.Take(t.Context(), r); !errors.Is(err, sluice.ErrRequestIDConflict) {
		t.Fatalf("reused request ID with another cost: %v, want ErrRequestIDConflict", err)
	}
}

// TestLocalFull: when the local table is full of buckets that are not
// full, a new key is denied (degraded), not an error, and no bucket is
// evicted.
func TestLocalFull(t *testing.T) {
	c := newClock()
	f := newFlaky(t, c.Now)
	f.set(errDown, false)
	g := mustNew(t, f, guard.Options{Now: c.Now, LocalMaxKeys: 2})
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	for _, k := range []string{"a", "b"} {
		if d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: k, Cost: 1, Limit: l}); err != nil || !d.Allowed {
			t.Fatalf("Take(%s) = %+v, %v", k, d, err)
		}
	}
	d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "c", Cost: 1, Limit: l})
	if err != nil || d.Allowed || !d.Degraded {
		t.Fatalf("Take(c) with the local table full = %+v, %v; want a degraded denial", d, err)
	}
	if st := g.LocalStats(); st.Buckets != 2 || st.Evicted != 0 || st.Refused != 1 {
		t.Errorf("LocalStats() = %+v; want 2 buckets, 0 evicted, 1 refused", st)
	}
}

func TestParseFailureMode(t *testing.T) {
	for _, p := range []guard.FailureMode{guard.FailLocal, guard.FailClosed, guard.FailOpen} {
		text, err := p.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got guard.FailureMode
		if err := got.UnmarshalText(text); err != nil || got != p {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, got, err, p)
		}
	}
	if _, err := guard.ParseFailureMode("deny"); err == nil {
		t.Error(`ParseFailureMode("deny") succeeded, want an error`)
	}
	if _, err := guard.FailureMode(9).MarshalText(); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("FailureMode(9).MarshalText() = %v, want an error wrapping ErrInvalidOption", err)
	}
	if _, err := guard.ParseFailureMode("deny"); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf(`ParseFailureMode("deny") = %v, want an error wrapping ErrInvalidOption`, err)
	}
}

// TestOptionsRefused: New refuses a nil store and every option out of its
// range, naming it, instead of repairing it.
func TestOptionsRefused(t *testing.T) {
	ms := newMemstore(t, memstore.Options{})
	tests := []struct {
		name  string
		store sluice.Store
		o     guard.Options
		says  string // in the message
	}{
		{"nil store", nil, guard.Options{}, "store"},
		{"unknown failure mode", ms, guard.Options{FailureMode: 9}, "failure mode"},
		{"negative LocalDivisor", ms, guard.Options{LocalDivisor: -4}, "LocalDivisor"},
		{"negative LocalMaxKeys", ms, guard.Options{LocalMaxKeys: -1}, "LocalMaxKeys"},
		{"negative Timeout", ms, guard.Options{Timeout: -time.Millisecond}, "Timeout"},
		{"negative Window", ms, guard.Options{Window: -time.Second}, "Window"},
		{"negative MinCalls", ms, guard.Options{MinCalls: -1}, "MinCalls"},
		{"negative ProbeInterval", ms, guard.Options{ProbeInterval: -time.Second}, "ProbeInterval"},
		{"FailurePercent above 100", ms, guard.Options{FailurePercent: 101}, "FailurePercent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := guard.New(tt.store, tt.o)
			if !errors.Is(err, sluice.ErrInvalidOption) || g != nil {
				t.Fatalf("New(%+v) = (a store: %v), %v; want no store and an error wrapping ErrInvalidOption", tt.o, g != nil, err)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("New(%+v): %q does not name %q", tt.o, err, tt.says)
			}
		})
	}
	for _, o := range []guard.Options{
		{},
		{FailureMode: guard.FailOpen, ConsecutiveFailures: -1, FailurePercent: -1},
		{FailurePercent: 100, LocalDivisor: 1, Timeout: time.Nanosecond},
	} {
		if _, err := guard.New(ms, o); err != nil {
			t.Errorf("New(%+v): %v, want a store", o, err)
		}
	}
}

// bounded is a store that decides only limits of capacity up to max, and
// says so through sluice.LimitChecker.
type bounded struct {
	sluice.Store
	max int64
}

func (b bounded) CheckLimit(l sluice.Limit) error {
	if l.Capacity > b.max {
		return fmt.Errorf("%w: capacity %d is above this store's bound %d", sluice.ErrInvalidLimit, l.Capacity, b.max)
	}
	return nil
}

// TestCheckLimit: the guard asks the store it wraps whether it decides a
// limit, so that sluice.NewLimiter refuses one it cannot at construction.
func TestCheckLimit(t *testing.T) {
	g := mustNew(t, bounded{newMemstore(t, memstore.Options{}), 100}, guard.Options{})
	if _, err := sluice.NewLimiter(g, "api", sluice.Limit{Capacity: 101, Rate: sluice.PerSecond(1)}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("NewLimiter(guard(store bounded at 100), capacity 101) = %v, want an error wrapping ErrInvalidLimit", err)
	}
	if _, err := sluice.NewLimiter(g, "api", sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}); err != nil {
		t.Errorf("NewLimiter(guard(store bounded at 100), capacity 100) = %v, want a limiter", err)
	}
	if err := sluice.CheckLimit(g, sluice.Limit{Capacity: 1}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("CheckLimit(guard, a limit with no rate) = %v, want an error wrapping ErrInvalidLimit", err)
	}
	// A store without bounds: every valid limit.
	plain := mustNew(t, newMemstore(t, memstore.Options{}), guard.Options{})
	if err := sluice.CheckLimit(plain, sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.PerSecond(1)}); err != nil {
		t.Errorf("CheckLimit(guard(memstore), the largest capacity) = %v, want nil", err)
	}
}
