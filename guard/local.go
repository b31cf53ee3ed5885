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

// decideLocally decides r against its local bucket, which belongs to the
// same (policy, key) as the store's.
func (s *Store) decideLocally(ctx context.Context, op Op, r *sluice.Request) (sluice.Decision, error) {
	l := LocalLimit(r.Limit, s.divisor)
	deny := sluice.Decision{RetryAfter: s.probe, Limit: l, Degraded: true}
	if r.Cost > l.Capacity {
		return deny, nil // more than the local share can ever hold
	}
	local := *r
	local.Limit = l
	var (
		d   sluice.Decision
		err error
	)
	if op == OpTake {
		d, err = s.local.Take(ctx, local)
	} else {
		d, err = s.local.Peek(ctx, local)
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
