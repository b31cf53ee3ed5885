package sluice

import "errors"

// Errors returned for bad parameters. A call that returns one of them (wrapped
// with the offending value; test with errors.Is) has changed no state and is
// not a denial.
var (
	// ErrInvalidPolicy means the policy name is empty, longer than
	// MaxPolicyLen bytes, or not printable ASCII.
	ErrInvalidPolicy = errors.New("sluice: invalid policy name")
	// ErrInvalidKey means the key is empty or longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("sluice: invalid key")
	// ErrInvalidCost means the cost is below 1 or above the limit's capacity.
	ErrInvalidCost = errors.New("sluice: invalid cost")
	// ErrInvalidLimit means the limit is out of range, or its exact
	// arithmetic does not fit the store's integers or time unit.
	ErrInvalidLimit = errors.New("sluice: invalid limit")
	// ErrInvalidRequestID means the request ID is longer than
	// MaxRequestIDLen bytes, or was given to an operation that takes none
	// (Peek).
	ErrInvalidRequestID = errors.New("sluice: invalid request ID")
	// ErrRequestIDConflict means a request ID the store still remembers for
	// a bucket was sent again with another cost or limit. Request IDs are
	// scoped by policy and key.
	ErrRequestIDConflict = errors.New("sluice: request ID reused with different parameters")
	// ErrUnknownRequestID means a Refund named a request ID that the store
	// does not remember as an allowed take of that bucket (never taken,
	// denied, or forgotten after the store's request-ID TTL). Nothing was
	// given back; refund without the ID to give tokens back unconditionally.
	ErrUnknownRequestID = errors.New("sluice: unknown request ID")
	// ErrInvalidMulti means a TakeAll had no buckets, more than MaxParts,
	// or the same (policy, key) twice.
	ErrInvalidMulti = errors.New("sluice: invalid multi-take")
)

// Errors of Limiter.Wait: the wait was not started.
var (
	// ErrWaitNever means no wait can cover the cost: the bucket does not
	// refill.
	ErrWaitNever = errors.New("sluice: waiting cannot help")
	// ErrWaitTooLong means the wait would end after the context's
	// deadline.
	ErrWaitTooLong = errors.New("sluice: wait would exceed the context deadline")
)

// Errors about the store rather than the request.
var (
	// ErrTooManyKeys means the store holds its maximum number of buckets,
	// the bounded search of a new key's insert found none it could reclaim
	// without loss, and the store's overflow rule is to refuse new keys.
	// Existing keys are still decided.
	ErrTooManyKeys = errors.New("sluice: too many keys")
	// ErrUnavailable means a shared store could not be asked or did not
	// answer: the connection failed, the server is down or read-only, the
	// call timed out. The request may or may not have been decided (and
	// charged). Every shared store in this module wraps it; a failure
	// policy (package guard) decides instead.
	ErrUnavailable = errors.New("sluice: store unavailable")
	// ErrMisconfigured means the store answered, but is not set up for
	// Sluice: a PostgreSQL schema that was never migrated, a Redis value
	// that Sluice did not write under one of its keys. It is a deployment
	// mistake, not an outage: a failure policy returns it as it is rather
	// than deciding in the store's place, and a retry fails the same way.
	ErrMisconfigured = errors.New("sluice: store misconfigured")
	// ErrInvalidOption means a constructor was given an option out of its
	// range (a negative size, an unknown name). The error names the option
	// and the allowed values; nothing was built.
	ErrInvalidOption = errors.New("sluice: invalid option")
)

// IsInvalid reports whether err says the request itself was wrong: it wraps
// ErrInvalidPolicy, ErrInvalidKey, ErrInvalidCost, ErrInvalidLimit,
// ErrInvalidRequestID, ErrRequestIDConflict, ErrUnknownRequestID or
// ErrInvalidMulti. Such an error comes from
// validation or from a store that answered; it is never a sign that the
// store is unavailable, and a retry of the same request fails the same way.
func IsInvalid(err error) bool {
	return errors.Is(err, ErrInvalidPolicy) || errors.Is(err, ErrInvalidKey) ||
		errors.Is(err, ErrInvalidCost) || errors.Is(err, ErrInvalidLimit) ||
		errors.Is(err, ErrInvalidRequestID) || errors.Is(err, ErrRequestIDConflict) ||
		errors.Is(err, ErrUnknownRequestID) || errors.Is(err, ErrInvalidMulti)
}

// IsUnavailable reports whether err wraps ErrUnavailable: the store could
// not decide, and the request may or may not have been charged.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
