package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
	"pgregory.net/rapid"
)

var _ sluice.Operator = (*pgstore.Store)(nil)

// bucketID names a bucket: (policy, key).
type bucketID struct{ policy, key string }

// modelRig drives a store and sluicetest.Model with the same operations at
// the same instants and fails on any difference in a decision or an error.
// Time is in µs after epoch, the store's tick.
type modelRig struct {
	s     *pgstore.Store
	table string
	clock *sluicetest.Clock
	conv  sluice.Conversion
	ttl   time.Duration
	m     *sluicetest.Model
	now   int64
}

// newModelRig returns a rig of a fresh store converting by conv and
// remembering request IDs for ttl, at epoch.
func newModelRig(t *testing.T, conv sluice.Conversion, ttl time.Duration) *modelRig {
	t.Helper()
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now, OnLimitChange: conv, RequestIDTTL: ttl})
	return &modelRig{s: s, table: table, clock: clock, conv: conv, ttl: ttl, m: sluicetest.NewModel(time.Microsecond, conv, ttl)}
}

// restart empties the rig's tables, lowers the sweep floor to its start,
// and starts a new model at epoch.
func (r *modelRig) restart(t tb) {
	t.Helper()
	if _, err := testPool.Exec(context.Background(), "DELETE FROM "+qualified(r.table)+"; DELETE FROM "+qualified(r.table+"_request_ids")+
		"; UPDATE "+qualified(r.table+"_floor")+" SET floor_us = -9223372036854775808"); err != nil {
		t.Fatalf("emptying %s: %v", r.table, err)
	}
	r.m = sluicetest.NewModel(time.Microsecond, r.conv, r.ttl)
	r.set(0)
}

func (r *modelRig) set(us int64) {
	r.now = us
	r.clock.Set(epoch.Add(time.Duration(us) * time.Microsecond))
}

func (r *modelRig) advance(d time.Duration) { r.set(r.now + int64(d/time.Microsecond)) }

func (r *modelRig) at() string { return (time.Duration(r.now) * time.Microsecond).String() }

func (r *modelRig) take(t tb, q sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.s.Take(context.Background(), q)
	want, werr := r.m.Take(r.now, q)
	mustMatch(t, fmt.Sprintf("Take(%s) at %s", describe(q), r.at()), got, err, want, werr)
	return got, err
}

func (r *modelRig) peek(t tb, q sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.s.Peek(context.Background(), q)
	want, werr := r.m.Peek(r.now, q)
	mustMatch(t, fmt.Sprintf("Peek(%s) at %s", describe(q), r.at()), got, err, want, werr)
	return got, err
}

func (r *modelRig) takeAll(t tb, rs []sluice.Request) (sluice.MultiDecision, error) {
	t.Helper()
	got, err := r.s.TakeAll(context.Background(), rs)
	want, werr := r.m.TakeAll(r.now, rs)
	mustMatch(t, fmt.Sprintf("TakeAll(%s) at %s", describeAll(rs), r.at()), got, err, want, werr)
	return got, err
}

func (r *modelRig) drain(t tb, q sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.s.Drain(context.Background(), q)
	want, werr := r.m.Drain(r.now, q)
	mustMatch(t, fmt.Sprintf("Drain(%s) at %s", describe(q), r.at()), got, err, want, werr)
	return got, err
}

func (r *modelRig) refund(t tb, q sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.s.Refund(context.Background(), q)
	want, werr := r.m.Refund(r.now, q)
	mustMatch(t, fmt.Sprintf("Refund(%s) at %s", describe(q), r.at()), got, err, want, werr)
	return got, err
}

func (r *modelRig) reset(t tb, policy, key string) error {
	t.Helper()
	err := r.s.Reset(context.Background(), policy, key)
	werr := r.m.Reset(r.now, policy, key)
	mustMatch(t, fmt.Sprintf("Reset(%q, %.20q) at %s", policy, key, r.at()), 0, err, 0, werr)
	return err
}

func (r *modelRig) sweep(t tb) {
	t.Helper()
	if _, err := r.s.Sweep(context.Background()); err != nil {
		t.Fatalf("Sweep at %s: %v", r.at(), err)
	}
	r.m.Sweep(r.now)
}

// checkLevels requires the stored level of each bucket of ids to be
// exactly the model's, and the store to hold a row for it exactly when
// the model holds the bucket.
func (r *modelRig) checkLevels(t tb, ids []bucketID) {
	t.Helper()
	stored := readLevels(t, r.table)
	for _, id := range ids {
		want := r.m.Level(id.policy, id.key)
		got, ok := stored[id]
		switch {
		case want == nil && ok:
			t.Fatalf("at %s, the store holds bucket %q/%q at level %v, which the model does not hold", r.at(), id.policy, id.key, got.RatString())
		case want != nil && !ok:
			t.Fatalf("at %s, the store holds no bucket %q/%q; the model's level is %v", r.at(), id.policy, id.key, want.RatString())
		case ok && got.Cmp(want) != 0:
			t.Fatalf("at %s, bucket %q/%q is stored at level %v; the model's is %v", r.at(), id.policy, id.key, got.RatString(), want.RatString())
		}
	}
}

