package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/sluicetest"
)

// modelStore is a sluice.Operator that decides by a sluicetest.Model, on
// ticks of 1ns since the clock's first reading: the reference every store
// must match, so that the guard's tests of the operations need no store of
// their own. It returns the context's error if ctx has ended, as a store
// does.
type modelStore struct {
	now   func() time.Time
	epoch time.Time
	mu    sync.Mutex
	m     *sluicetest.Model
}

// newModelStore returns an empty modelStore on now, remembering request
// IDs for a minute.
func newModelStore(now func() time.Time) *modelStore {
	return &modelStore{now: now, epoch: now(), m: sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, time.Minute)}
}

func (s *modelStore) tick() int64 { return int64(s.now().Sub(s.epoch)) }

func (s *modelStore) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Take(s.tick(), r)
}

func (s *modelStore) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Peek(s.tick(), r)
}

func (s *modelStore) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.MultiDecision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.TakeAll(s.tick(), rs)
}

func (s *modelStore) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Drain(s.tick(), r)
}

func (s *modelStore) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Refund(s.tick(), r)
}

func (s *modelStore) Reset(ctx context.Context, policy, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Reset(s.tick(), policy, key)
}

// newFlakyOps returns a flaky store in front of a modelStore: one that
// implements every operation.
func newFlakyOps(now func() time.Time) *flaky {
	return &flaky{next: newModelStore(now)}
}

// The operations of flaky fail as its Take does, then ask the store it
// wraps, which must be a sluice.Operator.

func (f *flaky) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.MultiDecision{}, err
	}
	return f.next.(sluice.Operator).TakeAll(ctx, rs)
}

func (f *flaky) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Decision{}, err
	}
	return f.next.(sluice.Operator).Drain(ctx, r)
}

func (f *flaky) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Decision{}, err
	}
	return f.next.(sluice.Operator).Refund(ctx, r)
}

func (f *flaky) Reset(ctx context.Context, policy, key string) error {
	if err := f.fail(ctx); err != nil {
		return err
	}
	return f.next.(sluice.Operator).Reset(ctx, policy, key)
}

// The operations of deaf sleep for its hang, ignoring the context, as its
// Take does.

func (s *deaf) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	d, err := s.Take(ctx, rs[0])
	return sluice.MultiDecision{Allowed: true, Denied: -1, Parts: []sluice.Decision{d}}, err
}

func (s *deaf) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

func (s *deaf) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

func (s *deaf) Reset(ctx context.Context, policy, key string) error {
	_, err := s.Take(ctx, sluice.Request{Policy: policy, Key: key})
	return err
}

// The operations of socketlike fail at the context's deadline as its Take
// does.

func (s *socketlike) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	_, err := s.Take(ctx, rs[0])
	return sluice.MultiDecision{}, err
}

func (s *socketlike) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

func (s *socketlike) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

func (s *socketlike) Reset(ctx context.Context, policy, key string) error {
	_, err := s.Take(ctx, sluice.Request{Policy: policy, Key: key})
	return err
}

// allOps are the operations of the guard, Take and Peek included.
var allOps = []guard.Op{guard.OpTake, guard.OpPeek, guard.OpTakeAll, guard.OpDrain, guard.OpRefund, guard.OpReset}

// newOps are the operations beyond Take and Peek.
var newOps = []guard.Op{guard.OpTakeAll, guard.OpDrain, guard.OpRefund, guard.OpReset}

// result is what one call of an operation came to.
type result struct {
	d   sluice.Decision
	md  sluice.MultiDecision
	err error
}

// second is the other bucket of the multi-takes of do: another policy,
// the same key.
func second(r sluice.Request) sluice.Request {
	r.Policy = "other"
	return r
}

// do calls op on s with r: TakeAll with r and second(r), Reset with r's
// policy and key.
func do(ctx context.Context, s sluice.Operator, op guard.Op, r sluice.Request) result {
	var res result
	switch op {
	case guard.OpTake:
		res.d, res.err = s.Take(ctx, r)
	case guard.OpPeek:
		res.d, res.err = s.Peek(ctx, r)
	case guard.OpTakeAll:
		res.md, res.err = s.TakeAll(ctx, []sluice.Request{r, second(r)})
	case guard.OpDrain:
		res.d, res.err = s.Drain(ctx, r)
	case guard.OpRefund:
		res.d, res.err = s.Refund(ctx, r)
	case guard.OpReset:
		res.err = s.Reset(ctx, r.Policy, r.Key)
	default:
		panic(fmt.Sprintf("no such op %v", op))
	}
	return res
}

