package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// modelRig drives a Store and a sluicetest.Model with the same calls at the
// same clock readings and fails on the first difference.
type modelRig struct {
	t    *testing.T
	s    *memstore.Store
	m    *sluicetest.Model
	clk  *clock
	base time.Time
	ctx  context.Context
}

// newModelRig returns a rig whose store is built with o, its clock and
// sweeps driven by the rig.
func newModelRig(t *testing.T, o memstore.Options) *modelRig {
	t.Helper()
	clk := newClock()
	o.Now, o.SweepInterval = clk.Now, -1
	ttl := o.RequestIDTTL
	if ttl == 0 {
		ttl = memstore.DefaultRequestIDTTL
	}
	return &modelRig{
		t:    t,
		s:    newStore(t, o),
		m:    sluicetest.NewModel(time.Nanosecond, o.OnLimitChange, ttl),
		clk:  clk,
		base: clk.Now(),
		ctx:  context.Background(),
	}
}

// now is the clock's reading in the model's ticks (nanoseconds since the
// store was built).
func (r *modelRig) now() int64 { return int64(r.clk.Now().Sub(r.base)) }

func (r *modelRig) advance(d time.Duration) { r.clk.Advance(d) }

func (r *modelRig) take(q sluice.Request) (sluice.Decision, error) {
	r.t.Helper()
	got, err := r.s.Take(r.ctx, q)
	want, wantErr := r.m.Take(r.now(), q)
	r.same(fmt.Sprintf("Take(%+v)", q), got, err, want, wantErr)
	return got, err
}

func (r *modelRig) peek(q sluice.Request) (sluice.Decision, error) {
	r.t.Helper()
	got, err := r.s.Peek(r.ctx, q)
	want, wantErr := r.m.Peek(r.now(), q)
	r.same(fmt.Sprintf("Peek(%+v)", q), got, err, want, wantErr)
	return got, err
}

func (r *modelRig) takeAll(rs ...sluice.Request) (sluice.MultiDecision, error) {
	r.t.Helper()
	got, err := r.s.TakeAll(r.ctx, rs)
	want, wantErr := r.m.TakeAll(r.now(), rs)
	call := fmt.Sprintf("TakeAll(%+v) at %v", rs, r.clk.Now().Sub(r.base))
	if msg := differ(got, err, want, wantErr); msg != "" {
		r.t.Fatalf("%s%s", call, msg)
	}
	return got, err
}

func (r *modelRig) drain(q sluice.Request) (sluice.Decision, error) {
	r.t.Helper()
	got, err := r.s.Drain(r.ctx, q)
	want, wantErr := r.m.Drain(r.now(), q)
	r.same(fmt.Sprintf("Drain(%+v)", q), got, err, want, wantErr)
	return got, err
}

func (r *modelRig) refund(q sluice.Request) (sluice.Decision, error) {
	r.t.Helper()
	got, err := r.s.Refund(r.ctx, q)
	want, wantErr := r.m.Refund(r.now(), q)
	r.same(fmt.Sprintf("Refund(%+v)", q), got, err, want, wantErr)
	return got, err
}

func (r *modelRig) reset(policy, key string) error {
	r.t.Helper()
	err := r.s.Reset(r.ctx, policy, key)
	wantErr := r.m.Reset(r.now(), policy, key)
	r.same(fmt.Sprintf("Reset(%q, %q)", policy, key), sluice.Decision{}, err, sluice.Decision{}, wantErr)
	return err
}

// sweep sweeps the store and the model at the clock's reading.
func (r *modelRig) sweep() {
	r.s.SweepNow()
	r.m.Sweep(r.now())
}

func (r *modelRig) same(call string, got sluice.Decision, err error, want sluice.Decision, wantErr error) {
	r.t.Helper()
	if msg := differ(got, err, want, wantErr); msg != "" {
		r.t.Fatalf("%s at %v%s", call, r.clk.Now().Sub(r.base), msg)
	}
}

