package sluice

import "context"

// Limiter binds a Store to one Limit, for the common case of one limit for
// many keys:
//
//	lim, err := sluice.NewLimiter(store, sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)})
//	d, err := lim.Allow(ctx, userID)
//
// A Limiter is safe for concurrent use if its Store is (every Store in this
// module is).
type Limiter struct {
	store Store
	limit Limit
}

// NewLimiter returns a Limiter deciding under l in store. It returns an error
// wrapping ErrInvalidLimit if l is not valid.
func NewLimiter(store Store, l Limit) (*Limiter, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &Limiter{store: store, limit: l}, nil
}

// Limit returns the limit lim decides under.
func (lim *Limiter) Limit() Limit { return lim.limit }

// Allow takes one token from the bucket of key.
func (lim *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return lim.store.Take(ctx, Request{Key: key, Cost: 1, Limit: lim.limit})
}

// AllowN takes cost tokens from the bucket of key.
func (lim *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	return lim.store.Take(ctx, Request{Key: key, Cost: cost, Limit: lim.limit})
}

// Peek reports the bucket of key without taking anything.
func (lim *Limiter) Peek(ctx context.Context, key string) (Decision, error) {
	return lim.store.Peek(ctx, key, lim.limit)
}
