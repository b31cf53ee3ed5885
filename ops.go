package sluice

import (
	"fmt"
	"time"
)

// MaxParts is the most buckets one TakeAll decides together.
const MaxParts = 16

// ValidateAll checks the requests of one TakeAll before any state is
// touched: 1 to MaxParts requests, each passing Validate and carrying no
// request ID, and no two for the same (Policy, Key). The error wraps
// ErrInvalidMulti, or the error of the first bad request (with its index).
func ValidateAll(rs []Request) error {
	if len(rs) == 0 {
		return fmt.Errorf("%w: no buckets; a multi-take decides 1 to %d", ErrInvalidMulti, MaxParts)
	}
	if len(rs) > MaxParts {
		return fmt.Errorf("%w: %d buckets, more than %d", ErrInvalidMulti, len(rs), MaxParts)
	}
	for i := range rs {
		if err := rs[i].Validate(); err != nil {
			return fmt.Errorf("bucket %d: %w", i, err)
		}
		if rs[i].RequestID != "" {
			return fmt.Errorf("bucket %d: %w: a multi-take takes no request ID (got %d bytes)", i, ErrInvalidRequestID, len(rs[i].RequestID))
		}
		for j := 0; j < i; j++ {
			if rs[j].Policy == rs[i].Policy && rs[j].Key == rs[i].Key {
				return fmt.Errorf("%w: buckets %d and %d are both policy %q key %q; a bucket appears once per call", ErrInvalidMulti, j, i, rs[i].Policy, rs[i].Key)
			}
		}
	}
	return nil
}

// MultiDecision is the outcome of one TakeAll.
type MultiDecision struct {
	// Allowed reports whether every bucket covered its cost, so that all
	// were charged. When false, none was.
	Allowed bool
	// Denied is the index of the bucket that decided the denial: among the
	// buckets that could not cover their cost, the one with the longest
	// RetryAfter (the first such on a tie). It is -1 when allowed.
	Denied int
	// RetryAfter is zero when allowed; when denied, the longest RetryAfter
	// of the buckets that could not cover their cost: the wait after which
	// every bucket covers its cost, if nothing else takes tokens. Never if
	// one of them never does.
	RetryAfter time.Duration
	// Parts holds one Decision per request, in order. Each says whether that
	// bucket alone covered its cost (Allowed), its own RetryAfter, and
	// Remaining and ResetAfter after the call: after the take when the
	// multi-take was allowed, as they were when it was denied.
	Parts []Decision
	// Degraded reports that the store could not be consulted and a failure
	// policy decided.
	Degraded bool
}

// Combine fills Allowed, Denied and RetryAfter of md from md.Parts, whose
// Allowed and RetryAfter are the buckets' own. Stores call it once they
// have decided the parts.
func (md *MultiDecision) Combine() {
	md.Allowed, md.Denied, md.RetryAfter = true, -1, 0
	for i, d := range md.Parts {
		if d.Allowed {
			continue
		}
		if md.Allowed || d.RetryAfter > md.RetryAfter {
			md.Denied, md.RetryAfter = i, d.RetryAfter
		}
		md.Allowed = false
	}
}

// ValidateDrain checks a Drain request: as Validate, except that the cost
// may exceed the capacity (a charge made after the fact can be larger than
// any bucket; it drains the bucket to zero), and that a drain takes no
// request ID. The error wraps the same sentinels as Validate.
func (r Request) ValidateDrain() error {
	if r.RequestID != "" {
		return fmt.Errorf("%w: a drain takes no request ID (got %d bytes)", ErrInvalidRequestID, len(r.RequestID))
	}
	c := r
	if c.Cost > c.Limit.Capacity && c.Limit.Capacity >= 1 {
		c.Cost = c.Limit.Capacity
	}
	return c.Validate()
}

// ValidateRefund checks a Refund request: as Validate (the cost, the tokens
// to give back, is 1 to the capacity). A request ID, if any, names the take
// being undone.
func (r Request) ValidateRefund() error { return r.Validate() }

// ValidateReset checks the policy and key of a Reset.
func ValidateReset(policy, key string) error {
	if err := ValidatePolicy(policy); err != nil {
		return err
	}
	return ValidateKey(key)
}