// degraded reports whether res is a degraded decision.
func (res result) degraded() bool { return res.d.Degraded || res.md.Degraded }

// allowed reports whether res allowed.
func (res result) allowed() bool { return res.d.Allowed || res.md.Allowed }

func TestOpString(t *testing.T) {
	want := []string{"take", "peek", "take_all", "drain", "refund", "reset"}
	for i, op := range allOps {
		if got := op.String(); got != want[i] {
			t.Errorf("Op(%d).String() = %q, want %q", uint8(op), got, want[i])
		}
	}
	if got := guard.Op(200).String(); got != "Op(200)" {
		t.Errorf("Op(200).String() = %q, want %q", got, "Op(200)")
	}
}

// TestOperatorHealthy: in front of a healthy store, every operation gives
// exactly what the store gives (here the reference model itself), whether
// the guard calls it on a goroutine of its own or inline.
func TestOperatorHealthy(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)}
	big := sluice.Limit{Capacity: 3, Rate: sluice.Per(1, time.Minute)}
	type step struct {
		advance time.Duration
		op      string
		r       sluice.Request
		rs      []sluice.Request
	}
	r := func(key string, cost int64, l sluice.Limit) sluice.Request {
		return sluice.Request{Policy: "test", Key: key, Cost: cost, Limit: l}
	}
	withID := func(q sluice.Request, id string) sluice.Request { q.RequestID = id; return q }
	steps := []step{
		{0, "take", r("a", 4, l), nil},
		{0, "takeall", sluice.Request{}, []sluice.Request{r("a", 6, l), r("b", 3, big)}},
		{0, "takeall", sluice.Request{}, []sluice.Request{r("a", 1, l), r("b", 1, big)}}, // a is short
		{100 * time.Millisecond, "drain", r("b", 5, big), nil},                           // more than the capacity
		{0, "drain", r("a", 1, l), nil},
		{0, "refund", r("a", 2, l), nil},
		{0, "take", withID(r("c", 3, l), "id-1"), nil},
		{0, "refund", withID(r("c", 3, l), "id-1"), nil},
		{0, "refund", withID(r("c", 3, l), "id-1"), nil}, // replayed
		{0, "refund", withID(r("c", 1, l), "unknown"), nil},
		{0, "refund", withID(r("c", 9, l), "id-1"), nil}, // more than the take's cost
		{0, "peek", r("a", 1, l), nil},
		{0, "reset", r("a", 1, l), nil},
		{0, "peek", r("a", 10, l), nil},
		{0, "reset", r("missing", 1, l), nil},
		{0, "takeall", sluice.Request{}, []sluice.Request{r("a", 1, l), r("a", 1, l)}}, // the same bucket twice
		{0, "drain", withID(r("a", 1, l), "x"), nil},
		{0, "refund", r("a", 11, l), nil},
		{0, "reset", sluice.Request{Policy: "test"}, nil},
	}
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			c := newClock()
			var store sluice.Store = newModelStore(c.Now)
			if inline {
				store = nonBlockingOps{store.(sluice.Operator)}
			}
			g := mustNew(t, store, guard.Options{Now: c.Now, Timeout: time.Minute})
			model := sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, time.Minute)
			epoch := c.Now()
			for i, s := range steps {
				c.Advance(s.advance)
				now := int64(c.Now().Sub(epoch))
				var got, want result
				switch s.op {
				case "take":
					got.d, got.err = g.Take(t.Context(), s.r)
					want.d, want.err = model.Take(now, s.r)
				case "peek":
					got.d, got.err = g.Peek(t.Context(), s.r)
					want.d, want.err = model.Peek(now, s.r)
				case "takeall":
					got.md, got.err = g.TakeAll(t.Context(), s.rs)
					want.md, want.err = model.TakeAll(now, s.rs)
				case "drain":
					got.d, got.err = g.Drain(t.Context(), s.r)
					want.d, want.err = model.Drain(now, s.r)
				case "refund":
					got.d, got.err = g.Refund(t.Context(), s.r)
					want.d, want.err = model.Refund(now, s.r)
				case "reset":
					got.err = g.Reset(t.Context(), s.r.Policy, s.r.Key)
					want.err = model.Reset(now, s.r.Policy, s.r.Key)
				}
				if diff := cmp.Diff(want.d, got.d); diff != "" {
					t.Errorf("step %d: %s(%+v%+v) decision differs from the model's (-want +got):\n%s", i, s.op, s.r, s.rs, diff)
				}
				if diff := cmp.Diff(want.md, got.md); diff != "" {
					t.Errorf("step %d: %s(%+v) multi-decision differs from the model's (-want +got):\n%s", i, s.op, s.rs, diff)
				}
				if (got.err == nil) != (want.err == nil) || (want.err != nil && got.err.Error() != want.err.Error()) {
					t.Errorf("step %d: %s(%+v%+v) error %v, want %v", i, s.op, s.r, s.rs, got.err, want.err)
				}
			}
			if st := g.Status(); st.State != guard.BreakerClosed || st.LastError != nil {
				t.Errorf("Status() = %+v, want the breaker closed and no store error", st)
			}
		})
	}
}