// differ returns "" if (got, err) equals (want, wantErr): equal results, or
// errors wrapping the same sluice sentinel; else the end of a failure
// message.
func differ[D any](got D, err error, want D, wantErr error) string {
	if wantErr != nil {
		target := sentinel(wantErr)
		if !errors.Is(err, target) {
			return fmt.Sprintf(" = %+v, %v; want error %v (the model's: %v)", got, err, target, wantErr)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf(": error %v; want %+v", err, want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		return fmt.Sprintf(" = %+v, want the model's %+v (-want +got):\n%s", got, want, diff)
	}
	return ""
}

var sentinels = []error{
	sluice.ErrInvalidPolicy, sluice.ErrInvalidKey, sluice.ErrInvalidCost, sluice.ErrInvalidLimit,
	sluice.ErrInvalidRequestID, sluice.ErrRequestIDConflict, sluice.ErrUnknownRequestID,
	sluice.ErrInvalidMulti, sluice.ErrTooManyKeys,
}

// sentinel returns the sluice sentinel err wraps, or err itself.
func sentinel(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

func rq(policy, key string, cost int64, l sluice.Limit) sluice.Request {
	return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l}
}

func rqID(policy, key string, cost int64, l sluice.Limit, id string) sluice.Request {
	return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l, RequestID: id}
}

// shardLayouts are the stores the sequence tests run on: one shard, so
// that every bucket of a multi-take shares it, and many.
var shardLayouts = []struct {
	name   string
	shards int
}{{"one shard", 1}, {"256 shards", 256}}

// A multi-take charges every bucket or none; a denial names the bucket
// with the longest wait and writes back each bucket's refilled state, a
// bucket it created included, as the model does.
func TestTakeAll(t *testing.T) {
	a := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	b := sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(1)}
	for _, layout := range shardLayouts {
		t.Run(layout.name, func(t *testing.T) {
			r := newModelRig(t, memstore.Options{Shards: layout.shards})
			rs := func(ca, cb int64) []sluice.Request {
				return []sluice.Request{rq("tenant", "t1", ca, a), rq("ip", "10.0.0.1", cb, b), rq("tenant", "t2", 1, a)}
			}
			md, err := r.takeAll(rs(4, 3)...)
			if err != nil || !md.Allowed || md.Denied != -1 || md.Parts[0].Remaining != 6 || md.Parts[1].Remaining != 0 || md.Parts[2].Remaining != 9 {
				t.Fatalf("first multi-take = %+v, %v; want allowed with 6, 0, 9 left", md, err)
			}
			md, _ = r.takeAll(rs(4, 1)...)
			if md.Allowed || md.Denied != 1 || md.RetryAfter != time.Second || !md.Parts[0].Allowed || md.Parts[0].Remaining != 6 {
				t.Fatalf("multi-take with bucket 1 empty = %+v; want denied by part 1 after 1s, part 0 covering but not charged", md)
			}
			// Two short: the longer wait decides.
			md, _ = r.takeAll(rs(10, 2)...)
			if md.Allowed || md.Denied != 0 || md.RetryAfter != 4*time.Second {
				t.Fatalf("multi-take with two buckets short = %+v; want denied by part 0 after 4s", md)
			}
			// A denied multi-take creates its missing buckets, full, as a
			// take would: with the clock stepped back, the new bucket's
			// stamp counts.
			before := r.s.Stats().Buckets
			md, _ = r.takeAll(rq("tenant", "new", 1, a), rq("ip", "10.0.0.1", 1, b))
			if md.Allowed || r.s.Stats().Buckets != before+1 {
				t.Fatalf("denied multi-take with a new bucket = %+v, %d buckets; want denied, %d buckets", md, r.s.Stats().Buckets, before+1)
			}
			r.advance(-500 * time.Millisecond)
			r.take(rq("tenant", "new", 10, a))
			r.advance(4500 * time.Millisecond)
			r.takeAll(rs(10, 2)...)
			r.takeAll(rs(1, 1)...)
			// Sweeps between multi-takes, and readings older than the sweep.
			r.advance(time.Minute)
			r.sweep()
			r.advance(-30 * time.Second)
			r.takeAll(rs(3, 3)...)
			r.takeAll(rq("ip", "10.0.0.1", 1, b), rq("tenant", "fresh", 10, a))
			r.advance(time.Second)
			r.takeAll(rq("tenant", "fresh", 1, a), rq("ip", "10.0.0.1", 1, b))
		})
	}
}

