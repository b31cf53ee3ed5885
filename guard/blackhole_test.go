package guard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/internal/faultproxy"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The black-hole tests put a real Redis (internal/redistest) behind a
// faultproxy.Proxy that drops every reply: Redis accepts the connections
// and runs the commands, and the client never hears back. They check the
// two deadline cases of package guard's documentation on real sockets,
// where the client's socket deadline, set from the context, races the
// context's own timer.

// How much later than its deadline a guarded decision may answer: the
// median within slack, every one within tail plus the worst lateness of a
// control timer (see decideInTurn). A loaded machine running the race
// detector (and other packages' tests) stalls a process now and then for
// tens of milliseconds, which the controls show only in part; the failures
// these tests catch took seconds, or were no decision at all.
const (
	slack = 10 * time.Millisecond
	tail  = 200 * time.Millisecond
)

// blackHole returns client options reaching Redis through a proxy that
// forwards until it is told to drop replies, and the proxy. It fails t if
// Redis cannot be reached through the proxy.
func blackHole(t *testing.T) (*redis.Options, *faultproxy.Proxy) {
	t.Helper()
	if testing.Short() {
		t.Skip("black-hole tests run against Redis; skipped with -short")
	}
	opts := redistest.Options(t)
	p, err := faultproxy.New(opts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	via := *opts
	via.Addr = p.Addr()
	return &via, p
}

// redisBehindBlackHole returns a redisstore with the client settings
// redisstore's documentation gives (no retries, the context's deadline on
// every socket operation), already used once through the proxy, whose
// replies are then dropped.
func redisBehindBlackHole(t *testing.T) *redisstore.Store {
	t.Helper()
	opts, p := blackHole(t)
	opts.MaxRetries = -1
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	var b [6]byte
	rand.Read(b[:])
	prefix := "sluiceblackhole:" + hex.EncodeToString(b[:]) + ":"
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		direct := redistest.Client(t)
		ctx := context.Background()
		iter := direct.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			direct.Unlink(ctx, iter.Val())
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := store.Take(ctx, req); err != nil {
		t.Fatalf("Take through the proxy before the fault: %v", err)
	}
	p.DropReplies(true)
	return store
}

// outcome is one guarded decision of the black-hole tests.
type outcome struct {
	took  time.Duration
	d     sluice.Decision
	err   error
	cause error // from the Degraded hook, nil if none
	// late is how much later than asked a 1ms sleep right after the
	// decision woke up: the machine's own scheduling delay (go test runs
	// other packages meanwhile), which the latency bounds allow for.
	late time.Duration
}

// causeKey marks a call's context with a *error the Degraded hook fills.
type causeKey struct{}

// causeHook records each degraded decision's cause in its call's context.
func causeHook(ctx context.Context, d guard.Degradation) {
	if p, ok := ctx.Value(causeKey{}).(*error); ok {
		*p = d.Cause
	}
}

// decideInTurn makes n guarded takes, one after another, each with the
// context ctx returns (and its cancel), and returns them: one caller at a
// time, so that each call reaches the store's own socket deadline rather
// than waiting behind another caller's batch.
func decideInTurn(g *guard.Store, n int, ctx func() (context.Context, context.CancelFunc)) []outcome {
	out := make([]outcome, n)
	for i := range out {
		c, cancel := ctx()
		c = context.WithValue(c, causeKey{}, &out[i].cause)
		start := time.Now()
		r := req
		r.Key = fmt.Sprint("key", i%4)
		out[i].d, out[i].err = g.Take(c, r)
		out[i].took = time.Since(start)
		cancel()
		start = time.Now()
		time.Sleep(time.Millisecond)
		out[i].late = time.Since(start) - time.Millisecond
	}
	return out
}

// checkLatency checks that the outcomes answered within their deadline:
// the median within slack, every one within tail and the worst scheduling
// delay of the controls. It logs the median and the longest.
func checkLatency(t *testing.T, what string, out []outcome, deadline time.Duration) {
	t.Helper()
	d := make([]time.Duration, len(out))
	var late time.Duration
	for i, o := range out {
		d[i] = o.took
		late = max(late, o.late)
	}
	slices.Sort(d)
	median := d[len(d)/2]
	t.Logf("%d decisions with %s: median %v, 90th percentile %v, longest %v (the control timer was up to %v late)", len(out), what, median, d[len(d)*9/10], d[len(d)-1], late)
	if median > deadline+slack {
		t.Errorf("median decision took %v, want at most %v + %v", median, deadline, slack)
	}
	for i, o := range out {
		if o.took > deadline+tail+late {
			t.Errorf("decision %d took %v, want at most %v + %v + %v", i, o.took, deadline, tail, late)
		}
	}
}

// TestBlackHoleGuardDeadline: Redis accepts and never answers; the guard's
// deadline (50ms) is the earlier one. Every decision is degraded within
// the deadline plus a few ms, and every cause wraps ErrTimeout, however the
// client reported the timeout.
func TestBlackHoleGuardDeadline(t *testing.T) {
	store := redisBehindBlackHole(t)
	g := mustNew(t, store, guard.Options{FailureMode: guard.FailClosed, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: guard.Hooks{Degraded: causeHook}})
	out := decideInTurn(g, 40, func() (context.Context, context.CancelFunc) {
		return context.WithCancel(context.Background())
	})
	checkLatency(t, "the guard's 50ms deadline first", out, guard.DefaultTimeout)
	var wrong int
	for i, o := range out {
		if o.err != nil || !o.d.Degraded || o.d.Allowed {
			t.Errorf("decision %d = %+v, %v; want a degraded denial", i, o.d, o.err)
		}
		if !errors.Is(o.cause, guard.ErrTimeout) {
			if wrong++; wrong == 1 {
				t.Errorf("decision %d: cause %v, want one wrapping ErrTimeout", i, o.cause)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d causes of the guard's timeouts do not wrap ErrTimeout", wrong, len(out))
	}
}

// TestBlackHoleCallerDeadline: Redis accepts and never answers; each
// caller's own 20ms deadline is earlier than the guard's 250ms. Every
// caller gets its own context's error at its deadline, nothing is
// degraded, and the breaker counts nothing.
func TestBlackHoleCallerDeadline(t *testing.T) {
	store := redisBehindBlackHole(t)
	var degraded sync.Map
	g := mustNew(t, store, guard.Options{
		FailureMode: guard.FailOpen,
		Timeout:     250 * time.Millisecond,
		Hooks: guard.Hooks{Degraded: func(ctx context.Context, d guard.Degradation) {
			degraded.Store(d.Cause.Error(), true)
		}},
	})
	const callerTimeout = 20 * time.Millisecond
	out := decideInTurn(g, 200, func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), callerTimeout)
	})
	checkLatency(t, "the caller's 20ms deadline first", out, callerTimeout)
	var wrong int
	for i, o := range out {
		if !errors.Is(o.err, context.DeadlineExceeded) || o.d != (sluice.Decision{}) {
			if wrong++; wrong <= 3 {
				t.Errorf("decision %d = %+v, %v after %v; want the caller's context.DeadlineExceeded", i, o.d, o.err, o.took)
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d calls past the caller's deadline did not return its error", wrong, len(out))
	}
	if st := g.Status(); st.State != guard.BreakerClosed || st.LastError != nil {
		t.Errorf("Status() = %+v, want the breaker closed and no store error", st)
	}
	degraded.Range(func(cause, _ any) bool {
		t.Errorf("degraded, cause %v; want no degraded decision", cause)
		return false
	})
}

// getStore decides with one GET per call on a go-redis client: a store
// over a client that does not take deadlines from the context.
type getStore struct{ client *redis.Client }

func (s getStore) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.client.Get(ctx, "sluiceblackhole:"+r.Key).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return sluice.Decision{}, err
	}
	return sluice.Decision{Allowed: true, Limit: r.Limit}, nil
}

