package sluicetest

import (
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/sluicehq/sluice"
)

// Model is the reference token bucket every store is compared with. It keeps
// each level as an exact math/big.Rat and follows the contract of
// the package sluice documentation step by step, written independently of
// bucket.Plan and bucket.State so that the two can check each other.
//
// Time is an integer number of ticks (the store's time unit) since the
// store's epoch. A limit whose period is not a whole number of ticks is
// ErrInvalidLimit. For every (policy, key) the model holds the level, the tick it was
// brought up to date (the stamp) and the limit it was last decided under, and
// it never drops a bucket or a request ID on its own: the request ID of an
// allowed decision is replayed exactly while now < first decision + TTL,
// also after the clock has stepped back; a denial is not remembered. (Run accepts a store that forgot an ID once the clock
// had shown the end of its TTL; see Suite.)
//
// The zero Model is not usable; build one with NewModel. A Model is not safe
// for concurrent use.
type Model struct {
	tick    time.Duration
	conv    sluice.Conversion
	idTTL   int64 // ticks
	buckets map[modelKey]*modelBucket
	ids     map[modelIDKey]modelID
	// floor is the tick of the latest Sweep: a bucket created after it is
	// stamped no earlier, since the sweep may have dropped it.
	floor int64
}

type modelBucket struct {
	level *big.Rat
	stamp int64
	limit sluice.Limit
}

// modelKey is the identity of a bucket: two policies never share one.
type modelKey struct{ policy, key string }

type modelIDKey struct{ policy, key, id string }

// modelID is the remembered first allowed decision of a request ID.
type modelID struct {
	at       int64 // tick of the first decision
	cost     int64
	decision sluice.Decision
	refunded bool // a Refund with this ID has undone the take
}

// NewModel returns an empty Model of a store whose clock counts ticks of the
// given length (zero or negative means 1ns), which converts levels on a limit
// change under conv (values other than sluice.ScaleTokens and
// sluice.ResetTokens behave as sluice.KeepTokens) and remembers the request
// IDs of allowed decisions for requestIDTTL, rounded up to whole ticks (zero or negative remembers
// nothing).
func NewModel(tick time.Duration, conv sluice.Conversion, requestIDTTL time.Duration) *Model {
	if tick <= 0 {
		tick = time.Nanosecond
	}
	var ttl int64
	if requestIDTTL > 0 {
		ttl = int64(requestIDTTL / tick)
		if requestIDTTL%tick != 0 {
			ttl++
		}
	}
	return &Model{
		tick:    tick,
		conv:    conv,
		idTTL:   ttl,
		buckets: make(map[modelKey]*modelBucket),
		ids:     make(map[modelIDKey]modelID),
		floor:   math.MinInt64,
	}
}

