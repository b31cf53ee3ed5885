package bucket_test

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/sluicetest"
)

func limit(capacity, tokens int64, period time.Duration) sluice.Limit {
	return sluice.Limit{Capacity: capacity, Rate: sluice.Rate{Tokens: tokens, Period: period}}
}

const (
	day  = 24 * time.Hour
	year = 365 * day
)

func allow(remaining int64, resetAfter time.Duration, l sluice.Limit) sluice.Decision {
	return sluice.Decision{Allowed: true, Remaining: remaining, ResetAfter: resetAfter, Limit: l}
}

func deny(remaining int64, retryAfter, resetAfter time.Duration, l sluice.Limit) sluice.Decision {
	return sluice.Decision{Remaining: remaining, RetryAfter: retryAfter, ResetAfter: resetAfter, Limit: l}
}

func mustPlan(t testing.TB, l sluice.Limit, tick time.Duration) bucket.Plan {
	t.Helper()
	p, err := bucket.NewPlan(l, tick)
	if err != nil {
		t.Fatalf("NewPlan(%v, %v): %v", l, tick, err)
	}
	return p
}

func TestNewPlan(t *testing.T) {
	tests := []struct {
		l                  sluice.Limit
		tick               time.Duration
		scale, refillUnits uint64
	}{
		{limit(10, 10, time.Second), time.Nanosecond, 1e8, 1},
		{limit(10, 10, 13*time.Second), time.Nanosecond, 13e8, 1},
		{limit(10, 7, 13*time.Second), time.Nanosecond, 13e9, 7},
		{limit(10, 0, time.Second), time.Nanosecond, 1, 0},
		{limit(10, 6, 4), time.Nanosecond, 2, 3},
		{limit(sluice.MaxCapacity, sluice.MaxTokens, 1), time.Nanosecond, 1, sluice.MaxTokens},
		{limit(1, 1, sluice.MaxPeriod), time.Nanosecond, uint64(sluice.MaxPeriod), 1},
		{limit(1, 1, sluice.MaxPeriod), time.Microsecond, uint64(sluice.MaxPeriod / time.Microsecond), 1},
		{limit(1, 1000, time.Second), time.Millisecond, 1, 1},
	}
	for _, tt := range tests {
		p := mustPlan(t, tt.l, tt.tick)
		if p.Scale() != tt.scale || p.RefillUnits() != tt.refillUnits || p.Limit() != tt.l || p.Tick() != tt.tick {
			t.Errorf("NewPlan(%v, %v) = scale %d, units %d, limit %v, tick %v; want scale %d, units %d",
				tt.l, tt.tick, p.Scale(), p.RefillUnits(), p.Limit(), p.Tick(), tt.scale, tt.refillUnits)
		}
	}
}

func TestNewPlanErrors(t *testing.T) {
	tests := []struct {
		name string
		l    sluice.Limit
		tick time.Duration
	}{
		{"invalid limit", limit(0, 1, time.Second), time.Nanosecond},
		{"tick 0", limit(1, 1, time.Second), 0},
		{"tick -1ns", limit(1, 1, time.Second), -1},
		{"period not a whole number of ticks", limit(1, 1, 1500*time.Nanosecond), time.Microsecond},
		{"period shorter than a tick", limit(1, 1, time.Nanosecond), time.Microsecond},
	}
	for _, tt := range tests {
		if p, err := bucket.NewPlan(tt.l, tt.tick); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s: NewPlan(%v, %v) = %+v, %v; want an error wrapping ErrInvalidLimit", tt.name, tt.l, tt.tick, p, err)
		}
	}
}

// step is one call of a transition table at tick at: a take of cost, or a
// Peek if cost is 0.
type step struct {
	at    int64
	cost  int64
	want  sluice.Decision
	state *bucket.State // the state afterwards, if checked
}