func (s getStore) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

// TestBlackHoleClientIgnoringContext: a client that ignores the context's
// deadline (go-redis without ContextTimeoutEnabled, which waits for its
// ReadTimeout) still gets a guarded answer within the guard's deadline;
// the abandoned calls end when the client gives up.
func TestBlackHoleClientIgnoringContext(t *testing.T) {
	opts, p := blackHole(t)
	client := redis.NewClient(&redis.Options{Addr: opts.Addr, DB: opts.DB, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store := getStore{client}
	if _, err := store.Take(t.Context(), req); err != nil {
		t.Fatalf("GET through the proxy before the fault: %v", err)
	}
	p.DropReplies(true)
	g := mustNew(t, store, guard.Options{FailureMode: guard.FailClosed, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: guard.Hooks{Degraded: causeHook}})
	out := decideInTurn(g, 8, func() (context.Context, context.CancelFunc) {
		return context.WithCancel(context.Background())
	})
	checkLatency(t, "a client ignoring the context", out, guard.DefaultTimeout)
	for i, o := range out {
		if o.err != nil || !o.d.Degraded || o.d.Allowed || !errors.Is(o.cause, guard.ErrTimeout) {
			t.Errorf("decision %d = %+v, %v (cause %v); want a degraded denial caused by ErrTimeout", i, o.d, o.err, o.cause)
		}
	}
	if n := g.Status().Stalled; n != int64(len(out)) {
		t.Errorf("Status().Stalled = %d after %d calls the client kept waiting on, want %d", n, len(out), len(out))
	}
	checkStalledDrain(t, g, client.Close)
}

// The operations of getStore make one GET each, as its Take does.

func (s getStore) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	d, err := s.Take(ctx, rs[0])
	if err != nil {
		return sluice.MultiDecision{}, err
	}
	md := sluice.MultiDecision{Parts: make([]sluice.Decision, len(rs))}
	for i := range md.Parts {
		md.Parts[i] = d
	}
	md.Combine()
	return md, nil
}

func (s getStore) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

func (s getStore) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return s.Take(ctx, r)
}

