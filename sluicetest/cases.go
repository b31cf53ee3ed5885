package sluicetest

import (
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// allow is an allowed decision under l.
func allow(remaining int64, resetAfter time.Duration, l sluice.Limit) sluice.Decision {
	return sluice.Decision{Allowed: true, Remaining: remaining, ResetAfter: resetAfter, Limit: l}
}

// deny is a denied decision under l.
func deny(remaining int64, retryAfter, resetAfter time.Duration, l sluice.Limit) sluice.Decision {
	return sluice.Decision{Remaining: remaining, RetryAfter: retryAfter, ResetAfter: resetAfter, Limit: l}
}

// replayed marks d as a replay.
func replayed(d sluice.Decision) sluice.Decision {
	d.Replayed = true
	return d
}

// refillTime is the time, rounded up to whole ticks, that l takes to refill
// the given number of tokens; l must refill.
func refillTime(tokens int64, l sluice.Limit, tick time.Duration) time.Duration {
	num := new(big.Int).Mul(big.NewInt(tokens), big.NewInt(int64(l.Rate.Period/tick)))
	ticks := ceil(new(big.Rat).SetFrac(num, big.NewInt(l.Rate.Tokens)))
	return time.Duration(ticks.Int64()) * tick
}

func req(key string, cost int64, l sluice.Limit) sluice.Request {
	return sluice.Request{Policy: testPolicy, Key: key, Cost: cost, Limit: l}
}

func reqID(key string, cost int64, l sluice.Limit, id string) sluice.Request {
	return sluice.Request{Policy: testPolicy, Key: key, Cost: cost, Limit: l, RequestID: id}
}

// testClockRollback: a clock that steps back refills nothing and never moves
// a bucket's stamp back; neither a Peek nor a later Peek moves it either.
// Waits are measured from the caller's now, so they include the time from
// now to the stamp: the wait a denial names is one that works.
func (s Suite) testClockRollback(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	at := func(d time.Duration) { r.set(r.ticks(d)) }

	at(2 * time.Hour)
	r.mustTake(t, req("k", 10, l), allow(0, 10*time.Second, l))
	at(time.Hour)
	r.mustTake(t, req("k", 1, l), deny(0, time.Hour+time.Second, time.Hour+10*time.Second, l))
	r.mustPeek(t, "k", l, deny(0, time.Hour+time.Second, time.Hour+10*time.Second, l))
	// Refill counts from 2h, not from 1h.
	at(2*time.Hour + 500*time.Millisecond)
	r.mustTake(t, req("k", 1, l), deny(0, 500*time.Millisecond, 9500*time.Millisecond, l))
	at(2*time.Hour + time.Second)
	r.mustTake(t, req("k", 1, l), allow(0, 10*time.Second, l))
	at(time.Hour + time.Second)
	r.mustTake(t, req("k", 1, l), deny(0, time.Hour+time.Second, time.Hour+10*time.Second, l))
	at(2*time.Hour + 3*time.Second)
	r.mustTake(t, req("k", 2, l), allow(0, 10*time.Second, l))

	// A Peek at a later time moves no stamp.
	at(3 * time.Hour)
	r.mustTake(t, req("f", 1, l), allow(9, time.Second, l))
	at(3*time.Hour + 500*time.Millisecond)
	r.mustPeek(t, "f", l, allow(9, 500*time.Millisecond, l))
	at(2 * time.Hour)
	r.mustTake(t, req("f", 10, l), deny(9, time.Hour+time.Second, time.Hour+time.Second, l))
	// Waiting what the denial said is enough, and one tick less is not.
	at(3*time.Hour + time.Second - s.Tick)
	r.mustPeekReq(t, req("f", 10, l), deny(9, s.Tick, s.Tick, l))
	at(3*time.Hour + time.Second)
	r.mustTake(t, req("f", 10, l), allow(0, 10*time.Second, l))

	// A Peek of a missing key creates no bucket.
	at(5 * time.Hour)
	r.mustPeek(t, "p", l, allow(10, 0, l))
	at(4 * time.Hour)
	r.mustTake(t, req("p", 10, l), allow(0, 10*time.Second, l))
	at(4*time.Hour + time.Second)
	r.mustTake(t, req("p", 1, l), allow(0, 10*time.Second, l))
}

// testIdleGaps: after idle gaps of up to 100 years the level is exact and
// capped at capacity, with the tiniest and the hugest rates.
func (s Suite) testIdleGaps(t *testing.T) {
	tick := s.Tick
	huge := sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Per(sluice.MaxTokens, tick)}
	tiny := sluice.Limit{Capacity: 10, Rate: sluice.Every(sluice.MaxPeriod)}
	tinyHuge := sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Every(sluice.MaxPeriod)}
	odd := sluice.Limit{Capacity: 1000, Rate: sluice.Per(7, 13*time.Second)}
	tests := []struct {
		name  string
		l     sluice.Limit
		drain sluice.Decision // taking the whole capacity at tick zero
		idle  time.Duration
		cost  int64
		want  sluice.Decision
		later sluice.Decision // a Peek 100 years later still
	}{
		{"1 per 366 days, 100 years", tiny, allow(0, 10*sluice.MaxPeriod, tiny), 100 * year, 1, allow(9, sluice.MaxPeriod, tiny), allow(10, 0, tiny)},
		{"1 per 366 days, 3 periods", tiny, allow(0, 10*sluice.MaxPeriod, tiny), 3 * sluice.MaxPeriod, 1, allow(2, 8*sluice.MaxPeriod, tiny), allow(10, 0, tiny)},
		{"1 per 366 days, 3 periods less a tick", tiny, allow(0, 10*sluice.MaxPeriod, tiny), 3*sluice.MaxPeriod - tick, 3, deny(2, tick, 7*sluice.MaxPeriod+tick, tiny), allow(10, 0, tiny)},
		{"2^40 per tick, 1 tick", huge, allow(0, tick, huge), tick, sluice.MaxCapacity, allow(0, tick, huge), allow(sluice.MaxCapacity, 0, huge)},
		{"2^40 per tick, 100 years", huge, allow(0, tick, huge), 100 * year, sluice.MaxCapacity, allow(0, tick, huge), allow(sluice.MaxCapacity, 0, huge)},
		// 100 years of 1 token per 366 days is 36500/366 = 99.73 tokens;
		// 2^40 tokens take longer than a time.Duration can hold. 100 more
		// years make 98.73 + 99.73 = 198.45 tokens.
		{"2^40 capacity, 1 per 366 days, 100 years", tinyHuge, allow(0, sluice.Never, tinyHuge), 100 * year, 1, allow(98, sluice.Never, tinyHuge), allow(198, sluice.Never, tinyHuge)},
		{"7 per 13s, 100 years", odd, allow(0, refillTime(1000, odd, tick), odd), 100 * year, 1, allow(999, refillTime(1, odd, tick), odd), allow(1000, 0, odd)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := s.newRig(t, sluice.KeepTokens, time.Minute)
			r.mustTake(t, req("k", tt.l.Capacity, tt.l), tt.drain)
			r.advance(tt.idle)
			r.mustTake(t, req("k", tt.cost, tt.l), tt.want)
			// A second gap: still exact, still capped, no overflow.
			r.advance(100 * year)
			r.mustPeek(t, "k", tt.l, tt.later)
		})
	}
}