func TestPlanTransitions(t *testing.T) {
	const ms = int64(time.Millisecond)
	const s = int64(time.Second)
	tenPerSec := limit(10, 10, time.Second)
	tenPer13s := limit(10, 10, 13*time.Second)
	yearly := limit(1, 1, sluice.MaxPeriod)
	huge := limit(sluice.MaxCapacity, sluice.MaxTokens, time.Nanosecond)
	odd := limit(2, 3, 10*time.Nanosecond)
	oddMicro := limit(2, 3, 10*time.Microsecond)
	none := limit(3, 0, time.Second)
	slowHuge := limit(sluice.MaxCapacity, 1, sluice.MaxPeriod)
	perSec := limit(10, 1, time.Second)
	never := sluice.Never
	tests := []struct {
		name  string
		l     sluice.Limit
		tick  time.Duration
		steps []step
	}{
		{"10/s for 150ms is 1.5 tokens", tenPerSec, time.Nanosecond, []step{
			{0, 10, allow(0, time.Second, tenPerSec), &bucket.State{Tokens: 0, Frac: 0, Stamp: 0}},
			{150 * ms, 0, allow(1, 850*time.Millisecond, tenPerSec), nil},
			{150 * ms, 1, allow(0, 950*time.Millisecond, tenPerSec), &bucket.State{Tokens: 0, Frac: 5e7, Stamp: 150 * ms}},
			{150 * ms, 1, deny(0, 50*time.Millisecond, 950*time.Millisecond, tenPerSec), nil},
			{200 * ms, 1, allow(0, time.Second, tenPerSec), &bucket.State{Stamp: 200 * ms}},
		}},
		{"10 per 13s", tenPer13s, time.Nanosecond, []step{
			{0, 10, allow(0, 13*time.Second, tenPer13s), nil},
			// 10/13 of a token: 0.3s more for one, 12s more for ten.
			{1 * s, 1, deny(0, 300*time.Millisecond, 12*time.Second, tenPer13s), &bucket.State{Tokens: 0, Frac: 1e9, Stamp: s}},
			{1300 * ms, 1, allow(0, 13*time.Second, tenPer13s), &bucket.State{Stamp: 1300 * ms}},
			{14300 * ms, 0, allow(10, 0, tenPer13s), nil},
		}},
		{"1 per 366 days", yearly, time.Nanosecond, []step{
			{0, 1, allow(0, sluice.MaxPeriod, yearly), nil},
			{int64(sluice.MaxPeriod) - 1, 1, deny(0, 1, 1, yearly), nil},
			{int64(sluice.MaxPeriod), 1, allow(0, sluice.MaxPeriod, yearly), nil},
		}},
		{"2^40 per ns, 100 years idle", huge, time.Nanosecond, []step{
			{0, sluice.MaxCapacity, allow(0, 1, huge), nil},
			{0, 1, deny(0, 1, 1, huge), nil},
			{1, sluice.MaxCapacity, allow(0, 1, huge), nil},
			{int64(100 * year), sluice.MaxCapacity, allow(0, 1, huge), &bucket.State{Stamp: int64(100 * year)}},
			{int64(200 * year), 0, allow(sluice.MaxCapacity, 0, huge), nil},
			{math.MaxInt64, 1, allow(sluice.MaxCapacity-1, 1, huge), &bucket.State{Tokens: sluice.MaxCapacity - 1, Stamp: math.MaxInt64}},
		}},
		{"waits round up", odd, time.Nanosecond, []step{
			{0, 2, allow(0, 7, odd), nil},     // 20/3 ns
			{0, 1, deny(0, 4, 7, odd), nil},   // 10/3 ns
			{4, 1, allow(0, 6, odd), nil},     // 1.2 - 1 = 0.2; 1.8 more is 6ns
			{4, 1, deny(0, 3, 6, odd), nil},   // 0.8 more is 2.67ns
			{100, 0, allow(2, 0, odd), nil},   // full
			{100, 2, allow(0, 7, odd), nil},   // again
			{103, 2, deny(0, 4, 4, odd), nil}, // 0.9: 1.1 more is 3.67ns
		}},
		{"waits round up to the tick", oddMicro, time.Microsecond, []step{
			{0, 2, allow(0, 7*time.Microsecond, oddMicro), nil},
			{0, 1, deny(0, 4*time.Microsecond, 7*time.Microsecond, oddMicro), nil},
			{4, 1, allow(0, 6*time.Microsecond, oddMicro), nil},
		}},
		{"no refill", none, time.Nanosecond, []step{
			{0, 0, allow(3, 0, none), nil},
			{0, 3, allow(0, never, none), nil},
			{0, 1, deny(0, never, never, none), nil},
			{int64(100 * year), 1, deny(0, never, never, none), nil},
			{int64(100 * year), 0, deny(0, never, never, none), nil},
		}},
		{"a wait beyond a Duration is Never", slowHuge, time.Nanosecond, []step{
			{0, sluice.MaxCapacity, allow(0, never, slowHuge), nil},
			{0, 1, deny(0, sluice.MaxPeriod, never, slowHuge), nil},
			{int64(sluice.MaxPeriod), 1, allow(0, never, slowHuge), nil},
		}},
		{"a clock that steps back refills nothing", perSec, time.Nanosecond, []step{
			{3600 * s, 10, allow(0, 10*time.Second, perSec), nil},
			// Waits count from now: an hour to the stamp, then the refill.
			{0, 1, deny(0, 3601*time.Second, 3610*time.Second, perSec), &bucket.State{Stamp: 3600 * s}},
			{3600*s + 500*ms, 1, deny(0, 500*time.Millisecond, 9500*time.Millisecond, perSec), nil},
			{-3600 * s, 0, deny(0, 7201*time.Second, 7210*time.Second, perSec), nil},
			{3601 * s, 1, allow(0, 10*time.Second, perSec), &bucket.State{Stamp: 3601 * s}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPlan(t, tt.l, tt.tick)
			model := sluicetest.NewModel(tt.tick, sluice.KeepTokens, 0)
			var st bucket.State
			for i, s := range tt.steps {
				if i == 0 {
					st = p.Full(s.at)
				}
				var got, want sluice.Decision
				var err error
				if s.cost == 0 {
					got = p.Peek(st, s.at, 1)
					want, err = model.Peek(s.at, sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: tt.l})
				} else {
					p.Take(&st, s.at, s.cost, &got)
					want, err = model.Take(s.at, sluice.Request{Policy: "p", Key: "k", Cost: s.cost, Limit: tt.l})
				}
				if diff := cmp.Diff(s.want, got); diff != "" {
					t.Fatalf("step %d: cost %d at tick %d = %+v, want %+v (-want +got):\n%s", i, s.cost, s.at, got, s.want, diff)
				}
				if err != nil || want != got {
					t.Fatalf("step %d: cost %d at tick %d = %+v, the model says %+v, %v", i, s.cost, s.at, got, want, err)
				}
				if s.state != nil && st != *s.state {
					t.Fatalf("step %d: state %+v, want %+v", i, st, *s.state)
				}
			}
		})
	}
}

