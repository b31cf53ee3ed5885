package service

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// onlyStore hides every method but Take and Peek.
type onlyStore struct{ sluice.Store }

func newClockStore(t *testing.T) (*memstore.Store, *sluicetest.Clock) {
	t.Helper()
	clock := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, clock
}

func TestNewTableSeveralLimits(t *testing.T) {
	st := newStore(t)
	a := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}
	b := sluice.Limit{Capacity: 20, Rate: sluice.Per(20, 24*time.Hour)}
	tab, err := NewTable(st, "v", []Policy{{Name: "login", Limits: []sluice.Limit{a, b}}, {Name: "api", Limit: a}})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := tab.Lookup("login")
	if p.Limit != a || len(p.Limits) != 2 || p.Bucket(0) != "login" || p.Bucket(1) != "login/1" {
		t.Fatalf("policy login = %+v; want Limit %v, two limits, buckets login and login/1", p, a)
	}
	if q, _ := tab.Lookup("api"); len(q.Limits) != 1 || q.Limits[0] != a || q.Bucket(0) != "api" {
		t.Fatalf("policy api = %+v; want Limits [%v], bucket api", q, a)
	}
	for _, c := range []struct {
		name     string
		store    sluice.Store
		policies []Policy
		want     error
		text     string
	}{
		{"bucket names collide", st, []Policy{{Name: "a", Limits: []sluice.Limit{a, b}}, {Name: "a/1", Limit: a}}, sluice.ErrInvalidOption, `bucket name "a/1"`},
		{"bucket name too long", st, []Policy{{Name: strings.Repeat("p", 63), Limits: []sluice.Limit{a, b}}}, sluice.ErrInvalidPolicy, "limit 1"},
		{"store without TakeAll", onlyStore{st}, []Policy{{Name: "a", Limits: []sluice.Limit{a, b}}}, sluice.ErrInvalidOption, "cannot decide several limits together"},
		{"bad second limit", st, []Policy{{Name: "a", Limits: []sluice.Limit{a, {}}}}, sluice.ErrInvalidLimit, ""},
	} {
		_, err := NewTable(c.store, "v", c.policies)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: NewTable = %v; want %v containing %q", c.name, err, c.want, c.text)
		}
	}
}