// Each part of a multi-take is brought to its request's limit as a take of
// it would be, allowed or not, and counted in Stats.Conversions.
func TestTakeAllConvertsLimits(t *testing.T) {
	small := sluice.Limit{Capacity: 4, Rate: sluice.PerSecond(1)}
	big := sluice.Limit{Capacity: 40, Rate: sluice.PerSecond(2)}
	for _, conv := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		t.Run(conv.String(), func(t *testing.T) {
			r := newModelRig(t, memstore.Options{OnLimitChange: conv, Shards: 1})
			r.takeAll(rq("api", "a", 3, small), rq("api", "b", 1, small), rq("api", "e", 4, small))
			r.advance(300 * time.Millisecond)
			r.takeAll(rq("api", "a", 1, big), rq("api", "b", 1, small))
			if got := r.s.Stats().Conversions; got != 1 {
				t.Fatalf("Stats().Conversions = %d after a multi-take changed one limit, want 1", got)
			}
			// Denied (e has 0.3 tokens), still converted.
			md, _ := r.takeAll(rq("api", "a", 1, small), rq("api", "b", 4, big), rq("api", "c", 4, small), rq("api", "e", 1, small))
			if md.Allowed {
				t.Fatalf("multi-take with e short = %+v; want denied", md)
			}
			if got := r.s.Stats().Conversions; got != 3 {
				t.Fatalf("Stats().Conversions = %d after a denied multi-take changed two limits, want 3", got)
			}
			r.advance(time.Second)
			r.take(rq("api", "a", 1, small))
			r.take(rq("api", "b", 1, big))
		})
	}
}

// A drain takes what is there, up to its cost, which may exceed the
// capacity.
func TestDrain(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	r := newModelRig(t, memstore.Options{})
	d, err := r.drain(rq("api", "k", 4, l))
	if want := (sluice.Decision{Allowed: true, Remaining: 6, ResetAfter: 2 * time.Second, Taken: 4, Limit: l}); err != nil || d != want {
		t.Fatalf("Drain(4) = %+v, %v; want %+v", d, err, want)
	}
	d, _ = r.drain(rq("api", "k", 8, l))
	if want := (sluice.Decision{RetryAfter: 4 * time.Second, ResetAfter: 5 * time.Second, Taken: 6, Limit: l}); d != want {
		t.Fatalf("Drain(8) of 6 = %+v; want %+v", d, want)
	}
	r.advance(5 * time.Second)
	d, _ = r.drain(rq("api", "k", 1000, l))
	if want := (sluice.Decision{RetryAfter: sluice.Never, ResetAfter: 5 * time.Second, Taken: 10, Limit: l}); d != want {
		t.Fatalf("Drain(1000) of a full bucket = %+v; want %+v", d, want)
	}
	// A drain of a missing bucket creates it; one under another limit
	// converts it, counted.
	r.drain(rq("api", "new", 3, l))
	if st := r.s.Stats(); st.Buckets != 2 {
		t.Fatalf("Stats().Buckets = %d after draining a new key, want 2", st.Buckets)
	}
	r.advance(1250 * time.Millisecond)
	r.drain(rq("api", "k", 1, sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(3)}))
	if st := r.s.Stats(); st.Conversions != 1 {
		t.Fatalf("Stats().Conversions = %d after a drain under another limit, want 1", st.Conversions)
	}
	r.advance(-time.Second)
	r.drain(rq("api", "k", 2, sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(3)}))
	r.take(rq("api", "new", 7, l))
}