// readLevels returns the exact level of every bucket stored in table:
// tokens + frac/p', p' = P/gcd(n, P) (1 if n = 0).
func readLevels(t tb, table string) map[bucketID]*big.Rat {
	t.Helper()
	rows, err := testPool.Query(context.Background(), "SELECT policy, key, tokens, frac, rate_tokens, period_us FROM "+qualified(table))
	if err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	levels := map[bucketID]*big.Rat{}
	var (
		policy                  string
		key                     []byte
		tokens, frac, n, period int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&policy, &key, &tokens, &frac, &n, &period}, func() error {
		per := int64(1)
		if n > 0 {
			per = period / new(big.Int).GCD(nil, nil, big.NewInt(n), big.NewInt(period)).Int64()
		}
		levels[bucketID{policy, string(key)}] = new(big.Rat).Add(new(big.Rat).SetInt64(tokens), big.NewRat(frac, per))
		return nil
	}); err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	return levels
}

// sentinels are the errors a store's error is matched by.
var sentinels = []error{
	sluice.ErrInvalidPolicy, sluice.ErrInvalidKey, sluice.ErrInvalidCost, sluice.ErrInvalidLimit,
	sluice.ErrInvalidRequestID, sluice.ErrRequestIDConflict, sluice.ErrUnknownRequestID, sluice.ErrInvalidMulti,
}

// mustMatch fails t unless got and err are want and werr: the same value,
// or errors wrapping the same sentinel (a store's error carries no
// decision).
func mustMatch[D any](t tb, call string, got D, err error, want D, werr error) {
	t.Helper()
	if werr != nil {
		for _, s := range sentinels {
			if errors.Is(werr, s) {
				if !errors.Is(err, s) {
					t.Fatalf("%s = %+v, %v; want an error wrapping %v (the model's: %v)", call, got, err, s, werr)
				}
				var zero D
				if diff := cmp.Diff(zero, got); diff != "" {
					t.Fatalf("%s = %+v with error %v; want no decision", call, got, err)
				}
				return
			}
		}
		t.Fatalf("the model's error %v for %s wraps no sentinel", werr, call)
	}
	if err != nil {
		t.Fatalf("%s: %v; want %+v (the model's)", call, err, want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%s = %+v, want %+v (the model's) (-want +got):\n%s", call, got, want, diff)
	}
}

func describe(q sluice.Request) string {
	s := fmt.Sprintf("%q/%.20q cost %d under %v", q.Policy, q.Key, q.Cost, q.Limit)
	if q.RequestID != "" {
		s += fmt.Sprintf(" ID %q", q.RequestID)
	}
	return s
}

func describeAll(rs []sluice.Request) string {
	parts := make([]string, len(rs))
	for i, q := range rs {
		parts[i] = "{" + describe(q) + "}"
	}
	return strings.Join(parts, ", ")
}

func req(policy, key string, cost int64, l sluice.Limit) sluice.Request {
	return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l}
}

func reqID(policy, key string, cost int64, l sluice.Limit, id string) sluice.Request {
	return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l, RequestID: id}
}

