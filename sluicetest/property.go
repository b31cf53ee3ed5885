package sluicetest

import (
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"pgregory.net/rapid"
)

const year = 365 * 24 * time.Hour

// maxElapsed bounds how far from tick zero the property tests move the clock:
// far beyond any idle gap that matters, and within what time.Time.Sub can
// return (about 292 years).
const maxElapsed = 250 * year

// machineKeys are the keys of the state machine: few, so that requests meet
// on the same buckets, including the longest key and arbitrary bytes.
var machineKeys = []string{"a", "b", "c", strings.Repeat("k", sluice.MaxKeyLen), "\x00\xffключ"}

// machinePolicies are the policies of the state machine: two, so that one
// key is seen under both and their buckets must stay apart.
var machinePolicies = []string{testPolicy, "other"}

var conversions = []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens}

// Limits returns a rapid generator of valid limits whose periods are whole
// ticks of the given length, favouring the edges: capacity 1 and 2^40, no
// refill, 2^40 tokens a tick, 1 token in 366 days. tick must divide one
// second.
func Limits(tick time.Duration) *rapid.Generator[sluice.Limit] {
	maxP := int64(sluice.MaxPeriod / tick)
	sec := int64(time.Second / tick)
	return rapid.Custom(func(t *rapid.T) sluice.Limit {
		c := rapid.OneOf(
			rapid.SampledFrom([]int64{1, 2, 3, 10, 1000, sluice.MaxCapacity}),
			rapid.Int64Range(1, 100),
			rapid.Int64Range(1, sluice.MaxCapacity),
		).Draw(t, "capacity")
		n := rapid.OneOf(
			rapid.SampledFrom([]int64{0, 1, 3, 1000, sluice.MaxTokens}),
			rapid.Int64Range(0, 100),
			rapid.Int64Range(0, sluice.MaxTokens),
		).Draw(t, "tokens")
		p := rapid.OneOf(
			rapid.SampledFrom([]int64{1, 13, sec, 13 * sec, maxP}),
			rapid.Int64Range(1, 1000),
			rapid.Int64Range(1, maxP),
		).Draw(t, "period ticks")
		return sluice.Limit{Capacity: c, Rate: sluice.Per(n, time.Duration(p)*tick)}
	})
}

// limitGen draws the limits of the suite's tests: Limits at the store's tick.
func (s Suite) limitGen() *rapid.Generator[sluice.Limit] { return Limits(s.Tick) }

// supportedLimitGen is limitGen restricted to the limits the store decides
// (Suite.Supports): the capacity of a refused limit is halved until the
// store accepts it, which also draws capacities at the edge of what it
// accepts. Limits it refuses even at capacity 1 are filtered out.
func (s Suite) supportedLimitGen() *rapid.Generator[sluice.Limit] {
	lg := s.limitGen()
	if s.Supports == nil {
		return lg
	}
	return rapid.Custom(func(t *rapid.T) sluice.Limit {
		l := lg.Draw(t, "limit")
		for l.Capacity > 1 && s.Supports(l) != nil {
			l.Capacity /= 2
		}
		return l
	}).Filter(func(l sluice.Limit) bool { return s.Supports(l) == nil })
}

// costGen draws costs in [1, capacity], favouring small ones and the whole
// capacity.
func costGen(capacity int64) *rapid.Generator[int64] {
	return rapid.OneOf(
		rapid.Int64Range(1, min(capacity, 5)),
		rapid.Int64Range(1, capacity),
		rapid.Just(capacity),
	)
}

// tokenTicks returns about the ticks one token takes to refill under l (P
// if l never refills), at least 1.
func tokenTicks(l sluice.Limit, tick time.Duration) int64 {
	p := int64(l.Rate.Period / tick)
	if l.Rate.Tokens == 0 {
		return p
	}
	return max(1, p/l.Rate.Tokens)
}

// machine is the state of one rapid check of the model-based test.
type machine struct {
	r        *rig
	limits   []sluice.Limit
	using    map[modelKey]sluice.Limit // the limit each bucket is used with
	maxTicks int64
	limitGen *rapid.Generator[sluice.Limit]
	sweep    func(sluice.Store) // Suite.Sweep; nil if the store has none
	// swept is the tick of the latest sweep: the clock never steps back
	// before it, because a store that dropped a full bucket cannot know
	// its stamp any more and may be stricter than the model there (the
	// stale-reading tests check that case against the guarantee).
	swept int64
}

