// Package grpclimit is a pair of gRPC server interceptors, unary and
// stream, that rate-limit calls with a sluice.Store: each call (each stream,
// when it starts) is charged to the bucket of its key under the
// interceptor's named policy (Options.Policy).
//
// A call over quota fails with codes.ResourceExhausted, carrying a
// google.rpc.RetryInfo (the wait, unless waiting cannot help) and a
// google.rpc.QuotaFailure in its status details. A call the limiter cannot
// decide never goes through silently: a store failure is codes.Unavailable,
// and so is a denial made by a failure policy while the store is
// unreachable (a Decision with Degraded set), never ResourceExhausted.
package grpclimit

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
)

// Errors passed to Options.ErrorHandler (wrapped; test with errors.Is). The
// store's own parameter errors (sluice.ErrInvalidKey, ErrInvalidCost,
// ErrInvalidLimit, ErrInvalidRequestID, ErrRequestIDConflict) are passed as
// they are. New and PeerIP refuse invalid options with
// sluice.ErrInvalidOption (and a policy name with sluice.ErrInvalidPolicy).
var (
	// ErrNoKey means the key function found nothing to key the call by (no
	// such metadata, a peer that is not an IP address). Default:
	// codes.InvalidArgument.
	ErrNoKey = errors.New("grpclimit: call has no key")
	// ErrStore means the store failed to decide (unreachable, timed out,
	// full with sluice.ErrTooManyKeys, or the call's context ended); the
	// call was not allowed. Default: codes.Unavailable.
	ErrStore = errors.New("grpclimit: store failed")
)

// Options configure an Interceptor. Policy is required, and so is one of
// Limit and LimitFunc; the zero value of every other field means its
// documented default. Every function gets the call's context (with its
// incoming metadata and peer) and its full method name
// ("/package.Service/Method").
type Options struct {
	// Policy names the quota this interceptor enforces ("api",
	// "orders"): the bucket of a call is (Policy, key), and the name is
	// the quota ID of QuotaFailure violations. Required, with no default:
	// two interceptors (or an interceptor and an httplimit middleware)
	// with different policies never share a bucket, even on one store and
	// one key, while two with the same policy share their buckets. It
	// must pass sluice.ValidatePolicy: 1 to sluice.MaxPolicyLen bytes of
	// printable ASCII without spaces; otherwise New returns an error
	// wrapping sluice.ErrInvalidPolicy.
	Policy string
	// Key returns the key of a call's bucket within Policy. Default:
	// PeerIP with the zero PeerIPOptions (the peer's address, IPv6 by
	// /64).
	//
	// The key is passed to the store as it is (the store keeps the
	// policies apart), so it may be up to sluice.MaxKeyLen bytes; a
	// longer one is sluice.ErrInvalidKey. An empty key is ErrNoKey.
	Key KeyFunc
	// Limit is the limit of every call when LimitFunc is nil. New checks
	// it with sluice.CheckLimit, so a limit the store cannot decide fails
	// New rather than every call.
	Limit sluice.Limit
	// LimitFunc, when set, returns the limit of each call (tiers). An
	// error it returns, or the store's error for a limit it cannot
	// decide, is passed to ErrorHandler (codes.Internal by default). Set
	// Limit or LimitFunc, not both.
	LimitFunc func(ctx context.Context, fullMethod string) (sluice.Limit, error)
	// Cost returns the tokens a call costs, 1 to the limit's capacity.
	// Default: 1. A cost outside that range is sluice.ErrInvalidCost
	// (codes.Internal by default: a bug, not a denial).
	Cost func(ctx context.Context, fullMethod string) (int64, error)
	// RequestIDMetadata names an incoming metadata key (such as
	// "idempotency-key") whose first value, when present, is the request
	// ID of the take: a retry with the same value for the same policy and
	// key is not charged again while the store remembers the first allowed
	// decision. A denial takes nothing and is not remembered, so a retry
	// of a denied call is decided afresh. Default: none. As with
	// httplimit, set it only if the service itself deduplicates calls by
	// this value, or one value admits any number of different calls.
	RequestIDMetadata string
	// ErrorHandler returns the error a call that could not be decided
	// fails with, given err wrapping ErrNoKey, ErrStore, a sluice
	// parameter error, or an error from Key, LimitFunc or Cost. Returning
	// nil lets the call through. Default: DefaultErrorHandler.
	ErrorHandler func(ctx context.Context, fullMethod string, err error) error
}

// Interceptor charges each call to its key's bucket in a store. Create one
// with New; it is safe for concurrent use if its store is.
type Interceptor struct {
	store     sluice.Store
	key       KeyFunc
	limit     sluice.Limit
	limitFunc func(context.Context, string) (sluice.Limit, error)
	cost      func(context.Context, string) (int64, error)
	policy    string
	idKey     string
	onError   func(context.Context, string, error) error
}