// A refund gives tokens back, never above the capacity, and creates
// nothing; with a request ID it undoes that allowed take once.
func TestRefund(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	r := newModelRig(t, memstore.Options{RequestIDTTL: 3 * time.Hour})
	d, err := r.refund(rq("api", "k", 3, l))
	if want := (sluice.Decision{Allowed: true, Remaining: 10, Limit: l}); err != nil || d != want {
		t.Fatalf("Refund of a missing bucket = %+v, %v; want %+v", d, err, want)
	}
	if st := r.s.Stats(); st.Buckets != 0 {
		t.Fatalf("Stats().Buckets = %d after refunding a missing bucket, want 0", st.Buckets)
	}
	r.take(rq("api", "k", 7, l))
	d, _ = r.refund(rq("api", "k", 2, l))
	if want := (sluice.Decision{Allowed: true, Remaining: 5, ResetAfter: 5 * time.Hour, Taken: -2, Limit: l}); d != want {
		t.Fatalf("Refund(2) = %+v; want %+v", d, want)
	}
	r.advance(30 * time.Minute) // 5.5 tokens
	d, _ = r.refund(rq("api", "k", 9, l))
	if want := (sluice.Decision{Allowed: true, Remaining: 10, Taken: -5, Limit: l}); d != want {
		t.Fatalf("Refund(9) of 5.5 = %+v; want %+v (capped, exactly full)", d, want)
	}

	// By request ID: once; the second is a replay that gives nothing.
	r.take(rqID("api", "k", 4, l, "order-1"))
	d, _ = r.refund(rqID("api", "k", 4, l, "order-1"))
	if d.Taken != -4 || d.Replayed || d.Remaining != 10 {
		t.Fatalf("first Refund(order-1) = %+v; want 4 given back", d)
	}
	r.take(rq("api", "k", 5, l))
	d, _ = r.refund(rqID("api", "k", 4, l, "order-1"))
	if want := (sluice.Decision{Allowed: true, Remaining: 5, ResetAfter: 5 * time.Hour, Limit: l, Replayed: true}); d != want {
		t.Fatalf("second Refund(order-1) = %+v; want %+v", d, want)
	}
	// A replay of the take still charges nothing.
	d, _ = r.take(rqID("api", "k", 4, l, "order-1"))
	if !d.Replayed {
		t.Fatalf("Take(order-1) after its refund = %+v; want the replay", d)
	}
	// A partial refund, then conflicts and unknown IDs.
	r.take(rqID("api", "k", 3, l, "order-2"))
	r.refund(rqID("api", "k", 1, l, "order-2"))
	for _, q := range []sluice.Request{
		rqID("api", "k", 4, l, "order-2"),
		rqID("api", "k", 1, sluice.Limit{Capacity: 10, Rate: sluice.Per(2, time.Hour)}, "order-2"),
		rqID("api", "k", 1, l, "never-taken"),
		rqID("api", "other", 1, l, "order-2"),
		rqID("web", "k", 1, l, "order-2"),
	} {
		if _, err := r.refund(q); err == nil {
			t.Fatalf("Refund(%+v) succeeded, want an error", q)
		}
	}
	r.take(rqID("api", "k", 9, l, "denied"))
	if _, err := r.refund(rqID("api", "k", 9, l, "denied")); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("Refund of a denied take's ID: %v, want ErrUnknownRequestID", err)
	}
	// A refund with an ID whose bucket was swept creates nothing either.
	r.take(rqID("api", "swept", 2, l, "s"))
	r.advance(2 * time.Hour)
	r.sweep()
	d, _ = r.refund(rqID("api", "swept", 2, l, "s"))
	if d.Taken != 0 || r.s.Stats().Buckets != 1 {
		t.Fatalf("Refund(s) of a swept bucket = %+v with %d buckets; want nothing given, 1 bucket", d, r.s.Stats().Buckets)
	}
	r.refund(rqID("api", "swept", 2, l, "s"))
	// After the TTL the ID is unknown.
	r.advance(3 * time.Hour)
	if _, err := r.refund(rqID("api", "k", 1, l, "order-2")); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("Refund after the TTL: %v, want ErrUnknownRequestID", err)
	}
	r.take(rq("api", "k", 1, l))
}