func TestPlanRefill(t *testing.T) {
	p := mustPlan(t, limit(10, 10, time.Second), time.Nanosecond) // scale 1e8
	tests := []struct {
		name string
		s    bucket.State
		now  int64
		want bucket.State
	}{
		{"no time", bucket.State{Tokens: 3, Frac: 7, Stamp: 100}, 100, bucket.State{Tokens: 3, Frac: 7, Stamp: 100}},
		{"backwards", bucket.State{Tokens: 3, Frac: 7, Stamp: 100}, 50, bucket.State{Tokens: 3, Frac: 7, Stamp: 100}},
		{"one unit", bucket.State{Tokens: 3, Frac: 7, Stamp: 100}, 101, bucket.State{Tokens: 3, Frac: 8, Stamp: 101}},
		{"carry into a token", bucket.State{Tokens: 3, Frac: 1e8 - 1, Stamp: 0}, 1, bucket.State{Tokens: 4, Frac: 0, Stamp: 1}},
		{"exactly full", bucket.State{Tokens: 9, Frac: 1, Stamp: 0}, 1e8 - 1, bucket.State{Tokens: 10, Stamp: 1e8 - 1}},
		{"just short of full", bucket.State{Tokens: 9, Frac: 1, Stamp: 0}, 1e8 - 2, bucket.State{Tokens: 9, Frac: 1e8 - 1, Stamp: 1e8 - 2}},
		{"capped", bucket.State{Tokens: 0, Stamp: math.MinInt64}, math.MaxInt64, bucket.State{Tokens: 10, Stamp: math.MaxInt64}},
		{"full moves the stamp", bucket.State{Tokens: 10, Stamp: 0}, 5, bucket.State{Tokens: 10, Stamp: 5}},
	}
	for _, tt := range tests {
		if got := p.Refill(tt.s, tt.now); got != tt.want {
			t.Errorf("%s: Refill(%+v, %d) = %+v, want %+v", tt.name, tt.s, tt.now, got, tt.want)
		}
	}
}

