// Package bucket is the exact arithmetic of one token bucket: the reference
// transition that every Sluice store implements, as pure functions of
// (state, plan, now, cost) with no I/O, clock or locks. Users of a store do
// not need it; it is for stores, for tests and for tools that replay traces
// without a store.
package bucket

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/exact"
)

// Plan is a sluice.Limit prepared for exact integer arithmetic on a store's clock,
// which counts whole ticks (1ns for the in-memory store). Its methods are the
// reference transition that every store implements: pure functions of
// (state, plan, now, cost) with no I/O, clock or locks.
//
// The rate n tokens per P is reduced by gcd(n, P/tick) to n' tokens every p'
// ticks. A level is held as Tokens whole tokens plus Frac/p' of a token, so
// e ticks of refill add exactly e*n' fraction units and nothing is rounded
// away or invented. Within the bounds of sluice.Limit.Validate every intermediate
// fits in 128 bits.
//
// A Plan is a comparable value; the zero Plan is not usable. Build one with
// NewPlan.
type Plan struct {
	limit sluice.Limit
	tick  time.Duration
	n     uint64 // fraction units added per tick (reduced rate tokens)
	per   uint64 // ticks per n tokens (reduced), and fraction units per token
	// maxTicks is the most ticks a time.Duration holds below Never.
	maxTicks uint64
}

// State is the exact state of one bucket under a Plan: the level is
// Tokens + Frac/Scale tokens, brought up to date at tick Stamp. A valid State
// has 0 <= Tokens <= capacity, Frac < Scale, and Frac == 0 when
// Tokens == capacity.
type State struct {
	Tokens int64
	Frac   uint64
	Stamp  int64
}

// NewPlan validates l and prepares it for a clock that counts ticks of the
// given length. The period must be a whole number of ticks. Errors wrap
// sluice.ErrInvalidLimit.
func NewPlan(l sluice.Limit, tick time.Duration) (Plan, error) {
	if err := l.Validate(); err != nil {
		return Plan{}, err
	}
	if tick <= 0 {
		return Plan{}, fmt.Errorf("%w: clock tick %v is not positive", sluice.ErrInvalidLimit, tick)
	}
	if l.Rate.Period%tick != 0 {
		return Plan{}, fmt.Errorf("%w: period %v is not a whole number of %v (the store's time unit)", sluice.ErrInvalidLimit, l.Rate.Period, tick)
	}
	n, per := uint64(l.Rate.Tokens), uint64(l.Rate.Period/tick)
	if n == 0 {
		per = 1
	} else {
		g := exact.GCD(n, per)
		n, per = n/g, per/g
	}
	return Plan{limit: l, tick: tick, n: n, per: per, maxTicks: uint64(sluice.Never / tick)}, nil
}

// Limit returns the limit p was built from.
func (p *Plan) Limit() sluice.Limit { return p.limit }

// Tick returns the length of one clock tick.
func (p *Plan) Tick() time.Duration { return p.tick }

// Scale returns the number of fraction units in one token (p' above).
func (p *Plan) Scale() uint64 { return p.per }

// RefillUnits returns the fraction units added per tick (n' above); zero
// means the bucket never refills.
func (p *Plan) RefillUnits() uint64 { return p.n }

// Full returns the state of a bucket seen for the first time at tick now.
func (p *Plan) Full(now int64) State {
	return State{Tokens: p.limit.Capacity, Stamp: now}
}

// Refill brings s up to date at tick now: time never runs backwards inside a
// bucket (a now before s.Stamp refills nothing and keeps the stamp), and the
// level grows by exactly (now-Stamp)*n/P, capped at capacity.
func (p *Plan) Refill(s State, now int64) State {
	if now > s.Stamp {
		s.Tokens, s.Frac = p.refill(s.Tokens, s.Frac, uint64(now)-uint64(s.Stamp))
		s.Stamp = now
	}
	return s
}

// refill adds elapsed ticks of refill to the level tokens+frac/per, capped
// at capacity.
func (p *Plan) refill(tokens int64, frac, elapsed uint64) (int64, uint64) {
	if p.n == 0 || tokens >= p.limit.Capacity {
		return tokens, frac
	}
	dhi, dlo := p.deficit(tokens, frac, p.limit.Capacity)
	ahi, alo := bits.Mul64(elapsed, p.n)
	if ahi > dhi || (ahi == dhi && alo >= dlo) {
		return p.limit.Capacity, 0
	}
	// frac+added < (capacity-tokens)*per, so the quotient is below
	// capacity-tokens and Div64 cannot overflow.
	lo, carry := bits.Add64(alo, frac, 0)
	q, r := bits.Div64(ahi+carry, lo, p.per)
	return tokens + int64(q), r
}

