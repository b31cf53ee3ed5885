package sluice

import "errors"

// Errors returned for bad parameters. A call that returns one of them (wrapped
// with the offending value; test with errors.Is) has changed no state and is
// not a denial.
var (
	// ErrInvalidKey means the key is empty or longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("sluice: invalid key")
	// ErrInvalidCost means the cost is below 1 or above the limit's capacity.
	ErrInvalidCost = errors.New("sluice: invalid cost")
	// ErrInvalidLimit means the limit is out of range, or its exact
	// arithmetic does not fit the store's integers or time unit.
	ErrInvalidLimit = errors.New("sluice: invalid limit")
	// ErrInvalidRequestID means the request ID is longer than MaxRequestIDLen
	// bytes.
	ErrInvalidRequestID = errors.New("sluice: invalid request ID")
	// ErrRequestIDConflict means a request ID the store still remembers for
	// a key was sent again with another cost or limit. Request IDs are
	// scoped by key.
	ErrRequestIDConflict = errors.New("sluice: request ID reused with different parameters")
	// ErrTooManyKeys means the store holds its maximum number of buckets (or
	// remembered request IDs), none of them can be reclaimed without loss,
	// and its overflow policy is to refuse new ones.
	ErrTooManyKeys = errors.New("sluice: too many keys")
)

// IsInvalid reports whether err says the request itself was wrong: it wraps
// ErrInvalidKey, ErrInvalidCost, ErrInvalidLimit, ErrInvalidRequestID or
// ErrRequestIDConflict. Such an error comes from validation or from a store
// that answered; it is never a sign that the store is unavailable, and a
// retry of the same request fails the same way.
func IsInvalid(err error) bool {
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidCost) ||
		errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrInvalidRequestID) ||
		errors.Is(err, ErrRequestIDConflict)
}