// testModel runs random sequences of takes, peeks, clock moves, request IDs,
// limit changes and bad requests against the store and the model and
// requires identical results after every action.
func (s Suite) testModel(t *testing.T) {
	lg := s.limitGen()
	hour := int64(time.Hour / s.Tick)
	rapid.Check(t, func(rt *rapid.T) {
		conv := rapid.SampledFrom(conversions).Draw(rt, "conversion")
		ttl := rapid.SampledFrom([]int64{1, 3, 1000, hour}).Draw(rt, "request ID TTL ticks")
		m := &machine{
			r:        s.newRig(t, conv, time.Duration(ttl)*s.Tick),
			limits:   rapid.SliceOfN(s.supportedLimitGen(), 1, 4).Draw(rt, "limits"),
			using:    make(map[modelKey]sluice.Limit),
			maxTicks: int64(maxElapsed / s.Tick),
			limitGen: lg,
			sweep:    s.Sweep,
		}
		rt.Repeat(map[string]func(*rapid.T){
			"Take":        m.take,
			"ChangeLimit": m.changeLimit,
			"Peek":        m.peek,
			"Wait":        m.wait,
			"WaitRefill":  m.waitRefill,
			"StepBack":    m.stepBack,
			"TakeID":      m.takeID,
			"Sweep":       m.sweepNow,
			"Bad":         m.bad,
			"TakeAll":     m.takeAll,
			"Drain":       m.drain,
			"Refund":      m.refund,
			"Reset":       m.reset,
			"":            m.check,
		})
	})
}

// key draws a bucket: a policy and a key by their indexes in
// machinePolicies and machineKeys, which keeps failure traces short.
func (m *machine) key(t *rapid.T) modelKey {
	return modelKey{
		policy: machinePolicies[rapid.IntRange(0, len(machinePolicies)-1).Draw(t, "policy (0 test, 1 other)")],
		key:    machineKeys[rapid.IntRange(0, len(machineKeys)-1).Draw(t, "key (0 a, 1 b, 2 c, 3 512 bytes, 4 binary)")],
	}
}

func (m *machine) limitOf(key modelKey) sluice.Limit {
	if l, ok := m.using[key]; ok {
		return l
	}
	return m.limits[0]
}

func (m *machine) take(t *rapid.T) {
	key := m.key(t)
	l := m.limitOf(key)
	m.r.take(t, sluice.Request{Policy: key.policy, Key: key.key, Cost: costGen(l.Capacity).Draw(t, "cost"), Limit: l})
}

// changeLimit takes under another limit of the pool, or a new one.
func (m *machine) changeLimit(t *rapid.T) {
	key := m.key(t)
	l := rapid.OneOf(rapid.SampledFrom(m.limits), m.limitGen).Draw(t, "new limit")
	m.using[key] = l
	m.r.take(t, sluice.Request{Policy: key.policy, Key: key.key, Cost: costGen(l.Capacity).Draw(t, "cost"), Limit: l})
}

func (m *machine) peek(t *rapid.T) {
	key := m.key(t)
	l := m.limitOf(key)
	if rapid.Bool().Draw(t, "other limit") {
		l = rapid.SampledFrom(m.limits).Draw(t, "peek limit")
	}
	m.r.peekReq(t, sluice.Request{Policy: key.policy, Key: key.key, Cost: costGen(l.Capacity).Draw(t, "peek cost"), Limit: l})
}

// forward moves the clock d ticks forwards, not beyond maxTicks.
func (m *machine) forward(d int64) {
	m.r.set(m.r.now + min(d, m.maxTicks-m.r.now))
}

// wait moves the clock forwards: not at all, one tick, a little, or up to
// 100 years.
func (m *machine) wait(t *rapid.T) {
	m.forward(rapid.OneOf(
		rapid.Just[int64](0),
		rapid.Just[int64](1),
		rapid.Int64Range(0, 1000),
		rapid.Int64Range(0, int64(100*year/m.r.tick)),
	).Draw(t, "wait ticks"))
}

// waitRefill moves the clock forwards by up to a few tokens' worth of a
// key's refill, where levels are neither empty nor full.
func (m *machine) waitRefill(t *rapid.T) {
	tok := tokenTicks(m.limitOf(m.key(t)), m.r.tick)
	m.forward(rapid.Int64Range(0, 3*tok).Draw(t, "refill ticks"))
}

// stepBack moves the clock backwards, never before tick zero nor before
// the latest sweep.
func (m *machine) stepBack(t *rapid.T) {
	room := m.r.now - m.swept
	if room <= 0 {
		t.Skip("clock at tick zero or at the latest sweep")
	}
	d := rapid.OneOf(
		rapid.Just[int64](1),
		rapid.Int64Range(1, min(room, 1000)),
		rapid.Int64Range(1, room),
	).Draw(t, "step back ticks")
	m.r.set(m.r.now - d)
}