// A refund under another limit converts the bucket first, counted; a
// replayed refund converts nothing.
func TestRefundConverts(t *testing.T) {
	small := sluice.Limit{Capacity: 4, Rate: sluice.Per(1, time.Hour)}
	big := sluice.Limit{Capacity: 40, Rate: sluice.Per(1, time.Hour)}
	r := newModelRig(t, memstore.Options{OnLimitChange: sluice.ScaleTokens})
	r.take(rqID("api", "k", 3, small, "x"))
	r.take(rq("api", "k", 1, big))
	r.refund(rqID("api", "k", 2, small, "x"))
	if got := r.s.Stats().Conversions; got != 2 {
		t.Fatalf("Stats().Conversions = %d, want 2", got)
	}
	r.take(rq("api", "k", 1, big))
	r.refund(rqID("api", "k", 2, small, "x"))
	if got := r.s.Stats().Conversions; got != 3 {
		t.Fatalf("Stats().Conversions = %d after a replayed refund, want 3 (the take only)", got)
	}
	r.refund(rq("api", "k", 30, big))
}

// A reset bucket is full, stamped no earlier than before; request IDs stay,
// a missing bucket stays missing.
func TestReset(t *testing.T) {
	l := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Hour)}
	r := newModelRig(t, memstore.Options{RequestIDTTL: time.Hour})
	r.take(rqID("api", "k", 5, l, "login-1"))
	r.reset("api", "k")
	if d, _ := r.peek(rq("api", "k", 5, l)); !d.Allowed {
		t.Fatalf("Peek(5) after Reset = %+v; want allowed", d)
	}
	if d, _ := r.take(rqID("api", "k", 5, l, "login-1")); !d.Replayed {
		t.Fatalf("Take(login-1) after Reset = %+v; want the replay", d)
	}
	r.reset("api", "missing")
	if st := r.s.Stats(); st.Buckets != 1 {
		t.Fatalf("Stats().Buckets = %d after resetting a missing bucket, want 1", st.Buckets)
	}
	// The clock behind the stamp: the bucket stays stamped at 1h, so a
	// take at 30m waits for its refill from 1h.
	r.advance(time.Hour)
	r.take(rq("api", "k", 2, l))
	r.advance(-30 * time.Minute)
	r.reset("api", "k")
	d, _ := r.take(rq("api", "k", 1, l))
	if want := (sluice.Decision{Allowed: true, Remaining: 4, ResetAfter: 90 * time.Minute, Limit: l}); d != want {
		t.Fatalf("Take(1) at 30m after a reset of a bucket stamped 1h = %+v; want %+v", d, want)
	}
	// After a reset and a sweep, a reading older than the sweep recreates
	// the bucket at the sweep.
	r.advance(3 * time.Hour)
	r.reset("api", "k")
	r.sweep()
	r.advance(-time.Hour)
	r.take(rq("api", "k", 5, l))
	r.reset("api", "k")
	r.take(rq("api", "k", 5, l))
}