// nonBlockingOps is an Operator that reports itself guard.NonBlocking.
type nonBlockingOps struct{ sluice.Operator }

func (nonBlockingOps) NonBlocking() bool { return true }

// takeOnly is a store that implements Take and Peek and nothing more.
type takeOnly struct{ calls int }

func (s *takeOnly) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	s.calls++
	return sluice.Decision{Allowed: true}, nil
}

func (s *takeOnly) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
	s.calls++
	return sluice.Decision{Allowed: true}, nil
}

// TestOperatorUnsupported: over a store that is not a sluice.Operator,
// the operations beyond Take and Peek return an error wrapping
// errors.ErrUnsupported, under every failure mode: they never panic,
// never call the store, never degrade and never count for the breaker.
// Bad parameters are still reported as such first.
func TestOperatorUnsupported(t *testing.T) {
	for _, mode := range []guard.FailureMode{guard.FailLocal, guard.FailClosed, guard.FailOpen} {
		t.Run(mode.String(), func(t *testing.T) {
			st := &takeOnly{}
			var rec recorder
			g := mustNew(t, st, guard.Options{FailureMode: mode, ConsecutiveFailures: 1, Hooks: rec.hooks()})
			for _, op := range newOps {
				res := do(t.Context(), g, op, req)
				if !errors.Is(res.err, errors.ErrUnsupported) || res.degraded() || res.allowed() {
					t.Errorf("%v over a store without it = %+v; want an error wrapping errors.ErrUnsupported", op, res)
				}
				if res.err != nil && !strings.Contains(res.err.Error(), "*guard_test.takeOnly") {
					t.Errorf("%v: %q does not name the store's type", op, res.err)
				}
				bad := req
				bad.Key = ""
				if res := do(t.Context(), g, op, bad); !errors.Is(res.err, sluice.ErrInvalidKey) {
					t.Errorf("%v with an empty key over a store without it: %v, want an error wrapping ErrInvalidKey", op, res.err)
				}
			}
			if st.calls != 0 || len(rec.calls) != 0 || len(rec.degraded) != 0 {
				t.Errorf("%d store calls, %d StoreCall and %d Degraded hook calls, want none", st.calls, len(rec.calls), len(rec.degraded))
			}
			if s := g.Status(); s.State != guard.BreakerClosed {
				t.Errorf("breaker %v, want closed", s.State)
			}
			if d, err := g.Take(t.Context(), req); err != nil || !d.Allowed {
				t.Errorf("Take over a store without the operations = %+v, %v; want the store's allow", d, err)
			}
		})
	}
}