// TestOperationsModel is the model-based property test of the operations:
// several buckets under two policies get random takes (with and without
// request IDs), multi-takes of one to four of them (sometimes the same one
// twice, which is refused), drains (of costs up to twice the capacity),
// refunds (with and without request IDs, known, unknown, refunded
// already, or in conflict), resets, peeks and sweeps, under limits that
// change (some on either side of the bound up to which takes compute in
// bigint), with the clock moving forwards and backwards. Every decision and
// error is the model's, and after every step every bucket is stored at
// exactly the model's level, and stored exactly when the model holds it.
func TestOperationsModel(t *testing.T) {
	rigs := map[sluice.Conversion]*modelRig{}
	for _, c := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		rigs[c] = newModelRig(t, c, 10*time.Second)
	}
	var ids []bucketID
	for _, p := range []string{"a", "b"} {
		for k := range 3 {
			ids = append(ids, bucketID{p, "k" + strconv.Itoa(k)})
		}
	}
	small := rapid.Custom(func(t *rapid.T) sluice.Limit {
		return sluice.Limit{
			Capacity: rapid.Int64Range(1, 10).Draw(t, "capacity"),
			Rate: sluice.Per(rapid.Int64Range(0, 5).Draw(t, "tokens"),
				rapid.SampledFrom([]time.Duration{time.Microsecond, 7 * time.Millisecond, time.Second, time.Hour}).Draw(t, "period")),
		}
	})
	ops := map[string]int{}
	rapid.Check(t, func(rt *rapid.T) {
		r := rigs[rapid.SampledFrom([]sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens}).Draw(rt, "conversion")]
		r.restart(rt)
		limits := rapid.SliceOfN(rapid.OneOf(small, small, limitGen(), edgeLimitGen()), 1, 3).Draw(rt, "limits")
		using := map[bucketID]sluice.Limit{}
		limitOf := func(id bucketID) sluice.Limit {
			l, ok := using[id]
			if !ok || rapid.IntRange(0, 5).Draw(rt, "change limit (0)") == 0 {
				l = rapid.SampledFrom(limits).Draw(rt, "limit")
				using[id] = l
			}
			return l
		}
		cost := func(l sluice.Limit) int64 {
			return rapid.OneOf(rapid.Int64Range(1, min(l.Capacity, 3)), rapid.Int64Range(1, l.Capacity)).Draw(rt, "cost")
		}
		requestID := func() string { return "r" + strconv.Itoa(rapid.IntRange(0, 2).Draw(rt, "request ID")) }
		for range rapid.IntRange(1, 40).Draw(rt, "steps") {
			switch rapid.IntRange(0, 3).Draw(rt, "move (0 none, 1 small, 2 large, 3 back)") {
			case 1:
				r.set(r.now + rapid.Int64Range(0, 3e6).Draw(rt, "µs"))
			case 2:
				r.set(r.now + rapid.Int64Range(0, int64(10*365*24*time.Hour/time.Microsecond)).Draw(rt, "µs"))
			case 3:
				r.set(r.now - rapid.Int64Range(0, 5e6).Draw(rt, "µs back"))
			}
			id := rapid.SampledFrom(ids).Draw(rt, "bucket")
			op := rapid.SampledFrom([]string{"take", "take ID", "take all", "take all", "drain", "refund", "refund ID", "reset", "peek", "sweep"}).Draw(rt, "op")
			ops[op]++
			switch op {
			case "take":
				l := limitOf(id)
				r.take(rt, req(id.policy, id.key, cost(l), l))
			case "take ID":
				l := limitOf(id)
				r.take(rt, reqID(id.policy, id.key, cost(l), l, requestID()))
			case "take all":
				var rs []sluice.Request
				for _, id := range rapid.SliceOfN(rapid.SampledFrom(ids), 1, 4).Draw(rt, "buckets") {
					l := limitOf(id)
					rs = append(rs, req(id.policy, id.key, cost(l), l))
				}
				r.takeAll(rt, rs)
			case "drain":
				l := limitOf(id)
				c := cost(l)
				if rapid.Bool().Draw(rt, "over the capacity") && l.Capacity <= math.MaxInt64/2 {
					c += l.Capacity
				}
				r.drain(rt, req(id.policy, id.key, c, l))
			case "refund":
				l := limitOf(id)
				r.refund(rt, req(id.policy, id.key, cost(l), l))
			case "refund ID":
				l := limitOf(id)
				r.refund(rt, reqID(id.policy, id.key, cost(l), l, requestID()))
			case "reset":
				r.reset(rt, id.policy, id.key)
			case "peek":
				l := limitOf(id)
				r.peek(rt, req(id.policy, id.key, cost(l), l))
			case "sweep":
				r.sweep(rt)
			}
			r.checkLevels(rt, ids)
		}
	})
	t.Logf("operations: %v", ops)
}

// TestTakeAll: a multi-take charges every bucket or none; a denied one
// writes each bucket back as a denied take would (refilled, converted,
// created full if missing), and each part reports its own bucket.
func TestTakeAll(t *testing.T) {
	r := newModelRig(t, sluice.KeepTokens, time.Minute)
	a := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	b := sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(1)}
	all := func(rs ...sluice.Request) sluice.MultiDecision {
		t.Helper()
		md, err := r.takeAll(t, rs)
		if err != nil {
			t.Fatal(err)
		}
		return md
	}
	md := all(req(testPolicy, "a", 10, a), req("ip", "b", 3, b))
	if want := (sluice.MultiDecision{Allowed: true, Denied: -1, Parts: []sluice.Decision{
		{Allowed: true, Remaining: 0, ResetAfter: 10 * time.Second, Limit: a},
		{Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second, Limit: b},
	}}); !cmp.Equal(md, want) {
		t.Fatalf("first multi-take = %+v, want %+v", md, want)
	}
	// 2.5s later: a has 2.5 and covers 2; b has 2.5 and not 3; c is new.
	r.advance(2500 * time.Millisecond)
	c := sluice.Limit{Capacity: 4, Rate: sluice.PerSecond(2)}
	md = all(req(testPolicy, "a", 2, a), req("ip", "b", 3, b), req(testPolicy, "c", 4, c))
	if want := (sluice.MultiDecision{Denied: 1, RetryAfter: 500 * time.Millisecond, Parts: []sluice.Decision{
		{Allowed: true, Remaining: 2, ResetAfter: 7500 * time.Millisecond, Limit: a},
		{Remaining: 2, RetryAfter: 500 * time.Millisecond, ResetAfter: 500 * time.Millisecond, Limit: b},
		{Allowed: true, Remaining: 4, Limit: c},
	}}); !cmp.Equal(md, want) {
		t.Fatalf("denied multi-take = %+v, want %+v", md, want)
	}
	// Written back as denied takes: refilled and stamped at 2.5s, nothing
	// taken, the new bucket created full.
	stamp := epoch.Add(2500 * time.Millisecond).UnixMicro()
	for key, want := range map[string]row{
		// a's frac is in units of 1/p' = 1/1e6 token: 0.5 token.
		"a": {Tokens: 2, Frac: 500_000, Stamp: stamp, Capacity: 10, RateTokens: 1, PeriodMicros: 1e6, FullAt: stamp + 7_500_000},
		"c": {Tokens: 4, Frac: 0, Stamp: stamp, Capacity: 4, RateTokens: 2, PeriodMicros: 1e6, FullAt: stamp},
	} {
		if got, ok := readRow(t, r.table, key); !ok || got != want {
			t.Fatalf("after the denied multi-take, the row of %q = %+v (%v); want %+v", key, got, ok, want)
		}
	}
	r.checkLevels(t, []bucketID{{testPolicy, "a"}, {"ip", "b"}, {testPolicy, "c"}})
	// Under a's new limit: converted (kept, clamped), and the take is all
	// or nothing again.
	a2 := sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}
	r.advance(500 * time.Millisecond)
	md = all(req(testPolicy, "a", 2, a2), req("ip", "b", 3, b))
	if !md.Allowed || md.Parts[0].Remaining != 0 || md.Parts[1].Remaining != 0 {
		t.Fatalf("multi-take after the refill = %+v; want allowed, both empty", md)
	}
	r.checkLevels(t, []bucketID{{testPolicy, "a"}, {"ip", "b"}, {testPolicy, "c"}})
	if st := r.s.Stats(); st.Conversions != 1 {
		t.Fatalf("Stats().Conversions = %d after one bucket of a multi-take converted; want 1", st.Conversions)
	}
	// One part, and the longest wait decides among several short buckets.
	r.advance(time.Second)
	md = all(req(testPolicy, "a", 2, a2), req("ip", "b", 3, b), req(testPolicy, "c", 1, c))
	if md.Allowed || md.Denied != 1 || md.RetryAfter != 2*time.Second {
		t.Fatalf("two short buckets = %+v; want denied by part 1 (b, 2s)", md)
	}
	never := sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}
	all(req(testPolicy, "n", 1, never))
	md = all(req(testPolicy, "a", 2, a2), req(testPolicy, "n", 1, never))
	if md.Allowed || md.Denied != 1 || md.RetryAfter != sluice.Never {
		t.Fatalf("a bucket that never refills = %+v; want denied by part 1, Never", md)
	}
}

