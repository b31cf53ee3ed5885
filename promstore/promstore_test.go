package promstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/internal/promtest"
	"github.com/sluicehq/sluice/sluicetest"
)

// newClock returns a manual clock at 2026-01-01 UTC.
func newClock() *sluicetest.Clock {
	return sluicetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// switchable is a memstore that fails with err while err is set.
type switchable struct {
	sluice.Store
	mu  sync.Mutex
	err error
}

func (s *switchable) set(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

func (s *switchable) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *switchable) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.failure(); err != nil {
		return sluice.Decision{}, err
	}
	return s.Store.Take(ctx, r)
}

func (s *switchable) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.failure(); err != nil {
		return sluice.Decision{}, err
	}
	return s.Store.Peek(ctx, r)
}

func newMemstore(t *testing.T, o memstore.Options) *memstore.Store {
	t.Helper()
	o.SweepInterval = -1
	s, err := memstore.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newGuard returns newGuard(t, store, o), failing t on an error.
func newGuard(t *testing.T, store sluice.Store, o guard.Options) *guard.Store {
	t.Helper()
	g, err := guard.New(store, o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var limit = sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}

// TestConformance: the wrapper is invisible to the suite.
func TestConformance(t *testing.T) {
	sluicetest.Run(t, sluicetest.Suite{
		New: func(t *testing.T, o sluicetest.StoreOptions) sluice.Store {
			ms := newMemstore(t, memstore.Options{Now: o.Now, OnLimitChange: o.OnLimitChange, RequestIDTTL: o.RequestIDTTL})
			s, err := promstore.New(ms, prometheus.NewRegistry(), promstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		TakesPerWorker: 1000,
	})
}

// TestDecisions: every result is counted under its label and the
// request's policy name, replays and errors by kind too.
func TestDecisions(t *testing.T) {
	c := newClock()
	ms := newMemstore(t, memstore.Options{Now: c.Now})
	sw := &switchable{Store: ms}
	reg := prometheus.NewRegistry()
	g := newGuard(t, sw, guard.Options{FailureMode: guard.FailOpen, Now: c.Now, ConsecutiveFailures: -1, FailurePercent: -1})
	s, err := promstore.New(g, reg, promstore.Options{ConstLabels: prometheus.Labels{"limiter": "open"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	take := func(r sluice.Request) {
		t.Helper()
		s.Take(ctx, r)
	}
	take(sluice.Request{Policy: "api", Key: "a", Cost: 10, Limit: limit})                  // allowed
	take(sluice.Request{Policy: "api", Key: "a", Cost: 1, Limit: limit})                   // denied
	take(sluice.Request{Policy: "login", Key: "b", Cost: 4, Limit: limit, RequestID: "r"}) // allowed
	take(sluice.Request{Policy: "login", Key: "b", Cost: 4, Limit: limit, RequestID: "r"}) // allowed, replayed
	take(sluice.Request{Policy: "login", Key: "b", Cost: 11, Limit: limit})                // error: invalid
	take(sluice.Request{Policy: "login", Key: "b", Cost: 5, Limit: limit, RequestID: "r"}) // error: conflict
	take(sluice.Request{Policy: "", Key: "b", Cost: 1, Limit: limit})                      // error: invalid, no policy
	s.Peek(ctx, sluice.Request{Policy: "api", Key: "b", Cost: 1, Limit: limit})            // peek allowed
	sw.set(errors.New("down"))                                                             //
	take(sluice.Request{Policy: "api", Key: "c", Cost: 1, Limit: limit})                   // degraded allowed
	s.Peek(ctx, sluice.Request{Policy: "api", Key: "c", Cost: 1, Limit: limit})            // peek degraded allowed
	canceled, cancel := context.WithCancel(ctx)                                            //
	cancel()                                                                               //
	s.Take(canceled, sluice.Request{Policy: "api", Key: "c", Cost: 1, Limit: limit})       // error: canceled
	g2 := newGuard(t, sw, guard.Options{FailureMode: guard.FailClosed, Now: c.Now})        //
	s2, err := promstore.New(g2, reg, promstore.Options{ConstLabels: prometheus.Labels{"limiter": "closed"}})
	if err != nil {
		t.Fatal(err)
	}
	s2.Take(ctx, sluice.Request{Policy: "api", Key: "c", Cost: 1, Limit: limit}) // degraded denied

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_decisions_total Decisions by policy, operation (take, peek, take_all, drain, refund, reset) and result (allowed, denied, degraded_allowed, degraded_denied, error); a multi-take counts once per bucket.
# TYPE sluice_decisions_total counter
sluice_decisions_total{limiter="open",op="peek",policy="api",result="allowed"} 1
sluice_decisions_total{limiter="open",op="peek",policy="api",result="degraded_allowed"} 1
sluice_decisions_total{limiter="open",op="peek",policy="api",result="degraded_denied"} 0
sluice_decisions_total{limiter="open",op="peek",policy="api",result="denied"} 0
sluice_decisions_total{limiter="open",op="peek",policy="api",result="error"} 0
sluice_decisions_total{limiter="open",op="take",policy="api",result="allowed"} 1
sluice_decisions_total{limiter="open",op="take",policy="api",result="degraded_allowed"} 1
sluice_decisions_total{limiter="open",op="take",policy="api",result="degraded_denied"} 0
sluice_decisions_total{limiter="open",op="take",policy="api",result="denied"} 1
sluice_decisions_total{limiter="open",op="take",policy="api",result="error"} 1
sluice_decisions_total{limiter="open",op="peek",policy="login",result="allowed"} 0
sluice_decisions_total{limiter="open",op="peek",policy="login",result="degraded_allowed"} 0
sluice_decisions_total{limiter="open",op="peek",policy="login",result="degraded_denied"} 0
sluice_decisions_total{limiter="open",op="peek",policy="login",result="denied"} 0
sluice_decisions_total{limiter="open",op="peek",policy="login",result="error"} 0
sluice_decisions_total{limiter="open",op="take",policy="login",result="allowed"} 2
sluice_decisions_total{limiter="open",op="take",policy="login",result="degraded_allowed"} 0
sluice_decisions_total{limiter="open",op="take",policy="login",result="degraded_denied"} 0
sluice_decisions_total{limiter="open",op="take",policy="login",result="denied"} 0
sluice_decisions_total{limiter="open",op="take",policy="login",result="error"} 2
sluice_decisions_total{limiter="open",op="peek",policy="(other policies)",result="allowed"} 0
sluice_decisions_total{limiter="open",op="peek",policy="(other policies)",result="degraded_allowed"} 0
sluice_decisions_total{limiter="open",op="peek",policy="(other policies)",result="degraded_denied"} 0
sluice_decisions_total{limiter="open",op="peek",policy="(other policies)",result="denied"} 0
sluice_decisions_total{limiter="open",op="peek",policy="(other policies)",result="error"} 0
sluice_decisions_total{limiter="open",op="take",policy="(other policies)",result="allowed"} 0
sluice_decisions_total{limiter="open",op="take",policy="(other policies)",result="degraded_allowed"} 0
sluice_decisions_total{limiter="open",op="take",policy="(other policies)",result="degraded_denied"} 0
sluice_decisions_total{limiter="open",op="take",policy="(other policies)",result="denied"} 0
sluice_decisions_total{limiter="open",op="take",policy="(other policies)",result="error"} 1
sluice_decisions_total{limiter="closed",op="peek",policy="api",result="allowed"} 0
sluice_decisions_total{limiter="closed",op="peek",policy="api",result="degraded_allowed"} 0
sluice_decisions_total{limiter="closed",op="peek",policy="api",result="degraded_denied"} 0
sluice_decisions_total{limiter="closed",op="peek",policy="api",result="denied"} 0
sluice_decisions_total{limiter="closed",op="peek",policy="api",result="error"} 0
sluice_decisions_total{limiter="closed",op="take",policy="api",result="allowed"} 0
sluice_decisions_total{limiter="closed",op="take",policy="api",result="degraded_allowed"} 0
sluice_decisions_total{limiter="closed",op="take",policy="api",result="degraded_denied"} 1
sluice_decisions_total{limiter="closed",op="take",policy="api",result="denied"} 0
sluice_decisions_total{limiter="closed",op="take",policy="api",result="error"} 0
# HELP sluice_replays_total Decisions replayed for a repeated request ID (takes and refunds); they consumed or gave back nothing.
# TYPE sluice_replays_total counter
sluice_replays_total{limiter="closed"} 0
sluice_replays_total{limiter="open"} 1
`), "sluice_decisions_total", "sluice_replays_total")
	if err != nil {
		t.Error(err)
	}
	for _, tt := range []struct {
		kind string
		want float64
	}{
		{promstore.KindInvalid, 3},
		{promstore.KindCanceled, 1},
		{promstore.KindTimeout, 0},
		{promstore.KindMisconfigured, 0},
		{promstore.KindOther, 0},
	} {
		if got := promtest.Value(t, reg, "sluice_errors_total", map[string]string{"op": "take", "kind": tt.kind, "limiter": "open"}); got != tt.want {
			t.Errorf("sluice_errors_total{op=take,kind=%s} = %v, want %v", tt.kind, got, tt.want)
		}
	}
	if got := promtest.Value(t, reg, "sluice_decision_duration_seconds", map[string]string{"op": "take", "limiter": "open"}); got != 9 {
		t.Errorf("sluice_decision_duration_seconds{op=take} has %v samples, want 9", got)
	}
}

// TestPolicyLabels: the first MaxPolicies valid policy names get series
// of their own; later names, and names that are not valid policy names,
// share the series of OtherPolicies.
func TestPolicyLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := promstore.New(newMemstore(t, memstore.Options{}), reg, promstore.Options{MaxPolicies: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b", "c", "a", "d", "", "x y", strings.Repeat("p", 65)} {
		s.Take(t.Context(), sluice.Request{Policy: p, Key: "k", Cost: 1, Limit: limit})
	}
	for _, tt := range []struct {
		policy, result string
		want           float64
	}{
		{"a", promstore.ResultAllowed, 2},
		{"b", promstore.ResultAllowed, 1},
		{promstore.OtherPolicies, promstore.ResultAllowed, 2}, // c, d
		{promstore.OtherPolicies, promstore.ResultError, 3},   // "", "x y", 65 bytes
		{"c", promstore.ResultAllowed, -1},
		{"d", promstore.ResultAllowed, -1},
	} {
		if got := promtest.Value(t, reg, "sluice_decisions_total", map[string]string{"op": "take", "policy": tt.policy, "result": tt.result}); got != tt.want {
			t.Errorf("sluice_decisions_total{policy=%q,result=%s} = %v, want %v", tt.policy, tt.result, got, tt.want)
		}
	}
	if err := sluice.ValidatePolicy(promstore.OtherPolicies); err == nil {
		t.Errorf("OtherPolicies %q is a valid policy name, so a policy could share its series", promstore.OtherPolicies)
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

// nonBlocking is a store that reports itself guard.NonBlocking.
type nonBlocking struct{ sluice.Store }

func (nonBlocking) NonBlocking() bool { return true }

// TestForwarding: the wrapper asks the store it wraps whether it decides a
// limit (so that sluice.NewLimiter refuses one it cannot at construction)
// and whether it blocks (so that a guard in front of it knows).
func TestForwarding(t *testing.T) {
	ms := newMemstore(t, memstore.Options{})
	s, err := promstore.New(bounded{ms, 100}, prometheus.NewRegistry(), promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sluice.NewLimiter(s, "api", sluice.Limit{Capacity: 101, Rate: sluice.PerSecond(1)}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("NewLimiter(promstore(store bounded at 100), capacity 101) = %v, want an error wrapping ErrInvalidLimit", err)
	}
	if _, err := sluice.NewLimiter(s, "api", sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}); err != nil {
		t.Errorf("NewLimiter(promstore(store bounded at 100), capacity 100) = %v, want a limiter", err)
	}
	g := newGuard(t, bounded{ms, 100}, guard.Options{})
	s, err = promstore.New(g, prometheus.NewRegistry(), promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sluice.CheckLimit(s, sluice.Limit{Capacity: 101, Rate: sluice.PerSecond(1)}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("CheckLimit(promstore(guard(store bounded at 100)), capacity 101) = %v, want an error wrapping ErrInvalidLimit", err)
	}
	for _, tt := range []struct {
		store sluice.Store
		want  bool
	}{
		{nonBlocking{ms}, true},
		{&switchable{Store: ms}, false},
	} {
		s, err := promstore.New(tt.store, prometheus.NewRegistry(), promstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.NonBlocking(); got != tt.want {
			t.Errorf("promstore(%T).NonBlocking() = %v, want %v", tt.store, got, tt.want)
		}
	}
}

// TestOptionsRefused: every constructor refuses options out of range, or
// a nil registerer, store or stats function, with an error wrapping
// sluice.ErrInvalidOption that names it, and registers nothing; none
// panics.
func TestOptionsRefused(t *testing.T) {
	ms := newMemstore(t, memstore.Options{})
	constructors := []struct {
		name string
		new  func(reg prometheus.Registerer, o promstore.Options) error
	}{
		{"New", func(reg prometheus.Registerer, o promstore.Options) error {
			_, err := promstore.New(ms, reg, o)
			return err
		}},
		{"GuardHooks", func(reg prometheus.Registerer, o promstore.Options) error {
			_, err := promstore.GuardHooks(reg, o)
			return err
		}},
		{"RegisterMemstore", func(reg prometheus.Registerer, o promstore.Options) error {
			return promstore.RegisterMemstore(reg, o, ms.Stats)
		}},
	}
	for _, tt := range []struct {
		name string
		o    promstore.Options
		says string
	}{
		{"negative MaxPolicies", promstore.Options{MaxPolicies: -1}, "MaxPolicies"},
		{"unsorted DurationBuckets", promstore.Options{DurationBuckets: []float64{.1, .01}}, "DurationBuckets"},
		{"repeated RemainingBuckets", promstore.Options{RemainingBuckets: []float64{0, .5, .5}}, "RemainingBuckets"},
	} {
		for _, c := range constructors {
			t.Run(tt.name+"/"+c.name, func(t *testing.T) {
				reg := prometheus.NewRegistry()
				var err error
				func() {
					defer func() {
						if v := recover(); v != nil {
							err = fmt.Errorf("panic: %v", v)
						}
					}()
					err = c.new(reg, tt.o)
				}()
				if !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), tt.says) {
					t.Errorf("%s with %+v: %v, want an error wrapping ErrInvalidOption naming %s", c.name, tt.o, err, tt.says)
				}
				if n, _ := testutil.GatherAndCount(reg); n != 0 {
					t.Errorf("%d series registered by a refused call, want 0", n)
				}
			})
		}
	}
	if _, err := promstore.New(nil, prometheus.NewRegistry(), promstore.Options{}); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("New with a nil store: %v, want an error wrapping ErrInvalidOption", err)
	}
	for _, c := range constructors {
		if err := c.new(nil, promstore.Options{}); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("%s with a nil registerer: %v, want an error wrapping ErrInvalidOption", c.name, err)
		}
	}
	if err := promstore.RegisterMemstore(prometheus.NewRegistry(), promstore.Options{}, nil); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("RegisterMemstore with nil stats: %v, want an error wrapping ErrInvalidOption", err)
	}
}

// TestRemaining: remaining/capacity of store-backed takes only.
func TestRemaining(t *testing.T) {
	reg := prometheus.NewRegistry()
	sw := &switchable{Store: newMemstore(t, memstore.Options{})}
	s, err := promstore.New(newGuard(t, sw, guard.Options{FailureMode: guard.FailOpen}), reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cost := range []int64{5, 4, 1, 1} { // remaining 5, 1, 0, denied (0)
		s.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: cost, Limit: limit})
	}
	sw.set(errors.New("down"))
	s.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}) // degraded: not observed
	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_remaining_ratio Tokens remaining after a take, a multi-take's bucket or a drain decided by the store, as a fraction of the capacity.
# TYPE sluice_remaining_ratio histogram
sluice_remaining_ratio_bucket{le="0"} 2
sluice_remaining_ratio_bucket{le="0.05"} 2
sluice_remaining_ratio_bucket{le="0.1"} 3
sluice_remaining_ratio_bucket{le="0.25"} 3
sluice_remaining_ratio_bucket{le="0.5"} 4
sluice_remaining_ratio_bucket{le="0.75"} 4
sluice_remaining_ratio_bucket{le="0.9"} 4
sluice_remaining_ratio_bucket{le="1"} 4
sluice_remaining_ratio_bucket{le="+Inf"} 4
sluice_remaining_ratio_sum 0.6
sluice_remaining_ratio_count 4
`), "sluice_remaining_ratio")
	if err != nil {
		t.Error(err)
	}
}

// TestGuardHooks follows a breaker through open, a failed probe and a
// successful one on a manual clock.
func TestGuardHooks(t *testing.T) {
	c := newClock()
	reg := prometheus.NewRegistry()
	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchable{Store: newMemstore(t, memstore.Options{Now: c.Now})}
	g := newGuard(t, sw, guard.Options{FailureMode: guard.FailClosed, ConsecutiveFailures: 2, Now: c.Now, Hooks: hooks})
	take := func() { g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}) }
	take()
	sw.set(fmt.Errorf("redisstore: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}))
	take()
	take() // opens
	take() // breaker open
	c.Advance(guard.DefaultProbeInterval)
	take() // probe fails
	c.Advance(guard.DefaultProbeInterval)
	sw.set(nil)
	take() // probe succeeds

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_breaker_state 1 for the circuit breaker's current state (closed, open, half-open), 0 for the others.
# TYPE sluice_breaker_state gauge
sluice_breaker_state{state="closed"} 1
sluice_breaker_state{state="half-open"} 0
sluice_breaker_state{state="open"} 0
# HELP sluice_breaker_transitions_total Changes of the circuit breaker's state, by the state entered.
# TYPE sluice_breaker_transitions_total counter
sluice_breaker_transitions_total{to="closed"} 1
sluice_breaker_transitions_total{to="half-open"} 2
sluice_breaker_transitions_total{to="open"} 2
# HELP sluice_degraded_total Decisions made by the failure mode instead of the store, by failure mode and reason (breaker_open, stalled or the kind of store error).
# TYPE sluice_degraded_total counter
sluice_degraded_total{failure_mode="closed",reason="breaker_open"} 1
sluice_degraded_total{failure_mode="closed",reason="unavailable"} 3
# HELP sluice_store_errors_total Calls to the guarded store that ended in an error, by operation and kind (timeout, unavailable, script, server, other; invalid, refused, misconfigured; canceled).
# TYPE sluice_store_errors_total counter
sluice_store_errors_total{kind="other",op="drain"} 0
sluice_store_errors_total{kind="other",op="peek"} 0
sluice_store_errors_total{kind="other",op="refund"} 0
sluice_store_errors_total{kind="other",op="reset"} 0
sluice_store_errors_total{kind="other",op="take"} 0
sluice_store_errors_total{kind="other",op="take_all"} 0
sluice_store_errors_total{kind="script",op="drain"} 0
sluice_store_errors_total{kind="script",op="peek"} 0
sluice_store_errors_total{kind="script",op="refund"} 0
sluice_store_errors_total{kind="script",op="reset"} 0
sluice_store_errors_total{kind="script",op="take"} 0
sluice_store_errors_total{kind="script",op="take_all"} 0
sluice_store_errors_total{kind="server",op="drain"} 0
sluice_store_errors_total{kind="server",op="peek"} 0
sluice_store_errors_total{kind="server",op="refund"} 0
sluice_store_errors_total{kind="server",op="reset"} 0
sluice_store_errors_total{kind="server",op="take"} 0
sluice_store_errors_total{kind="server",op="take_all"} 0
sluice_store_errors_total{kind="timeout",op="drain"} 0
sluice_store_errors_total{kind="timeout",op="peek"} 0
sluice_store_errors_total{kind="timeout",op="refund"} 0
sluice_store_errors_total{kind="timeout",op="reset"} 0
sluice_store_errors_total{kind="timeout",op="take"} 0
sluice_store_errors_total{kind="timeout",op="take_all"} 0
sluice_store_errors_total{kind="unavailable",op="drain"} 0
sluice_store_errors_total{kind="unavailable",op="peek"} 0
sluice_store_errors_total{kind="unavailable",op="refund"} 0
sluice_store_errors_total{kind="unavailable",op="reset"} 0
sluice_store_errors_total{kind="unavailable",op="take"} 3
sluice_store_errors_total{kind="unavailable",op="take_all"} 0
`), "sluice_breaker_state", "sluice_breaker_transitions_total", "sluice_degraded_total", "sluice_store_errors_total")
	if err != nil {
		t.Error(err)
	}
	if got := promtest.Value(t, reg, "sluice_store_duration_seconds", map[string]string{"op": "take"}); got != 5 {
		t.Errorf("sluice_store_duration_seconds{op=take} has %v samples, want 5 (every call that reached the store)", got)
	}
}

// redisLike is an error reply as go-redis returns it.
type redisLike string

func (e redisLike) Error() string { return string(e) }
func (redisLike) RedisError()     {}

// scriptLike is an error about a store's script, as redisstore wraps
// them: here around the Redis error reply of a failed script.
type scriptLike struct{ err error }

func (e scriptLike) Error() string { return "script: " + e.err.Error() }
func (e scriptLike) Unwrap() error { return e.err }
func (scriptLike) ScriptError()    {}

// sqlLike is a PostgreSQL error as pgx returns it (*pgconn.PgError): its
// SQLState method returns the SQLSTATE code.
type sqlLike string

func (e sqlLike) Error() string    { return "ERROR: something (SQLSTATE " + string(e) + ")" }
func (e sqlLike) SQLState() string { return string(e) }

// errPgUnavailable is how the shared stores wrap their failures: in
// sluice.ErrUnavailable, around the cause.
var errPgUnavailable = fmt.Errorf("pgstore: %w", sluice.ErrUnavailable)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestKind(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", sluice.ErrInvalidKey), promstore.KindInvalid},
		{fmt.Errorf("x: %w", sluice.ErrInvalidLimit), promstore.KindInvalid},
		{fmt.Errorf("x: %w", sluice.ErrRequestIDConflict), promstore.KindInvalid},
		{fmt.Errorf("x: %w", sluice.ErrTooManyKeys), promstore.KindRefused},
		{fmt.Errorf("%w: %w", guard.ErrBreakerOpen, io.EOF), promstore.KindBreakerOpen},
		{fmt.Errorf("%w: %w", guard.ErrTimeout, io.EOF), promstore.KindTimeout},
		{fmt.Errorf("redisstore: %w", context.DeadlineExceeded), promstore.KindTimeout},
		{os.ErrDeadlineExceeded, promstore.KindTimeout},
		{&net.OpError{Op: "read", Err: timeoutErr{}}, promstore.KindTimeout},
		{fmt.Errorf("x: %w", context.Canceled), promstore.KindCanceled},
		{fmt.Errorf("redisstore: %w", redisLike("OOM command not allowed")), promstore.KindServer},
		{fmt.Errorf("redisstore: %w", scriptLike{redisLike("ERR user_script:12: attempt to compare nil with number")}), promstore.KindScript},
		{fmt.Errorf("redisstore: %w", scriptLike{errors.New(`reply ["ok"] is not a decision`)}), promstore.KindScript},
		{fmt.Errorf("redisstore: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), promstore.KindUnavailable},
		{fmt.Errorf("redisstore: %w", io.EOF), promstore.KindUnavailable},
		{net.ErrClosed, promstore.KindUnavailable},
		{syscall.ECONNRESET, promstore.KindUnavailable},
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("55P03")), promstore.KindTimeout},     // lock_not_available
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("57014")), promstore.KindTimeout},     // query_canceled
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("08006")), promstore.KindUnavailable}, // connection_failure
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("08P01")), promstore.KindUnavailable}, // protocol_violation
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("57P01")), promstore.KindUnavailable}, // admin_shutdown
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("57P02")), promstore.KindUnavailable}, // crash_shutdown
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("57P03")), promstore.KindUnavailable}, // cannot_connect_now
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("57000")), promstore.KindServer},      // operator_intervention
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("42P01")), promstore.KindServer},      // undefined_table
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("40001")), promstore.KindServer},      // serialization_failure
		{fmt.Errorf("%w: take: %w", errPgUnavailable, sqlLike("53300")), promstore.KindServer},      // too_many_connections
		{fmt.Errorf("%w: take: %w", errPgUnavailable, context.DeadlineExceeded), promstore.KindTimeout},
		{fmt.Errorf("%w: take: %w", errPgUnavailable, context.Canceled), promstore.KindCanceled},
		{errPgUnavailable, promstore.KindUnavailable},
		{fmt.Errorf("redisstore: %w: %w", sluice.ErrUnavailable, redisLike("READONLY You can't write against a read only replica.")), promstore.KindServer},
		{fmt.Errorf("redisstore: %w: %w", sluice.ErrUnavailable, &net.OpError{Op: "read", Err: timeoutErr{}}), promstore.KindTimeout},
		{fmt.Errorf("pgstore: %w: relation \"sluice_buckets\" does not exist; run Migrate: %w", sluice.ErrMisconfigured, sqlLike("42P01")), promstore.KindMisconfigured},
		{fmt.Errorf("redisstore: %w: %w", sluice.ErrMisconfigured, scriptLike{redisLike("WRONGTYPE Operation against a key holding the wrong kind of value")}), promstore.KindMisconfigured},
		{fmt.Errorf("x: %w", sluice.ErrInvalidPolicy), promstore.KindInvalid},
		{fmt.Errorf("%w: 3 calls running", guard.ErrStalled), promstore.KindStalled},
		{errors.New("something"), promstore.KindOther},
	}
	for _, tt := range tests {
		if got := promstore.Kind(tt.err); got != tt.want {
			t.Errorf("Kind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
	// Options.Kind comes first; "" falls back to Kind.
	errDB := errors.New("db unavailable")
	reg := prometheus.NewRegistry()
	s, err := promstore.New(&switchable{Store: newMemstore(t, memstore.Options{}), err: fmt.Errorf("pg: %w", errDB)}, reg, promstore.Options{
		Kind: func(err error) string {
			if errors.Is(err, errDB) {
				return promstore.KindUnavailable
			}
			return ""
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit})
	if got := promtest.Value(t, reg, "sluice_errors_total", map[string]string{"op": "take", "kind": "unavailable"}); got != 1 {
		t.Errorf("errors_total{kind=unavailable} = %v with a custom Kind, want 1", got)
	}
}

// TestMemstore exports the counters of memstore.Stats.
func TestMemstore(t *testing.T) {
	c := newClock()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	refuse := newMemstore(t, memstore.Options{Now: c.Now, MaxKeys: 2, Shards: 1})
	evict := newMemstore(t, memstore.Options{Now: c.Now, MaxKeys: 2, Shards: 1, Overflow: memstore.EvictLRU})
	reg := prometheus.NewRegistry()
	for name, s := range map[string]*memstore.Store{"refuse": refuse, "evict": evict} {
		if err := promstore.RegisterMemstore(reg, promstore.Options{ConstLabels: prometheus.Labels{"store": name}}, s.Stats); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"a", "b", "c"} { // c: refused, or evicts a
			s.Take(t.Context(), sluice.Request{Policy: "test", Key: k, Cost: 1, Limit: l})
		}
	}
	c.Advance(time.Second) // every bucket full again
	refuse.Take(t.Context(), sluice.Request{Policy: "test", Key: "d", Cost: 1, Limit: l})
	// A take under another limit than the one the bucket holds converts it.
	evict.Take(t.Context(), sluice.Request{Policy: "test", Key: "c", Cost: 1, Limit: l})
	evict.Take(t.Context(), sluice.Request{Policy: "test", Key: "c", Cost: 1, Limit: sluice.Limit{Capacity: 20, Rate: sluice.PerSecond(10)}})
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_memstore_conversions_total Takes that found their bucket stored under another limit than the request's and converted it; a steady rate means callers disagree on a policy's limit.
# TYPE sluice_memstore_conversions_total counter
sluice_memstore_conversions_total{store="evict"} 1
sluice_memstore_conversions_total{store="refuse"} 0
# HELP sluice_memstore_buckets Buckets held by the in-memory store.
# TYPE sluice_memstore_buckets gauge
sluice_memstore_buckets{store="evict"} 2
sluice_memstore_buckets{store="refuse"} 1
# HELP sluice_memstore_evictions_total Buckets dropped by the in-memory store, by reason: full (reclaimed at no loss) or lru (evicted before full).
# TYPE sluice_memstore_evictions_total counter
sluice_memstore_evictions_total{reason="full",store="evict"} 0
sluice_memstore_evictions_total{reason="full",store="refuse"} 2
sluice_memstore_evictions_total{reason="lru",store="evict"} 1
sluice_memstore_evictions_total{reason="lru",store="refuse"} 0
# HELP sluice_memstore_refused_total Requests for new keys the in-memory store refused because it held its maximum of keys and found none to reclaim.
# TYPE sluice_memstore_refused_total counter
sluice_memstore_refused_total{store="evict"} 0
sluice_memstore_refused_total{store="refuse"} 1
`), "sluice_memstore_buckets", "sluice_memstore_conversions_total", "sluice_memstore_evictions_total", "sluice_memstore_refused_total")
	if err != nil {
		t.Error(err)
	}
}

// TestNoKeyLabels: 5,000 distinct keys, with the store up and down, add no
// series.
func TestNoKeyLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchable{Store: newMemstore(t, memstore.Options{})}
	g := newGuard(t, sw, guard.Options{Hooks: hooks})
	s, err := promstore.New(g, reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := promstore.RegisterMemstore(reg, promstore.Options{}, g.LocalStats); err != nil {
		t.Fatal(err)
	}
	s.Take(t.Context(), sluice.Request{Policy: "test", Key: "first", Cost: 1, Limit: limit})
	sw.set(errors.New("down"))
	for range 10 { // fail, open the breaker, answer with it open
		s.Take(t.Context(), sluice.Request{Policy: "test", Key: "first", Cost: 1, Limit: limit})
	}
	before, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		if i == 2500 {
			sw.set(nil)
		}
		s.Take(t.Context(), sluice.Request{Policy: "test", Key: fmt.Sprint("user-", i), Cost: 1, Limit: limit})
		s.Peek(t.Context(), sluice.Request{Policy: "test", Key: fmt.Sprint("user-", i), Cost: 1, Limit: limit})
	}
	after, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("%d series after 5,000 keys, %d before: a metric grows with the keys", after, before)
	}
}

// TestRegistration: no global registry, no partial registration, and
// distinct constant labels share a registry.
func TestRegistration(t *testing.T) {
	ms := newMemstore(t, memstore.Options{})
	if _, err := promstore.New(ms, nil, promstore.Options{}); err == nil {
		t.Error("New with a nil registerer succeeded, want an error")
	}
	if _, err := promstore.GuardHooks(nil, promstore.Options{}); err == nil {
		t.Error("GuardHooks with a nil registerer succeeded, want an error")
	}
	if err := promstore.RegisterMemstore(prometheus.NewRegistry(), promstore.Options{}, nil); err == nil {
		t.Error("RegisterMemstore with nil stats succeeded, want an error")
	}
	reg := prometheus.NewRegistry()
	if _, err := promstore.New(ms, reg, promstore.Options{}); err != nil {
		t.Fatal(err)
	}
	n, _ := testutil.GatherAndCount(reg)
	var already prometheus.AlreadyRegisteredError
	if _, err := promstore.New(ms, reg, promstore.Options{}); !errors.As(err, &already) {
		t.Errorf("second New on one registry: %v, want prometheus.AlreadyRegisteredError", err)
	}
	if m, _ := testutil.GatherAndCount(reg); m != n {
		t.Errorf("a failed New left %d series, want %d", m, n)
	}
	if _, err := promstore.New(ms, reg, promstore.Options{Namespace: "other"}); err != nil {
		t.Errorf("New in another namespace: %v", err)
	}
	// Several limiters in one registry: the same constant label names,
	// other values.
	reg = prometheus.NewRegistry()
	for _, name := range []string{"api", "login"} {
		if _, err := promstore.New(ms, reg, promstore.Options{ConstLabels: prometheus.Labels{"limiter": name}}); err != nil {
			t.Errorf("New with limiter=%q: %v", name, err)
		}
	}
}
