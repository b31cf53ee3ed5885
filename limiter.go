package sluice

import (
	"context"
	"fmt"
	"time"
)

// Limiter binds a Store to one policy and one Limit, for the common case of
// one quota over many keys:
//
//	lim, err := sluice.NewLimiter(store, "api", sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)})
//	d, err := lim.Allow(ctx, userID)
//
// Two Limiters with different policies never share buckets, even on one
// store and one key; two with the same policy share them (and convert them
// when their limits differ, which is what a limit change is). A Limiter is
// safe for concurrent use if its Store is (every Store in this module is).
type Limiter struct {
	store  Store
	policy string
	limit  Limit
}

// NewLimiter returns a Limiter deciding the buckets of policy under l in
// store. The error wraps ErrInvalidOption if store is nil, ErrInvalidPolicy
// if policy is not a valid name, or ErrInvalidLimit if l is not valid or the
// store cannot decide it exactly (CheckLimit).
func NewLimiter(store Store, policy string, l Limit) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidOption)
	}
	if err := ValidatePolicy(policy); err != nil {
		return nil, err
	}
	if err := CheckLimit(store, l); err != nil {
		return nil, err
	}
	return &Limiter{store: store, policy: policy, limit: l}, nil
}

// Policy returns the policy name lim decides under.
func (lim *Limiter) Policy() string { return lim.policy }

// Limit returns the limit lim decides under.
func (lim *Limiter) Limit() Limit { return lim.limit }

// Allow takes one token from the bucket of key.
func (lim *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return lim.store.Take(ctx, Request{Policy: lim.policy, Key: key, Cost: 1, Limit: lim.limit})
}

// AllowN takes cost tokens from the bucket of key.
func (lim *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	return lim.store.Take(ctx, Request{Policy: lim.policy, Key: key, Cost: cost, Limit: lim.limit})
}

// Take takes cost tokens from the bucket of key under request ID id (see
// Request.RequestID): a retry with the same id is not charged again while
// the store remembers the first allowed decision.
func (lim *Limiter) Take(ctx context.Context, key string, cost int64, id string) (Decision, error) {
	return lim.store.Take(ctx, Request{Policy: lim.policy, Key: key, Cost: cost, Limit: lim.limit, RequestID: id})
}

// Peek reports the bucket of key as a take of one token would see it,
// without taking anything.
func (lim *Limiter) Peek(ctx context.Context, key string) (Decision, error) {
	return lim.store.Peek(ctx, Request{Policy: lim.policy, Key: key, Cost: 1, Limit: lim.limit})
}

// PeekN reports whether a take of cost tokens from the bucket of key would
// succeed now, and when it would, without taking anything.
func (lim *Limiter) PeekN(ctx context.Context, key string, cost int64) (Decision, error) {
	return lim.store.Peek(ctx, Request{Policy: lim.policy, Key: key, Cost: cost, Limit: lim.limit})
}

// minWait is the shortest sleep of Wait between two takes, so that a
// denial that names no wait (a store that cannot tell) is not retried in a
// busy loop.
const minWait = time.Millisecond

// Wait takes cost tokens from the bucket of key, sleeping until the bucket
// has them, as golang.org/x/time/rate's Limiter.Wait does. It returns the
// allowed decision, or:
//   - at once, an error wrapping ErrWaitNever with the denial, if no wait
//     can cover cost (the bucket does not refill);
//   - at once, an error wrapping ErrWaitTooLong with the denial, if the
//     wait the bucket names would end after ctx's deadline (Wait never
//     sleeps past it);
//   - ctx's error, if ctx ends while it sleeps;
//   - the store's error, as Take returns it.
//
// After each sleep it takes again: another caller may have taken the
// tokens first, and then it waits again. Each take is a new decision (no
// request ID), so a cancelled Wait has taken nothing.
func (lim *Limiter) Wait(ctx context.Context, key string, cost int64) (Decision, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		d, err := lim.AllowN(ctx, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		if d.RetryAfter == Never {
			return d, fmt.Errorf("%w: policy %q key %q: a take of %d under %v never succeeds", ErrWaitNever, lim.policy, key, cost, d.Limit)
		}
		wait := max(d.RetryAfter, minWait)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return d, fmt.Errorf("%w: policy %q key %q: a take of %d needs %v, past the context's deadline", ErrWaitTooLong, lim.policy, key, cost, d.RetryAfter)
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return Decision{}, ctx.Err()
		case <-timer.C:
		}
	}
}
