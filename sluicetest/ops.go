package sluicetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
)

// ops returns the store as a sluice.Operator, or skips t if it is not one.
func (r *rig) ops(t tb) sluice.Operator {
	t.Helper()
	o, ok := r.store.(sluice.Operator)
	if !ok {
		t.Skipf("the store (%T) does not implement sluice.Operator", r.store)
	}
	return o
}

// refusedAny returns the error of Suite.Supports for the first request
// whose limit the store refuses, nil if it decides them all.
func (r *rig) refusedAny(rs []sluice.Request) error {
	for _, q := range rs {
		if why := r.refused(q.Limit); why != nil {
			return why
		}
	}
	return nil
}

// takeAll is take for TakeAll.
func (r *rig) takeAll(t tb, rs []sluice.Request) (sluice.MultiDecision, error) {
	t.Helper()
	got, err := r.ops(t).TakeAll(r.ctx, rs)
	call := fmt.Sprintf("TakeAll(%s) at %v", describeAll(rs), r.at())
	if sluice.ValidateAll(rs) == nil && r.refusedAny(rs) != nil {
		if !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Fatalf("%s = %+v, %v; want error %v (Suite.Supports refuses a limit: %v)", call, got, err, sluice.ErrInvalidLimit, r.refusedAny(rs))
		}
		return got, err
	}
	want, wantErr := r.model.TakeAll(r.now, rs)
	if msg := differAll(got, err, want, wantErr); msg != "" {
		t.Fatalf("%s%s", call, msg)
	}
	return got, err
}

// refusedLimit checks the answer (got, err) of a call whose request
// passed validation (valid) under limit l: if Suite.Supports refuses l,
// the store must have answered ErrInvalidLimit, and refusedLimit reports
// true (the model is not consulted).
func (r *rig) refusedLimit(t tb, call string, valid bool, l sluice.Limit, got any, err error) bool {
	t.Helper()
	if !valid {
		return false
	}
	why := r.refused(l)
	if why == nil {
		return false
	}
	if !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("%s = %+v, %v; want error %v (Suite.Supports refuses the limit: %v)", call, got, err, sluice.ErrInvalidLimit, why)
	}
	return true
}

// drain is take for Drain.
func (r *rig) drain(t tb, req sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.ops(t).Drain(r.ctx, req)
	call := fmt.Sprintf("Drain(%s) at %v", describe(req), r.at())
	if r.refusedLimit(t, call, req.ValidateDrain() == nil, req.Limit, got, err) {
		return got, err
	}
	want, wantErr := r.model.Drain(r.now, req)
	same(t, call, got, err, want, wantErr)
	return got, err
}

// refund is take for Refund. A store may have forgotten the request ID
// once the clock has shown the end of its TTL (see forgettable): then
// ErrUnknownRequestID is accepted and the model forgets the ID too.
func (r *rig) refund(t tb, req sluice.Request) (sluice.Decision, error) {
	t.Helper()
	got, err := r.ops(t).Refund(r.ctx, req)
	call := fmt.Sprintf("Refund(%s) at %v", describe(req), r.at())
	if r.refusedLimit(t, call, req.ValidateRefund() == nil, req.Limit, got, err) {
		return got, err
	}
	if r.forgettable(req) && errors.Is(err, sluice.ErrUnknownRequestID) {
		delete(r.model.ids, modelIDKey{req.Policy, req.Key, req.RequestID})
	}
	want, wantErr := r.model.Refund(r.now, req)
	same(t, call, got, err, want, wantErr)
	return got, err
}

// reset is take for Reset.
func (r *rig) reset(t tb, policy, key string) error {
	t.Helper()
	err := r.ops(t).Reset(r.ctx, policy, key)
	wantErr := r.model.Reset(r.now, policy, key)
	same(t, fmt.Sprintf("Reset(%q, %q) at %v", short(policy), short(key), r.at()), sluice.Decision{}, err, sluice.Decision{}, wantErr)
	return err
}