func TestPlanFullAt(t *testing.T) {
	perSec := mustPlan(t, limit(10, 1, time.Second), time.Nanosecond)
	none := mustPlan(t, limit(10, 0, time.Second), time.Nanosecond)
	slow := mustPlan(t, limit(sluice.MaxCapacity, 1, sluice.MaxPeriod), time.Nanosecond)
	tests := []struct {
		name string
		p    bucket.Plan
		s    bucket.State
		want int64
	}{
		{"full", perSec, bucket.State{Tokens: 10, Stamp: 7}, 7},
		{"empty", perSec, bucket.State{Stamp: 7}, 7 + 10e9},
		{"fraction", perSec, bucket.State{Tokens: 9, Frac: 1, Stamp: 0}, 1e9 - 1},
		{"no refill", none, bucket.State{Tokens: 9, Stamp: 0}, math.MaxInt64},
		{"beyond 64 bits", slow, bucket.State{Stamp: 0}, math.MaxInt64},
		{"beyond int64", perSec, bucket.State{Stamp: math.MaxInt64 - 5}, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := tt.p.FullAt(tt.s); got != tt.want {
			t.Errorf("%s: FullAt(%+v) = %d, want %d", tt.name, tt.s, got, tt.want)
		}
	}
}

func TestPlanConvert(t *testing.T) {
	tick := time.Nanosecond
	old := limit(10, 1, time.Second) // scale 1e9
	halfway := bucket.State{Tokens: 6, Frac: 5e8, Stamp: 42}
	full := bucket.State{Tokens: 10, Stamp: 42}
	type want struct{ keep, scale, reset bucket.State }
	tests := []struct {
		name     string
		from, to sluice.Limit
		s        bucket.State
		want     want
	}{
		{"raise capacity", old, limit(20, 1, time.Second), halfway, want{
			keep:  bucket.State{Tokens: 6, Frac: 5e8, Stamp: 42},
			scale: bucket.State{Tokens: 13, Stamp: 42},
			reset: bucket.State{Tokens: 20, Stamp: 42},
		}},
		{"lower capacity", old, limit(4, 1, time.Second), halfway, want{
			keep:  bucket.State{Tokens: 4, Stamp: 42},
			scale: bucket.State{Tokens: 2, Frac: 6e8, Stamp: 42},
			reset: bucket.State{Tokens: 4, Stamp: 42},
		}},
		{"faster rate", old, limit(10, 4, time.Second), halfway, want{ // scale 2.5e8
			keep:  bucket.State{Tokens: 6, Frac: 125e6, Stamp: 42},
			scale: bucket.State{Tokens: 6, Frac: 125e6, Stamp: 42},
			reset: bucket.State{Tokens: 10, Stamp: 42},
		}},
		{"coarser grid rounds down", old, limit(10, 1, 2), halfway, want{ // scale 2
			keep:  bucket.State{Tokens: 6, Frac: 1, Stamp: 42},
			scale: bucket.State{Tokens: 6, Frac: 1, Stamp: 42},
			reset: bucket.State{Tokens: 10, Stamp: 42},
		}},
		{"coarser grid rounds down, not to nearest", limit(1, 1, time.Second), limit(1, 1, 2),
			bucket.State{Frac: 999999999}, want{
				keep:  bucket.State{Frac: 1},
				scale: bucket.State{Frac: 1},
				reset: bucket.State{Tokens: 1},
			}},
		{"no refill", old, limit(10, 0, time.Second), halfway, want{ // scale 1
			keep:  bucket.State{Tokens: 6, Stamp: 42},
			scale: bucket.State{Tokens: 6, Stamp: 42},
			reset: bucket.State{Tokens: 10, Stamp: 42},
		}},
		{"from no refill", limit(10, 0, time.Second), limit(5, 1, time.Second), bucket.State{Tokens: 7}, want{
			keep:  bucket.State{Tokens: 5},
			scale: bucket.State{Tokens: 3, Frac: 5e8},
			reset: bucket.State{Tokens: 5},
		}},
		{"thirds round down", limit(3, 1, time.Second), limit(7, 1, time.Second), bucket.State{Tokens: 1}, want{
			keep:  bucket.State{Tokens: 1},
			scale: bucket.State{Tokens: 2, Frac: 333333333},
			reset: bucket.State{Tokens: 7},
		}},
		{"full, raise capacity", old, limit(20, 1, time.Second), full, want{
			keep:  bucket.State{Tokens: 20, Stamp: 42},
			scale: bucket.State{Tokens: 20, Stamp: 42},
			reset: bucket.State{Tokens: 20, Stamp: 42},
		}},
		{"full, lower capacity", old, limit(4, 1, time.Second), full, want{
			keep:  bucket.State{Tokens: 4, Stamp: 42},
			scale: bucket.State{Tokens: 4, Stamp: 42},
			reset: bucket.State{Tokens: 4, Stamp: 42},
		}},
		{"huge to tiny", limit(sluice.MaxCapacity, sluice.MaxTokens, 1), limit(1, 1, sluice.MaxPeriod),
			bucket.State{Tokens: sluice.MaxCapacity - 1}, want{
				keep: bucket.State{Tokens: 1},
				// (2^40-1)/2^40 of a token is P - P/2^40 = P - 28760.3 units, rounded down.
				scale: bucket.State{Tokens: 0, Frac: uint64(sluice.MaxPeriod) - 28761},
				reset: bucket.State{Tokens: 1},
			}},
		{"empty", old, limit(20, 3, time.Second), bucket.State{}, want{
			keep:  bucket.State{},
			scale: bucket.State{},
			reset: bucket.State{Tokens: 20},
		}},
	}
	for _, tt := range tests {
		from := mustPlan(t, tt.from, tick)
		to := mustPlan(t, tt.to, tick)
		for policy, want := range map[sluice.Conversion]bucket.State{
			sluice.KeepTokens: tt.want.keep, sluice.ScaleTokens: tt.want.scale, sluice.ResetTokens: tt.want.reset,
		} {
			if got := to.Convert(tt.s, &from, policy); got != want {
				t.Errorf("%s: Convert(%+v) under %v = %+v, want %+v", tt.name, tt.s, policy, got, want)
			}
		}
	}
}

// TestPlanMillion makes a million decisions at random times, some with the
// clock stepping back, on a bucket that never empties nor fills. Every
// decision must equal the closed form, level = C - taken + (t - t0) * n / P
// with t the latest time so far, and so must the final state; the first
// decisions are also compared with the model.
func TestPlanMillion(t *testing.T) {
	n, checked := 1_000_000, 100_000
	if testing.Short() {
		n, checked = 100_000, 10_000
	}
	const c, tokens, period = int64(sluice.MaxCapacity), 7, 13 // 7/13 of a token per ns
	l := limit(c, tokens, period)
	p := mustPlan(t, l, time.Nanosecond)
	model := sluicetest.NewModel(time.Nanosecond, sluice.KeepTokens, 0)
	rng := rand.New(rand.NewPCG(3, 4))

	const t0 = 1000
	now, latest := int64(t0), int64(t0)
	s := p.Full(now)
	taken := c / 2
	var d sluice.Decision
	p.Take(&s, now, taken, &d)
	if _, err := model.Take(now, sluice.Request{Policy: "p", Key: "k", Cost: taken, Limit: l}); err != nil || !d.Allowed {
		t.Fatalf("first take: %+v, %v", d, err)
	}
	// units is the closed-form level in 1/13 of a token.
	units := func() int64 { return (latest-t0)*tokens + (c-taken)*period }
	for i := range n {
		if rng.IntN(10) == 0 {
			now -= rng.Int64N(50)
		} else {
			now += rng.Int64N(200)
		}
		latest = max(latest, now)
		cost := 1 + rng.Int64N(100)
		p.Take(&s, now, cost, &d)
		taken += cost
		u := units()
		// The wait until full counts from now: latest-now ticks behind.
		want := allow(u/period, time.Duration((c*period-u+tokens-1)/tokens+latest-now), l)
		if d != want {
			t.Fatalf("decision %d: cost %d at %d = %+v, want %+v (closed form)", i, cost, now, d, want)
		}
		if i < checked {
			if want, err := model.Take(now, sluice.Request{Policy: "p", Key: "k", Cost: cost, Limit: l}); err != nil || want != d {
				t.Fatalf("decision %d: cost %d at %d = %+v, the model says %+v, %v", i, cost, now, d, want, err)
			}
			if i == checked-1 {
				if got := model.Level("p", "k"); got.Cmp(big.NewRat(u, period)) != 0 {
					t.Fatalf("after %d decisions: model level %s, want %d/%d (closed form)", checked, got.RatString(), u, period)
				}
			}
		}
	}
	u := units()
	if want := (bucket.State{Tokens: u / period, Frac: uint64(u % period), Stamp: latest}); s != want {
		t.Fatalf("after %d decisions: state %+v, want %+v (closed form)", n, s, want)
	}
}

// TestPlanAgainstModel compares Plan-based decisions with the model on
// random traces that fill and empty small buckets, change limits under each
// policy and step the clock back.
func TestPlanAgainstModel(t *testing.T) {
	limits := []sluice.Limit{
		limit(3, 1, time.Second),
		limit(10, 7, 13*time.Nanosecond),
		limit(100, 3, 7*time.Nanosecond),
		limit(1, 0, time.Second),
		limit(5, 2, 3),
	}
	for _, policy := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		t.Run(policy.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, uint64(policy)))
			b := newPlanBuckets(time.Nanosecond, policy)
			model := sluicetest.NewModel(time.Nanosecond, policy, 0)
			now := int64(0)
			for i := range 30_000 {
				switch rng.IntN(10) {
				case 0:
					now -= rng.Int64N(100)
				case 1:
					now += rng.Int64N(int64(2 * time.Second))
				default:
					now += rng.Int64N(20)
				}
				key := string(rune('a' + rng.IntN(3)))
				l := limits[rng.IntN(len(limits))]
				r := sluice.Request{Policy: "p", Key: key, Cost: 1 + rng.Int64N(l.Capacity), Limit: l}
				if rng.IntN(5) == 0 {
					got, err := b.peek(now, r)
					want, werr := model.Peek(now, r)
					if err != nil || werr != nil || got != want {
						t.Fatalf("%d: Peek(%s) at %d = %+v, %v; the model says %+v, %v", i, r.Key, now, got, err, want, werr)
					}
					continue
				}
				if rng.IntN(20) == 0 {
					b.reset(now, key)
					if err := model.Reset(now, "p", key); err != nil {
						t.Fatal(err)
					}
					continue
				}
				op, bop, mop := "Take", b.take, model.Take
				switch rng.IntN(6) {
				case 0:
					op, bop, mop = "Drain", b.drain, model.Drain
					if rng.IntN(4) == 0 {
						r.Cost += l.Capacity // a charge larger than the bucket
					}
				case 1:
					op, bop, mop = "Refund", b.refund, model.Refund
				}
				got, err := bop(now, r)
				want, werr := mop(now, r)
				if err != nil || werr != nil || got != want {
					t.Fatalf("%d: %s(%q, %d, %v) at %d = %+v, %v; the model says %+v, %v", i, op, key, r.Cost, l, now, got, err, want, werr)
				}
				if err := b.check(key); err != nil {
					t.Fatalf("%d: %v", i, err)
				}
			}
		})
	}
}