// testNoRefill: a limit of 0 tokens per period drains and then denies
// forever, saying Never rather than a wait.
func (s Suite) testNoRefill(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 5, Rate: sluice.Per(0, time.Second)}
	never := sluice.Never
	r.mustPeek(t, "k", l, allow(5, 0, l))
	r.mustTake(t, req("k", 2, l), allow(3, never, l))
	r.mustTake(t, req("k", 4, l), deny(3, never, never, l))
	r.mustTake(t, req("k", 3, l), allow(0, never, l))
	r.mustTake(t, req("k", 1, l), deny(0, never, never, l))
	r.advance(100 * year)
	r.mustTake(t, req("k", 1, l), deny(0, never, never, l))
	r.mustTake(t, req("k", 5, l), deny(0, never, never, l))
	r.mustPeek(t, "k", l, deny(0, never, never, l))

	one := sluice.Limit{Capacity: 1, Rate: sluice.Per(0, sluice.MaxPeriod)}
	r.mustTake(t, req("one", 1, one), allow(0, never, one))
	r.mustTake(t, req("one", 1, one), deny(0, never, never, one))
}

// testWholeCapacity: cost = capacity is allowed on a full bucket only, with
// exact waits rounded up to a tick.
func (s Suite) testWholeCapacity(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	tick := s.Tick
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(3)}
	full := refillTime(10, l, tick) // 3.333...s, rounded up
	r.mustTake(t, req("k", 10, l), allow(0, full, l))
	r.mustTake(t, req("k", 10, l), deny(0, full, full, l))
	r.mustPeek(t, "k", l, deny(0, refillTime(1, l, tick), full, l))
	r.advance(full - tick)
	r.mustTake(t, req("k", 10, l), deny(9, tick, tick, l))
	r.advance(tick)
	r.mustTake(t, req("k", 10, l), allow(0, full, l))

	one := sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Second)}
	r.mustTake(t, req("one", 1, one), allow(0, time.Second, one))
	r.mustTake(t, req("one", 1, one), deny(0, time.Second, time.Second, one))
}