// TestOperatorBadParameters: bad parameters of every operation are errors
// wrapping the sluice sentinels under every failure mode, with the store up
// or down; the store is not called and the breaker does not count them.
func TestOperatorBadParameters(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)}
	ok := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l}
	with := func(f func(*sluice.Request)) sluice.Request { r := ok; f(&r); return r }
	tests := []struct {
		name string
		call func(ctx context.Context, g *guard.Store) error
		want error
	}{
		{"TakeAll of none", func(ctx context.Context, g *guard.Store) error { _, err := g.TakeAll(ctx, nil); return err }, sluice.ErrInvalidMulti},
		{"TakeAll of 17", func(ctx context.Context, g *guard.Store) error {
			rs := make([]sluice.Request, sluice.MaxParts+1)
			for i := range rs {
				rs[i] = with(func(r *sluice.Request) { r.Key = fmt.Sprint("k", i) })
			}
			_, err := g.TakeAll(ctx, rs)
			return err
		}, sluice.ErrInvalidMulti},
		{"TakeAll of one bucket twice", func(ctx context.Context, g *guard.Store) error {
			_, err := g.TakeAll(ctx, []sluice.Request{ok, ok})
			return err
		}, sluice.ErrInvalidMulti},
		{"TakeAll with a request ID", func(ctx context.Context, g *guard.Store) error {
			_, err := g.TakeAll(ctx, []sluice.Request{with(func(r *sluice.Request) { r.RequestID = "x" })})
			return err
		}, sluice.ErrInvalidRequestID},
		{"TakeAll with a cost above the capacity", func(ctx context.Context, g *guard.Store) error {
			_, err := g.TakeAll(ctx, []sluice.Request{ok, with(func(r *sluice.Request) { r.Key, r.Cost = "k2", 11 })})
			return err
		}, sluice.ErrInvalidCost},
		{"Drain of zero", func(ctx context.Context, g *guard.Store) error {
			_, err := g.Drain(ctx, with(func(r *sluice.Request) { r.Cost = 0 }))
			return err
		}, sluice.ErrInvalidCost},
		{"Drain with a request ID", func(ctx context.Context, g *guard.Store) error {
			_, err := g.Drain(ctx, with(func(r *sluice.Request) { r.RequestID = "x" }))
			return err
		}, sluice.ErrInvalidRequestID},
		{"Drain with a bad policy", func(ctx context.Context, g *guard.Store) error {
			_, err := g.Drain(ctx, with(func(r *sluice.Request) { r.Policy = "a b" }))
			return err
		}, sluice.ErrInvalidPolicy},
		{"Refund above the capacity", func(ctx context.Context, g *guard.Store) error {
			_, err := g.Refund(ctx, with(func(r *sluice.Request) { r.Cost = 11 }))
			return err
		}, sluice.ErrInvalidCost},
		{"Refund without a limit", func(ctx context.Context, g *guard.Store) error {
			_, err := g.Refund(ctx, with(func(r *sluice.Request) { r.Limit = sluice.Limit{} }))
			return err
		}, sluice.ErrInvalidLimit},
		{"Reset of an empty key", func(ctx context.Context, g *guard.Store) error { return g.Reset(ctx, "test", "") }, sluice.ErrInvalidKey},
		{"Reset of an empty policy", func(ctx context.Context, g *guard.Store) error { return g.Reset(ctx, "", "k") }, sluice.ErrInvalidPolicy},
	}
	for _, mode := range []guard.FailureMode{guard.FailLocal, guard.FailClosed, guard.FailOpen} {
		for _, down := range []bool{false, true} {
			for _, tt := range tests {
				t.Run(fmt.Sprintf("%v/down=%v/%s", mode, down, tt.name), func(t *testing.T) {
					c := newClock()
					f := newFlakyOps(c.Now)
					if down {
						f.set(errDown, false)
					}
					g := mustNew(t, f, guard.Options{FailureMode: mode, Now: c.Now, ConsecutiveFailures: 1})
					for range 3 {
						if err := tt.call(t.Context(), g); !errors.Is(err, tt.want) {
							t.Fatalf("%s: %v, want an error wrapping %v", tt.name, err, tt.want)
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

// TestOperatorAnswers: an error by which the store answers an operation (a
// request ID it does not know or that conflicts, a limit it refuses, a full
// table, a store not set up for Sluice) is returned as it is, never
// degraded, and counts as a success for the breaker.
func TestOperatorAnswers(t *testing.T) {
	for _, want := range []error{sluice.ErrUnknownRequestID, sluice.ErrRequestIDConflict, sluice.ErrInvalidLimit, sluice.ErrTooManyKeys, sluice.ErrMisconfigured} {
		for _, op := range newOps {
			t.Run(want.Error()+"/"+op.String(), func(t *testing.T) {
				c := newClock()
				f := newFlakyOps(c.Now)
				f.set(fmt.Errorf("store says: %w", want), false)
				g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, Now: c.Now, ConsecutiveFailures: 1, Timeout: time.Minute})
				for range 5 {
					if res := do(t.Context(), g, op, req); !errors.Is(res.err, want) || res.degraded() || res.allowed() {
						t.Fatalf("%v = %+v; want an error wrapping %v", op, res, want)
					}
				}
				if st := g.Status().State; st != guard.BreakerClosed {
					t.Errorf("breaker %v, want closed", st)
				}
			})
		}
	}
}

// TestOperatorFailureModes: with the store failing, each mode decides the
// multi-takes and drains, marks them degraded, returns no error, and
// reports the cause to the hook with the operation; FailLocal decides
// against the local buckets exactly as the store would against buckets of
// the local limits.
func TestOperatorFailureModes(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)}
	ll := guard.LocalLimit(l, 3) // capacity 3, 4 tokens every 3s
	r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l}
	probe := guard.DefaultProbeInterval
	open := sluice.Decision{Allowed: true, Limit: l, Degraded: true}
	closed := sluice.Decision{RetryAfter: probe, Limit: l, Degraded: true}
	for _, mode := range []guard.FailureMode{guard.FailOpen, guard.FailClosed, guard.FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			c := newClock()
			f := newFlakyOps(c.Now)
			f.set(errDown, false)
			var rec recorder
			g := mustNew(t, f, guard.Options{FailureMode: mode, LocalDivisor: 3, Now: c.Now, Hooks: rec.hooks(), Timeout: time.Minute})
			// local is what the local buckets must do: the model, under the
			// local limits.
			local := sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, time.Minute)
			epoch := c.Now()
			now := func() int64 { return int64(c.Now().Sub(epoch)) }
			localize := func(q sluice.Request) sluice.Request { q.Limit = guard.LocalLimit(q.Limit, 3); return q }
			ctx := context.WithValue(t.Context(), ctxKey{}, "request-1")
			check := func(what string, op guard.Op, allowed bool) {
				t.Helper()
				d := rec.lastDegraded()
				if !errors.Is(d.Cause, errDown) || d.FailureMode != mode || d.Allowed != allowed || d.Op != op || d.Policy != "test" {
					t.Fatalf("%s: Degraded hook got %+v; want op %v, policy test, cause %v, mode %v, allowed %v", what, d, op, errDown, mode, allowed)
				}
			}

			// Four multi-takes of the bucket k of two policies.
			for i := range 4 {
				rs := []sluice.Request{r, second(r)}
				got, err := g.TakeAll(ctx, rs)
				if err != nil {
					t.Fatalf("TakeAll %d: %+v, %v; want no error", i, got, err)
				}
				var want sluice.MultiDecision
				switch mode {
				case guard.FailOpen:
					want = sluice.MultiDecision{Allowed: true, Denied: -1, Parts: []sluice.Decision{open, open}, Degraded: true}
				case guard.FailClosed:
					want = sluice.MultiDecision{Denied: 0, RetryAfter: probe, Parts: []sluice.Decision{closed, closed}, Degraded: true}
				case guard.FailLocal:
					want, _ = local.TakeAll(now(), []sluice.Request{localize(rs[0]), localize(rs[1])})
					want.Degraded = true
					for i := range want.Parts {
						want.Parts[i].Degraded = true
					}
					if i == 3 && (want.Allowed || want.Denied != 0) {
						t.Fatalf("the model allowed a fourth multi-take of local capacity %d: %+v", ll.Capacity, want)
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("TakeAll %d = %+v, want %+v (-want +got):\n%s", i, got, want, diff)
				}
				check(fmt.Sprint("TakeAll ", i), guard.OpTakeAll, got.Allowed)
			}

			// Drains: of 2, then of 5 (above the local capacity, within the
			// store's), then of 12 (above the store's capacity too).
			c.Advance(750 * time.Millisecond) // one token back in the local buckets
			for _, cost := range []int64{2, 5, 12} {
				q := r
				q.Key, q.Cost = "drain", cost
				got, err := g.Drain(ctx, q)
				if err != nil {
					t.Fatalf("Drain(%d): %+v, %v; want no error", cost, got, err)
				}
				var want sluice.Decision
				switch mode {
				case guard.FailOpen:
					want = open
				case guard.FailClosed:
					want = closed
				case guard.FailLocal:
					want, _ = local.Drain(now(), localize(q))
					want.Degraded = true
					if cost > ll.Capacity && cost <= l.Capacity {
						// The local bucket can never hold it, the store's
						// can: a hint, as for a take above the local
						// capacity.
						want.RetryAfter = probe
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("Drain(%d) = %+v, want %+v (-want +got):\n%s", cost, got, want, diff)
				}
				check(fmt.Sprint("Drain ", cost), guard.OpDrain, got.Allowed)
			}
			if mode == guard.FailLocal {
				if d, _ := g.Peek(ctx, sluice.Request{Policy: "test", Key: "drain", Cost: 1, Limit: l}); d.Remaining != 0 {
					t.Errorf("the local bucket after draining 2, 5 and 12 holds %d, want 0", d.Remaining)
				}
			}
		})
	}
}

// TestOperatorLocalTooBig: FailLocal denies a multi-take with a part above
// its local capacity, degraded, as a take above it is, and takes nothing
// from the other parts' local buckets.
func TestOperatorLocalTooBig(t *testing.T) {
	c := newClock()
	f := newFlakyOps(c.Now)
	f.set(errDown, false)
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)}
	g := mustNew(t, f, guard.Options{LocalDivisor: 4, Now: c.Now, Timeout: time.Minute}) // local capacity 2
	small := sluice.Request{Policy: "test", Key: "small", Cost: 1, Limit: l}
	big := sluice.Request{Policy: "test", Key: "big", Cost: 3, Limit: l}
	got, err := g.TakeAll(t.Context(), []sluice.Request{small, big})
	ll := guard.LocalLimit(l, 4)
	deny := sluice.Decision{RetryAfter: guard.DefaultProbeInterval, Limit: ll, Degraded: true}
	want := sluice.MultiDecision{Denied: 0, RetryAfter: guard.DefaultProbeInterval, Parts: []sluice.Decision{deny, deny}, Degraded: true}
	if diff := cmp.Diff(want, got); err != nil || diff != "" {
		t.Fatalf("TakeAll with a part above the local capacity = %+v, %v; want %+v (-want +got):\n%s", got, err, want, diff)
	}
	if st := g.LocalStats(); st.Buckets != 0 {
		t.Errorf("%d local buckets after a refused multi-take, want 0", st.Buckets)
	}
}