// sweepNow makes the store drop what its maintenance would drop at the
// current reading; decisions must not change.
func (m *machine) sweepNow(t *rapid.T) {
	if m.sweep == nil {
		t.Skip("the store has no sweep")
	}
	m.sweep(m.r.store)
	m.swept = m.r.now
}

// takeID takes with a request ID of a small pool: the same parameters as
// its remembered first use (a replay while remembered), another cost or
// limit (a conflict while remembered), or new ones.
func (m *machine) takeID(t *rapid.T) {
	key := m.key(t)
	id := rapid.SampledFrom([]string{"r0", "r1", "r2"}).Draw(t, "request ID")
	rec, seen := m.r.model.ids[modelIDKey{key.policy, key.key, id}]
	how := "new"
	if seen {
		how = rapid.SampledFrom([]string{"same", "other cost", "other limit", "new"}).Draw(t, "parameters")
	}
	req := sluice.Request{Policy: key.policy, Key: key.key, RequestID: id}
	switch how {
	case "same":
		req.Cost, req.Limit = rec.cost, rec.decision.Limit
	case "other cost":
		req.Limit = rec.decision.Limit
		req.Cost = rec.cost%req.Limit.Capacity + 1 // differs unless capacity is 1
	case "other limit":
		req.Limit = rapid.SampledFrom(m.limits).Draw(t, "limit")
		if req.Limit == rec.decision.Limit {
			req.Limit.Capacity = req.Limit.Capacity%sluice.MaxCapacity + 1
		}
		req.Cost = min(rec.cost, req.Limit.Capacity)
	default:
		req.Limit = m.limitOf(key)
		req.Cost = costGen(req.Limit.Capacity).Draw(t, "cost")
	}
	m.r.take(t, req)
}

// bad sends a request with one bad parameter, which must change nothing.
func (m *machine) bad(t *rapid.T) {
	key := m.key(t)
	cases := badRequests(m.r.tick, key, m.limitOf(key))
	c := cases[rapid.IntRange(0, len(cases)-1).Draw(t, "bad request (index in badRequests)")]
	t.Logf("bad request: %s: Take(%s)", c.name, describe(c.req))
	m.r.take(t, c.req)
	if c.peek {
		q := c.req
		q.RequestID = ""
		m.r.peekReq(t, q)
	}
}

// operator skips the action if the store is not a sluice.Operator.
func (m *machine) operator(t *rapid.T) {
	if _, ok := m.r.store.(sluice.Operator); !ok {
		t.Skip("the store does not implement sluice.Operator")
	}
}

// takeAll decides 1 to 4 distinct buckets together, each under its limit
// (sometimes another of the pool, which converts it).
func (m *machine) takeAll(t *rapid.T) {
	m.operator(t)
	n := rapid.IntRange(1, 4).Draw(t, "parts")
	var rs []sluice.Request
	seen := map[modelKey]bool{}
	for range n {
		key := m.key(t)
		if seen[key] {
			continue
		}
		seen[key] = true
		l := m.limitOf(key)
		if rapid.IntRange(0, 4).Draw(t, "other limit (0)") == 0 {
			l = rapid.SampledFrom(m.limits).Draw(t, "part limit")
			m.using[key] = l
		}
		rs = append(rs, sluice.Request{Policy: key.policy, Key: key.key, Cost: costGen(l.Capacity).Draw(t, "part cost"), Limit: l})
	}
	m.r.takeAll(t, rs)
}

// drain drains a bucket by a cost that sometimes exceeds its capacity.
func (m *machine) drain(t *rapid.T) {
	m.operator(t)
	key := m.key(t)
	l := m.limitOf(key)
	cost := costGen(l.Capacity).Draw(t, "drain cost")
	if rapid.Bool().Draw(t, "more than the capacity") {
		cost = l.Capacity + rapid.Int64Range(1, sluice.MaxCapacity).Draw(t, "excess")
	}
	m.r.drain(t, sluice.Request{Policy: key.policy, Key: key.key, Cost: cost, Limit: l})
}