// A burst and a daily quota decided together: one request a second for
// 60 s allows the daily 20, the denials name the daily limit and its wait
// of over an hour, and the burst is not charged for them.
func TestSeveralLimits(t *testing.T) {
	st, clock := newClockStore(t)
	burst := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}
	daily := sluice.Limit{Capacity: 20, Rate: sluice.Per(20, 24*time.Hour)}
	tab, err := NewTable(st, "v", []Policy{{Name: "login", Limits: []sluice.Limit{burst, daily}}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(st, tab, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	r := Request{Policy: "login", Key: "alice", Cost: 1}
	allowed := 0
	for i := range 60 {
		res, err := c.Take(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Parts) != 2 {
			t.Fatalf("take %d: %d parts, want 2", i, len(res.Parts))
		}
		if res.Allowed {
			allowed++
		} else if res.Denied != 1 || res.Limit != daily || res.RetryAfter < time.Hour || res.Remaining != 0 {
			t.Fatalf("take %d = %+v; want a denial by the daily limit (part 1) with a wait of over an hour", i, res)
		}
		clock.Advance(time.Second)
	}
	if allowed != 20 {
		t.Fatalf("%d allowed in 60 s, want 20", allowed)
	}
	if d, err := st.Peek(ctx, sluice.Request{Policy: "login", Key: "alice", Cost: 5, Limit: burst}); err != nil || !d.Allowed {
		t.Fatalf("the burst after 40 denials = %+v, %v; want full (not charged)", d, err)
	}
	// Peek combines the same way, and takes nothing.
	res, err := c.Peek(ctx, r)
	if err != nil || res.Allowed || res.Denied != 1 || len(res.Parts) != 2 {
		t.Fatalf("Peek = %+v, %v; want denied by part 1", res, err)
	}
	if _, err := c.Take(ctx, Request{Policy: "login", Key: "alice", Cost: 1, RequestID: "x"}); !errors.Is(err, sluice.ErrInvalidRequestID) {
		t.Fatalf("a request ID on a policy of several limits = %v, want %v", err, sluice.ErrInvalidRequestID)
	}
	// Reset empties nothing and fills both.
	if _, err := c.Reset(ctx, "login", "alice"); err != nil {
		t.Fatal(err)
	}
	res, err = c.Take(ctx, Request{Policy: "login", Key: "alice", Cost: 5})
	if err != nil || !res.Allowed || res.Parts[0].Remaining != 0 || res.Parts[1].Remaining != 15 || res.Remaining != 0 || res.Limit != burst {
		t.Fatalf("take of 5 after reset = %+v, %v; want allowed, 0 and 15 left, reported under the burst", res, err)
	}
}

func TestDrainRefund(t *testing.T) {
	st, _ := newClockStore(t)
	l := sluice.Limit{Capacity: 100, Rate: sluice.Per(100, time.Hour)}
	small := sluice.Limit{Capacity: 30, Rate: sluice.Per(30, time.Hour)}
	tab, err := NewTable(st, "v", []Policy{{Name: "llm", Limit: l}, {Name: "both", Limits: []sluice.Limit{l, small}}, {Name: "shadow", Limit: small, Shadow: true}})
	if err != nil {
		t.Fatal(err)
	}
	var shadowed int
	c, err := New(st, tab, Hooks{ShadowDenied: func(string) { shadowed++ }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	res, err := c.Drain(ctx, Request{Policy: "llm", Key: "k", Cost: 130})
	if err != nil || res.Allowed || res.Taken != 100 || res.Remaining != 0 || res.RetryAfter != sluice.Never {
		t.Fatalf("drain of 130 from 100 = %+v, %v; want 100 taken, not allowed, never", res, err)
	}
	res, err = c.Refund(ctx, Request{Policy: "llm", Key: "k", Cost: 40})
	if err != nil || res.Taken != -40 || res.Remaining != 40 {
		t.Fatalf("refund of 40 = %+v, %v; want -40 taken, 40 left", res, err)
	}
	// Several limits: each drains as far as it can.
	res, err = c.Drain(ctx, Request{Policy: "both", Key: "k", Cost: 50})
	if err != nil || res.Allowed || res.Parts[0].Taken != 50 || res.Parts[1].Taken != 30 || res.Taken != 30 || res.Denied != 1 {
		t.Fatalf("drain of 50 from (100, 30) = %+v, %v; want 50 and 30 taken, denied by part 1", res, err)
	}
	res, err = c.Refund(ctx, Request{Policy: "both", Key: "k", Cost: 20})
	if err != nil || res.Parts[0].Remaining != 70 || res.Parts[1].Remaining != 20 {
		t.Fatalf("refund of 20 to (50, 0) = %+v, %v; want 70 and 20", res, err)
	}
	// Shadow mode allows a drain short of its cost, and counts it.
	res, err = c.Drain(ctx, Request{Policy: "shadow", Key: "k", Cost: 31})
	if err != nil || !res.Allowed || !res.ShadowDenied || res.Taken != 30 || shadowed != 1 {
		t.Fatalf("shadow drain = %+v, %v (hook %d); want allowed, shadow-denied, 30 taken", res, err, shadowed)
	}
	// Bad input names the field; an unknown policy is ErrUnknownPolicy.
	if _, err := c.Refund(ctx, Request{Policy: "llm", Key: "k", Cost: 101}); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("refund over the capacity = %v", err)
	}
	if _, err := c.Drain(ctx, Request{Policy: "llm", Key: "k", Cost: 1, RequestID: "x"}); !errors.Is(err, sluice.ErrInvalidRequestID) {
		t.Fatalf("drain with a request ID = %v", err)
	}
	if _, err := c.Refund(ctx, Request{Policy: "llm", Key: "k", Cost: 1, RequestID: "never"}); !errors.Is(err, sluice.ErrUnknownRequestID) {
		t.Fatalf("refund of an unknown take = %v", err)
	}
	if _, err := c.Reset(ctx, "nope", "k"); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("reset of an unknown policy = %v", err)
	}
	// A store without the operations says so.
	c2, err := New(onlyStore{st}, mustTable(t, onlyStore{st}, Policy{Name: "llm", Limit: l}), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Drain(ctx, Request{Policy: "llm", Key: "k", Cost: 1}); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Fatalf("drain on a store without Drain = %v", err)
	}
}

func mustTable(t *testing.T, st sluice.Store, ps ...Policy) *Table {
	t.Helper()
	tab, err := NewTable(st, "v", ps)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}