// TestOperatorLocalFull: when the local table is full of buckets that are
// not full, a multi-take or a drain of a new key is denied (degraded), not
// an error, and no bucket is evicted.
func TestOperatorLocalFull(t *testing.T) {
	c := newClock()
	f := newFlakyOps(c.Now)
	f.set(errDown, false)
	g := mustNew(t, f, guard.Options{Now: c.Now, LocalMaxKeys: 2, Timeout: time.Minute})
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	for _, k := range []string{"a", "b"} {
		if d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: k, Cost: 1, Limit: l}); err != nil || !d.Allowed {
			t.Fatalf("Take(%s) = %+v, %v", k, d, err)
		}
	}
	md, err := g.TakeAll(t.Context(), []sluice.Request{{Policy: "test", Key: "a", Cost: 1, Limit: l}, {Policy: "test", Key: "c", Cost: 1, Limit: l}})
	if err != nil || md.Allowed || !md.Degraded || len(md.Parts) != 2 || md.Denied < 0 {
		t.Fatalf("TakeAll(a, c) with the local table full = %+v, %v; want a degraded denial", md, err)
	}
	d, err := g.Drain(t.Context(), sluice.Request{Policy: "test", Key: "c", Cost: 1, Limit: l})
	if err != nil || d.Allowed || !d.Degraded || d.Taken != 0 {
		t.Fatalf("Drain(c) with the local table full = %+v, %v; want a degraded denial taking nothing", d, err)
	}
	if d, _ := g.Peek(t.Context(), sluice.Request{Policy: "test", Key: "a", Cost: 1, Limit: l}); d.Remaining != 9 {
		t.Errorf("the local bucket a holds %d after a refused multi-take, want 9 (nothing taken)", d.Remaining)
	}
	if st := g.LocalStats(); st.Buckets != 2 || st.Evicted != 0 {
		t.Errorf("LocalStats() = %+v; want 2 buckets, 0 evicted", st)
	}
}