// testBadParameters: every bad parameter is its error, never a denial, and
// changes no bucket and remembers no request ID.
func (s Suite) testBadParameters(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Hour)
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	r.mustTake(t, req("k", 3, l), allow(7, 3*time.Second, l))
	for _, c := range badRequests(s.Tick, modelKey{testPolicy, "k"}, l) {
		t.Run(c.name, func(t *testing.T) {
			d, err := r.take(t, c.req)
			if !errors.Is(err, c.want) {
				t.Fatalf("Take(%s) = %+v, %v; want error %v", describe(c.req), d, err, c.want)
			}
			if c.peek {
				q := c.req
				q.RequestID = ""
				d, err := r.peekReq(t, q)
				if !errors.Is(err, c.want) {
					t.Fatalf("Peek(%s) = %+v, %v; want error %v", describe(q), d, err, c.want)
				}
			}
			r.mustPeek(t, "k", l, allow(7, 3*time.Second, l))
		})
	}
	// The request ID "bad" of the bad requests was not remembered, and the
	// bucket still holds 7 tokens.
	r.mustTake(t, reqID("k", 1, l, "bad"), allow(6, 4*time.Second, l))
	r.mustTake(t, reqID("k", 1, l, "bad"), replayed(allow(6, 4*time.Second, l)))
}

// testRequestIDs: a retry with the same request ID is the remembered
// decision, consuming nothing, until the TTL ends; other parameters are a
// conflict; IDs are scoped by key.
func (s Suite) testRequestIDs(t *testing.T) {
	r := s.newRig(t, sluice.KeepTokens, time.Minute)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	other := sluice.Limit{Capacity: 10, Rate: sluice.Per(2, time.Hour)}
	at := func(d time.Duration) { r.set(r.ticks(d)) }
	conflict := func(q sluice.Request) {
		t.Helper()
		if d, err := r.take(t, q); !errors.Is(err, sluice.ErrRequestIDConflict) {
			t.Fatalf("Take(%s) at %v = %+v, %v; want error %v", describe(q), r.at(), d, err, sluice.ErrRequestIDConflict)
		}
	}

	first := allow(8, 2*time.Hour, l)
	r.mustTake(t, reqID("k", 2, l, "r1"), first)
	at(30 * time.Second)
	for range 5 {
		r.mustTake(t, reqID("k", 2, l, "r1"), replayed(first))
	}
	conflict(reqID("k", 3, l, "r1"))
	conflict(reqID("k", 2, other, "r1"))
	// Another key, the same ID: a request of its own.
	r.mustTake(t, reqID("k2", 3, l, "r1"), allow(7, 3*time.Hour, l))
	// Nothing was consumed by the replays: 8 tokens + 30s of refill.
	r.mustPeek(t, "k", l, allow(8, 2*time.Hour-30*time.Second, l))
	r.mustTake(t, req("k", 1, l), allow(7, 3*time.Hour-30*time.Second, l))

	// Remembered until the TTL ends, also after the clock steps back.
	at(time.Minute - s.Tick)
	r.mustTake(t, reqID("k", 2, l, "r1"), replayed(first))
	conflict(reqID("k", 1, l, "r1"))
	at(10 * time.Second)
	r.mustTake(t, reqID("k", 2, l, "r1"), replayed(first))

	// Expired: decided again and remembered anew.
	at(time.Minute)
	second := allow(5, 5*time.Hour-time.Minute, l)
	r.mustTake(t, reqID("k", 2, l, "r1"), second)
	at(time.Minute + time.Second)
	r.mustTake(t, reqID("k", 2, l, "r1"), replayed(second))
	conflict(reqID("k", 3, l, "r1"))

	// A denial is not remembered: it took nothing, so its retry decides
	// afresh, and is charged once when it is allowed.
	one := sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Minute)}
	r.mustTake(t, req("d", 1, one), allow(0, time.Minute, one))
	at(time.Minute + 31*time.Second) // 30s after the first take
	r.mustTake(t, reqID("d", 1, one, "x"), deny(0, 30*time.Second, 30*time.Second, one))
	r.mustTake(t, reqID("d", 1, one, "x"), deny(0, 30*time.Second, 30*time.Second, one))
	at(2*time.Minute + time.Second)
	r.mustTake(t, reqID("d", 1, one, "x"), allow(0, time.Minute, one))
	r.mustTake(t, reqID("d", 1, one, "x"), replayed(allow(0, time.Minute, one)))
	// The replay consumed nothing: the bucket is full a minute later.
	at(3*time.Minute + time.Second)
	r.mustPeek(t, "d", one, allow(1, 0, one))
	// A different ID is a new request, denied while the bucket refills.
	r.mustTake(t, reqID("d", 1, one, "y"), allow(0, time.Minute, one))
	r.mustTake(t, reqID("d", 1, one, "z"), deny(0, time.Minute, time.Minute, one))
}