// differAll is differ for multi-decisions.
func differAll(got sluice.MultiDecision, err error, want sluice.MultiDecision, wantErr error) string {
	if wantErr != nil {
		target := sentinel(wantErr)
		if err == nil || !errors.Is(err, target) {
			return fmt.Sprintf(" = %+v, %v; want error %v (%v)", got, err, target, wantErr)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf(": error %v; want %+v", err, want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		return fmt.Sprintf(" = %+v, want %+v (the model's) (-want +got):\n%s", got, want, diff)
	}
	return ""
}

// describeAll formats the requests of a multi-take for failure messages.
func describeAll(rs []sluice.Request) string {
	parts := make([]string, len(rs))
	for i, q := range rs {
		parts[i] = "{" + describe(q) + "}"
	}
	return strings.Join(parts, ", ")
}

// mustTakeAll is takeAll for a multi-take that must not fail, checked
// against hand-computed expectations (allowed, denied index, each part's
// Remaining) as well as the model. A refused limit skips the case.
func (r *rig) mustTakeAll(t tb, rs []sluice.Request, allowed bool, denied int, remaining ...int64) sluice.MultiDecision {
	t.Helper()
	md, err := r.takeAll(t, rs)
	if why := r.refusedAny(rs); why != nil {
		t.Skipf("the store refuses a limit this case needs: %v", why)
	}
	if err != nil {
		t.Fatalf("TakeAll(%s) at %v: %v", describeAll(rs), r.at(), err)
	}
	if md.Allowed != allowed || md.Denied != denied || len(md.Parts) != len(rs) {
		t.Fatalf("TakeAll(%s) at %v = %+v; want allowed %v, denied %d, %d parts", describeAll(rs), r.at(), md, allowed, denied, len(rs))
	}
	for i, want := range remaining {
		if md.Parts[i].Remaining != want {
			t.Fatalf("TakeAll(%s) at %v: part %d has Remaining %d, want %d", describeAll(rs), r.at(), i, md.Parts[i].Remaining, want)
		}
	}
	return md
}

// mustOp checks a Drain or Refund that must not fail against a
// hand-computed decision as well as the model.
func mustOp(t tb, name string, req sluice.Request, got sluice.Decision, err error, want sluice.Decision) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s(%s): %v", name, describe(req), err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%s(%s) = %+v, want %+v (-want +got):\n%s", name, describe(req), got, want, diff)
	}
}

func reqIn(policy, key string, cost int64, l sluice.Limit) sluice.Request {
	return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l}
}

