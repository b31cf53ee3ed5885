package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func newMultiCore(t *testing.T, ps ...Policy) *Core {
	t.Helper()
	st, _ := newClockStore(t)
	tab, err := NewTable(st, "v", ps)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(st, tab, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A request denied by one policy consumes nothing from the others.
func TestTakeAllAllOrNothing(t *testing.T) {
	ctx := context.Background()
	frozen := func(n int64) sluice.Limit { return sluice.Limit{Capacity: n, Rate: sluice.Per(0, time.Second)} }
	c := newMultiCore(t,
		Policy{Name: "wide", Limit: frozen(10)},
		Policy{Name: "narrow", Limit: frozen(2)},
		Policy{Name: "pair", Limits: []sluice.Limit{frozen(5), frozen(3)}},
	)
	rs := []Request{{Policy: "wide", Key: "k", Cost: 1}, {Policy: "narrow", Key: "k", Cost: 1}, {Policy: "pair", Key: "k", Cost: 1}}
	for i := range 2 {
		mr, err := c.TakeAll(ctx, rs)
		if err != nil || !mr.Allowed || mr.Denied != -1 {
			t.Fatalf("take %d = %+v, %v; want allowed", i, mr, err)
		}
	}
	mr, err := c.TakeAll(ctx, rs)
	if err != nil || mr.Allowed || mr.Denied != 1 {
		t.Fatalf("third take = %+v, %v; want denied by request 1 (narrow)", mr, err)
	}
	if !mr.Results[0].Allowed || mr.Results[1].Allowed || !mr.Results[2].Allowed {
		t.Fatalf("results = %+v; want wide and pair allowed alone, narrow denied", mr.Results)
	}
	if got := mr.Results[0].Remaining; got != 8 {
		t.Fatalf("wide remaining = %d after the denial, want 8 (nothing taken)", got)
	}
	if got := mr.Results[2].Remaining; got != 1 || len(mr.Results[2].Parts) != 2 {
		t.Fatalf("pair = %+v; want remaining 1 (its 3-token limit) and two parts", mr.Results[2])
	}
	// The denial took nothing: wide alone still has 8.
	res, err := c.Peek(ctx, Request{Policy: "wide", Key: "k", Cost: 8})
	if err != nil || !res.Allowed {
		t.Fatalf("peek of 8 from wide = %+v, %v; want allowed", res, err)
	}
}

// A shadow policy's denial does not deny the others, and is recorded.
func TestTakeAllShadow(t *testing.T) {
	ctx := context.Background()
	frozen := sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}
	var shadowed []string
	st, _ := newClockStore(t)
	tab, err := NewTable(st, "v", []Policy{{Name: "real", Limit: sluice.Limit{Capacity: 10, Rate: sluice.Per(0, time.Second)}}, {Name: "try", Limit: frozen, Shadow: true}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(st, tab, Hooks{ShadowDenied: func(p string) { shadowed = append(shadowed, p) }})
	if err != nil {
		t.Fatal(err)
	}
	rs := []Request{{Policy: "real", Key: "k", Cost: 1}, {Policy: "try", Key: "k", Cost: 1}}
	for i := range 3 {
		mr, err := c.TakeAll(ctx, rs)
		if err != nil || !mr.Allowed {
			t.Fatalf("take %d = %+v, %v; want allowed", i, mr, err)
		}
		if got := mr.Results[0].Remaining; got != int64(9-i) {
			t.Fatalf("take %d: real remaining %d, want %d", i, got, 9-i)
		}
		if want := i > 0; mr.Results[1].ShadowDenied != want || !mr.Results[1].Allowed {
			t.Fatalf("take %d: shadow result %+v; want allowed, ShadowDenied %v", i, mr.Results[1], want)
		}
	}
	if len(shadowed) != 2 {
		t.Fatalf("shadow denials recorded %v, want two of try", shadowed)
	}
}

func TestTakeAllRefuses(t *testing.T) {
	ctx := context.Background()
	l := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	c := newMultiCore(t, Policy{Name: "a", Limit: l})
	many := make([]Request, sluice.MaxParts+1)
	for i := range many {
		many[i] = Request{Policy: "a", Key: string(rune('a' + i)), Cost: 1}
	}
	for _, tc := range []struct {
		name string
		rs   []Request
		want error
	}{
		{"unknown policy", []Request{{Policy: "a", Key: "k", Cost: 1}, {Policy: "b", Key: "k", Cost: 1}}, ErrUnknownPolicy},
		{"request ID", []Request{{Policy: "a", Key: "k", Cost: 1, RequestID: "r1"}}, sluice.ErrInvalidRequestID},
		{"too many limits", many, sluice.ErrInvalidMulti},
		{"none", nil, nil},
		{"cost above capacity", []Request{{Policy: "a", Key: "k", Cost: 6}}, sluice.ErrInvalidCost},
	} {
		mr, err := c.TakeAll(ctx, tc.rs)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: TakeAll = %+v, %v; want %v", tc.name, mr, err, tc.want)
		}
	}
	// Nothing was taken by the refused calls.
	if res, err := c.Peek(ctx, Request{Policy: "a", Key: "k", Cost: 5}); err != nil || !res.Allowed {
		t.Fatalf("peek = %+v, %v; want the bucket full", res, err)
	}
}
