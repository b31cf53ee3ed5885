package promstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/internal/promtest"
	"github.com/sluicehq/sluice/sluicetest"
)

// modelStore is a sluice.Operator that decides by a sluicetest.Model, on
// ticks of 1ns since the clock's first reading.
type modelStore struct {
	now   func() time.Time
	epoch time.Time
	mu    sync.Mutex
	m     *sluicetest.Model
}

func newModelStore(now func() time.Time) *modelStore {
	return &modelStore{now: now, epoch: now(), m: sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, time.Minute)}
}

func (s *modelStore) tick() int64 { return int64(s.now().Sub(s.epoch)) }

func (s *modelStore) Take(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Take(s.tick(), r)
}

func (s *modelStore) Peek(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Peek(s.tick(), r)
}

func (s *modelStore) TakeAll(_ context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.TakeAll(s.tick(), rs)
}

func (s *modelStore) Drain(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Drain(s.tick(), r)
}

func (s *modelStore) Refund(_ context.Context, r sluice.Request) (sluice.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Refund(s.tick(), r)
}

func (s *modelStore) Reset(_ context.Context, policy, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Reset(s.tick(), policy, key)
}

// The operations of switchable fail as its Take does, then ask the store
// it wraps, which must be a sluice.Operator.

func (s *switchable) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := s.failure(); err != nil {
		return sluice.MultiDecision{}, err
	}
	return s.Store.(sluice.Operator).TakeAll(ctx, rs)
}

func (s *switchable) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.failure(); err != nil {
		return sluice.Decision{}, err
	}
	return s.Store.(sluice.Operator).Drain(ctx, r)
}

func (s *switchable) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.failure(); err != nil {
		return sluice.Decision{}, err
	}
	return s.Store.(sluice.Operator).Refund(ctx, r)
}

func (s *switchable) Reset(ctx context.Context, policy, key string) error {
	if err := s.failure(); err != nil {
		return err
	}
	return s.Store.(sluice.Operator).Reset(ctx, policy, key)
}

// decisionSeries returns the exposition of sluice_decisions_total for
// one policy and op: want holds the allowed, denied, degraded_allowed,
// degraded_denied and error counts.
func decisionSeries(policy, op string, want [5]int) string {
	var b strings.Builder
	for i, res := range []string{promstore.ResultAllowed, promstore.ResultDenied, promstore.ResultDegradedAllowed, promstore.ResultDegradedDenied, promstore.ResultError} {
		fmt.Fprintf(&b, "sluice_decisions_total{op=%q,policy=%q,result=%q} %d\n", op, policy, res, want[i])
	}
	return b.String()
}