// testTakeAll: a stacked limit — a burst and a daily quota on one key —
// and two keys under one policy are decided together: a request one bucket
// denies costs the others nothing, the decision names the bucket that
// denied and the longest wait, and each part reports its own bucket.
func (s Suite) testTakeAll(t *testing.T) {
	t.Run("StackedLimit", func(t *testing.T) {
		r := s.newRig(t, sluice.KeepTokens, time.Minute)
		r.ops(t)
		burst := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}
		daily := sluice.Limit{Capacity: 20, Rate: sluice.Per(20, 24*time.Hour)}
		both := func(cost int64) []sluice.Request {
			return []sluice.Request{reqIn("burst", "u", cost, burst), reqIn("daily", "u", cost, daily)}
		}
		// One request a second for 60 s: the daily quota allows 20.
		allowed := 0
		for i := range 60 {
			md, err := r.takeAll(t, both(1))
			if why := r.refusedAny(both(1)); why != nil {
				t.Skipf("the store refuses a limit this case needs: %v", why)
			}
			if err != nil {
				t.Fatalf("second %d: %v", i, err)
			}
			if md.Allowed {
				allowed++
			} else if md.Denied != 1 || md.RetryAfter < time.Hour {
				t.Fatalf("second %d: denied by part %d after %v; want the daily quota (part 1) and a wait of hours", i, md.Denied, md.RetryAfter)
			}
			r.advance(time.Second)
		}
		if allowed != 20 {
			t.Fatalf("60 stacked requests a second apart: %d allowed, want 20 (the daily quota)", allowed)
		}
		// The burst was not charged for the 40 denials: it is full.
		r.mustPeekReq(t, reqIn("burst", "u", 5, burst), allow(5, 0, burst))
	})
	t.Run("NothingTakenOnDenial", func(t *testing.T) {
		r := s.newRig(t, sluice.KeepTokens, time.Minute)
		r.ops(t)
		a := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
		b := sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(1)}
		rs := func(ca, cb int64) []sluice.Request {
			return []sluice.Request{reqIn("tenant", "t1", ca, a), reqIn("ip", "10.0.0.1", cb, b), reqIn("tenant", "t2", 1, a)}
		}
		r.mustTakeAll(t, rs(4, 3), true, -1, 6, 0, 9)
		md := r.mustTakeAll(t, rs(4, 1), false, 1, 6, 0, 9)
		if md.RetryAfter != time.Second || md.Parts[0].Taken != 0 || !md.Parts[0].Allowed || md.Parts[1].Allowed {
			t.Fatalf("denied multi-take = %+v; want part 1 short with a 1s wait, part 0 covering but not charged", md)
		}
		// Two buckets short: the longer wait decides.
		md = r.mustTakeAll(t, rs(10, 2), false, 0, 6, 0, 9)
		if md.RetryAfter != 4*time.Second {
			t.Fatalf("two buckets short: RetryAfter %v, want 4s (part 0's)", md.RetryAfter)
		}
		r.advance(4 * time.Second)
		r.mustTakeAll(t, rs(10, 2), true, -1, 0, 1, 9)
		// A cost no wait can cover.
		never := sluice.Limit{Capacity: 2, Rate: sluice.Per(0, time.Second)}
		r.mustTakeAll(t, []sluice.Request{reqIn("tenant", "t3", 2, never)}, true, -1, 0)
		md = r.mustTakeAll(t, []sluice.Request{reqIn("tenant", "t4", 1, a), reqIn("tenant", "t3", 1, never)}, false, 1, 10, 0)
		if md.RetryAfter != sluice.Never {
			t.Fatalf("a bucket that never refills: RetryAfter %v, want Never", md.RetryAfter)
		}
	})
	t.Run("SameKeyManyPolicies", func(t *testing.T) {
		r := s.newRig(t, sluice.KeepTokens, time.Minute)
		r.ops(t)
		var rs []sluice.Request
		for i := range sluice.MaxParts {
			l := sluice.Limit{Capacity: int64(i + 1), Rate: sluice.PerSecond(1)}
			rs = append(rs, reqIn(fmt.Sprintf("p%d", i), "same", 1, l))
		}
		r.mustTakeAll(t, rs, true, -1, 0)
		r.mustTakeAll(t, rs, false, 0, 0)
		r.advance(time.Second)
		r.mustTakeAll(t, rs, true, -1, 0, 1, 2)
	})
}

// testDrain: a drain takes what is there, up to its cost, which may exceed
// the capacity; it reports what it took.
func (s Suite) testDrain(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	r.ops(t)
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	drain := func(cost int64, want sluice.Decision) {
		t.Helper()
		q := req("k", cost, l)
		d, err := r.drain(t, q)
		if why := r.refused(l); why != nil {
			t.Skipf("the store refuses limit %v: %v", l, why)
		}
		mustOp(t, "Drain", q, d, err, want)
	}
	taken := func(d sluice.Decision, n int64) sluice.Decision { d.Taken = n; return d }
	drain(4, taken(allow(6, 2*time.Second, l), 4))
	drain(8, taken(deny(0, 4*time.Second, 5*time.Second, l), 6))
	drain(1, taken(deny(0, 500*time.Millisecond, 5*time.Second, l), 0))
	r.advance(5 * time.Second)
	// A charge larger than the bucket empties it; no wait covers it.
	drain(1000, taken(deny(0, sluice.Never, 5*time.Second, l), 10))
	r.advance(time.Second)
	r.mustTake(t, req("k", 2, l), allow(0, 5*time.Second, l))
}