// TestDrain: a drain takes what is there up to its cost, which may exceed
// the capacity, and creates a missing bucket as a take does.
func TestDrain(t *testing.T) {
	r := newModelRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	drain := func(cost int64, want sluice.Decision) {
		t.Helper()
		q := req(testPolicy, "k", cost, l)
		if got, err := r.drain(t, q); err != nil || got != want {
			t.Fatalf("Drain(%s) = %+v, %v; want %+v", describe(q), got, err, want)
		}
		r.checkLevels(t, []bucketID{{testPolicy, "k"}})
	}
	drain(4, sluice.Decision{Allowed: true, Remaining: 6, ResetAfter: 2 * time.Second, Taken: 4, Limit: l})
	if got, ok := readRow(t, r.table, "k"); !ok || got.Tokens != 6 || got.Stamp != epoch.UnixMicro() {
		t.Fatalf("the row after draining a new bucket = %+v (%v); want 6 tokens stamped at the drain", got, ok)
	}
	drain(8, sluice.Decision{Remaining: 0, RetryAfter: 4 * time.Second, ResetAfter: 5 * time.Second, Taken: 6, Limit: l})
	drain(1, sluice.Decision{Remaining: 0, RetryAfter: 500 * time.Millisecond, ResetAfter: 5 * time.Second, Limit: l})
	r.advance(5 * time.Second)
	drain(math.MaxInt64, sluice.Decision{Remaining: 0, RetryAfter: sluice.Never, ResetAfter: 5 * time.Second, Taken: 10, Limit: l})
	// A bucket that never refills; a drain of a new bucket beyond its
	// capacity.
	never := sluice.Limit{Capacity: 3, Rate: sluice.Per(0, time.Second)}
	q := req(testPolicy, "n", 5, never)
	if got, err := r.drain(t, q); err != nil || got != (sluice.Decision{RetryAfter: sluice.Never, ResetAfter: sluice.Never, Taken: 3, Limit: never}) {
		t.Fatalf("Drain(%s) = %+v, %v", describe(q), got, err)
	}
	r.checkLevels(t, []bucketID{{testPolicy, "k"}, {testPolicy, "n"}})
}

