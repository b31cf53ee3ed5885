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

// Length bounds for policy names, keys and request IDs.
const (
	// MaxPolicyLen is the longest policy name, in bytes.
	MaxPolicyLen = 64
	// MaxKeyLen is the longest key, in bytes. It bounds the caller's key
	// alone: a store's own prefixes and the policy name do not count.
	MaxKeyLen = 512
	// MaxRequestIDLen is the longest request ID, in bytes.
	MaxRequestIDLen = 512
)

// Request asks a store to take Cost tokens from the bucket of (Policy, Key),
// shaped by Limit.
//
// Policy names the quota the bucket belongs to ("api", "login",
// "daily-export"). Two policies never share a bucket, whatever their keys;
// requests of one policy that arrive with another Limit (a customer's new
// tier, a changed config) convert the bucket as the store's Conversion says.
// There is no default: each quota needs a name of its own.
//
// RequestID, when not empty, makes the request idempotent: the store
// remembers the first allowed decision for (Policy, Key, RequestID) for a
// bounded time, and a retry with the same ID returns that decision again
// with Replayed set, consuming nothing. A denial is not remembered: it took
// nothing, so its retry decides afresh. The same ID with another Cost or
// Limit, while remembered, is ErrRequestIDConflict. This makes retries of
// the limiter call safe; it does not make the caller's own operation
// exactly-once.
type Request struct {
	Policy    string
	Key       string
	Cost      int64
	Limit     Limit
	RequestID string
}

// Validate checks r before any state is touched: the policy name passes
// ValidatePolicy, the key ValidateKey, the limit is valid,
// 1 <= Cost <= Limit.Capacity, and the request ID is at most
// MaxRequestIDLen bytes. The error wraps ErrInvalidPolicy, ErrInvalidKey,
// ErrInvalidLimit, ErrInvalidCost or ErrInvalidRequestID.
func (r Request) Validate() error {
	if err := ValidatePolicy(r.Policy); err != nil {
		return err
	}
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

// ValidatePeek is Validate for Peek: the same checks, and no request ID
// (a peek consumes nothing, so there is nothing to make idempotent).
func (r Request) ValidatePeek() error {
	if r.RequestID != "" {
		return fmt.Errorf("%w: a peek takes no request ID (got %d bytes)", ErrInvalidRequestID, len(r.RequestID))
	}
	return r.Validate()
}

// ValidatePolicy reports whether name is a policy name: 1 to MaxPolicyLen
// bytes of printable ASCII without spaces (0x21 to 0x7e), so that it can
// appear in a RateLimit-Policy field, a metric label and a config file as
// it is. The error wraps ErrInvalidPolicy.
func ValidatePolicy(name string) error {
	if name == "" {
		return fmt.Errorf("%w: policy name is empty; every quota needs a name of its own (for example \"api\" or \"login\")", ErrInvalidPolicy)
	}
	if len(name) > MaxPolicyLen {
		return fmt.Errorf("%w: policy name is %d bytes, more than %d", ErrInvalidPolicy, len(name), MaxPolicyLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: policy name %q has byte 0x%02x at %d; allowed are printable ASCII bytes 0x21 to 0x7e (no spaces)", ErrInvalidPolicy, name, c, i)
		}
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
	// Allowed reports whether the cost was taken (for Peek: whether it
	// would be).
	Allowed bool
	// Remaining is the whole number of tokens left after the decision
	// (rounded down).
	Remaining int64
	// RetryAfter is zero when allowed. When denied, it is the exact wait
	// from now, rounded up to the store's time unit, after which the same
	// cost would be allowed if nothing else took tokens; Never if waiting
	// cannot help.
	RetryAfter time.Duration
	// ResetAfter is the wait from now until the bucket is full again (zero
	// if full), rounded up to the store's time unit; Never if it does not
	// refill.
	ResetAfter time.Duration
	// Taken is what a Drain took (at most Cost) or, negative, what a
	// Refund gave back. It is zero for Take, TakeAll and Peek, which take
	// all of Cost when Allowed and nothing otherwise, and for a replay.
	Taken int64
	// Limit is the limit the decision was made under.
	Limit Limit
	// Replayed reports that this is the remembered decision of an earlier
	// request with the same RequestID; nothing was consumed this time.
	Replayed bool
	// Degraded reports that the store could not be consulted and the
	// decision was made by a failure policy instead.
	Degraded bool
}

// Store holds buckets and decides requests atomically. See the package
// documentation for the contract of each method.
type Store interface {
	// Take validates r, then takes r.Cost tokens from the bucket of
	// (r.Policy, r.Key) if the refilled level covers it.
	Take(ctx context.Context, r Request) (Decision, error)
	// Peek reports whether a take of r.Cost would succeed now, and when,
	// without consuming anything and without creating state.
	Peek(ctx context.Context, r Request) (Decision, error)
}

// Operator is a Store with the operations beyond a single take: several
// buckets in one all-or-nothing decision, drain, refund and reset. Every
// store in this module implements it, and so do guard and promstore over
// a store that does. See the package documentation for the contract.
type Operator interface {
	Store
	// TakeAll validates rs (ValidateAll), then takes each request's cost
	// from its bucket if every bucket covers its cost, and from none
	// otherwise, in one atomic step.
	TakeAll(ctx context.Context, rs []Request) (MultiDecision, error)
	// Drain validates r (ValidateDrain), then takes the smaller of r.Cost
	// and the bucket's whole tokens; Allowed reports whether all of r.Cost
	// was there, Taken what was taken.
	Drain(ctx context.Context, r Request) (Decision, error)
	// Refund validates r (ValidateRefund), then gives r.Cost tokens back
	// to the bucket, never above its capacity. With a request ID it undoes
	// the remembered allowed take of that ID, at most once and at most its
	// cost.
	Refund(ctx context.Context, r Request) (Decision, error)
	// Reset makes the bucket of (policy, key) full again, as if it had
	// never been used. Request-ID records are kept.
	Reset(ctx context.Context, policy, key string) error
}

// LimitChecker is implemented by a Store that cannot decide every valid
// Limit exactly (the Redis store's arithmetic is exact only below 2^53).
// CheckLimit returns nil if the store decides l exactly, or an error
// wrapping ErrInvalidLimit that says which bound l exceeds. Wrappers of a
// store implement it by asking the store they wrap.
type LimitChecker interface {
	CheckLimit(l Limit) error
}

// CheckLimit reports whether store decides l: l must be valid, and, if the
// store implements LimitChecker, accepted by it. Call it when a limit is
// bound (NewLimiter and the middleware constructors do), so that a limit a
// store cannot decide fails at start-up rather than on every request. The
// error wraps ErrInvalidLimit.
func CheckLimit(store Store, l Limit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if c, ok := store.(LimitChecker); ok {
		return c.CheckLimit(l)
	}
	return nil
}