// testRefund: tokens come back, never above the capacity; a refund with
// the request ID of an allowed take undoes it once, and a retried refund
// gives nothing.
func (s Suite) testRefund(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	r.ops(t)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	if why := r.refused(l); why != nil {
		t.Skipf("the store refuses limit %v: %v", l, why)
	}
	refund := func(q sluice.Request, want sluice.Decision) {
		t.Helper()
		d, err := r.refund(t, q)
		mustOp(t, "Refund", q, d, err, want)
	}
	back := func(remaining, n int64) sluice.Decision {
		d := allow(remaining, time.Duration(10-remaining)*time.Hour, l)
		d.Taken = -n
		return d
	}
	// A missing bucket is full: nothing to give back, nothing created.
	refund(req("k", 3, l), back(10, 0))
	r.mustTake(t, req("k", 7, l), allow(3, 7*time.Hour, l))
	refund(req("k", 2, l), back(5, 2))
	refund(req("k", 9, l), back(10, 5)) // capped at the capacity
	// Undo a take by its request ID, once.
	r.mustTake(t, reqID("k", 4, l, "order-1"), allow(6, 4*time.Hour, l))
	refund(reqID("k", 4, l, "order-1"), back(10, 4))
	r.mustTake(t, req("k", 5, l), allow(5, 5*time.Hour, l))
	again := back(5, 0)
	again.Replayed = true
	refund(reqID("k", 4, l, "order-1"), again)
	// The take's replay still charges nothing.
	r.mustTake(t, reqID("k", 4, l, "order-1"), replayed(allow(6, 4*time.Hour, l)))
	// A refund larger than the take, or under another limit, is a conflict;
	// an ID never taken, or only denied, is unknown.
	r.mustTake(t, reqID("k", 2, l, "order-2"), allow(3, 7*time.Hour, l))
	for _, c := range []struct {
		q    sluice.Request
		want error
	}{
		{reqID("k", 3, l, "order-2"), sluice.ErrRequestIDConflict},
		{reqID("k", 2, sluice.Limit{Capacity: 10, Rate: sluice.Per(2, time.Hour)}, "order-2"), sluice.ErrRequestIDConflict},
		{reqID("k", 1, l, "never-taken"), sluice.ErrUnknownRequestID},
		{reqID("other", 1, l, "order-2"), sluice.ErrUnknownRequestID},
	} {
		if _, err := r.refund(t, c.q); !errors.Is(err, c.want) {
			t.Fatalf("Refund(%s) = %v, want %v", describe(c.q), err, c.want)
		}
	}
	r.mustTake(t, reqID("k", 9, l, "denied"), deny(3, 6*time.Hour, 7*time.Hour, l))
	if _, err := r.refund(t, reqID("k", 9, l, "denied")); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("refund of a denied take's ID = %v, want %v", err, sluice.ErrUnknownRequestID)
	}
	// A partial refund of order-2, then its TTL ends: the ID is unknown.
	refund(reqID("k", 1, l, "order-2"), back(4, 1))
	r.advance(time.Minute)
	if _, err := r.refund(t, reqID("k", 1, l, "order-2")); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("refund after the request-ID TTL = %v, want %v", err, sluice.ErrUnknownRequestID)
	}
}