// TestRefund: a refund gives tokens back, never above the capacity, and
// never creates a bucket; with a request ID it undoes that take once, and
// marks the record; once the ID's TTL has ended and a new take has reused
// it, the new take can be refunded.
func TestRefund(t *testing.T) {
	r := newModelRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	refund := func(q sluice.Request, want sluice.Decision) {
		t.Helper()
		if got, err := r.refund(t, q); err != nil || got != want {
			t.Fatalf("Refund(%s) = %+v, %v; want %+v", describe(q), got, err, want)
		}
		r.checkLevels(t, []bucketID{{testPolicy, "k"}, {testPolicy, "missing"}})
	}
	back := func(remaining, n int64, replay bool) sluice.Decision {
		return sluice.Decision{Allowed: true, Remaining: remaining, ResetAfter: time.Duration(10-remaining) * time.Hour, Taken: -n, Limit: l, Replayed: replay}
	}
	refund(req(testPolicy, "missing", 3, l), back(10, 0, false))
	if _, ok := readRow(t, r.table, "missing"); ok {
		t.Fatalf("a refund to a missing bucket created it")
	}
	if _, err := r.take(t, req(testPolicy, "k", 7, l)); err != nil {
		t.Fatal(err)
	}
	refund(req(testPolicy, "k", 2, l), back(5, 2, false))
	refund(req(testPolicy, "k", 9, l), back(10, 5, false))
	if _, err := r.take(t, reqID(testPolicy, "k", 4, l, "order-1")); err != nil {
		t.Fatal(err)
	}
	if refunded(t, r.table, "k", "order-1") {
		t.Fatalf("the record of a take that was not refunded says it was")
	}
	refund(reqID(testPolicy, "k", 3, l, "order-1"), back(9, 3, false))
	if !refunded(t, r.table, "k", "order-1") {
		t.Fatalf("the record of a refunded take does not say so")
	}
	refund(reqID(testPolicy, "k", 3, l, "order-1"), back(9, 0, true))
	if got, err := r.take(t, reqID(testPolicy, "k", 4, l, "order-1")); err != nil || !got.Replayed {
		t.Fatalf("retry of the refunded take = %+v, %v; want its replay", got, err)
	}
	// The partial refund used the ID up. A refund whose whole tokens reach
	// the capacity fills the bucket exactly: 0.5 + 10 is 10.
	r.advance(30 * time.Minute)
	if _, err := r.take(t, req(testPolicy, "k", 9, l)); err != nil {
		t.Fatal(err)
	}
	refund(req(testPolicy, "k", 10, l), back(10, 10, false))
	// After the TTL the ID is unknown; a new take with it is refundable.
	r.advance(time.Minute)
	if _, err := r.refund(t, reqID(testPolicy, "k", 1, l, "order-1")); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("refund after the TTL = %v; want %v", err, sluice.ErrUnknownRequestID)
	}
	if got, err := r.take(t, reqID(testPolicy, "k", 2, l, "order-1")); err != nil || got.Replayed {
		t.Fatalf("a take reusing the expired ID = %+v, %v; want a new decision", got, err)
	}
	refund(reqID(testPolicy, "k", 2, l, "order-1"), back(10, 2, false))
	// Unknown and conflicting IDs change nothing.
	if _, err := r.take(t, reqID(testPolicy, "k", 5, l, "order-2")); err != nil {
		t.Fatal(err)
	}
	before, beforeIDs := readTables(t, r.table)
	for _, c := range []struct {
		q    sluice.Request
		want error
	}{
		{reqID(testPolicy, "k", 6, l, "order-2"), sluice.ErrRequestIDConflict},
		{reqID(testPolicy, "k", 5, sluice.Limit{Capacity: 10, Rate: sluice.Per(2, time.Hour)}, "order-2"), sluice.ErrRequestIDConflict},
		{reqID(testPolicy, "k", 1, l, "never"), sluice.ErrUnknownRequestID},
		{reqID(testPolicy, "other", 1, l, "order-2"), sluice.ErrUnknownRequestID},
		{reqID("other", "k", 1, l, "order-2"), sluice.ErrUnknownRequestID},
	} {
		if _, err := r.refund(t, c.q); !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.q.RequestID) {
			t.Fatalf("Refund(%s) = %v; want %v naming the ID", describe(c.q), err, c.want)
		}
	}
	after, afterIDs := readTables(t, r.table)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Fatalf("refused refunds changed the buckets (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(beforeIDs, afterIDs); diff != "" || refunded(t, r.table, "k", "order-2") {
		t.Fatalf("refused refunds changed the request IDs (-before +after):\n%s", diff)
	}
}

// refunded reads the refunded mark of the request ID record (testPolicy,
// key, id) in table.
func refunded(t *testing.T, table, key, id string) bool {
	t.Helper()
	var done bool
	if err := testPool.QueryRow(context.Background(), "SELECT refunded FROM "+qualified(table+"_request_ids")+" WHERE policy = $1 AND key = $2 AND request_id = $3",
		testPolicy, []byte(key), []byte(id)).Scan(&done); err != nil {
		t.Fatalf("reading the record of %q/%q: %v", key, id, err)
	}
	return done
}

// TestConcurrentRefundOnce: many callers refund one request ID at once, on
// a bucket that exists and on one that was swept since the take: exactly
// one refund gives tokens back, the others are replays that give nothing.
func TestConcurrentRefundOnce(t *testing.T) {
	const callers = 16
	clock := sluicetest.NewClock(epoch)
	s, table := newStoreTable(t, pgstore.Options{Now: clock.Now, RequestIDTTL: 2 * time.Hour, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 100, Rate: sluice.Per(1, time.Minute)}
	for _, swept := range []bool{false, true} {
		key := fmt.Sprintf("swept=%v", swept)
		q := reqID(testPolicy, key, 40, l, "order")
		if _, err := s.Take(ctx, q); err != nil {
			t.Fatal(err)
		}
		want := int64(-40)
		if swept {
			clock.Set(clock.Now().Add(time.Hour))
			if _, err := s.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if _, ok := readRow(t, table, key); ok {
				t.Fatalf("the sweep left the full bucket %q", key)
			}
			want = 0
		}
		ds := make([]sluice.Decision, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() { ds[i], errs[i] = s.Refund(ctx, q) })
		}
		wg.Wait()
		var first []sluice.Decision
		for i, d := range ds {
			if errs[i] != nil {
				t.Fatalf("Refund(%s): %v", describe(q), errs[i])
			}
			if !d.Replayed {
				first = append(first, d)
			} else if d.Taken != 0 || d.Remaining != 100 {
				t.Fatalf("a replayed refund = %+v; want nothing given, 100 remaining", d)
			}
		}
		if len(first) != 1 || first[0].Taken != want || first[0].Remaining != 100 {
			t.Fatalf("%s: the refunds that were not replays: %+v; want one giving %d back, 100 remaining", key, first, -want)
		}
		if _, ok := readRow(t, table, key); ok == swept {
			t.Fatalf("%s: after the refunds, the bucket's row is there: %v; want %v", key, ok, !swept)
		}
	}
}