// TestOperations: every operation is counted under its op label; a
// multi-take once per part under the part's policy (by whether that bucket
// covered its cost) and once as a whole; drained and refunded tokens by
// policy; errors by op and kind; latency by op.
func TestOperations(t *testing.T) {
	c := newClock()
	sw := &switchable{Store: newModelStore(c.Now)}
	g := newGuard(t, sw, guard.Options{FailureMode: guard.FailOpen, Now: c.Now, ConsecutiveFailures: -1, FailurePercent: -1, Timeout: time.Minute})
	reg := prometheus.NewRegistry()
	s, err := promstore.New(g, reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	r := func(policy, key string, cost int64) sluice.Request {
		return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: limit}
	}
	withID := func(q sluice.Request, id string) sluice.Request { q.RequestID = id; return q }
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	md, err := s.TakeAll(ctx, []sluice.Request{r("api", "a", 4), r("login", "a", 3)}) // allowed: 6 and 7 left
	must("TakeAll 1", err)
	if !md.Allowed {
		t.Fatalf("TakeAll 1 = %+v, want allowed", md)
	}
	md, err = s.TakeAll(ctx, []sluice.Request{r("api", "a", 7), r("login", "a", 1)}) // api short, login covers
	must("TakeAll 2", err)
	if md.Allowed || md.Denied != 0 {
		t.Fatalf("TakeAll 2 = %+v, want denied by part 0", md)
	}
	d, err := s.Drain(ctx, r("api", "b", 12)) // takes 10 of 12
	must("Drain 12", err)
	if d.Taken != 10 || d.Allowed {
		t.Fatalf("Drain(12) = %+v, want 10 taken, not allowed", d)
	}
	_, err = s.Drain(ctx, r("api", "c", 3))
	must("Drain 3", err)
	_, err = s.Refund(ctx, r("api", "b", 4))
	must("Refund 4", err)
	_, err = s.Take(ctx, withID(r("login", "r", 2), "r1"))
	must("Take r1", err)
	_, err = s.Refund(ctx, withID(r("login", "r", 2), "r1"))
	must("Refund r1", err)
	if d, err := s.Refund(ctx, withID(r("login", "r", 2), "r1")); err != nil || !d.Replayed {
		t.Fatalf("second Refund r1 = %+v, %v; want a replay", d, err)
	}
	if _, err := s.Refund(ctx, withID(r("login", "r", 1), "nope")); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("Refund of an unknown ID: %v, want ErrUnknownRequestID", err)
	}
	must("Reset", s.Reset(ctx, "api", "a"))
	if err := s.Reset(ctx, "", "k"); !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Fatalf("Reset without a policy: %v, want ErrInvalidPolicy", err)
	}
	if _, err := s.TakeAll(ctx, []sluice.Request{r("api", "a", 1), r("api", "a", 1)}); !errors.Is(err, sluice.ErrInvalidMulti) {
		t.Fatalf("TakeAll of one bucket twice: %v, want ErrInvalidMulti", err)
	}
	sw.set(errors.New("down"))
	md, err = s.TakeAll(ctx, []sluice.Request{r("api", "d", 1), r("login", "d", 1)})
	must("degraded TakeAll", err)
	if !md.Degraded || !md.Allowed {
		t.Fatalf("TakeAll with the store down = %+v, want a degraded allow", md)
	}
	_, err = s.Drain(ctx, r("api", "d", 2))
	must("degraded Drain", err)
	if _, err := s.Refund(ctx, r("api", "d", 1)); !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("Refund with the store down: %v, want ErrUnavailable", err)
	}
	if err := s.Reset(ctx, "login", "d"); !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("Reset with the store down: %v, want ErrUnavailable", err)
	}

	other := promstore.OtherPolicies
	want := "# HELP sluice_decisions_total Decisions by policy, operation (take, peek, take_all, drain, refund, reset) and result (allowed, denied, degraded_allowed, degraded_denied, error); a multi-take counts once per bucket.\n" +
		"# TYPE sluice_decisions_total counter\n" +
		decisionSeries("api", "take", [5]int{}) +
		decisionSeries("api", "peek", [5]int{}) +
		decisionSeries("api", "take_all", [5]int{1, 1, 1, 0, 2}) +
		decisionSeries("api", "drain", [5]int{1, 1, 1, 0, 0}) +
		decisionSeries("api", "refund", [5]int{1, 0, 0, 0, 1}) +
		decisionSeries("api", "reset", [5]int{1, 0, 0, 0, 0}) +
		decisionSeries("login", "take", [5]int{1, 0, 0, 0, 0}) +
		decisionSeries("login", "peek", [5]int{}) +
		decisionSeries("login", "take_all", [5]int{2, 0, 1, 0, 0}) +
		decisionSeries("login", "drain", [5]int{}) +
		decisionSeries("login", "refund", [5]int{2, 0, 0, 0, 1}) +
		decisionSeries("login", "reset", [5]int{0, 0, 0, 0, 1}) +
		decisionSeries(other, "take", [5]int{}) +
		decisionSeries(other, "peek", [5]int{}) +
		decisionSeries(other, "take_all", [5]int{}) +
		decisionSeries(other, "drain", [5]int{}) +
		decisionSeries(other, "refund", [5]int{}) +
		decisionSeries(other, "reset", [5]int{0, 0, 0, 0, 1}) + `
# HELP sluice_take_all_decisions_total Multi-takes (TakeAll) by result (allowed, denied, degraded_allowed, degraded_denied, error), once per call.
# TYPE sluice_take_all_decisions_total counter
sluice_take_all_decisions_total{result="allowed"} 1
sluice_take_all_decisions_total{result="degraded_allowed"} 1
sluice_take_all_decisions_total{result="degraded_denied"} 0
sluice_take_all_decisions_total{result="denied"} 1
sluice_take_all_decisions_total{result="error"} 1
# HELP sluice_drained_tokens_total Tokens taken by drains, by policy (Decision.Taken).
# TYPE sluice_drained_tokens_total counter
sluice_drained_tokens_total{policy="(other policies)"} 0
sluice_drained_tokens_total{policy="api"} 13
sluice_drained_tokens_total{policy="login"} 0
# HELP sluice_refunded_tokens_total Tokens given back by refunds, by policy (minus Decision.Taken).
# TYPE sluice_refunded_tokens_total counter
sluice_refunded_tokens_total{policy="(other policies)"} 0
sluice_refunded_tokens_total{policy="api"} 4
sluice_refunded_tokens_total{policy="login"} 2
# HELP sluice_replays_total Decisions replayed for a repeated request ID (takes and refunds); they consumed or gave back nothing.
# TYPE sluice_replays_total counter
sluice_replays_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_decisions_total", "sluice_take_all_decisions_total", "sluice_drained_tokens_total", "sluice_refunded_tokens_total", "sluice_replays_total"); err != nil {
		t.Error(err)
	}
	for _, tt := range []struct {
		op, kind string
		want     float64
	}{
		{"take_all", promstore.KindInvalid, 1},
		{"take_all", promstore.KindUnavailable, 0},
		{"drain", promstore.KindInvalid, 0},
		{"refund", promstore.KindInvalid, 1},
		{"refund", promstore.KindUnavailable, 1},
		{"reset", promstore.KindInvalid, 1},
		{"reset", promstore.KindUnavailable, 1},
		{"reset", promstore.KindUnsupported, 0},
	} {
		if got := promtest.Value(t, reg, "sluice_errors_total", map[string]string{"op": tt.op, "kind": tt.kind}); got != tt.want {
			t.Errorf("sluice_errors_total{op=%s,kind=%s} = %v, want %v", tt.op, tt.kind, got, tt.want)
		}
	}
	for op, want := range map[string]float64{"take": 1, "peek": 0, "take_all": 4, "drain": 3, "refund": 5, "reset": 3} {
		if got := promtest.Value(t, reg, "sluice_decision_duration_seconds", map[string]string{"op": op}); got != want {
			t.Errorf("sluice_decision_duration_seconds{op=%s} has %v samples, want %v", op, got, want)
		}
	}
	// Remaining after each part of the multi-takes (0.6 and 0.7, twice),
	// the drains (0 and 0.7) and the take (0.8); none degraded.
	if got := promtest.Value(t, reg, "sluice_remaining_ratio", nil); got != 7 {
		t.Errorf("sluice_remaining_ratio has %v samples, want 7", got)
	}
}

// TestOperationsUnsupported: over a store that does not implement
// sluice.Operator (directly, or behind a guard), the operations return an
// error wrapping errors.ErrUnsupported, counted as kind "unsupported".
func TestOperationsUnsupported(t *testing.T) {
	ms := newModelStore(newClock().Now)
	for _, next := range []sluice.Store{
		nonBlocking{ms},
		newGuard(t, nonBlocking{ms}, guard.Options{}),
	} {
		reg := prometheus.NewRegistry()
		s, err := promstore.New(next, reg, promstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}
		_, err1 := s.TakeAll(t.Context(), []sluice.Request{r})
		_, err2 := s.Drain(t.Context(), r)
		_, err3 := s.Refund(t.Context(), r)
		err4 := s.Reset(t.Context(), "test", "k")
		for i, err := range []error{err1, err2, err3, err4} {
			if !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("%T: operation %d: %v, want an error wrapping errors.ErrUnsupported", next, i, err)
			}
		}
		if got := promtest.Value(t, reg, "sluice_errors_total", map[string]string{"op": "take_all", "kind": promstore.KindUnsupported}); got != 1 {
			t.Errorf("%T: sluice_errors_total{op=take_all,kind=unsupported} = %v, want 1", next, got)
		}
		if d, err := s.Take(t.Context(), r); err != nil || !d.Allowed {
			t.Errorf("%T: Take = %+v, %v; want the store's allow", next, d, err)
		}
	}
	if got := promstore.Kind(fmt.Errorf("x: %w", errors.ErrUnsupported)); got != promstore.KindUnsupported {
		t.Errorf("Kind(ErrUnsupported) = %q, want %q", got, promstore.KindUnsupported)
	}
}

// TestMultiPolicyLabels: the parts of a multi-take share the policy series
// of single takes: the first MaxPolicies names get their own, later ones
// OtherPolicies.
func TestMultiPolicyLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := promstore.New(newModelStore(newClock().Now), reg, promstore.Options{MaxPolicies: 2})
	if err != nil {
		t.Fatal(err)
	}
	var rs []sluice.Request
	for _, p := range []string{"a", "b", "c", "d"} {
		rs = append(rs, sluice.Request{Policy: p, Key: "k", Cost: 1, Limit: limit})
	}
	if _, err := s.TakeAll(t.Context(), rs); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		policy string
		want   float64
	}{{"a", 1}, {"b", 1}, {promstore.OtherPolicies, 2}, {"c", -1}, {"d", -1}} {
		if got := promtest.Value(t, reg, "sluice_decisions_total", map[string]string{"op": "take_all", "policy": tt.policy, "result": promstore.ResultAllowed}); got != tt.want {
			t.Errorf("sluice_decisions_total{op=take_all,policy=%q,result=allowed} = %v, want %v", tt.policy, got, tt.want)
		}
	}
}

// TestGuardHooksOps: the guard's hooks record every operation's store
// calls under its op label.
func TestGuardHooksOps(t *testing.T) {
	c := newClock()
	reg := prometheus.NewRegistry()
	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchable{Store: newModelStore(c.Now)}
	g := newGuard(t, sw, guard.Options{FailureMode: guard.FailClosed, ConsecutiveFailures: -1, FailurePercent: -1, Now: c.Now, Hooks: hooks, Timeout: time.Minute})
	r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: limit}
	ops := func() {
		g.TakeAll(t.Context(), []sluice.Request{r})
		g.Drain(t.Context(), r)
		g.Refund(t.Context(), r)
		g.Reset(t.Context(), "test", "k")
	}
	ops()
	sw.set(errors.New("down"))
	ops()
	for _, op := range []string{"take_all", "drain", "refund", "reset"} {
		if got := promtest.Value(t, reg, "sluice_store_duration_seconds", map[string]string{"op": op}); got != 2 {
			t.Errorf("sluice_store_duration_seconds{op=%s} has %v samples, want 2", op, got)
		}
		if got := promtest.Value(t, reg, "sluice_store_errors_total", map[string]string{"op": op, "kind": promstore.KindOther}); got != 1 {
			t.Errorf("sluice_store_errors_total{op=%s,kind=other} = %v, want 1", op, got)
		}
	}
	// Degraded: the multi-take and the drain; refunds and resets fail.
	if got := promtest.Value(t, reg, "sluice_degraded_total", map[string]string{"failure_mode": "closed", "reason": promstore.KindOther}); got != 2 {
		t.Errorf("sluice_degraded_total{failure_mode=closed,reason=other} = %v, want 2", got)
	}
}

// TestNoKeyLabelsOps: 2,000 distinct keys through every operation, with
// the store up and down, add no series.
func TestNoKeyLabelsOps(t *testing.T) {
	c := newClock()
	reg := prometheus.NewRegistry()
	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchable{Store: newModelStore(c.Now)}
	// A deadline no call reaches on a loaded machine: a timeout would be
	// a new reason of sluice_degraded_total.
	g := newGuard(t, sw, guard.Options{Hooks: hooks, Now: c.Now, Timeout: time.Minute})
	s, err := promstore.New(g, reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := promstore.RegisterMemstore(reg, promstore.Options{}, g.LocalStats); err != nil {
		t.Fatal(err)
	}
	all := func(key string) {
		r := sluice.Request{Policy: "test", Key: key, Cost: 1, Limit: limit}
		s.Take(t.Context(), r)
		s.TakeAll(t.Context(), []sluice.Request{r, {Policy: "other", Key: key, Cost: 1, Limit: limit}})
		s.Drain(t.Context(), r)
		s.Refund(t.Context(), r)
		s.Reset(t.Context(), "test", key)
	}
	all("first")
	sw.set(errors.New("down"))
	for range 10 {
		all("first")
	}
	before, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		if i == 1000 {
			sw.set(nil)
			c.Advance(guard.DefaultProbeInterval)
		}
		all(fmt.Sprint("user-", i))
	}
	after, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("%d series after 2,000 keys, %d before: a metric grows with the keys", after, before)
	}
}
