package limitcore

import (
	"context"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

func TestRefillSeconds(t *testing.T) {
	tests := []struct {
		l      sluice.Limit
		want   int64
		wantOK bool
	}{
		{sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}, 10, true},
		{sluice.Limit{Capacity: 3, Rate: sluice.Per(1, 1500*time.Millisecond)}, 5, true}, // 4.5s
		{sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Nanosecond)}, 1, true},        // 1ns rounds up
		{sluice.Limit{Capacity: 7, Rate: sluice.Per(1, 24*time.Hour)}, 7 * 86400, true},
		{sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(0)}, 0, false},
		{sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Per(1, sluice.MaxPeriod)}, 0, false}, // beyond sluice.Never
		{sluice.Limit{Capacity: 292 * 365, Rate: sluice.Per(1, 24*time.Hour)}, 292 * 365 * 86400, true},
		{sluice.Limit{Capacity: 292 * 366, Rate: sluice.Per(1, 24*time.Hour)}, 0, false},
	}
	for _, tt := range tests {
		got, ok := RefillSeconds(tt.l)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("RefillSeconds(%v) = %d, %v, want %d, %v", tt.l, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		d      time.Duration
		want   int64
		wantOK bool
	}{
		{0, 0, false},
		{-time.Second, 0, false},
		{sluice.Never, 0, false},
		{time.Nanosecond, 1, true},
		{time.Second, 1, true},
		{time.Second + time.Nanosecond, 2, true},
		{1500 * time.Millisecond, 2, true},
		{sluice.Never - 1, int64(sluice.Never/time.Second) + 1, true},
	}
	for _, tt := range tests {
		got, ok := RetryAfterSeconds(tt.d)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("RetryAfterSeconds(%v) = %d, %v, want %d, %v", tt.d, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestMulDiv(t *testing.T) {
	tests := []struct {
		a, b, c uint64
		up      bool
		want    uint64
		wantOK  bool
	}{
		{7, 3, 2, false, 10, true},
		{7, 3, 2, true, 11, true},
		{6, 3, 2, true, 9, true},
		{1, 1, 0, false, 0, false},
		{math.MaxInt64, 1, 1, true, math.MaxInt64, true},
		{math.MaxInt64, 2, 2, true, math.MaxInt64, true},
		{math.MaxInt64 + 1, 1, 1, false, 0, false},
		{1 << 63, 3, 3, false, 0, false},
		{math.MaxUint64, math.MaxUint64, 2, true, 0, false}, // quotient above 2^64
		{math.MaxInt64, 3, 2, false, 0, false},
		{1<<63 - 1, 2, 2, false, 1<<63 - 1, true},
		{1<<64 - 1, 2, 3, true, 0, false}, // about 1.2e19: above MaxInt64
	}
	for _, tt := range tests {
		got, ok := mulDiv(tt.a, tt.b, tt.c, tt.up)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("mulDiv(%d, %d, %d, %v) = %d, %v, want %d, %v", tt.a, tt.b, tt.c, tt.up, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestGrowSecondsEdges(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)} // a token every 250ms
	tests := []struct {
		name   string
		d      sluice.Decision
		l      sluice.Limit
		want   int64
		wantOK bool
	}{
		{"full: one token after the first take", sluice.Decision{Remaining: 10}, l, 1, true},
		{"over full", sluice.Decision{Remaining: 12}, l, 1, true},
		{"level 9.5", sluice.Decision{Remaining: 9, ResetAfter: 125 * time.Millisecond}, l, 1, true},
		{"empty", sluice.Decision{Remaining: 0, ResetAfter: 2500 * time.Millisecond}, l, 1, true},
		{"inconsistent: reset shorter than the tokens above", sluice.Decision{Remaining: 0, ResetAfter: time.Second}, l, 1, true},
		{"never refills", sluice.Decision{Remaining: 3}, sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(0)}, 0, false},
		{"reset never", sluice.Decision{Remaining: 3, ResetAfter: sluice.Never}, l, 0, false},
		{"slow", sluice.Decision{Remaining: 0, ResetAfter: 3 * time.Hour}, sluice.Limit{Capacity: 3, Rate: sluice.Every(time.Hour)}, 3600, true},
		{"full and slow", sluice.Decision{Remaining: 3}, sluice.Limit{Capacity: 3, Rate: sluice.Every(time.Hour)}, 3600, true},
	}
	for _, tt := range tests {
		got, ok := GrowSeconds(tt.d, tt.l)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: GrowSeconds(%+v, %v) = %d, %v, want %d, %v", tt.name, tt.d, tt.l, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestGrowSecondsMeaning checks t against the store itself: after any
// decision with r < capacity, the whole-token level is still r just under
// t−1 seconds later and above r t seconds later; t is the whole seconds,
// rounded up, until r grows (up to the 2ns the store's rounding can add).
// On a denial, t never ends after Retry-After.
func TestGrowSecondsMeaning(t *testing.T) {
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, 333 * time.Millisecond, time.Second,
		1500 * time.Millisecond, 7 * time.Second, time.Minute, time.Hour}
	rapid.Check(t, func(rt *rapid.T) {
		l := sluice.Limit{
			Capacity: rapid.Int64Range(1, 50).Draw(rt, "capacity"),
			Rate: sluice.Rate{
				Tokens: rapid.Int64Range(1, 20).Draw(rt, "tokens"),
				Period: rapid.SampledFrom(periods).Draw(rt, "period"),
			},
		}
		clock := sluicetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		store, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
		if err != nil {
			rt.Fatal(err)
		}
		defer store.Close()
		ctx := context.Background()
		for range rapid.IntRange(1, 30).Draw(rt, "steps") {
			clock.Advance(time.Duration(rapid.Int64Range(0, int64(3*l.Rate.Period)).Draw(rt, "advance")))
			cost := rapid.Int64Range(1, l.Capacity).Draw(rt, "cost")
			d, err := store.Take(ctx, sluice.Request{Policy: "p", Key: "k", Cost: cost, Limit: l})
			if err != nil {
				rt.Fatal(err)
			}
			ts, ok := GrowSeconds(d, l)
			if !ok {
				rt.Fatalf("GrowSeconds(%+v) not ok", d)
			}
			if !d.Allowed {
				ra, ok := RetryAfterSeconds(d.RetryAfter)
				if !ok || ts > ra {
					rt.Fatalf("denial %+v: t = %d after Retry-After %d", d, ts, ra)
				}
			}
			if d.Remaining >= l.Capacity {
				continue
			}
			peek := func(after time.Duration) int64 {
				now := clock.Now()
				defer clock.Set(now)
				clock.Set(now.Add(after))
				p, err := store.Peek(ctx, sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: l})
				if err != nil {
					rt.Fatal(err)
				}
				return p.Remaining
			}
			if got := peek(time.Duration(ts) * time.Second); got <= d.Remaining {
				rt.Fatalf("%+v: t = %d, but the level is still %d then", d, ts, got)
			}
			if ts >= 2 {
				if got := peek(time.Duration(ts-1)*time.Second - 2*time.Nanosecond); got != d.Remaining {
					rt.Fatalf("%+v: t = %d, but the level is already %d a second earlier", d, ts, got)
				}
			}
		}
	})
}