// testLimitChanges: a bucket decided under another limit is refilled under
// the old one, then converted under the store's policy, rounding down, and
// never above the new capacity.
func (s Suite) testLimitChanges(t *testing.T) {
	tick := s.Tick
	old := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	raise := sluice.Limit{Capacity: 20, Rate: sluice.PerSecond(1)}
	lower := sluice.Limit{Capacity: 4, Rate: sluice.PerSecond(1)}
	faster := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(4)}
	coarse := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, tick)}
	never := sluice.Limit{Capacity: 10, Rate: sluice.Per(0, time.Second)}
	type want struct{ keep, scale, reset sluice.Decision }
	tests := []struct {
		name string
		cost int64         // taken under old at tick zero
		at   time.Duration // when the new limit arrives
		l    sluice.Limit
		want want // of a cost-1 take under l
	}{
		// The level under old is 6.5 at 500ms.
		{"raise capacity", 4, 500 * time.Millisecond, raise, want{
			keep:  allow(5, 14500*time.Millisecond, raise), // 6.5 -> 5.5
			scale: allow(12, 8*time.Second, raise),         // 13 -> 12
			reset: allow(19, time.Second, raise),           // 20 -> 19
		}},
		{"lower capacity", 4, 500 * time.Millisecond, lower, want{
			keep:  allow(3, time.Second, lower),           // 4 -> 3
			scale: allow(1, 2400*time.Millisecond, lower), // 2.6 -> 1.6
			reset: allow(3, time.Second, lower),           // 4 -> 3
		}},
		{"faster rate", 4, 500 * time.Millisecond, faster, want{
			keep:  allow(5, 1125*time.Millisecond, faster), // 6.5 -> 5.5
			scale: allow(5, 1125*time.Millisecond, faster),
			reset: allow(9, 250*time.Millisecond, faster),
		}},
		{"coarser grid rounds down", 4, 500 * time.Millisecond, coarse, want{
			keep:  allow(5, 5*tick, coarse), // 6.5 -> 6 -> 5
			scale: allow(5, 5*tick, coarse),
			reset: allow(9, tick, coarse),
		}},
		{"no refill", 4, 500 * time.Millisecond, never, want{
			keep:  allow(5, sluice.Never, never), // 6.5 -> 6 -> 5
			scale: allow(5, sluice.Never, never),
			reset: allow(9, sluice.Never, never),
		}},
		// A full bucket is the same as a missing one: full under the new
		// limit whatever the policy.
		{"full, raise capacity", 1, time.Second, raise, want{
			keep:  allow(19, time.Second, raise),
			scale: allow(19, time.Second, raise),
			reset: allow(19, time.Second, raise),
		}},
		{"full, lower capacity", 1, time.Second, lower, want{
			keep:  allow(3, time.Second, lower),
			scale: allow(3, time.Second, lower),
			reset: allow(3, time.Second, lower),
		}},
	}
	for _, policy := range conversions {
		t.Run(policy.String(), func(t *testing.T) {
			r := s.newRig(t, policy, time.Minute)
			for i, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					key := strings.Repeat("x", i+1)
					r.set(0)
					r.mustTake(t, req(key, tt.cost, old), allow(old.Capacity-tt.cost, time.Duration(tt.cost)*time.Second, old))
					r.set(r.ticks(tt.at))
					// A Peek converts too, but only for its answer.
					for range 2 {
						if d, _ := r.peek(t, key, tt.l); d.Remaining > tt.l.Capacity {
							t.Fatalf("Peek(%q, %v).Remaining = %d, above the capacity", key, tt.l, d.Remaining)
						}
					}
					w := map[sluice.Conversion]sluice.Decision{
						sluice.KeepTokens: tt.want.keep, sluice.ScaleTokens: tt.want.scale, sluice.ResetTokens: tt.want.reset,
					}[policy]
					r.mustTake(t, req(key, 1, tt.l), w)
					// And back to the old limit.
					if d, _ := r.peek(t, key, old); d.Remaining > old.Capacity {
						t.Fatalf("Peek(%q, %v).Remaining = %d, above the capacity", key, old, d.Remaining)
					}
					r.take(t, req(key, 1, old))
				})
			}
		})
	}
}
