package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var _ sluice.LimitChecker = (*pgstore.Store)(nil)

// TestCheckLimit: the store decides every valid limit whose period is a
// whole number of microseconds, its time unit, and refuses the others
// (sluice.CheckLimit, and Take and Peek) with an error wrapping
// sluice.ErrInvalidLimit that names the bound.
func TestCheckLimit(t *testing.T) {
	s := newStore(t, pgstore.Options{})
	ctx := context.Background()
	tests := []struct {
		l    sluice.Limit
		says string // "": decided
	}{
		{sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Microsecond)}, ""},
		{sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Per(sluice.MaxTokens, sluice.MaxPeriod)}, ""},
		{sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Per(sluice.MaxTokens, time.Microsecond)}, ""},
		{sluice.Limit{Capacity: 10, Rate: sluice.Per(0, time.Microsecond)}, ""},
		{sluice.Limit{Capacity: 10, Rate: sluice.Per(1, 1500*time.Nanosecond)}, "microsecond"},
		{sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Nanosecond)}, "microsecond"},
		{sluice.Limit{Capacity: 0, Rate: sluice.PerSecond(1)}, "capacity"},
	}
	for _, tt := range tests {
		for _, check := range []struct {
			name string
			err  error
		}{
			{"CheckLimit", s.CheckLimit(tt.l)},
			{"sluice.CheckLimit", sluice.CheckLimit(s, tt.l)},
		} {
			if tt.says == "" {
				if check.err != nil {
					t.Errorf("%s(%v) = %v; want nil", check.name, tt.l, check.err)
				}
				continue
			}
			if !errors.Is(check.err, sluice.ErrInvalidLimit) || !strings.Contains(check.err.Error(), tt.says) {
				t.Errorf("%s(%v) = %v; want an error wrapping %v that names the %s", check.name, tt.l, check.err, sluice.ErrInvalidLimit, tt.says)
			}
		}
		if tt.says == "" {
			continue
		}
		r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: tt.l}
		if _, err := s.Take(ctx, r); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("Take under %v = %v; want %v", tt.l, err, sluice.ErrInvalidLimit)
		}
		if _, err := s.Peek(ctx, r); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("Peek under %v = %v; want %v", tt.l, err, sluice.ErrInvalidLimit)
		}
	}
}

// TestConversions: Stats counts the takes that decided a bucket stored
// under another limit than the request's (processes that disagree on a
// policy's limit), and nothing else: not a take of a new or same-limit
// bucket, a replay, a peek, or a take under another policy.
func TestConversions(t *testing.T) {
	clock := sluicetest.NewClock(epoch)
	s := newStore(t, pgstore.Options{Now: clock.Now})
	ctx := context.Background()
	a := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	b := sluice.Limit{Capacity: 20, Rate: sluice.PerSecond(1)}
	steps := []struct {
		name        string
		r           sluice.Request
		peek        bool
		conversions uint64 // after the step
	}{
		{"new bucket", sluice.Request{Policy: testPolicy, Key: "k", Cost: 5, Limit: a, RequestID: "r"}, false, 0},
		{"same limit", sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: a}, false, 0},
		{"peek under another limit", sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: b}, true, 0},
		{"another limit", sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: b}, false, 1},
		{"back", sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: a}, false, 2},
		{"replay", sluice.Request{Policy: testPolicy, Key: "k", Cost: 5, Limit: a, RequestID: "r"}, false, 2},
		{"another policy", sluice.Request{Policy: "other", Key: "k", Cost: 1, Limit: b}, false, 2},
		{"another policy, another limit", sluice.Request{Policy: "other", Key: "k", Cost: 10, Limit: a}, false, 3},
	}
	for _, st := range steps {
		var err error
		if st.peek {
			_, err = s.Peek(ctx, st.r)
		} else {
			_, err = s.Take(ctx, st.r)
		}
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := s.Stats().Conversions; got != st.conversions {
			t.Fatalf("after %s, Stats().Conversions = %d; want %d", st.name, got, st.conversions)
		}
	}
}