// testReset: a reset bucket is full, as if never used; request IDs stay.
func (s Suite) testReset(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	r.ops(t)
	l := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Hour)}
	if why := r.refused(l); why != nil {
		t.Skipf("the store refuses limit %v: %v", l, why)
	}
	r.mustTake(t, reqID("k", 5, l, "login-1"), allow(0, 5*time.Hour, l))
	r.mustTake(t, req("k", 1, l), deny(0, time.Hour, 5*time.Hour, l))
	r.reset(t, testPolicy, "k")
	r.mustPeekReq(t, req("k", 5, l), allow(5, 0, l))
	r.mustTake(t, reqID("k", 5, l, "login-1"), replayed(allow(0, 5*time.Hour, l)))
	r.mustTake(t, req("k", 2, l), allow(3, 2*time.Hour, l))
	// Another policy's bucket of the same key is untouched.
	r.mustTake(t, reqIn("other", "k", 5, l), allow(0, 5*time.Hour, l))
	r.reset(t, testPolicy, "k")
	r.mustTake(t, reqIn("other", "k", 1, l), deny(0, time.Hour, 5*time.Hour, l))
	// A reset of a missing bucket creates nothing; a reset with the clock
	// behind the stamp keeps time running forwards inside the bucket.
	r.reset(t, testPolicy, "missing")
	r.mustTake(t, req("k", 5, l), allow(0, 5*time.Hour, l))
	r.advance(-time.Minute)
	r.reset(t, testPolicy, "k")
	r.mustTake(t, req("k", 1, l), allow(4, time.Hour+time.Minute, l))
}

// testOpsBadInput: each bad input to the operations is an error naming it
// and changes nothing.
func (s Suite) testOpsBadInput(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	o := r.ops(t)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	if why := r.refused(l); why != nil {
		t.Skipf("the store refuses limit %v: %v", l, why)
	}
	r.mustTake(t, req("k", 4, l), allow(6, 4*time.Hour, l))
	huge := strings.Repeat("k", sluice.MaxKeyLen+1)
	multis := map[string][]sluice.Request{
		"no buckets":       nil,
		"duplicate":        {req("k", 1, l), req("j", 1, l), req("k", 1, l)},
		"negative cost":    {req("j", 1, l), req("k", -1, l)},
		"cost over cap":    {req("k", 11, l)},
		"request ID":       {reqID("k", 1, l, "x")},
		"key too long":     {req("k", 1, l), req(huge, 1, l)},
		"invalid limit":    {req("k", 1, l), req("j", 1, sluice.Limit{})},
		"too many":         make([]sluice.Request, sluice.MaxParts+1),
		"invalid policy":   {reqIn("a b", "k", 1, l)},
		"one good one bad": {req("k", 6, l), req("j", 0, l)},
	}
	for i := range multis["too many"] {
		multis["too many"][i] = req(fmt.Sprint("m", i), 1, l)
	}
	for name, rs := range multis {
		md, err := r.takeAll(t, rs)
		if err == nil || !sluice.IsInvalid(err) {
			t.Fatalf("TakeAll %s = %+v, %v; want an invalid-input error", name, md, err)
		}
	}
	singles := map[string]sluice.Request{
		"negative cost": req("k", -3, l),
		"zero cost":     req("k", 0, l),
		"no policy":     reqIn("", "k", 1, l),
		"long key":      req(huge, 1, l),
		"no limit":      req("k", 1, sluice.Limit{}),
	}
	for name, q := range singles {
		if _, err := r.drain(t, q); err == nil {
			t.Fatalf("Drain %s succeeded", name)
		}
		if _, err := r.refund(t, q); err == nil {
			t.Fatalf("Refund %s succeeded", name)
		}
	}
	if _, err := r.refund(t, req("k", 11, l)); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("a refund over the capacity = %v, want %v", err, sluice.ErrInvalidCost)
	}
	if _, err := r.drain(t, reqID("k", 1, l, "x")); !errors.Is(err, sluice.ErrInvalidRequestID) {
		t.Fatalf("a drain with a request ID = %v, want %v", err, sluice.ErrInvalidRequestID)
	}
	for _, c := range []struct{ policy, key string }{{"", "k"}, {testPolicy, ""}, {testPolicy, huge}, {"a b", "k"}} {
		if err := o.Reset(r.ctx, c.policy, c.key); err == nil || !sluice.IsInvalid(err) {
			t.Fatalf("Reset(%q, %q) = %v; want an invalid-input error", short(c.policy), short(c.key), err)
		}
	}
	// Nothing changed: k still has 6.
	r.mustPeekReq(t, req("k", 6, l), allow(6, 4*time.Hour, l))
	r.mustPeekReq(t, req("j", 10, l), allow(10, 0, l))
}

