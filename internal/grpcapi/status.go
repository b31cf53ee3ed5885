package grpcapi

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/service"
)

// The google.rpc detail values the API answers with; the proto file
// documents them for clients.
const (
	// policyResource is the ResourceInfo.resource_type of an unknown
	// policy.
	policyResource = "sluice.v1.Policy"
	// errorDomain is the ErrorInfo.domain of the API's reasons.
	errorDomain = "sluice"
	// reasonDegradedDenial is the ErrorInfo.reason of a degraded denial.
	reasonDegradedDenial = "DEGRADED_DENIAL"
	// The PreconditionFailure types of a request ID the store's memory
	// refuses.
	preconditionRequestIDConflict = "REQUEST_ID_CONFLICT"
	preconditionUnknownRequestID  = "UNKNOWN_REQUEST_ID"
)

// errorStatus maps an error of the core for a request of policy to the
// status the API answers, as httpapi's errorProblem maps it to an HTTP
// status. prefix goes before a field's name (a batch item's
// "requests[3]."). Errors of the deployment rather than of the request are
// logged, with the method and the error: neither names a key or a token.
func (s *Server) errorStatus(method, policy string, err error, prefix string) *status.Status {
	switch {
	case errors.Is(err, service.ErrUnknownPolicy):
		return withDetails(status.New(codes.NotFound, err.Error()),
			&errdetails.ResourceInfo{ResourceType: policyResource, ResourceName: policy, Description: "the config defines no policy of this name"})
	case errors.Is(err, sluice.ErrRequestIDConflict):
		return precondition(err, preconditionRequestIDConflict, prefix)
	case errors.Is(err, sluice.ErrUnknownRequestID):
		return precondition(err, preconditionUnknownRequestID, prefix)
	case errors.Is(err, sluice.ErrInvalidKey):
		return badRequest(prefix+"key", err.Error())
	case errors.Is(err, sluice.ErrInvalidCost):
		return badRequest(prefix+"cost", err.Error())
	case errors.Is(err, sluice.ErrInvalidRequestID):
		return badRequest(prefix+"request_id", err.Error())
	case errors.Is(err, sluice.ErrInvalidPolicy):
		return badRequest(prefix+"policy", err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The caller's own context ended: nothing to log.
		return status.FromContextError(err)
	case errors.Is(err, sluice.ErrTooManyKeys):
		s.log.Warn("decision failed", "method", method, "error", err)
		return status.New(codes.Unavailable, "the store holds its maximum number of keys and refuses new ones: "+err.Error())
	case sluice.IsUnavailable(err):
		s.log.Warn("decision failed", "method", method, "error", err)
		return status.New(codes.Unavailable, "the limiter's store is unavailable: "+err.Error())
	}
	// ErrMisconfigured, ErrInvalidLimit from a store, or anything else: a
	// fault of the deployment, not of the request.
	s.log.Error("decision failed", "method", method, "error", err)
	return status.New(codes.Internal, "the limiter failed: "+err.Error())
}

// degradedStatus is the answer to a degraded denial: the store could not
// be asked and the failure mode denies. It is UNAVAILABLE, so that no
// client takes an outage for a quota, with the failure mode's wait as
// RetryInfo when it names one.
func degradedStatus(res service.Result) *status.Status {
	st := status.New(codes.Unavailable, "the limiter cannot reach its store and denies while it is down (policy "+res.Policy.Name+")")
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{
		Reason:   reasonDegradedDenial,
		Domain:   errorDomain,
		Metadata: map[string]string{"policy": res.Policy.Name},
	}}
	if res.RetryAfter > 0 && res.RetryAfter != sluice.Never {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)})
	}
	return withDetails(st, details...)
}

// badRequest is INVALID_ARGUMENT naming field.
func badRequest(field, description string) *status.Status {
	return withDetails(status.New(codes.InvalidArgument, description),
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: description}}})
}

// precondition is FAILED_PRECONDITION for a request ID the store's memory
// refuses.
func precondition(err error, kind, prefix string) *status.Status {
	return withDetails(status.New(codes.FailedPrecondition, err.Error()),
		&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{Type: kind, Subject: prefix + "request_id", Description: err.Error()}}})
}

// withDetails adds details to st. Encoding these messages cannot fail; if
// it did, st would be answered without them rather than not at all.
func withDetails(st *status.Status, details ...protoadapt.MessageV1) *status.Status {
	if d, err := st.WithDetails(details...); err == nil {
		return d
	}
	return st
}