// Take refills *s at tick now, takes cost tokens if the level covers it,
// and writes the decision to *d (every field: Replayed and Degraded are
// false). The refilled state is kept either way. cost must be in
// [1, capacity]; sluice.Request.Validate checks that. Take writes through
// pointers so that a store's hot path copies neither the state nor the
// decision.
//
// Waits are measured from now, the caller's clock: if now is before the
// stamp (the clock stepped back), the bucket refills only from its stamp,
// so the waits include the ticks from now to the stamp.
func (p *Plan) Take(s *State, now int64, cost int64, d *sluice.Decision) {
	tokens, frac, stamp := s.Tokens, s.Frac, s.Stamp
	if now > stamp {
		tokens, frac = p.refill(tokens, frac, uint64(now)-uint64(stamp))
		stamp = now
	}
	// frac is less than one token, so level >= cost iff tokens >= cost.
	allowed := tokens >= cost
	var retry time.Duration
	if allowed {
		tokens -= cost
	} else {
		retry = p.wait(tokens, frac, cost, uint64(stamp)-uint64(now))
	}
	s.Tokens, s.Frac, s.Stamp = tokens, frac, stamp
	d.Allowed = allowed
	d.Remaining = tokens
	d.Taken = 0
	d.RetryAfter = retry
	// d.ResetAfter = p.wait(tokens, frac, capacity, stamp-now), with the
	// usual case (the clock not behind, a wait that fits) written out.
	t, ok := p.ticksUntil(tokens, frac, p.limit.Capacity)
	if ok && stamp == now && t <= p.maxTicks {
		d.ResetAfter = time.Duration(t) * p.tick
	} else {
		d.ResetAfter = p.ticksWait(t, ok, uint64(stamp)-uint64(now))
	}
	d.Limit = p.limit
	d.Replayed = false
	d.Degraded = false
}

// Drain refills *s at tick now, takes the smaller of cost and the whole
// tokens there, and writes the decision to *d: Allowed reports whether all
// of cost was there, Taken what was taken, RetryAfter (when not allowed)
// the wait until cost tokens are there again, Never if cost exceeds the
// capacity. cost must be at least 1; it may exceed the capacity.
func (p *Plan) Drain(s *State, now int64, cost int64, d *sluice.Decision) {
	behind := behindBy(s.Stamp, now)
	*s = p.Refill(*s, now)
	taken := min(cost, s.Tokens)
	s.Tokens -= taken
	*d = sluice.Decision{Allowed: taken == cost, Remaining: s.Tokens, Taken: taken, Limit: p.limit}
	if !d.Allowed {
		if cost > p.limit.Capacity {
			d.RetryAfter = sluice.Never
		} else {
			d.RetryAfter = p.wait(s.Tokens, s.Frac, cost, behind)
		}
	}
	d.ResetAfter = p.wait(s.Tokens, s.Frac, p.limit.Capacity, behind)
}

// Refund refills *s at tick now, gives tokens back, never above the
// capacity (a level that reaches it is exactly full, its fraction
// dropped), and writes the decision to *d: Allowed, and Taken minus the
// whole tokens the level rose by. tokens must be in [1, capacity].
//
// It reports whether the bucket changed: a bucket that is full at now
// (as a missing one is) is left exactly as it was, stamp included, and a
// store writes nothing for it.
func (p *Plan) Refund(s *State, now int64, tokens int64, d *sluice.Decision) (changed bool) {
	behind := behindBy(s.Stamp, now)
	r := p.Refill(*s, now)
	*d = sluice.Decision{Allowed: true, Remaining: r.Tokens, Limit: p.limit}
	if r.Tokens >= p.limit.Capacity {
		return false
	}
	added := min(tokens, p.limit.Capacity-r.Tokens)
	r.Tokens += added
	if r.Tokens == p.limit.Capacity {
		r.Frac = 0
	}
	*s = r
	d.Remaining, d.Taken = r.Tokens, -added
	d.ResetAfter = p.wait(r.Tokens, r.Frac, p.limit.Capacity, behind)
	return true
}

// Reset makes *s full at tick now, stamped at now or at its stamp if that
// is later, unless it is full at now already. It reports whether the
// bucket changed; a store writes nothing when it did not.
func (p *Plan) Reset(s *State, now int64) (changed bool) {
	r := p.Refill(*s, now)
	if r.Tokens >= p.limit.Capacity {
		return false
	}
	*s = State{Tokens: p.limit.Capacity, Stamp: r.Stamp}
	return true
}

// Peek reports s at tick now as a take of cost would see it, without taking
// anything: Allowed tells whether cost tokens are there, RetryAfter is the
// wait until they are. cost must be in [1, capacity].
func (p *Plan) Peek(s State, now int64, cost int64) sluice.Decision {
	behind := behindBy(s.Stamp, now)
	s = p.Refill(s, now)
	d := sluice.Decision{Allowed: s.Tokens >= cost, Remaining: s.Tokens, Limit: p.limit}
	d.RetryAfter = p.wait(s.Tokens, s.Frac, cost, behind)
	d.ResetAfter = p.wait(s.Tokens, s.Frac, p.limit.Capacity, behind)
	return d
}

