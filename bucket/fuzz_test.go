package bucket_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/sluicetest"
)

// planBuckets applies Plans to buckets the way a store does, at explicit
// ticks: a missing bucket is full; a bucket last decided under another limit
// is refilled under it and converted.
type planBuckets struct {
	tick    time.Duration
	policy  sluice.Conversion
	buckets map[string]planBucket
}

type planBucket struct {
	s bucket.State
	p bucket.Plan
}

func newPlanBuckets(tick time.Duration, policy sluice.Conversion) *planBuckets {
	return &planBuckets{tick: tick, policy: policy, buckets: make(map[string]planBucket)}
}

// current returns the state of key under p at tick now, without storing it.
func (b *planBuckets) current(now int64, key string, p *bucket.Plan) bucket.State {
	bk, ok := b.buckets[key]
	switch {
	case !ok:
		return p.Full(now)
	case bk.p.Limit() == p.Limit():
		return bk.s
	default:
		return p.Convert(bk.p.Refill(bk.s, now), &bk.p, b.policy)
	}
}

func (b *planBuckets) take(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := bucket.NewPlan(r.Limit, b.tick)
	if err != nil {
		return sluice.Decision{}, err
	}
	s := b.current(now, r.Key, &p)
	var d sluice.Decision
	p.Take(&s, now, r.Cost, &d)
	b.buckets[r.Key] = planBucket{s, p}
	return d, nil
}

func (b *planBuckets) drain(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := bucket.NewPlan(r.Limit, b.tick)
	if err != nil {
		return sluice.Decision{}, err
	}
	s := b.current(now, r.Key, &p)
	var d sluice.Decision
	p.Drain(&s, now, r.Cost, &d)
	b.buckets[r.Key] = planBucket{s, p}
	return d, nil
}

// refund gives tokens back; a full bucket (a missing one is) is not
// written.
func (b *planBuckets) refund(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := bucket.NewPlan(r.Limit, b.tick)
	if err != nil {
		return sluice.Decision{}, err
	}
	s := b.current(now, r.Key, &p)
	var d sluice.Decision
	if p.Refund(&s, now, r.Cost, &d) {
		b.buckets[r.Key] = planBucket{s, p}
	}
	return d, nil
}

// reset makes a bucket full under its own limit.
func (b *planBuckets) reset(now int64, key string) {
	if bk, ok := b.buckets[key]; ok && bk.p.Reset(&bk.s, now) {
		b.buckets[key] = bk
	}
}

func (b *planBuckets) peek(now int64, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := bucket.NewPlan(r.Limit, b.tick)
	if err != nil {
		return sluice.Decision{}, err
	}
	return p.Peek(b.current(now, r.Key, &p), now, r.Cost), nil
}

// check verifies the invariants of a State: 0 <= Tokens <= C, Frac < Scale,
// and Frac == 0 when full.
func (b *planBuckets) check(key string) error {
	bk, ok := b.buckets[key]
	if !ok {
		return nil
	}
	s, c := bk.s, bk.p.Limit().Capacity
	if s.Tokens < 0 || s.Tokens > c || s.Frac >= bk.p.Scale() || (s.Tokens == c && s.Frac != 0) {
		return fmt.Errorf("bucket %q under %v: state %+v breaks 0 <= Tokens <= %d, Frac < %d, Frac == 0 when full", key, bk.p.Limit(), s, c, bk.p.Scale())
	}
	return nil
}

// fuzzLimit maps arbitrary numbers onto a valid limit whose period is a
// whole number of ticks.
func fuzzLimit(c, n, p int64, tick time.Duration) sluice.Limit {
	return sluice.Limit{
		Capacity: 1 + int64(uint64(c)%sluice.MaxCapacity),
		Rate: sluice.Rate{
			Tokens: int64(uint64(n) % (sluice.MaxTokens + 1)),
			Period: tick * time.Duration(1+uint64(p)%uint64(sluice.MaxPeriod/tick)),
		},
	}
}

var fuzzTicks = []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond}

// opReader reads the operations of FuzzTransition; past the end it reads
// zeros.
type opReader []byte

func (r *opReader) byte() byte {
	if len(*r) == 0 {
		return 0
	}
	b := (*r)[0]
	*r = (*r)[1:]
	return b
}