// TestRefundResetFailing: no failure mode gives tokens back or resets a
// bucket in the store's place. With the store failing, Refund and Reset
// return an error wrapping sluice.ErrUnavailable and the cause, under every
// mode, and are not degraded decisions; under FailLocal they are applied to
// the local bucket too, so that the outage's budget reflects them.
func TestRefundResetFailing(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l}
	for _, mode := range []guard.FailureMode{guard.FailOpen, guard.FailClosed, guard.FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			c := newClock()
			f := newFlakyOps(c.Now)
			var rec recorder
			g := mustNew(t, f, guard.Options{FailureMode: mode, Now: c.Now, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: rec.hooks(), Timeout: time.Minute})
			// Before the outage: the store charges 5.
			if d, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 5, Limit: l}); err != nil || d.Degraded || !d.Allowed {
				t.Fatalf("Take(5) with the store up = %+v, %v", d, err)
			}
			f.set(errDown, false)
			local := func() int64 {
				t.Helper()
				d, err := g.Peek(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l})
				if err != nil || !d.Degraded {
					t.Fatalf("Peek with the store down = %+v, %v; want a degraded decision", d, err)
				}
				return d.Remaining
			}
			// During the outage: two degraded takes of 3 (local: 10 - 6 = 4).
			for range 2 {
				if _, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 3, Limit: l}); err != nil {
					t.Fatal(err)
				}
			}
			took := sluice.Request{Policy: "test", Key: "k", Cost: 2, Limit: l, RequestID: "t1"}
			if _, err := g.Take(t.Context(), took); err != nil { // local: 2
				t.Fatal(err)
			}
			degradedBefore := len(rec.degraded)
			steps := []struct {
				name      string
				call      func() (sluice.Decision, error)
				wantLocal int64 // FailLocal: the local bucket after the call
			}{
				{"Refund(3)", func() (sluice.Decision, error) { q := r; q.Cost = 3; return g.Refund(t.Context(), q) }, 5},
				{"Refund(2) of the local take t1", func() (sluice.Decision, error) { q := took; return g.Refund(t.Context(), q) }, 7},
				{"Refund(2) of t1 again", func() (sluice.Decision, error) { q := took; return g.Refund(t.Context(), q) }, 7}, // replayed locally
				{"Refund(1) of an ID the local buckets never saw", func() (sluice.Decision, error) {
					q := r
					q.RequestID = "store-take"
					return g.Refund(t.Context(), q)
				}, 7},
				{"Refund(10)", func() (sluice.Decision, error) { q := r; q.Cost = 10; return g.Refund(t.Context(), q) }, 10},
				{"Take(6)", nil, 4},
				{"Reset", func() (sluice.Decision, error) { return sluice.Decision{}, g.Reset(t.Context(), "test", "k") }, 10},
			}
			for _, s := range steps {
				if s.call == nil {
					if _, err := g.Take(t.Context(), sluice.Request{Policy: "test", Key: "k", Cost: 6, Limit: l}); err != nil {
						t.Fatal(err)
					}
					degradedBefore++
				} else {
					d, err := s.call()
					if !errors.Is(err, sluice.ErrUnavailable) || !errors.Is(err, errDown) || d != (sluice.Decision{}) {
						t.Fatalf("%s with the store down = %+v, %v; want an error wrapping sluice.ErrUnavailable and the store's error", s.name, d, err)
					}
				}
				if mode == guard.FailLocal {
					if got := local(); got != s.wantLocal {
						t.Errorf("after %s the local bucket holds %d, want %d", s.name, got, s.wantLocal)
					}
					degradedBefore++ // the Peek
				}
			}
			if n := len(rec.degraded) - degradedBefore; n != 0 {
				t.Errorf("the Degraded hook was called %d times for refunds and resets, want 0: they are not decisions", n)
			}
			for _, c := range rec.calls {
				if (c.Op == guard.OpRefund || c.Op == guard.OpReset) && !errors.Is(c.Err, errDown) {
					t.Errorf("StoreCall hook got %+v for a failed %v, want the store's error", c, c.Op)
				}
			}
			// Back up: the store was never refunded or reset.
			f.set(nil, false)
			if d, err := g.Peek(t.Context(), r); err != nil || d.Degraded || d.Remaining != 5 {
				t.Errorf("Peek with the store back = %+v, %v; want the store's bucket at 5 (never refunded)", d, err)
			}
		})
	}
}

