package service

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// refusing is a store that cannot decide limits whose period is over a day,
// as a store with narrower integers would.
type refusing struct{ sluice.Store }

func (refusing) CheckLimit(l sluice.Limit) error {
	if l.Rate.Period > 24*time.Hour {
		return sluice.ErrInvalidLimit
	}
	return nil
}

func newStore(t *testing.T) *memstore.Store {
	t.Helper()
	clock := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestNewTable(t *testing.T) {
	st := newStore(t)
	day := sluice.Limit{Capacity: 5, Rate: sluice.Per(5, 24*time.Hour)}
	week := sluice.Limit{Capacity: 5, Rate: sluice.Per(5, 7*24*time.Hour)}
	tests := []struct {
		name     string
		store    sluice.Store
		policies []Policy
		want     error
	}{
		{"valid", st, []Policy{{Name: "a", Limit: day}, {Name: "b", Limit: week}}, nil},
		{"bad name", st, []Policy{{Name: "a b", Limit: day}}, sluice.ErrInvalidPolicy},
		{"twice", st, []Policy{{Name: "a", Limit: day}, {Name: "a", Limit: week}}, sluice.ErrInvalidOption},
		{"bad limit", st, []Policy{{Name: "a"}}, sluice.ErrInvalidLimit},
		{"refused by the store", refusing{st}, []Policy{{Name: "a", Limit: day}, {Name: "b", Limit: week}}, sluice.ErrInvalidLimit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := NewTable(tt.store, "v", tt.policies)
			if tt.want == nil {
				if err != nil || len(tab.Policies()) != len(tt.policies) {
					t.Fatalf("NewTable = %v, %v; want every policy", tab, err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("NewTable = %v; want an error wrapping %v", err, tt.want)
			}
		})
	}
}

func TestShadowAndReload(t *testing.T) {
	st := newStore(t)
	one := sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}
	tab, err := NewTable(st, "v1", []Policy{{Name: "p", Limit: one, Shadow: true}})
	if err != nil {
		t.Fatal(err)
	}
	var shadowed []string
	c, err := New(st, tab, Hooks{ShadowDenied: func(p string) { shadowed = append(shadowed, p) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	r := Request{Policy: "p", Key: "k", Cost: 1}
	for i, wantShadow := range []bool{false, true} {
		res, err := c.Take(ctx, r)
		if err != nil || !res.Allowed || res.ShadowDenied != wantShadow {
			t.Fatalf("shadow take %d = %+v, %v; want allowed, ShadowDenied %v", i, res, err, wantShadow)
		}
	}
	if len(shadowed) != 1 {
		t.Fatalf("ShadowDenied hook called %d times, want 1", len(shadowed))
	}
	// A peek reports what is: shadow or not, nothing is left.
	if res, err := c.Peek(ctx, r); err != nil || res.Allowed {
		t.Fatalf("peek after the shadow denial = %+v, %v; want not allowed", res, err)
	}
	// Reloaded without shadow, the same bucket is enforced.
	tab2, err := NewTable(st, "v2", []Policy{{Name: "p", Limit: one}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetTable(tab2)
	if res, err := c.Take(ctx, r); err != nil || res.Allowed || res.RetryAfter != sluice.Never {
		t.Fatalf("take after reload = %+v, %v; want denied, never", res, err)
	}
	if _, err := c.Take(ctx, Request{Policy: "gone", Key: "k", Cost: 1}); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("take of an unknown policy = %v, want %v", err, ErrUnknownPolicy)
	}
}