// TestReset: a reset bucket is full under its limit, stamped no earlier
// than it was, and swept like any full bucket; a missing one stays
// missing; request IDs are kept.
func TestReset(t *testing.T) {
	r := newModelRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Hour)}
	keys := []bucketID{{testPolicy, "k"}, {testPolicy, "missing"}, {"other", "k"}}
	if _, err := r.take(t, reqID(testPolicy, "k", 5, l, "login-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.take(t, req("other", "k", 5, l)); err != nil {
		t.Fatal(err)
	}
	r.advance(10 * time.Second)
	if err := r.reset(t, testPolicy, "k"); err != nil {
		t.Fatal(err)
	}
	stamp := epoch.Add(10 * time.Second).UnixMicro()
	want := row{Tokens: 5, Stamp: stamp, Capacity: 5, RateTokens: 1, PeriodMicros: 3_600_000_000, FullAt: stamp}
	if got, ok := readRow(t, r.table, "k"); !ok || got != want {
		t.Fatalf("the row after a reset = %+v (%v); want %+v", got, ok, want)
	}
	if err := r.reset(t, testPolicy, "missing"); err != nil {
		t.Fatal(err)
	}
	r.checkLevels(t, keys)
	if got, err := r.take(t, reqID(testPolicy, "k", 5, l, "login-1")); err != nil || !got.Replayed {
		t.Fatalf("retry of a take before the reset = %+v, %v; want its replay", got, err)
	}
	if _, err := r.take(t, req(testPolicy, "k", 2, l)); err != nil {
		t.Fatal(err)
	}
	// The clock behind the stamp: the stamp stays.
	r.advance(-time.Minute)
	if err := r.reset(t, testPolicy, "k"); err != nil {
		t.Fatal(err)
	}
	if got, ok := readRow(t, r.table, "k"); !ok || got != want {
		t.Fatalf("the row after a reset with the clock behind = %+v (%v); want %+v", got, ok, want)
	}
	if _, err := r.take(t, req(testPolicy, "k", 1, l)); err != nil {
		t.Fatal(err)
	}
	if err := r.reset(t, testPolicy, "k"); err != nil {
		t.Fatal(err)
	}
	r.checkLevels(t, keys)
	// A sweep at the stamp deletes the reset bucket, not the other one.
	r.advance(time.Minute)
	r.sweep(t)
	r.checkLevels(t, keys)
	if _, ok := readRow(t, r.table, "k"); ok {
		t.Fatalf("a sweep left the reset bucket")
	}
}