// Bad input to the operations is an error wrapping its sentinel and
// changes nothing.
func TestOpsBadInputChangesNothing(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	r := newModelRig(t, memstore.Options{})
	r.take(rqID("api", "k", 4, l, "x"))
	before := r.s.Stats()
	long := string(make([]byte, sluice.MaxKeyLen+1))
	tooMany := make([]sluice.Request, sluice.MaxParts+1)
	for i := range tooMany {
		tooMany[i] = rq("api", fmt.Sprint("m", i), 1, l)
	}
	multis := []struct {
		name string
		rs   []sluice.Request
		want error
	}{
		{"no parts", nil, sluice.ErrInvalidMulti},
		{"empty parts", []sluice.Request{}, sluice.ErrInvalidMulti},
		{"duplicate parts", []sluice.Request{rq("api", "k", 1, l), rq("api", "j", 1, l), rq("api", "k", 2, l)}, sluice.ErrInvalidMulti},
		{"too many parts", tooMany, sluice.ErrInvalidMulti},
		{"negative cost", []sluice.Request{rq("api", "j", 1, l), rq("api", "k", -1, l)}, sluice.ErrInvalidCost},
		{"cost over capacity", []sluice.Request{rq("api", "j", 1, l), rq("api", "k", 11, l)}, sluice.ErrInvalidCost},
		{"request ID", []sluice.Request{rq("api", "j", 1, l), rqID("api", "k", 1, l, "x")}, sluice.ErrInvalidRequestID},
		{"long key", []sluice.Request{rq("api", "j", 1, l), rq("api", long, 1, l)}, sluice.ErrInvalidKey},
		{"no limit", []sluice.Request{rq("api", "j", 1, l), rq("api", "k", 1, sluice.Limit{})}, sluice.ErrInvalidLimit},
		{"bad policy", []sluice.Request{rq("a b", "k", 1, l)}, sluice.ErrInvalidPolicy},
	}
	for _, c := range multis {
		if md, err := r.takeAll(c.rs...); !errors.Is(err, c.want) {
			t.Fatalf("TakeAll %s = %+v, %v; want %v", c.name, md, err, c.want)
		}
	}
	singles := []struct {
		name       string
		q          sluice.Request
		drain, ref error
	}{
		{"negative cost", rq("api", "k", -3, l), sluice.ErrInvalidCost, sluice.ErrInvalidCost},
		{"zero cost", rq("api", "k", 0, l), sluice.ErrInvalidCost, sluice.ErrInvalidCost},
		{"refund over capacity", rq("api", "k", 11, l), nil, sluice.ErrInvalidCost},
		{"no policy", rq("", "k", 1, l), sluice.ErrInvalidPolicy, sluice.ErrInvalidPolicy},
		{"long key", rq("api", long, 1, l), sluice.ErrInvalidKey, sluice.ErrInvalidKey},
		{"no limit", rq("api", "k", 1, sluice.Limit{}), sluice.ErrInvalidLimit, sluice.ErrInvalidLimit},
		{"drain with an ID", rqID("api", "k", 1, l, "x"), sluice.ErrInvalidRequestID, nil},
		{"refund of an unknown ID", rqID("api", "k", 1, l, "y"), sluice.ErrInvalidRequestID, sluice.ErrUnknownRequestID},
		{"refund over the take", rqID("api", "k", 5, l, "x"), sluice.ErrInvalidRequestID, sluice.ErrRequestIDConflict},
	}
	for _, c := range singles {
		if c.drain != nil {
			if d, err := r.drain(c.q); !errors.Is(err, c.drain) {
				t.Fatalf("Drain %s = %+v, %v; want %v", c.name, d, err, c.drain)
			}
		}
		if c.ref != nil {
			if d, err := r.refund(c.q); !errors.Is(err, c.ref) {
				t.Fatalf("Refund %s = %+v, %v; want %v", c.name, d, err, c.ref)
			}
		}
	}
	for _, c := range []struct{ policy, key string }{{"", "k"}, {"api", ""}, {"api", long}, {"a b", "k"}} {
		if err := r.reset(c.policy, c.key); !sluice.IsInvalid(err) {
			t.Fatalf("Reset(%q, key of %d bytes) = %v; want an invalid-input error", c.policy, len(c.key), err)
		}
	}
	if after := r.s.Stats(); after != before {
		t.Fatalf("Stats() = %+v after bad input, want %+v", after, before)
	}
	r.peek(rq("api", "k", 6, l))
	r.take(rqID("api", "k", 4, l, "x"))
	r.refund(rqID("api", "k", 4, l, "x"))
}