// behindBy returns the ticks a clock reading now is behind a bucket's
// stamp: zero unless the clock stepped back.
func behindBy(stamp, now int64) uint64 {
	if now < stamp {
		return uint64(stamp) - uint64(now)
	}
	return 0
}

// wait returns the time until the level tokens+frac/per reaches target,
// plus behind ticks the caller's clock is behind the stamp, rounded up to
// whole ticks: zero if the level is there already, sluice.Never if it never
// gets there or the wait exceeds a time.Duration.
func (p *Plan) wait(tokens int64, frac uint64, target int64, behind uint64) time.Duration {
	t, ok := p.ticksUntil(tokens, frac, target)
	return p.ticksWait(t, ok, behind)
}

// ticksWait is the wait of t ticks (if ok) plus behind, as wait returns it.
func (p *Plan) ticksWait(t uint64, ok bool, behind uint64) time.Duration {
	if !ok {
		return sluice.Never
	}
	if t == 0 {
		return 0
	}
	if t += behind; t < behind || t > p.maxTicks {
		return sluice.Never
	}
	return time.Duration(t) * p.tick
}

// FullAt returns the tick at which s is full again if nothing is taken;
// math.MaxInt64 if it never refills or that tick is out of range. A bucket is
// indistinguishable from a missing one from that tick on.
func (p *Plan) FullAt(s State) int64 {
	t, ok := p.ticksUntil(s.Tokens, s.Frac, p.limit.Capacity)
	if !ok || t > math.MaxInt64 || s.Stamp > math.MaxInt64-int64(t) {
		return math.MaxInt64
	}
	return s.Stamp + int64(t)
}

// ticksUntil returns the ticks, rounded up, until the level
// tokens+frac/per reaches target; ok is false if it never does or the count
// exceeds 64 bits.
func (p *Plan) ticksUntil(tokens int64, frac uint64, target int64) (ticks uint64, ok bool) {
	if tokens >= target {
		return 0, true
	}
	if p.n == 0 {
		return 0, false
	}
	hi, lo := p.deficit(tokens, frac, target)
	return ceilDiv(hi, lo, p.n)
}

// deficit returns (target-level)*per as a 128-bit number; target > tokens.
func (p *Plan) deficit(tokens int64, frac uint64, target int64) (hi, lo uint64) {
	hi, lo = bits.Mul64(uint64(target-tokens), p.per)
	lo, borrow := bits.Sub64(lo, frac, 0)
	return hi - borrow, lo
}

// Convert carries s, already refilled under from, over to p under policy c.
// The level is rounded down to p's fraction units; the stamp is kept. A
// bucket that is full under from is full under p whatever the policy, exactly
// as if it had expired (which a store may do to full buckets at any time).
func (p *Plan) Convert(s State, from *Plan, c sluice.Conversion) State {
	out := State{Stamp: s.Stamp}
	switch {
	case s.Tokens >= from.limit.Capacity || c == sluice.ResetTokens:
		out.Tokens = p.limit.Capacity
	case c == sluice.ScaleTokens:
		// units = floor((Tokens*from.per + Frac) * newCap * per / (from.per * oldCap)).
		// Rare path; math/big keeps it exact whatever the sizes.
		num := new(big.Int).Mul(big.NewInt(s.Tokens), new(big.Int).SetUint64(from.per))
		num.Add(num, new(big.Int).SetUint64(s.Frac))
		num.Mul(num, big.NewInt(p.limit.Capacity))
		num.Mul(num, new(big.Int).SetUint64(p.per))
		den := new(big.Int).Mul(new(big.Int).SetUint64(from.per), big.NewInt(from.limit.Capacity))
		units := num.Quo(num, den)
		tokens, frac := units.QuoRem(units, new(big.Int).SetUint64(p.per), new(big.Int))
		out.Tokens, out.Frac = tokens.Int64(), frac.Uint64()
	default: // KeepTokens
		if s.Tokens >= p.limit.Capacity {
			out.Tokens = p.limit.Capacity
			break
		}
		out.Tokens = s.Tokens
		// Frac < from.per, so the quotient is below p.per.
		hi, lo := bits.Mul64(s.Frac, p.per)
		out.Frac, _ = bits.Div64(hi, lo, from.per)
	}
	if out.Tokens >= p.limit.Capacity {
		out.Tokens, out.Frac = p.limit.Capacity, 0
	}
	return out
}

// ceilDiv returns ceil((hi<<64 | lo) / d) and whether it fits in 64 bits.
func ceilDiv(hi, lo, d uint64) (uint64, bool) {
	if d == 1 {
		return lo, hi == 0
	}
	if hi >= d {
		return 0, false
	}
	q, r := bits.Div64(hi, lo, d)
	if r != 0 {
		if q == math.MaxUint64 {
			return 0, false
		}
		q++
	}
	return q, true
}
