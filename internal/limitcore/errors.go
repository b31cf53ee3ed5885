package limitcore

import (
	"errors"

	"github.com/sluicehq/sluice"
)

// Class is the kind of an error that kept a request from being decided:
// what the default error handlers answer it with.
type Class int

// The classes, from the client's fault to the application's.
const (
	// Internal is a fault of the application or its configuration: an
	// error from its key, limit or cost function, a cost outside the
	// limit, an invalid limit from a LimitFunc, a store wrapper that
	// cannot take several buckets (errors.ErrUnsupported). HTTP 500,
	// gRPC Internal.
	Internal Class = iota
	// BadRequest is a request with no key, a key or a request ID that is
	// too long. HTTP 400, gRPC InvalidArgument.
	BadRequest
	// Conflict is a request ID reused with another cost or limit
	// (sluice.ErrRequestIDConflict). HTTP 422, gRPC InvalidArgument.
	Conflict
	// Unavailable is a store that could not decide (an error wrapping
	// the transport's ErrStore); the request was not allowed. HTTP 503,
	// gRPC Unavailable.
	Unavailable
)

// Classify returns the class of err, an error of Decide, given the
// transport's sentinels.
func Classify(err, errNoKey, errStore error) Class {
	switch {
	case errors.Is(err, errNoKey), errors.Is(err, sluice.ErrInvalidKey), errors.Is(err, sluice.ErrInvalidRequestID):
		return BadRequest
	case errors.Is(err, sluice.ErrRequestIDConflict):
		return Conflict
	case errors.Is(err, errStore):
		return Unavailable
	}
	return Internal
}