// A request that passes validation with ctx done returns ctx.Err() and
// changes nothing.
func TestOpsCanceledContext(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	s := newStore(t, memstore.Options{Now: newClock().Now, SweepInterval: -1})
	if _, err := s.Take(context.Background(), rq("api", "k", 4, l)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.TakeAll(ctx, []sluice.Request{rq("api", "k", 1, l), rq("api", "new", 1, l)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("TakeAll(canceled) error %v, want context.Canceled", err)
	}
	if _, err := s.Drain(ctx, rq("api", "k", 1, l)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain(canceled) error %v, want context.Canceled", err)
	}
	if _, err := s.Refund(ctx, rq("api", "k", 1, l)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Refund(canceled) error %v, want context.Canceled", err)
	}
	if err := s.Reset(ctx, "api", "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reset(canceled) error %v, want context.Canceled", err)
	}
	d, err := s.Peek(context.Background(), rq("api", "k", 1, l))
	if err != nil || d.Remaining != 6 || s.Stats().Buckets != 1 {
		t.Fatalf("after canceled calls Peek = %+v, %v with %d buckets; want 6 remaining, 1 bucket", d, err, s.Stats().Buckets)
	}
}

// A multi-take that needs more new buckets than the store may hold fails
// with ErrTooManyKeys and changes nothing: no bucket of it is created,
// charged or evicted to make room for another of its parts. Buckets
// outside it are reclaimed or evicted as for a take.
func TestTakeAllAtMaxKeys(t *testing.T) {
	slow := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	fast := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	tests := []struct {
		name     string
		options  memstore.Options
		setup    func(r *modelRig) // at t=0; the multi-take runs at 2s
		parts    []sluice.Request
		wantErr  error
		wantLeft []int64 // each part's Remaining, if allowed
		want     memstore.Stats
	}{
		{
			name:    "refuse: two new, room for one",
			options: memstore.Options{MaxKeys: 2},
			setup:   func(r *modelRig) { r.take(rq("api", "a", 4, slow)) },
			parts:   []sluice.Request{rq("api", "a", 1, slow), rq("api", "b", 1, slow), rq("api", "c", 1, slow)},
			wantErr: sluice.ErrTooManyKeys,
			want:    memstore.Stats{Buckets: 1, Refused: 1},
		},
		{
			name:     "refuse: one new, room for it",
			options:  memstore.Options{MaxKeys: 2},
			setup:    func(r *modelRig) { r.take(rq("api", "a", 4, slow)) },
			parts:    []sluice.Request{rq("api", "b", 1, slow), rq("api", "a", 1, slow)},
			wantLeft: []int64{9, 5},
			want:     memstore.Stats{Buckets: 2},
		},
		{
			name:     "reclaim a full bucket outside the multi-take",
			options:  memstore.Options{MaxKeys: 2},
			setup:    func(r *modelRig) { r.take(rq("api", "a", 4, slow)); r.take(rq("api", "x", 4, fast)) },
			parts:    []sluice.Request{rq("api", "a", 1, slow), rq("api", "b", 1, slow)},
			wantLeft: []int64{5, 9},
			want:     memstore.Stats{Buckets: 2, Reclaimed: 1},
		},
		{
			name:    "a full bucket of the multi-take is not reclaimed for another part",
			options: memstore.Options{MaxKeys: 2},
			setup:   func(r *modelRig) { r.take(rq("api", "a", 4, fast)); r.take(rq("api", "x", 4, slow)) },
			parts:   []sluice.Request{rq("api", "a", 1, fast), rq("api", "b", 1, slow)},
			wantErr: sluice.ErrTooManyKeys,
			want:    memstore.Stats{Buckets: 2, Refused: 1},
		},
		{
			name:    "evict: nothing but the multi-take's own bucket",
			options: memstore.Options{MaxKeys: 1, Overflow: memstore.EvictLRU},
			setup:   func(r *modelRig) { r.take(rq("api", "a", 4, slow)) },
			parts:   []sluice.Request{rq("api", "a", 1, slow), rq("api", "b", 1, slow)},
			wantErr: sluice.ErrTooManyKeys,
			want:    memstore.Stats{Buckets: 1, Refused: 1},
		},
		{
			// a is the least recently used, but it is part of the
			// multi-take: x goes instead.
			name:    "evict: another bucket than the multi-take's",
			options: memstore.Options{MaxKeys: 3, Overflow: memstore.EvictLRU},
			setup: func(r *modelRig) {
				r.take(rq("api", "a", 4, slow))
				r.advance(time.Second)
				r.take(rq("api", "x", 4, slow))
				r.take(rq("api", "y", 4, slow))
				r.advance(-time.Second)
			},
			parts:    []sluice.Request{rq("api", "a", 1, slow), rq("api", "b", 1, slow), rq("api", "y", 1, slow)},
			wantLeft: []int64{5, 9, 5},
			want:     memstore.Stats{Buckets: 3, Evicted: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for round := range 20 { // eviction samples at random
				o := tt.options
				o.Shards = 1
				r := newModelRig(t, o)
				tt.setup(r)
				r.advance(2 * time.Second)
				md, err := r.s.TakeAll(r.ctx, tt.parts)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("round %d: TakeAll(%+v) = %+v, %v; want error %v", round, tt.parts, md, err, tt.wantErr)
				}
				if err == nil {
					for i, want := range tt.wantLeft {
						if !md.Allowed || md.Parts[i].Remaining != want {
							t.Fatalf("round %d: TakeAll(%+v) = %+v; want allowed, part %d with %d left", round, tt.parts, md, i, want)
						}
					}
				}
				if got := r.s.Stats(); got != tt.want {
					t.Fatalf("round %d: Stats() = %+v, want %+v", round, got, tt.want)
				}
				if got := memstore.CountBuckets(r.s); got != tt.want.Buckets {
					t.Fatalf("round %d: the tables hold %d buckets, Stats says %d", round, got, tt.want.Buckets)
				}
				// The existing parts kept their state.
				if err != nil {
					for _, q := range tt.parts {
						if r.m.Level(q.Policy, q.Key) != nil {
							q.Cost = 1
							r.peek(q)
						}
					}
				}
			}
		})
	}
}