// TestBreakerCountsEveryOp: a failure of any operation counts for the
// breaker, and any operation can be the probe that closes it.
func TestBreakerCountsEveryOp(t *testing.T) {
	for _, op := range allOps {
		t.Run(op.String(), func(t *testing.T) {
			c := newClock()
			f := newFlakyOps(c.Now)
			g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, Now: c.Now, Timeout: time.Minute})
			f.set(errDown, false)
			for i := range guard.DefaultConsecutiveFailures {
				if st := g.Status().State; st != guard.BreakerClosed {
					t.Fatalf("breaker %v after %d failures of %v, want closed", st, i, op)
				}
				do(t.Context(), g, op, req)
			}
			if st := g.Status(); st.State != guard.BreakerOpen || !errors.Is(st.LastError, errDown) {
				t.Fatalf("Status() after %d failures of %v = %+v, want open, last error %v", guard.DefaultConsecutiveFailures, op, st, errDown)
			}
			// Open: no operation reaches the store.
			calls := f.calls.Load()
			for _, other := range allOps {
				res := do(t.Context(), g, other, req)
				switch other {
				case guard.OpRefund, guard.OpReset:
					if !errors.Is(res.err, sluice.ErrUnavailable) || !errors.Is(res.err, guard.ErrBreakerOpen) {
						t.Errorf("%v with the breaker open: %v, want an error wrapping sluice.ErrUnavailable and guard.ErrBreakerOpen", other, res.err)
					}
				default:
					if res.err != nil || !res.degraded() {
						t.Errorf("%v with the breaker open = %+v, want a degraded decision", other, res)
					}
				}
			}
			if n := f.calls.Load() - calls; n != 0 {
				t.Errorf("%d store calls with the breaker open, want 0", n)
			}
			// The probe is an op like any other.
			c.Advance(guard.DefaultProbeInterval)
			f.set(nil, false)
			if res := do(t.Context(), g, op, req); res.err != nil || res.degraded() {
				t.Errorf("%v as the probe = %+v, want the store's answer", op, res)
			}
			if st := g.Status().State; st != guard.BreakerClosed {
				t.Errorf("breaker %v after a successful %v probe, want closed", st, op)
			}
		})
	}
	// Failures of different operations add up.
	c := newClock()
	f := newFlakyOps(c.Now)
	g := mustNew(t, f, guard.Options{FailureMode: guard.FailOpen, Now: c.Now, ConsecutiveFailures: len(allOps), Timeout: time.Minute})
	f.set(errDown, false)
	for i, op := range allOps {
		if st := g.Status().State; st != guard.BreakerClosed {
			t.Fatalf("breaker %v after %d failures, want closed", st, i)
		}
		do(t.Context(), g, op, req)
	}
	if st := g.Status().State; st != guard.BreakerOpen {
		t.Errorf("breaker %v after one failure of each of %d operations, want open", st, len(allOps))
	}
}

// TestOperatorHooks: the StoreCall hook names the operation and the policy
// of each call (a multi-take's first bucket's).
func TestOperatorHooks(t *testing.T) {
	c := newClock()
	var rec recorder
	g := mustNew(t, newFlakyOps(c.Now), guard.Options{Now: c.Now, Hooks: rec.hooks(), Timeout: time.Minute})
	for _, op := range allOps {
		if res := do(t.Context(), g, op, req); res.err != nil {
			t.Fatalf("%v: %v", op, res.err)
		}
	}
	if len(rec.calls) != len(allOps) {
		t.Fatalf("StoreCall hook called %d times, want %d", len(rec.calls), len(allOps))
	}
	for i, call := range rec.calls {
		if call.Op != allOps[i] || call.Policy != req.Policy || call.Err != nil {
			t.Errorf("call %d: StoreCall hook got %+v, want op %v, policy %q, no error", i, call, allOps[i], req.Policy)
		}
	}
}