// Take decides r at tick now, as every store must: validation errors first
// (wrapping the sentinels of Request.Validate, or ErrInvalidLimit for a
// period that is not a whole number of ticks), then a replay or
// ErrRequestIDConflict for a remembered request ID, then the transition;
// the request ID of an allowed decision is remembered. An error changes
// nothing.
func (m *Model) Take(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	if err := m.checkTick(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	ik := modelIDKey{r.Policy, r.Key, r.RequestID}
	if r.RequestID != "" {
		if rec, ok := m.ids[ik]; ok && now < satAdd(rec.at, m.idTTL) {
			if rec.cost != r.Cost || rec.decision.Limit != r.Limit {
				return sluice.Decision{}, fmt.Errorf("%w: request ID %q of policy %q key %q was first used with cost %d and limit %v, now cost %d and limit %v",
					sluice.ErrRequestIDConflict, r.RequestID, r.Policy, r.Key, rec.cost, rec.decision.Limit, r.Cost, r.Limit)
			}
			d := rec.decision
			d.Replayed = true
			return d, nil
		}
	}
	k := modelKey{r.Policy, r.Key}
	b := m.current(now, k, r.Limit)
	cost := new(big.Rat).SetInt64(r.Cost)
	allowed := b.level.Cmp(cost) >= 0
	if allowed {
		b.level.Sub(b.level, cost)
	}
	m.buckets[k] = b
	d := m.decision(b, allowed, r.Cost, now)
	if r.RequestID != "" && allowed {
		m.ids[ik] = modelID{at: now, cost: r.Cost, decision: d}
	}
	return d, nil
}

// TakeAll decides rs together at tick now: validation errors first (the
// sentinels of sluice.ValidateAll, or ErrInvalidLimit for a period that is
// not a whole number of ticks), then every bucket is brought up to date
// (refilled, converted to its request's limit) as a Take would, and each
// cost is taken if every bucket covers its own, none otherwise. Each part's
// Decision is the one a Take of that bucket alone would give, except that
// nothing is taken from any bucket when one of them is short. An error
// changes nothing.
func (m *Model) TakeAll(now int64, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := sluice.ValidateAll(rs); err != nil {
		return sluice.MultiDecision{}, err
	}
	for i := range rs {
		if err := m.checkTick(rs[i].Limit); err != nil {
			return sluice.MultiDecision{}, fmt.Errorf("bucket %d: %w", i, err)
		}
	}
	bs := make([]*modelBucket, len(rs))
	all := true
	for i, r := range rs {
		bs[i] = m.current(now, modelKey{r.Policy, r.Key}, r.Limit)
		if bs[i].level.Cmp(new(big.Rat).SetInt64(r.Cost)) < 0 {
			all = false
		}
	}
	md := sluice.MultiDecision{Parts: make([]sluice.Decision, len(rs))}
	for i, r := range rs {
		b := bs[i]
		covers := b.level.Cmp(new(big.Rat).SetInt64(r.Cost)) >= 0
		if all {
			b.level.Sub(b.level, new(big.Rat).SetInt64(r.Cost))
		}
		m.buckets[modelKey{r.Policy, r.Key}] = b
		md.Parts[i] = m.decision(b, covers, r.Cost, now)
	}
	md.Combine()
	return md, nil
}

// Drain takes the smaller of r.Cost and the whole tokens of the bucket of
// (r.Policy, r.Key) at tick now. Allowed reports whether all of r.Cost was
// there; RetryAfter (when not) is the wait until it is, Never if r.Cost
// exceeds the capacity. Errors wrap the sentinels of
// sluice.Request.ValidateDrain.
func (m *Model) Drain(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	if err := m.checkTick(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	k := modelKey{r.Policy, r.Key}
	b := m.current(now, k, r.Limit)
	taken := min(r.Cost, floor(b.level).Int64())
	b.level.Sub(b.level, new(big.Rat).SetInt64(taken))
	m.buckets[k] = b
	d := m.decision(b, taken == r.Cost, min(r.Cost, r.Limit.Capacity), now)
	if !d.Allowed && r.Cost > r.Limit.Capacity {
		d.RetryAfter = sluice.Never
	}
	d.Taken = taken
	return d, nil
}

// Refund gives r.Cost tokens back to the bucket of (r.Policy, r.Key) at
// tick now, never above the capacity: the whole tokens t of the level rise
// by a = min(r.Cost, capacity - t), and a level that reaches the capacity
// is exactly full. Taken is -a. A bucket that is full at now (a missing
// one is) is left as it is: nothing is written, nothing created.
//
// With a request ID, the refund undoes the remembered allowed take of that
// ID (ErrUnknownRequestID if there is none, or its TTL has ended;
// ErrRequestIDConflict if r.Limit is not the take's limit or r.Cost exceeds
// its cost), once: a second refund of the ID is Replayed, with Taken 0,
// and changes nothing. An error changes nothing.
func (m *Model) Refund(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	if err := m.checkTick(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	k := modelKey{r.Policy, r.Key}
	ik := modelIDKey{r.Policy, r.Key, r.RequestID}
	var replay bool
	if r.RequestID != "" {
		rec, ok := m.ids[ik]
		if !ok || now >= satAdd(rec.at, m.idTTL) {
			return sluice.Decision{}, fmt.Errorf("%w: no allowed take of policy %q key %q with request ID %q is remembered", sluice.ErrUnknownRequestID, r.Policy, r.Key, r.RequestID)
		}
		if rec.decision.Limit != r.Limit || r.Cost > rec.cost {
			return sluice.Decision{}, fmt.Errorf("%w: request ID %q of policy %q key %q took %d under %v; a refund of %d under %v does not undo it",
				sluice.ErrRequestIDConflict, r.RequestID, r.Policy, r.Key, rec.cost, rec.decision.Limit, r.Cost, r.Limit)
		}
		replay = rec.refunded
		if !replay {
			rec.refunded = true
			m.ids[ik] = rec
		}
	}
	b := m.current(now, k, r.Limit)
	var added int64
	full := b.level.Cmp(new(big.Rat).SetInt64(r.Limit.Capacity)) == 0
	if !replay && !full {
		tokens := floor(b.level).Int64()
		added = min(r.Cost, r.Limit.Capacity-tokens)
		if tokens+added == r.Limit.Capacity {
			b.level = new(big.Rat).SetInt64(r.Limit.Capacity)
		} else {
			b.level.Add(b.level, new(big.Rat).SetInt64(added))
		}
		m.buckets[k] = b
	}
	d := m.decision(b, true, 1, now)
	d.Taken = -added
	d.Replayed = replay
	return d, nil
}

// Reset makes the bucket of (policy, key) full at tick now, as if it had
// never been used: stamped at now, or at its old stamp if that is later
// (time never runs backwards inside a bucket). A bucket that is full at
// now (a missing one is) is left as it is. Request IDs are kept.
// Errors wrap the sentinels of sluice.ValidateReset.
func (m *Model) Reset(now int64, policy, key string) error {
	if err := sluice.ValidateReset(policy, key); err != nil {
		return err
	}
	k := modelKey{policy, key}
	b, ok := m.buckets[k]
	if !ok {
		return nil
	}
	if c := m.current(now, k, b.limit); c.level.Cmp(new(big.Rat).SetInt64(b.limit.Capacity)) < 0 {
		m.buckets[k] = &modelBucket{level: new(big.Rat).SetInt64(b.limit.Capacity), stamp: c.stamp, limit: b.limit}
	}
	return nil
}

// Peek reports the bucket of (r.Policy, r.Key) at tick now as a take of
// r.Cost under r.Limit would see it (converting the level if the bucket was
// last decided under another limit), without changing or creating anything.
// Errors wrap the sentinels of Request.ValidatePeek.
func (m *Model) Peek(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	if err := m.checkTick(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	b := m.current(now, modelKey{r.Policy, r.Key}, r.Limit)
	return m.decision(b, b.level.Cmp(new(big.Rat).SetInt64(r.Cost)) >= 0, r.Cost, now), nil
}

// Level returns a copy of the exact level of the bucket of (policy, key) as
// of its last decision (not refilled to any later time), or nil if the model
// holds no such bucket; a missing bucket is full under whatever limit it is
// next used with.
func (m *Model) Level(policy, key string) *big.Rat {
	b, ok := m.buckets[modelKey{policy, key}]
	if !ok {
		return nil
	}
	return new(big.Rat).Set(b.level)
}

// Sweep drops, at tick now, what a store's maintenance may drop: every
// bucket that is full by then (its stamp plus the time it takes to refill
// is at most now) and every request ID whose TTL has ended. A bucket created
// afterwards is stamped no earlier than now, so that a take whose clock
// reading is older than the sweep cannot recreate at that older time a
// bucket the sweep dropped (which would grant a burst the bucket did not
// have then).
func (m *Model) Sweep(now int64) {
	for k, b := range m.buckets {
		w := m.wait(b, b.limit.Capacity, b.stamp)
		if w != sluice.Never && b.stamp <= now && int64(w/m.tick) <= now-b.stamp {
			delete(m.buckets, k)
		}
	}
	for k, rec := range m.ids {
		if now >= satAdd(rec.at, m.idTTL) {
			delete(m.ids, k)
		}
	}
	m.floor = max(m.floor, now)
}

// current returns a copy of the bucket k brought up to date at tick now
// under l, without storing it.
func (m *Model) current(now int64, k modelKey, l sluice.Limit) *modelBucket {
	old, ok := m.buckets[k]
	if !ok {
		// 1. A missing bucket starts full, stamped now (or at the latest
		// sweep, if that is later).
		return &modelBucket{level: new(big.Rat).SetInt64(l.Capacity), stamp: max(now, m.floor), limit: l}
	}
	b := &modelBucket{level: new(big.Rat).Set(old.level), stamp: old.stamp, limit: old.limit}
	// 2. Time never runs backwards inside a bucket.
	at := max(now, b.stamp)
	if b.limit != l {
		m.refill(b, at)
		b.level = m.convert(b.level, b.limit, l)
		b.limit = l
	}
	// 3. Lazy refill.
	m.refill(b, at)
	return b
}

// refill adds (at - stamp) * n / P to the level, capped at capacity, and
// moves the stamp to at; at >= stamp.
func (m *Model) refill(b *modelBucket, at int64) {
	elapsed := new(big.Int).Sub(big.NewInt(at), big.NewInt(b.stamp))
	add := new(big.Rat).SetFrac(elapsed.Mul(elapsed, big.NewInt(b.limit.Rate.Tokens)), m.periodTicks(b.limit))
	b.level.Add(b.level, add)
	if c := new(big.Rat).SetInt64(b.limit.Capacity); b.level.Cmp(c) > 0 {
		b.level = c
	}
	b.stamp = at
}

// convert carries a level that is up to date under from over to to, under
// the model's conversion, rounded down to to's grid of fraction units.
func (m *Model) convert(level *big.Rat, from, to sluice.Limit) *big.Rat {
	oldCap := new(big.Rat).SetInt64(from.Capacity)
	newCap := new(big.Rat).SetInt64(to.Capacity)
	var v *big.Rat
	switch {
	case level.Cmp(oldCap) == 0:
		// A full bucket is the same as a missing one.
		v = newCap
	case m.conv == sluice.ScaleTokens:
		v = new(big.Rat).Mul(level, newCap)
		v.Quo(v, oldCap)
	case m.conv == sluice.ResetTokens:
		v = newCap
	default: // KeepTokens
		v = new(big.Rat).Set(level)
		if v.Cmp(newCap) > 0 {
			v = newCap
		}
	}
	// Round down to multiples of 1/p', p' = P / gcd(n, P) (1 if n = 0).
	grid := big.NewInt(1)
	if to.Rate.Tokens > 0 {
		p := m.periodTicks(to)
		grid.Quo(p, new(big.Int).GCD(nil, nil, big.NewInt(to.Rate.Tokens), p))
	}
	units := new(big.Rat).Mul(v, new(big.Rat).SetInt(grid))
	return new(big.Rat).SetFrac(floor(units), grid)
}

// decision reports b after a decision on a cost at tick now. Waits are
// measured from now: a bucket stamped after now (the clock stepped back)
// refills only from its stamp.
func (m *Model) decision(b *modelBucket, allowed bool, cost int64, now int64) sluice.Decision {
	d := sluice.Decision{
		Allowed:   allowed,
		Remaining: floor(b.level).Int64(),
		Limit:     b.limit,
	}
	if !allowed {
		d.RetryAfter = m.wait(b, cost, now)
	}
	d.ResetAfter = m.wait(b, b.limit.Capacity, now)
	return d
}

// wait returns the time from tick now until the level of b reaches target:
// whole ticks, rounded up; Never if it never does or the wait exceeds a
// time.Duration.
func (m *Model) wait(b *modelBucket, target int64, now int64) time.Duration {
	missing := new(big.Rat).Sub(new(big.Rat).SetInt64(target), b.level)
	if missing.Sign() <= 0 {
		return 0
	}
	if b.limit.Rate.Tokens == 0 {
		return sluice.Never
	}
	ticks := missing.Mul(missing, new(big.Rat).SetFrac(m.periodTicks(b.limit), big.NewInt(b.limit.Rate.Tokens)))
	ns := ceil(ticks)
	if b.stamp > now {
		ns.Add(ns, new(big.Int).Sub(big.NewInt(b.stamp), big.NewInt(now)))
	}
	ns.Mul(ns, big.NewInt(int64(m.tick)))
	if ns.Cmp(big.NewInt(math.MaxInt64)) > 0 {
		return sluice.Never
	}
	return time.Duration(ns.Int64())
}

func (m *Model) checkTick(l sluice.Limit) error {
	if l.Rate.Period%m.tick != 0 {
		return fmt.Errorf("%w: period %v is not a whole number of %v (the store's time unit)", sluice.ErrInvalidLimit, l.Rate.Period, m.tick)
	}
	return nil
}

// periodTicks returns P, the period in ticks.
func (m *Model) periodTicks(l sluice.Limit) *big.Int {
	return big.NewInt(int64(l.Rate.Period / m.tick))
}

// floor returns the largest integer <= x, for x >= 0.
func floor(x *big.Rat) *big.Int {
	return new(big.Int).Quo(x.Num(), x.Denom())
}

// ceil returns the smallest integer >= x, for x >= 0.
func ceil(x *big.Rat) *big.Int {
	q, r := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if r.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// satAdd returns a+b for b >= 0, saturated at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