// Random sequences of every operation, with time moving both ways and
// sweeps between steps, decide exactly as the model, on one shard and on
// several, under each conversion.
func TestOpsMatchModel(t *testing.T) {
	policies := []string{"api", "web"}
	keys := []string{"a", "b", "c", "d"}
	limits := []sluice.Limit{
		{Capacity: 5, Rate: sluice.PerSecond(2)},
		{Capacity: 8, Rate: sluice.Per(3, 2*time.Second)},
		{Capacity: 3, Rate: sluice.Per(0, time.Second)},
		{Capacity: 12, Rate: sluice.Per(7, 3*time.Second)},
	}
	ids := []string{"", "", "", "r1", "r2"}
	seeds := 30
	if testing.Short() {
		seeds = 5
	}
	for _, shards := range []int{1, 4} {
		for _, conv := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
			t.Run(fmt.Sprintf("%d shards/%v", shards, conv), func(t *testing.T) {
				for seed := range seeds {
					rng := rand.New(rand.NewPCG(uint64(seed), uint64(shards)<<8|uint64(conv)))
					// A TTL far beyond the time the steps cover: the
					// store may forget an expired ID that the model would
					// replay after the clock steps back (sluicetest.Suite
					// allows that); TestRefund covers expiry.
					r := newModelRig(t, memstore.Options{Shards: shards, OnLimitChange: conv, RequestIDTTL: 10000 * time.Hour})
					// Each policy has a usual limit, and sometimes another.
					usual := []sluice.Limit{limits[rng.IntN(len(limits))], limits[rng.IntN(len(limits))]}
					draw := func() sluice.Request {
						p := rng.IntN(len(policies))
						l := usual[p]
						if rng.IntN(6) == 0 {
							l = limits[rng.IntN(len(limits))]
						}
						return rq(policies[p], keys[rng.IntN(len(keys))], 1+rng.Int64N(l.Capacity+1), l)
					}
					for range 200 {
						switch op := rng.IntN(100); {
						case op < 20:
							q := draw()
							q.RequestID = ids[rng.IntN(len(ids))]
							r.take(q)
						case op < 40:
							rs := make([]sluice.Request, 1+rng.IntN(4))
							for i := range rs {
								rs[i] = draw()
							}
							r.takeAll(rs...)
						case op < 50:
							q := draw()
							q.Cost = 1 + rng.Int64N(2*q.Limit.Capacity)
							r.drain(q)
						case op < 62:
							q := draw()
							q.RequestID = ids[rng.IntN(len(ids))]
							r.refund(q)
						case op < 67:
							r.reset(policies[rng.IntN(len(policies))], keys[rng.IntN(len(keys))])
						case op < 72:
							q := draw()
							q.Cost = min(q.Cost, q.Limit.Capacity)
							r.peek(q)
						case op < 77:
							r.sweep()
						case op < 80:
							r.advance(time.Duration(rng.IntN(3)+1) * time.Hour)
						default:
							r.advance(time.Duration(rng.IntN(5000)-2000) * time.Millisecond)
						}
					}
				}
			})
		}
	}
}