// TestOpsBadInput: bad input to each operation is an error wrapping its
// sentinel that names the value, and changes no row.
func TestOpsBadInput(t *testing.T) {
	r := newModelRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	ns := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, 1500*time.Nanosecond)} // not whole µs
	if _, err := r.take(t, reqID(testPolicy, "k", 4, l, "x")); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("k", sluice.MaxKeyLen+1)
	tooMany := make([]sluice.Request, sluice.MaxParts+1)
	for i := range tooMany {
		tooMany[i] = req(testPolicy, "m"+strconv.Itoa(i), 1, l)
	}
	before, beforeIDs := readTables(t, r.table)
	calls := []struct {
		name string
		call func() error
		want error
		says string
	}{
		{"TakeAll of none", func() error { _, err := r.takeAll(t, nil); return err }, sluice.ErrInvalidMulti, "1 to 16"},
		{"TakeAll of 17", func() error { _, err := r.takeAll(t, tooMany); return err }, sluice.ErrInvalidMulti, "17"},
		{"TakeAll of one bucket twice", func() error {
			_, err := r.takeAll(t, []sluice.Request{req(testPolicy, "k", 1, l), req(testPolicy, "j", 1, l), req(testPolicy, "k", 2, l)})
			return err
		}, sluice.ErrInvalidMulti, "buckets 0 and 2"},
		{"TakeAll with a bad cost", func() error {
			_, err := r.takeAll(t, []sluice.Request{req(testPolicy, "k", 1, l), req(testPolicy, "j", 11, l)})
			return err
		}, sluice.ErrInvalidCost, "bucket 1"},
		{"TakeAll with a request ID", func() error { _, err := r.takeAll(t, []sluice.Request{reqID(testPolicy, "k", 1, l, "x")}); return err }, sluice.ErrInvalidRequestID, "bucket 0"},
		{"TakeAll with a long key", func() error {
			_, err := r.takeAll(t, []sluice.Request{req(testPolicy, "k", 1, l), req(testPolicy, huge, 1, l)})
			return err
		}, sluice.ErrInvalidKey, "513"},
		{"TakeAll with a limit of another unit", func() error {
			_, err := r.takeAll(t, []sluice.Request{req(testPolicy, "k", 1, l), req(testPolicy, "j", 1, ns)})
			return err
		}, sluice.ErrInvalidLimit, "bucket 1"},
		{"Drain of 0", func() error { _, err := r.drain(t, req(testPolicy, "k", 0, l)); return err }, sluice.ErrInvalidCost, "0"},
		{"Drain with a request ID", func() error { _, err := r.drain(t, reqID(testPolicy, "k", 1, l, "x")); return err }, sluice.ErrInvalidRequestID, "drain"},
		{"Drain under a limit of another unit", func() error { _, err := r.drain(t, req(testPolicy, "k", 1, ns)); return err }, sluice.ErrInvalidLimit, "microseconds"},
		{"Drain with no policy", func() error { _, err := r.drain(t, req("", "k", 1, l)); return err }, sluice.ErrInvalidPolicy, "empty"},
		{"Refund over the capacity", func() error { _, err := r.refund(t, req(testPolicy, "k", 11, l)); return err }, sluice.ErrInvalidCost, "11"},
		{"Refund of 0", func() error { _, err := r.refund(t, req(testPolicy, "k", 0, l)); return err }, sluice.ErrInvalidCost, "0"},
		{"Refund under a limit of another unit", func() error { _, err := r.refund(t, req(testPolicy, "k", 1, ns)); return err }, sluice.ErrInvalidLimit, "microseconds"},
		{"Refund of an unknown ID", func() error { _, err := r.refund(t, reqID(testPolicy, "k", 1, l, "y")); return err }, sluice.ErrUnknownRequestID, `"y"`},
		{"Refund of more than the take", func() error { _, err := r.refund(t, reqID(testPolicy, "k", 5, l, "x")); return err }, sluice.ErrRequestIDConflict, "took 4"},
		{"Reset with no policy", func() error { return r.reset(t, "", "k") }, sluice.ErrInvalidPolicy, "empty"},
		{"Reset with a bad policy", func() error { return r.reset(t, "a b", "k") }, sluice.ErrInvalidPolicy, "0x20"},
		{"Reset with no key", func() error { return r.reset(t, testPolicy, "") }, sluice.ErrInvalidKey, "empty"},
		{"Reset with a long key", func() error { return r.reset(t, testPolicy, huge) }, sluice.ErrInvalidKey, "513"},
	}
	for _, c := range calls {
		err := c.call()
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s = %v; want an error wrapping %v that says %q", c.name, err, c.want, c.says)
		}
	}
	after, afterIDs := readTables(t, r.table)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("bad input changed the buckets (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(beforeIDs, afterIDs); diff != "" {
		t.Errorf("bad input changed the request IDs (-before +after):\n%s", diff)
	}
	if refunded(t, r.table, "k", "x") {
		t.Errorf("a refused refund marked the request ID refunded")
	}
}