// refund gives tokens back: without a request ID, or with one of the
// takeID pool (a remembered take, refunded once; or unknown).
func (m *machine) refund(t *rapid.T) {
	m.operator(t)
	key := m.key(t)
	req := sluice.Request{Policy: key.policy, Key: key.key, Limit: m.limitOf(key)}
	if rapid.Bool().Draw(t, "with a request ID") {
		req.RequestID = rapid.SampledFrom([]string{"r0", "r1", "r2"}).Draw(t, "request ID")
		if rec, ok := m.r.model.ids[modelIDKey{key.policy, key.key, req.RequestID}]; ok && rapid.Bool().Draw(t, "the take's limit") {
			req.Limit = rec.decision.Limit
			req.Cost = rapid.Int64Range(1, rec.cost).Draw(t, "refund cost")
			m.r.refund(t, req)
			return
		}
	}
	req.Cost = costGen(req.Limit.Capacity).Draw(t, "refund cost")
	m.r.refund(t, req)
}

// reset makes a bucket full.
func (m *machine) reset(t *rapid.T) {
	m.operator(t)
	key := m.key(t)
	m.r.reset(t, key.policy, key.key)
}

// check verifies the model's own invariant: every level is in [0, C].
func (m *machine) check(t *rapid.T) {
	for key, b := range m.r.model.buckets {
		if b.level.Sign() < 0 || b.level.Cmp(new(big.Rat).SetInt64(b.limit.Capacity)) > 0 {
			t.Fatalf("model level of policy %q key %q is %s, outside [0, %d]", key.policy, short(key.key), level(b.level), b.limit.Capacity)
		}
	}
}

// badCase is a request with exactly one bad parameter.
type badCase struct {
	name string
	req  sluice.Request
	want error
	peek bool // a Peek of req without its request ID fails the same way
}

// badRequests returns one request per bad parameter, built from a valid key
// and limit, each carrying a request ID (which must not be remembered).
func badRequests(tick time.Duration, b modelKey, l sluice.Limit) []badCase {
	policy, key := b.policy, b.key
	// other is another valid limit, to which converting a bucket loses
	// tokens (half the capacity, whole tokens only): a store that converted
	// the bucket before checking the cost would be noticed.
	other := sluice.Limit{Capacity: max(1, l.Capacity/2), Rate: sluice.Per(1, tick)}
	if other == l {
		other.Capacity = 2
	}
	withLimit := func(f func(*sluice.Limit)) sluice.Request {
		bad := l
		f(&bad)
		return sluice.Request{Policy: policy, Key: key, Cost: 1, Limit: bad, RequestID: "bad"}
	}
	cases := []badCase{
		{"empty policy", sluice.Request{Policy: "", Key: key, Cost: 1, Limit: l, RequestID: "bad"}, sluice.ErrInvalidPolicy, true},
		{"65-byte policy", sluice.Request{Policy: strings.Repeat("p", sluice.MaxPolicyLen+1), Key: key, Cost: 1, Limit: l, RequestID: "bad"}, sluice.ErrInvalidPolicy, true},
		{"policy with a space", sluice.Request{Policy: "a b", Key: key, Cost: 1, Limit: l, RequestID: "bad"}, sluice.ErrInvalidPolicy, true},
		{"empty key", sluice.Request{Policy: policy, Key: "", Cost: 1, Limit: l, RequestID: "bad"}, sluice.ErrInvalidKey, true},
		{"513-byte key", sluice.Request{Policy: policy, Key: strings.Repeat("k", sluice.MaxKeyLen+1), Cost: 1, Limit: l, RequestID: "bad"}, sluice.ErrInvalidKey, true},
		{"cost 0", sluice.Request{Policy: policy, Key: key, Cost: 0, Limit: other, RequestID: "bad"}, sluice.ErrInvalidCost, true},
		{"cost -1", sluice.Request{Policy: policy, Key: key, Cost: -1, Limit: other, RequestID: "bad"}, sluice.ErrInvalidCost, true},
		{"cost above capacity", sluice.Request{Policy: policy, Key: key, Cost: other.Capacity + 1, Limit: other, RequestID: "bad"}, sluice.ErrInvalidCost, true},
		{"capacity 0", withLimit(func(l *sluice.Limit) { l.Capacity = 0 }), sluice.ErrInvalidLimit, true},
		{"capacity 2^40+1", withLimit(func(l *sluice.Limit) { l.Capacity = sluice.MaxCapacity + 1 }), sluice.ErrInvalidLimit, true},
		{"tokens -1", withLimit(func(l *sluice.Limit) { l.Rate.Tokens = -1 }), sluice.ErrInvalidLimit, true},
		{"tokens 2^40+1", withLimit(func(l *sluice.Limit) { l.Rate.Tokens = sluice.MaxTokens + 1 }), sluice.ErrInvalidLimit, true},
		{"period 0", withLimit(func(l *sluice.Limit) { l.Rate.Period = 0 }), sluice.ErrInvalidLimit, true},
		{"period -1ns", withLimit(func(l *sluice.Limit) { l.Rate.Period = -1 }), sluice.ErrInvalidLimit, true},
		{"period 366 days + 1ns", withLimit(func(l *sluice.Limit) { l.Rate.Period = sluice.MaxPeriod + 1 }), sluice.ErrInvalidLimit, true},
		{"513-byte request ID", sluice.Request{Policy: policy, Key: key, Cost: 1, Limit: other, RequestID: strings.Repeat("r", sluice.MaxRequestIDLen+1)}, sluice.ErrInvalidRequestID, false},
	}
	if tick > time.Nanosecond {
		cases = append(cases, badCase{"period not a whole number of ticks",
			withLimit(func(l *sluice.Limit) { l.Rate.Period = time.Second + time.Nanosecond }), sluice.ErrInvalidLimit, true})
	}
	return cases
}