func (s getStore) Reset(ctx context.Context, policy, key string) error {
	_, err := s.Take(ctx, sluice.Request{Policy: policy, Key: key})
	return err
}

// TestBlackHoleEveryOp: every operation, through a client that ignores
// the context's deadline, gets its guarded answer within the guard's
// deadline on real sockets: a degraded denial, or for Refund and Reset an
// error wrapping sluice.ErrUnavailable, caused by ErrTimeout.
func TestBlackHoleEveryOp(t *testing.T) {
	opts, p := blackHole(t)
	client := redis.NewClient(&redis.Options{Addr: opts.Addr, DB: opts.DB, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store := getStore{client}
	if _, err := store.Take(t.Context(), req); err != nil {
		t.Fatalf("GET through the proxy before the fault: %v", err)
	}
	p.DropReplies(true)
	g := mustNew(t, store, guard.Options{FailureMode: guard.FailClosed, ConsecutiveFailures: -1, FailurePercent: -1, Hooks: guard.Hooks{Degraded: causeHook}})
	const n = 4
	var out []outcome
	for _, op := range newOps {
		for range n {
			var o outcome
			ctx := context.WithValue(context.Background(), causeKey{}, &o.cause)
			start := time.Now()
			res := do(ctx, g, op, req)
			o.took = time.Since(start)
			o.d, o.err = res.d, res.err
			start = time.Now()
			time.Sleep(time.Millisecond)
			o.late = time.Since(start) - time.Millisecond
			switch op {
			case guard.OpRefund, guard.OpReset:
				if !errors.Is(o.err, sluice.ErrUnavailable) || !errors.Is(o.err, guard.ErrTimeout) {
					t.Errorf("%v = %v; want an error wrapping sluice.ErrUnavailable and ErrTimeout", op, o.err)
				}
			default:
				if o.err != nil || !res.degraded() || res.allowed() || !errors.Is(o.cause, guard.ErrTimeout) {
					t.Errorf("%v = %+v (cause %v); want a degraded denial caused by ErrTimeout", op, res, o.cause)
				}
			}
			out = append(out, o)
		}
	}
	checkLatency(t, "a client ignoring the context, every operation", out, guard.DefaultTimeout)
	checkStalledDrain(t, g, client.Close)
}