// TestConcurrentTakeAllDatabaseClock floods a multi-take of two buckets,
// of capacity 1,000 and 300 refilling 1 token an hour (less than one
// token refills during the test), from 64 goroutines on the database
// clock, half of them listing the buckets in the other order: exactly 300
// are allowed, every allowed one sees levels no other saw, every denied
// one sees 700 and 0 (no multi-take was half done), and no two
// deadlocked.
func TestConcurrentTakeAllDatabaseClock(t *testing.T) {
	const workers, takes = 64, 10
	s := newStore(t, pgstore.Options{StatementTimeout: time.Minute, LockTimeout: time.Minute})
	big := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1, time.Hour)}
	small := sluice.Limit{Capacity: 300, Rate: sluice.Per(1, time.Hour)}
	tenant, user := req("tenant", "acme", 1, big), req("user", "alice", 1, small)
	ctx := context.Background()
	var (
		mu         sync.Mutex
		seen       [2][]int64 // Remaining of tenant, user in allowed takes
		bad        []string
		errs       []error
		wg         sync.WaitGroup
		start      = time.Now()
		reversedAt = workers / 2
	)
	for w := range workers {
		wg.Go(func() {
			rs, ti, ui := []sluice.Request{tenant, user}, 0, 1
			if w >= reversedAt {
				rs, ti, ui = []sluice.Request{user, tenant}, 1, 0
			}
			for range takes {
				md, err := s.TakeAll(ctx, rs)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case md.Allowed:
					seen[0] = append(seen[0], md.Parts[ti].Remaining)
					seen[1] = append(seen[1], md.Parts[ui].Remaining)
				case md.Denied != ui || !md.Parts[ti].Allowed || md.Parts[ti].Remaining != 700 || md.Parts[ui].Remaining != 0:
					bad = append(bad, fmt.Sprintf("%+v", md))
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d×%d multi-takes in %v (%.0f/s)", workers, takes, elapsed, workers*takes/elapsed.Seconds())
	if len(errs) > 0 {
		t.Fatalf("TakeAll failed %d times, first: %v", len(errs), errs[0])
	}
	if elapsed > 30*time.Minute {
		t.Fatalf("the test took %v: more than one token may have refilled", elapsed)
	}
	if len(bad) > 0 {
		t.Fatalf("%d denials saw other levels than 700 and 0 with the user's bucket denying, first: %s", len(bad), bad[0])
	}
	if got := len(seen[1]); got != 300 {
		t.Fatalf("%d×%d concurrent multi-takes of (1000, 300) allowed %d, want exactly 300", workers, takes, got)
	}
	for i, lo := range []int64{700, 0} {
		slices.Sort(seen[i])
		for j, r := range seen[i] {
			if r != lo+int64(j) {
				t.Fatalf("bucket %d: the allowed multi-takes saw Remaining %d twice or not at all", i, lo+int64(j))
			}
		}
	}
	for _, c := range []struct {
		q    sluice.Request
		want int64
	}{{tenant, 700}, {user, 0}} {
		if d, err := s.Peek(ctx, c.q); err != nil || d.Remaining != c.want {
			t.Fatalf("Peek(%s) after the flood = %+v, %v; want Remaining %d", describe(c.q), d, err, c.want)
		}
	}
}

// TestTakeAllLockOrder: multi-takes that name the same buckets in
// different orders, from 16 goroutines at once, never deadlock (a
// deadlock would fail one of them with SQLSTATE 40P01 after
// deadlock_timeout; the lock timeout is longer than that), and every one
// of them is charged exactly once.
func TestTakeAllLockOrder(t *testing.T) {
	const workers, takes = 16, 40
	s := newStore(t, pgstore.Options{StatementTimeout: time.Minute, LockTimeout: time.Minute})
	l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(0, time.Second)}
	keys := []bucketID{{"a", "1"}, {"a", "2"}, {"b", "1"}, {"b", "0"}}
	ctx := context.Background()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range takes {
				// Every order of the four buckets over the run; new
				// buckets too, so that inserts race as well.
				perm := permutation(len(keys), w*takes+i)
				rs := []sluice.Request{req("new", strconv.Itoa(i), 1, l)}
				for _, j := range perm {
					rs = append(rs, req(keys[j].policy, keys[j].key, 1, l))
				}
				if w%2 == 1 {
					slices.Reverse(rs)
				}
				md, err := s.TakeAll(ctx, rs)
				if err == nil && !md.Allowed {
					err = fmt.Errorf("denied: %+v", md)
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent multi-takes in different orders: %v", err)
	}
	for _, k := range keys {
		d, err := s.Peek(ctx, req(k.policy, k.key, 1, l))
		if want := l.Capacity - workers*takes; err != nil || d.Remaining != want {
			t.Fatalf("Peek(%q/%q) = %+v, %v; want Remaining %d", k.policy, k.key, d, err, want)
		}
	}
}

// permutation returns the n-th permutation of 0..k-1 (mod k!).
func permutation(k, n int) []int {
	rest := make([]int, k)
	for i := range rest {
		rest[i] = i
	}
	var p []int
	for i := k; i > 0; i-- {
		j := n % i
		n /= i
		p = append(p, rest[j])
		rest = slices.Delete(rest, j, j+1)
	}
	return p
}

// TestOpsLockWaits: a multi-take, a drain and a refund that find a bucket
// locked by another transaction wait for it, decide, and count the wait
// in Stats, as a take does.
func TestOpsLockWaits(t *testing.T) {
	ops := []struct {
		name string
		fn   string // the function's suffix
		call func(s *pgstore.Store) error
	}{
		{"TakeAll", "_take_all", func(s *pgstore.Store) error {
			_, err := s.TakeAll(context.Background(), []sluice.Request{req(testPolicy, "j", 1, testLimit), req(testPolicy, "k", 1, testLimit)})
			return err
		}},
		{"Drain", "_take_all", func(s *pgstore.Store) error {
			_, err := s.Drain(context.Background(), req(testPolicy, "k", 20, testLimit))
			return err
		}},
		{"Refund", "_refund", func(s *pgstore.Store) error {
			_, err := s.Refund(context.Background(), req(testPolicy, "k", 1, testLimit))
			return err
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			ctx := context.Background()
			s, table := newStoreTable(t, pgstore.Options{StatementTimeout: time.Minute, LockTimeout: time.Minute})
			if _, err := s.Take(ctx, req(testPolicy, "k", 3, testLimit)); err != nil {
				t.Fatal(err)
			}
			if err := op.call(s); err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.LockWaits != 0 {
				t.Fatalf("after decisions on free buckets, Stats() = %+v; want no lock waits", st)
			}
			tx, err := testPool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SELECT 1 FROM "+qualified(table)+" WHERE key = $1 FOR UPDATE", []byte("k")); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- op.call(s) }()
			waitForLockWaitIn(t, table+op.fn)
			time.Sleep(lockHold)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s after waiting: %v", op.name, err)
			}
			elapsed := time.Since(start)
			st := s.Stats()
			if st.LockWaits != 1 || st.LockWaitSeconds < lockHold.Seconds() || st.LockWaitSeconds > elapsed.Seconds() {
				t.Errorf("after one %s that waited %v of %v, Stats() = %+v; want LockWaits 1 and that wait", op.name, lockHold, elapsed, st)
			}
		})
	}
}

// waitForLockWaitIn returns once a session running the store function fn
// (a table name with its suffix) waits for a lock, and fails t if none
// does within 10s.
func waitForLockWaitIn(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := testPool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE $1",
			"%"+pgx.Identifier{testSchema, fn}.Sanitize()+"%").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call of %s waited for a lock within 10s", fn)
		}
		time.Sleep(time.Millisecond)
	}
}