// testGuarantee checks the no-oversell guarantee on random traces of one key
// under one limit, with the clock stepping back at times: for every pair of
// events i < j, the cost allowed by events i+1..j is at most the level after
// event i plus the refill over (t_i, t_j], where t is the effective time
// max(now, previous t). Every decision also equals the model's.
func (s Suite) testGuarantee(t *testing.T) {
	lg := s.supportedLimitGen()
	maxTicks := int64(maxElapsed / s.Tick)
	rapid.Check(t, func(rt *rapid.T) {
		r := s.newRig(t, sluice.KeepTokens, time.Hour)
		l := lg.Draw(rt, "limit")
		capacity := new(big.Rat).SetInt64(l.Capacity)
		rate := big.NewRat(l.Rate.Tokens, int64(l.Rate.Period/s.Tick)) // tokens per tick
		tok := tokenTicks(l, s.Tick)
		step := rapid.OneOf(
			rapid.Just[int64](0),
			rapid.Int64Range(0, tok),
			rapid.Int64Range(0, 3*tok),
			rapid.Int64Range(-3*tok, 0),
			rapid.Int64Range(-int64(time.Hour/s.Tick), int64(time.Hour/s.Tick)),
		)
		cost := costGen(l.Capacity)
		events := rapid.IntRange(1, 200).Draw(rt, "events")

		r.set(rapid.Int64Range(0, int64(time.Hour/s.Tick)).Draw(rt, "first tick"))
		var (
			eff     int64 // effective time of the latest event
			allowed int64 // total cost allowed by events 1..j
			// bound is min over i < j of (A_i + L_i - t_i*rate); event j
			// keeps the guarantee against every earlier i iff
			// A_j - t_j*rate <= bound.
			bound   *big.Rat
			boundAt int
		)
		for j := 1; j <= events; j++ {
			if j > 1 {
				r.set(min(max(r.now+step.Draw(rt, "step"), 0), maxTicks))
			}
			if j == 1 {
				// Event 0 is the bucket's creation: full at the first take.
				eff = r.now
				bound = new(big.Rat).Sub(capacity, new(big.Rat).Mul(big.NewRat(eff, 1), rate))
			}
			c := cost.Draw(rt, "cost")
			d, _ := r.take(rt, sluice.Request{Policy: testPolicy, Key: "k", Cost: c, Limit: l})
			eff = max(eff, r.now)
			if d.Allowed {
				allowed += c
			}
			lv := r.model.Level(testPolicy, "k")
			if lv.Sign() < 0 || lv.Cmp(capacity) > 0 {
				rt.Fatalf("event %d: level %s is outside [0, %d]", j, level(lv), l.Capacity)
			}
			if d.Remaining < 0 || d.Remaining > l.Capacity {
				rt.Fatalf("event %d: Remaining %d is outside [0, %d]", j, d.Remaining, l.Capacity)
			}
			refilled := new(big.Rat).Mul(big.NewRat(eff, 1), rate)
			lhs := new(big.Rat).Sub(big.NewRat(allowed, 1), refilled)
			if lhs.Cmp(bound) > 0 {
				rt.Fatalf("events %d..%d allowed more than the level after event %d plus the refill since: A_j - t_j*rate = %s > %s",
					boundAt+1, j, boundAt, lhs.RatString(), bound.RatString())
			}
			x := new(big.Rat).Add(big.NewRat(allowed, 1), lv)
			if x.Sub(x, refilled); x.Cmp(bound) < 0 {
				bound, boundAt = x, j
			}
		}
	})
}
