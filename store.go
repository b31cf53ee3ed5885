package sluice

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Never is the RetryAfter or ResetAfter of a wait that cannot end: the bucket
// does not refill (Rate.Tokens == 0), or the exact wait is longer than a
// time.Duration can hold. It is never a wait to sleep on.
const Never = time.Duration(math.MaxInt64)

// Length bounds for keys and request IDs.
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 512
	// MaxRequestIDLen is the longest request ID, in bytes.
	MaxRequestIDLen = 512
)

// Request asks a store to take Cost tokens from the bucket of Key, shaped by
// Limit.
//
// RequestID, when not empty, makes the request idempotent: the store
// remembers the first decision for (Key, RequestID) for a bounded time, and a
// retry with the same ID returns that decision again with Replayed set,
// consuming nothing. The same ID with another Cost or Limit is
// ErrRequestIDConflict. This makes retries of the limiter call safe; it does
// not make the caller's own operation exactly-once.
type Request struct {
	Key       string
	Cost      int64
	Limit     Limit
	RequestID string
}

// Validate checks r before any state is touched: the key is 1 to MaxKeyLen
// bytes, the limit is valid, 1 <= Cost <= Limit.Capacity, and the request ID
// is at most MaxRequestIDLen bytes. The error wraps ErrInvalidKey,
// ErrInvalidLimit, ErrInvalidCost or ErrInvalidRequestID.
func (r Request) Validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if err := r.Limit.Validate(); err != nil {
		return err
	}
	if r.Cost < 1 || r.Cost > r.Limit.Capacity {
		return fmt.Errorf("%w: cost %d is outside [1, %d] (the capacity)", ErrInvalidCost, r.Cost, r.Limit.Capacity)
	}
	if len(r.RequestID) > MaxRequestIDLen {
		return fmt.Errorf("%w: request ID is %d bytes, more than %d", ErrInvalidRequestID, len(r.RequestID), MaxRequestIDLen)
	}
	return nil
}

// ValidateKey reports whether key is 1 to MaxKeyLen bytes long. Any bytes are
// allowed. The error wraps ErrInvalidKey.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// Decision is the outcome of one Take or Peek.
type Decision struct {
	// Allowed reports whether the cost was taken.
	Allowed bool
	// Remaining is the whole number of tokens left after the decision
	// (rounded down).
	Remaining int64
	// RetryAfter is zero when allowed. When denied, it is the exact wait,
	// rounded up to the store's time unit, after which the same cost would
	// be allowed if nothing else took tokens; Never if waiting cannot help.
	RetryAfter time.Duration
	// ResetAfter is the wait until the bucket is full again (zero if full),
	// rounded up to the store's time unit; Never if it does not refill.
	ResetAfter time.Duration
	// Limit is the limit the decision was made under.
	Limit Limit
	// Replayed reports that this is the remembered decision of an earlier
	// request with the same RequestID; nothing was consumed this time.
	Replayed bool
	// Degraded reports that the store could not be consulted and the
	// decision was made by a failure policy instead.
	Degraded bool
}

// Store holds buckets and decides requests atomically. Implementations are
// safe for concurrent use; every decision on one key is one atomic
// read-refill-decide-write step, also across processes for shared stores.
//
// Take validates r (errors wrap ErrInvalidKey, ErrInvalidCost,
// ErrInvalidLimit, ErrInvalidRequestID and leave every bucket unchanged),
// then takes r.Cost tokens if the refilled level covers it. A denial is a
// Decision with Allowed false, never an error.
//
// Peek reports the bucket of key as a take of cost 1 would see it, without
// consuming anything and without creating state: Allowed tells whether one
// token is available, Remaining is the current whole level, RetryAfter the
// wait for one token.
type Store interface {
	Take(ctx context.Context, r Request) (Decision, error)
	Peek(ctx context.Context, key string, l Limit) (Decision, error)
}