func (r *opReader) uint64() uint64 {
	var buf [8]byte
	n := copy(buf[:], *r)
	*r = (*r)[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

func satAdd(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

// FuzzTransition compares the decisions of Plans, applied as a store does,
// with the model's on two limits (l1 as given if raw&1, else mapped onto a
// valid one; l2 always valid), on operations read from ops: takes, peeks,
// small and huge clock moves forwards and backwards, and jumps to arbitrary
// ticks. After every take the state must keep its invariants.
func FuzzTransition(f *testing.F) {
	f.Add(int64(10), int64(10), int64(1e9), int64(4), int64(3), int64(13e9), uint8(0), uint8(0), uint8(0),
		[]byte{0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 2, 0x80, 0x96, 0, 0, 1, 0, 0})
	f.Add(int64(1<<40-1), int64(1<<40), int64(0), int64(0), int64(0), int64(1<<62), uint8(0), uint8(1), uint8(0),
		[]byte{0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 1, 1, 1})
	f.Add(int64(2), int64(3), int64(9), int64(100), int64(0), int64(999), uint8(1), uint8(2), uint8(0),
		[]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 4, 0x40, 0x42, 0x0f, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 5, 0, 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(int64(0), int64(-1), int64(0), int64(7), int64(7), int64(7), uint8(2), uint8(0), uint8(1), []byte{0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, c1, n1, p1, c2, n2, p2 int64, tickSel, policySel, raw uint8, ops []byte) {
		tick := fuzzTicks[int(tickSel)%len(fuzzTicks)]
		policy := sluice.Conversion(policySel % 3)
		limits := [2]sluice.Limit{fuzzLimit(c1, n1, p1, tick), fuzzLimit(c2, n2, p2, tick)}
		if raw&1 != 0 {
			limits[0] = sluice.Limit{Capacity: c1, Rate: sluice.Rate{Tokens: n1, Period: time.Duration(p1)}}
		}
		b := newPlanBuckets(tick, policy)
		model := sluicetest.NewModel(tick, policy, 0)
		r := opReader(ops)
		var now int64
		for i := 0; len(r) > 0 && i < 200; i++ {
			switch op := r.byte() % 6; op {
			case 0, 1: // take or peek: key, limit, cost
				key := string(rune('a' + r.byte()%2))
				l := limits[r.byte()%2]
				c := r.uint64()
				cost := l.Capacity // c == 0: the whole capacity
				if c != 0 && l.Capacity > 0 {
					cost = 1 + int64(c%uint64(l.Capacity))
				}
				req := sluice.Request{Policy: "p", Key: key, Cost: cost, Limit: l}
				if op == 1 {
					got, err := b.peek(now, req)
					want, werr := model.Peek(now, req)
					if err := same(got, err, want, werr); err != nil {
						t.Fatalf("op %d: Peek(%q, %d, %v) at tick %d: %v", i, key, cost, l, now, err)
					}
					continue
				}
				got, err := b.take(now, req)
				want, werr := model.Take(now, req)
				if err := same(got, err, want, werr); err != nil {
					t.Fatalf("op %d: Take(%q, %d, %v) at tick %d: %v", i, key, cost, l, now, err)
				}
				if err := b.check(key); err != nil {
					t.Fatalf("op %d: Take(%q, %d, %v) at tick %d: %v", i, key, cost, l, now, err)
				}
			case 2: // a little time
				now = satAdd(now, int64(r.byte()))
			case 3: // up to about 292 years forwards
				now = satAdd(now, int64(r.uint64()>>1))
			case 4: // up to about 292 years backwards
				now = satAdd(now, -int64(r.uint64()>>1))
			case 5: // anywhere
				now = int64(r.uint64())
			}
		}
	})
}

// same reports how a Plan-based result differs from the model's.
func same(got sluice.Decision, err error, want sluice.Decision, werr error) error {
	switch {
	case werr != nil && err != nil:
		for _, s := range []error{sluice.ErrInvalidKey, sluice.ErrInvalidCost, sluice.ErrInvalidLimit, sluice.ErrInvalidRequestID} {
			if errors.Is(werr, s) != errors.Is(err, s) {
				return fmt.Errorf("error %v, the model's %v", err, werr)
			}
		}
		return nil
	case werr != nil || err != nil:
		return fmt.Errorf("%+v, %v; the model says %+v, %v", got, err, want, werr)
	case got != want:
		return fmt.Errorf("%+v; the model says %+v", got, want)
	}
	return nil
}
