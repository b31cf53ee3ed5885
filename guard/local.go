package guard

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/exact"
)

// LocalLimit returns the share 1/n of l that one of n instances may allow on
// its own while the shared store is unreachable (FailLocal): capacity
// floor(C/n), at least 1, and the rate divided by n — exactly when it can
// be (k tokens every P becomes k/g tokens every P·n/g with g = gcd(k, n),
// as long as that period is at most sluice.MaxPeriod), else rounded down to
// floor(k/n) tokens every P. Rounding always goes against the caller, so n
// instances together never allow more than l (except through the capacity
// floor of 1). n below 1 counts as 1; an invalid l is returned unchanged.
func LocalLimit(l sluice.Limit, n int64) sluice.Limit {
	if n <= 1 || l.Validate() != nil {
		return l
	}
	out := sluice.Limit{Capacity: max(l.Capacity/n, 1), Rate: l.Rate}
	if k := l.Rate.Tokens; k > 0 {
		g := int64(exact.GCD(uint64(k), uint64(n)))
		if m := n / g; int64(l.Rate.Period) <= int64(sluice.MaxPeriod)/m {
			out.Rate = sluice.Rate{Tokens: k / g, Period: l.Rate.Period * time.Duration(m)}
		} else {
			out.Rate = sluice.Rate{Tokens: k / n, Period: l.Rate.Period}
		}
	}
	return out
}

// decideLocally decides a Take, Peek or Drain of r against its local
// bucket, which belongs to the same (policy, key) as the store's.
func (s *Store) decideLocally(ctx context.Context, op Op, r *sluice.Request) (sluice.Decision, error) {
	l := LocalLimit(r.Limit, s.divisor)
	deny := sluice.Decision{RetryAfter: s.probe, Limit: l, Degraded: true}
	if r.Cost > l.Capacity && op != OpDrain {
		return deny, nil // more than the local share can ever hold
	}
	local := *r
	local.Limit = l
	var (
		d   sluice.Decision
		err error
	)
	switch op {
	case OpTake:
		d, err = s.local.Take(ctx, local)
	case OpPeek:
		d, err = s.local.Peek(ctx, local)
	default:
		d, err = s.local.Drain(ctx, local)
		if err == nil && !d.Allowed && r.Cost > l.Capacity && r.Cost <= r.Limit.Capacity {
			// The local bucket never holds the cost, the store's does:
			// a hint, as for a take above the local capacity, rather than
			// the local bucket's Never.
			d.RetryAfter = s.probe
		}
	}
	switch {
	case errors.Is(err, sluice.ErrTooManyKeys):
		return deny, nil // no room for another local bucket: deny, evict none
	case err != nil:
		return sluice.Decision{}, err // a request-ID conflict, or the caller's context
	}
	d.Degraded = true
	return d, nil
}

// takeAllLocally decides a multi-take against the local buckets of its
// requests, all or nothing, each under its local limit. A part above its
// local capacity, or no room for a new local bucket, denies every part as
// FailClosed does, and takes nothing.
func (s *Store) takeAllLocally(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	local := make([]sluice.Request, len(rs))
	fits := true
	for i, r := range rs {
		local[i] = r
		local[i].Limit = LocalLimit(r.Limit, s.divisor)
		fits = fits && r.Cost <= local[i].Limit.Capacity
	}
	var (
		md  sluice.MultiDecision
		err error
	)
	if fits {
		md, err = s.local.TakeAll(ctx, local)
	}
	switch {
	case !fits, errors.Is(err, sluice.ErrTooManyKeys):
		md = sluice.MultiDecision{Parts: make([]sluice.Decision, len(rs))}
		for i := range md.Parts {
			md.Parts[i] = sluice.Decision{RetryAfter: s.probe, Limit: local[i].Limit}
		}
		md.Combine()
	case err != nil:
		return sluice.MultiDecision{}, err // the caller's context
	}
	md.Degraded = true
	for i := range md.Parts {
		md.Parts[i].Degraded = true
	}
	return md, nil
}

// applyLocally makes a Refund or Reset that the store did not make to the
// local bucket of the same (policy, key), so that a take the local bucket
// decided during the outage gets its tokens back there, and a reset key is
// not held back by it. A missing local bucket stays missing (it is full).
// The local store's errors are dropped: the caller gets the store's
// failure, and a refund whose request ID the local buckets never saw (a
// take the store decided) is one the local bucket has no part in.
func (s *Store) applyLocally(ctx context.Context, q *query) {
	if q.op == OpReset {
		s.local.Reset(ctx, q.r.Policy, q.r.Key)
		return
	}
	r := q.r
	r.Limit = LocalLimit(r.Limit, s.divisor)
	if r.Cost > r.Limit.Capacity {
		if r.RequestID != "" {
			return // more than any local take of that ID took
		}
		r.Cost = r.Limit.Capacity // the level never rises above it anyway
	}
	s.local.Refund(ctx, r)
}