// testConcurrentTakeAll floods a multi-take of two buckets (capacities
// 1000 and 300) from many goroutines with the clock frozen: exactly 300
// are allowed, and afterwards the buckets hold 700 and 0 — no take was
// half done.
func (s Suite) testConcurrentTakeAll(t *testing.T) {
	c := NewClock(start)
	st := s.New(t, StoreOptions{Now: c.Now, RequestIDTTL: time.Minute})
	o, ok := st.(sluice.Operator)
	if !ok {
		t.Skipf("the store (%T) does not implement sluice.Operator", st)
	}
	big := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1000, time.Hour)}
	small := sluice.Limit{Capacity: 300, Rate: sluice.Per(300, time.Hour)}
	s.skipRefused(t, big, small)
	ctx := t.Context()
	rs := []sluice.Request{reqIn("tenant", "acme", 1, big), reqIn("user", "alice", 1, small)}
	var (
		mu      sync.Mutex
		allowed int
		errs    []error
		wg      sync.WaitGroup
	)
	per := max(2*300/s.Workers+1, s.TakesPerWorker/100)
	for range s.Workers {
		wg.Go(func() {
			n := 0
			var err error
			for range per {
				md, e := o.TakeAll(ctx, rs)
				if e != nil {
					err = e
					break
				}
				if md.Allowed {
					n++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			allowed += n
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("TakeAll failed %d times, first: %v", len(errs), errs[0])
	}
	if allowed != 300 {
		t.Fatalf("%d×%d concurrent multi-takes of (1000, 300) allowed %d, want exactly 300", s.Workers, per, allowed)
	}
	for i, want := range []int64{700, 0} {
		d, err := st.Peek(ctx, sluice.Request{Policy: rs[i].Policy, Key: rs[i].Key, Cost: 1, Limit: rs[i].Limit})
		if err != nil || d.Remaining != want {
			t.Fatalf("after the flood, bucket %d has %+v, %v; want Remaining %d", i, d, err, want)
		}
	}
}

// testConcurrentDrainRefund drains and refunds one bucket from many
// goroutines with the clock frozen: the level at the end is the capacity
// minus what the drains took plus what the refunds gave back, exactly.
func (s Suite) testConcurrentDrainRefund(t *testing.T) {
	c := NewClock(start)
	st := s.New(t, StoreOptions{Now: c.Now, RequestIDTTL: time.Minute})
	o, ok := st.(sluice.Operator)
	if !ok {
		t.Skipf("the store (%T) does not implement sluice.Operator", st)
	}
	l := sluice.Limit{Capacity: 500, Rate: sluice.Per(1, time.Hour)}
	s.skipRefused(t, l)
	ctx := t.Context()
	var (
		mu             sync.Mutex
		taken, givenUp int64
		errs           []error
		wg             sync.WaitGroup
	)
	per := max(2*300/s.Workers+1, s.TakesPerWorker/100)
	for w := range s.Workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var tk, gv int64
			var err error
			for range per {
				q := req("k", 1+rng.Int64N(40), l)
				var d sluice.Decision
				if rng.IntN(3) == 0 {
					d, err = o.Refund(ctx, q)
					gv -= d.Taken
				} else {
					d, err = o.Drain(ctx, q)
					tk += d.Taken
				}
				if err != nil {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			taken += tk
			givenUp += gv
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("Drain/Refund failed %d times, first: %v", len(errs), errs[0])
	}
	d, err := st.Peek(ctx, req("k", 1, l))
	if want := l.Capacity - taken + givenUp; err != nil || d.Remaining != want {
		t.Fatalf("after %d drained and %d refunded, Peek = %+v, %v; want Remaining %d", taken, givenUp, d, err, want)
	}
}