// New returns an Interceptor that decides with store under o. The error
// wraps sluice.ErrInvalidOption if store is nil or o is not valid,
// sluice.ErrInvalidPolicy if o.Policy is empty or not a valid policy name,
// or sluice.ErrInvalidLimit if o.Limit is set and not valid or store cannot
// decide it exactly (sluice.CheckLimit).
func New(store sluice.Store, o Options) (*Interceptor, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", sluice.ErrInvalidOption)
	}
	if o.Policy == "" {
		return nil, fmt.Errorf("%w: Options.Policy is empty; name the quota this interceptor enforces (for example \"api\" or \"orders\"), so that it gets buckets of its own", sluice.ErrInvalidPolicy)
	}
	if err := sluice.ValidatePolicy(o.Policy); err != nil {
		return nil, err
	}
	in := &Interceptor{
		store:     store,
		key:       o.Key,
		limit:     o.Limit,
		limitFunc: o.LimitFunc,
		cost:      o.Cost,
		policy:    o.Policy,
		idKey:     o.RequestIDMetadata,
		onError:   o.ErrorHandler,
	}
	switch {
	case o.LimitFunc != nil && o.Limit != (sluice.Limit{}):
		return nil, fmt.Errorf("%w: set Limit or LimitFunc, not both", sluice.ErrInvalidOption)
	case o.LimitFunc == nil:
		if err := sluice.CheckLimit(store, o.Limit); err != nil {
			return nil, err
		}
	}
	if in.key == nil {
		key, err := PeerIP(PeerIPOptions{})
		if err != nil {
			return nil, err
		}
		in.key = key
	}
	if in.onError == nil {
		in.onError = DefaultErrorHandler
	}
	return in, nil
}

// Policy returns the name of the quota the Interceptor enforces.
func (in *Interceptor) Policy() string { return in.policy }

// Unary returns the unary server interceptor: it decides the call and runs
// the handler only if the call is allowed.
func (in *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := in.admit(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor: it decides once, when the
// stream starts, and runs the handler only if the stream is allowed.
// Messages on an admitted stream are not limited.
func (in *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := in.admit(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// admit returns nil if the call may go on, or the status error it fails
// with.
func (in *Interceptor) admit(ctx context.Context, method string) error {
	d, req, err := in.decide(ctx, method)
	if err != nil {
		return in.onError(ctx, method, err)
	}
	if d.Allowed {
		return nil
	}
	var details []protoadapt.MessageV1
	if d.RetryAfter > 0 && d.RetryAfter != sluice.Never {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)})
	}
	if d.Degraded {
		st, _ := status.New(codes.Unavailable, "rate limiter degraded: the call cannot be admitted now").WithDetails(details...)
		return st.Err()
	}
	lim := d.Limit
	if lim.Validate() != nil {
		lim = req.Limit
	}
	desc := fmt.Sprintf("the call costs %d and %d of %d remain", req.Cost, max(d.Remaining, 0), lim.Capacity)
	msg := fmt.Sprintf("rate limit %q exceeded; retry after %v", in.policy, d.RetryAfter)
	if d.RetryAfter <= 0 || d.RetryAfter == sluice.Never {
		desc += "; waiting will not help"
		msg = fmt.Sprintf("rate limit %q exceeded; waiting will not help", in.policy)
	}
	details = append(details, &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		QuotaId:     in.policy,
		Description: desc,
		QuotaValue:  lim.Capacity,
	}}})
	st, _ := status.New(codes.ResourceExhausted, msg).WithDetails(details...)
	return st.Err()
}

// decide builds the call's sluice.Request and takes it from the store.
func (in *Interceptor) decide(ctx context.Context, method string) (sluice.Decision, sluice.Request, error) {
	var req sluice.Request
	key, err := in.key(ctx, method)
	if err != nil {
		return sluice.Decision{}, req, err
	}
	if key == "" {
		return sluice.Decision{}, req, fmt.Errorf("%w: the key function returned an empty key", ErrNoKey)
	}
	req.Policy = in.policy
	req.Key = key
	req.Limit = in.limit
	if in.limitFunc != nil {
		if req.Limit, err = in.limitFunc(ctx, method); err != nil {
			return sluice.Decision{}, req, err
		}
	}
	req.Cost = 1
	if in.cost != nil {
		if req.Cost, err = in.cost(ctx, method); err != nil {
			return sluice.Decision{}, req, err
		}
	}
	if in.idKey != "" {
		if vs := metadata.ValueFromIncomingContext(ctx, in.idKey); len(vs) > 0 {
			req.RequestID = vs[0]
		}
	}
	if err := req.Validate(); err != nil {
		return sluice.Decision{}, req, err
	}
	d, err := in.store.Take(ctx, req)
	if err != nil && !sluice.IsInvalid(err) {
		err = fmt.Errorf("%w: %w", ErrStore, err)
	}
	return d, req, err
}

// DefaultErrorHandler returns the status error for a call that could not be
// decided:
//
//   - codes.InvalidArgument: ErrNoKey, sluice.ErrInvalidKey,
//     sluice.ErrInvalidRequestID, sluice.ErrRequestIDConflict; the
//     message is err's.
//   - codes.Unavailable: ErrStore; the call was not allowed.
//   - codes.Internal: anything else, such as sluice.ErrInvalidCost from
//     Options.Cost or an error from Options.LimitFunc.
//
// The message of Unavailable and Internal does not include err, which may
// name internal addresses.
func DefaultErrorHandler(ctx context.Context, fullMethod string, err error) error {
	switch {
	case errors.Is(err, ErrNoKey), errors.Is(err, sluice.ErrInvalidKey),
		errors.Is(err, sluice.ErrInvalidRequestID), errors.Is(err, sluice.ErrRequestIDConflict):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrStore):
		return status.Error(codes.Unavailable, "rate limiter unavailable: the call was not admitted")
	}
	return status.Error(codes.Internal, "rate limiter misconfigured")
}
