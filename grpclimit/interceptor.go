// Package grpclimit is a pair of gRPC server interceptors, unary and
// stream, that rate-limit calls with a sluice.Store: each call (each stream,
// when it starts) is charged to the bucket of its key under each of the
// interceptor's named limits (Options.Policy, or several in Options.Limits,
// decided together: all charged or none).
//
// A call over quota fails with codes.ResourceExhausted (Options.QuotaCode),
// carrying a google.rpc.RetryInfo (the wait, unless waiting cannot help)
// and a google.rpc.QuotaFailure in its status details, and a
// grpc-retry-pushback-ms trailer, so that a client's gRPC retry policy
// waits as long as the quota requires. A call the limiter cannot decide
// never goes through silently: a store failure is codes.Unavailable, and so
// is a denial made by a failure policy while the store is unreachable (a
// decision with Degraded set; Options.DegradedCode), never
// ResourceExhausted. Allowed calls get the quota in the header metadata of
// their answer (ratelimit-policy and ratelimit, the values of the HTTP
// fields), or in the trailer if the handler fails before answering; denied
// ones in their trailer: response headers would commit the call, and gRPC
// would not retry it.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitcore"
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

// Metadata keys the interceptors write.
const (
	// MetadataRateLimitPolicy is the metadata key of the quota
	// policies, in the header of an allowed call's answer and in the
	// trailer of a denied or failed one: the value of the HTTP
	// RateLimit-Policy field (draft-ietf-httpapi-ratelimit-headers-11),
	// one item per limit.
	MetadataRateLimitPolicy = "ratelimit-policy"
	// MetadataRateLimit is the metadata key of the current service
	// limits, beside MetadataRateLimitPolicy: the value of the HTTP
	// RateLimit field.
	MetadataRateLimit = "ratelimit"
	// MetadataRetryPushback is the trailer gRPC's retry policy reads
	// (gRFC A6): the milliseconds to wait before the next attempt, or a
	// negative value for none at all. Sent on every quota denial (-1
	// when waiting cannot help) and on degraded denials with a wait.
	MetadataRetryPushback = "grpc-retry-pushback-ms"
)

// Options configure an Interceptor. It enforces either one limit, named by
// Policy and given by Limit or LimitFunc, or several, listed in Limits;
// the zero value of every other field means its documented default. Every
// function gets the call's context (with its incoming metadata and peer)
// and its full method name ("/package.Service/Method").
type Options struct {
	// Policy names the quota this interceptor enforces ("api",
	// "orders"): the bucket of a call is (Policy, key), and the name is
	// the quota ID of QuotaFailure violations. Required unless Limits is
	// set, with no default: two interceptors (or an interceptor and an
	// httplimit middleware) with different policies never share a
	// bucket, even on one store and one key, while two with the same
	// policy share their buckets. It must pass sluice.ValidatePolicy: 1
	// to sluice.MaxPolicyLen bytes of printable ASCII without spaces;
	// otherwise New returns an error wrapping sluice.ErrInvalidPolicy.
	Policy string
	// Key returns the key of a call's bucket within Policy (and within
	// each of Limits that has no Key of its own). Default: PeerIP with
	// the zero PeerIPOptions (the peer's address, IPv6 by /64).
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
	// Limits, instead of Policy, Limit and LimitFunc, are several named
	// limits every call must pass together (a burst and a daily quota, a
	// per-client and a per-tenant limit), decided in one all-or-nothing
	// step (sluice.Operator.TakeAll): a call one limit denies costs the
	// others nothing. The denial's wait is the longest of the limits that
	// denied, and its QuotaFailure has one violation per such limit.
	// With more than one limit, New requires a store that implements
	// sluice.Operator and refuses RequestIDMetadata. 1 to sluice.MaxParts
	// limits, with distinct policies.
	Limits []Limit
	// Cost returns the tokens a call costs, 1 to the limit's capacity
	// (with Limits, the same cost in each). Default: 1. A cost outside
	// that range is sluice.ErrInvalidCost (codes.Internal by default: a
	// bug, not a denial).
	Cost func(ctx context.Context, fullMethod string) (int64, error)
	// RequestIDMetadata names an incoming metadata key (such as
	// "idempotency-key") whose first value, when present, is the request
	// ID of the take: a retry with the same value for the same policy and
	// key is not charged again while the store remembers the first allowed
	// decision. A denial takes nothing and is not remembered, so a retry
	// of a denied call is decided afresh. Default: none. Only with a
	// single limit. As with httplimit, set it only if the service itself
	// deduplicates calls by this value, or one value admits any number of
	// different calls.
	RequestIDMetadata string
	// QuotaCode is the status code of a call denied over quota. Default
	// (the zero value, codes.OK, which is never a denial):
	// codes.ResourceExhausted. Other codes are for clients that expect
	// them; the details and the pushback trailer are the same.
	QuotaCode codes.Code
	// DegradedCode is the status code of a call a failure policy denied
	// while the store was unreachable. Default: codes.Unavailable, so that
	// a client's own policy for an unavailable service applies; never
	// make it the quota's code, or clients slow down for an outage.
	DegradedCode codes.Code
	// ErrorHandler returns the error a call that could not be decided
	// fails with, given err wrapping ErrNoKey, ErrStore, a sluice
	// parameter error, or an error from Key, LimitFunc or Cost. Returning
	// nil lets the call through. Default: DefaultErrorHandler.
	ErrorHandler func(ctx context.Context, fullMethod string, err error) error
}

// Limit is one of the limits of Options.Limits.
type Limit struct {
	// Policy names the limit's quota, as Options.Policy does for a single
	// limit; required, and distinct within Options.Limits.
	Policy string
	// Limit is the limit of every call when LimitFunc is nil; New checks
	// it with sluice.CheckLimit.
	Limit sluice.Limit
	// LimitFunc, when set, returns the limit of each call. Set Limit or
	// LimitFunc, not both.
	LimitFunc func(ctx context.Context, fullMethod string) (sluice.Limit, error)
	// Key returns the key of a call's bucket within Policy. Default:
	// Options.Key.
	Key KeyFunc
}

// call is what the shared core decides: a call's context and method.
type call struct {
	ctx    context.Context
	method string
}

// Interceptor charges each call to its key's buckets in a store. Create
// one with New; it is safe for concurrent use if its store is.
type Interceptor struct {
	core         *limitcore.Core[call]
	policies     []string
	quotaCode    codes.Code
	degradedCode codes.Code
	onError      func(context.Context, string, error) error
}

// New returns an Interceptor that decides with store under o. The error
// wraps sluice.ErrInvalidOption if store is nil or o is not valid (both
// Policy and Limits set, more than sluice.MaxParts limits, two with one
// policy, several limits with RequestIDMetadata or with a store that does
// not implement sluice.Operator, a status code that is not one),
// sluice.ErrInvalidPolicy if a policy name is empty or not valid, or
// sluice.ErrInvalidLimit if a fixed limit is not valid or store cannot
// decide it exactly (sluice.CheckLimit).
func New(store sluice.Store, o Options) (*Interceptor, error) {
	in := &Interceptor{quotaCode: o.QuotaCode, degradedCode: o.DegradedCode, onError: o.ErrorHandler}
	for _, c := range []struct {
		name string
		code *codes.Code
		def  codes.Code
	}{{"QuotaCode", &in.quotaCode, codes.ResourceExhausted}, {"DegradedCode", &in.degradedCode, codes.Unavailable}} {
		switch {
		case *c.code == codes.OK:
			*c.code = c.def
		case *c.code > codes.Unauthenticated:
			return nil, fmt.Errorf("%w: Options.%s %d is not a gRPC status code; allowed are 1 (Canceled) to 16 (Unauthenticated)", sluice.ErrInvalidOption, c.name, uint32(*c.code))
		}
	}
	key := o.Key
	if key == nil {
		ip, err := PeerIP(PeerIPOptions{})
		if err != nil {
			return nil, err
		}
		key = ip
	}
	c := limitcore.Config[call]{
		RequestIDOption: "Options.RequestIDMetadata",
		ErrNoKey:        ErrNoKey,
		ErrStore:        ErrStore,
	}
	if o.Cost != nil {
		c.Cost = func(c call) (int64, error) { return o.Cost(c.ctx, c.method) }
	}
	if o.RequestIDMetadata != "" {
		name := o.RequestIDMetadata
		c.RequestID = func(c call) string {
			if vs := metadata.ValueFromIncomingContext(c.ctx, name); len(vs) > 0 {
				return vs[0]
			}
			return ""
		}
	}
	switch {
	case len(o.Limits) == 0:
		c.Limits = []limitcore.Limit[call]{bind("Options", o.Policy, o.Limit, o.LimitFunc, key)}
	case o.Policy != "" || o.Limit != (sluice.Limit{}) || o.LimitFunc != nil:
		return nil, fmt.Errorf("%w: set Policy (with Limit or LimitFunc) for one limit, or Limits for several, not both", sluice.ErrInvalidOption)
	default:
		for i, l := range o.Limits {
			k := l.Key
			if k == nil {
				k = key
			}
			c.Limits = append(c.Limits, bind(fmt.Sprintf("Options.Limits[%d]", i), l.Policy, l.Limit, l.LimitFunc, k))
		}
	}
	core, err := limitcore.New(store, c)
	if err != nil {
		return nil, err
	}
	in.core, in.policies = core, core.Policies()
	if in.onError == nil {
		in.onError = DefaultErrorHandler
	}
	return in, nil
}

// bind returns a limit of the core, its functions called with a call's
// context and method.
func bind(option, policy string, l sluice.Limit, limitFunc func(context.Context, string) (sluice.Limit, error), key KeyFunc) limitcore.Limit[call] {
	cl := limitcore.Limit[call]{Option: option, Policy: policy, Limit: l}
	if limitFunc != nil {
		cl.LimitFunc = func(c call) (sluice.Limit, error) { return limitFunc(c.ctx, c.method) }
	}
	if key != nil {
		cl.Key = func(c call) (string, error) { return key(c.ctx, c.method) }
	}
	return cl
}

// Policy returns the name of the quota the Interceptor enforces: its
// first, if it enforces several (see Policies).
func (in *Interceptor) Policy() string { return in.policies[0] }

// Policies returns the names of the quotas the Interceptor enforces, in
// order.
func (in *Interceptor) Policies() []string { return append([]string(nil), in.policies...) }

// Unary returns the unary server interceptor: it decides the call and runs
// the handler only if the call is allowed.
func (in *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := in.admit(ctx, info.FullMethod)
		if err != nil {
			if md != nil {
				grpc.SetTrailer(ctx, md) //nolint:errcheck // no stream when called directly: nothing to set
			}
			return nil, err
		}
		resp, err := handler(ctx, req)
		if md != nil {
			// In the header of the answer, which is sent after this
			// returns; in the trailer of a failed call, or if the handler
			// has sent its header itself.
			if err != nil || grpc.SetHeader(ctx, md) != nil {
				grpc.SetTrailer(ctx, md) //nolint:errcheck // likewise
			}
		}
		return resp, err
	}
}

// Stream returns the stream server interceptor: it decides once, when the
// stream starts, and runs the handler only if the stream is allowed.
// Messages on an admitted stream are not limited.
func (in *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := in.admit(ss.Context(), info.FullMethod)
		if err != nil {
			if md != nil {
				ss.SetTrailer(md)
			}
			return err
		}
		if md == nil {
			return handler(srv, ss)
		}
		fs := &fieldStream{ServerStream: ss, md: md}
		err = handler(srv, fs)
		fs.once.Do(func() { ss.SetTrailer(md) }) // nothing was sent
		return err
	}
}

// fieldStream adds the quota fields to the header of an allowed stream when
// the handler first sends, so that a stream that fails before sending
// anything stays a trailers-only answer, which gRPC can retry.
type fieldStream struct {
	grpc.ServerStream
	md   metadata.MD
	once sync.Once
}

func (s *fieldStream) attach() {
	s.once.Do(func() {
		if s.ServerStream.SetHeader(s.md) != nil {
			s.ServerStream.SetTrailer(s.md)
		}
	})
}

func (s *fieldStream) SendHeader(md metadata.MD) error {
	s.attach()
	return s.ServerStream.SendHeader(md)
}

func (s *fieldStream) SendMsg(m any) error {
	s.attach()
	return s.ServerStream.SendMsg(m)
}

// admit decides the call. It returns nil if the call may go on, or the
// status error it fails with; and the metadata the call's answer carries,
// if any: the fields (for the header of an allowed call, which must not be
// sent before the handler answers: gRPC commits, and never retries, a call
// whose headers have arrived), or the fields and the pushback (for the
// trailer of a denied one, which sends no header at all).
func (in *Interceptor) admit(ctx context.Context, method string) (metadata.MD, error) {
	var d limitcore.Decision
	if err := in.core.Decide(ctx, call{ctx, method}, &d); err != nil {
		return nil, in.onError(ctx, method, err)
	}
	f := in.core.Fields(&d)
	var md metadata.MD
	if f.Policy != "" || f.Limit != "" || !d.Allowed {
		md = make(metadata.MD, 3)
	}
	if f.Policy != "" {
		md[MetadataRateLimitPolicy] = []string{f.Policy}
	}
	if f.Limit != "" {
		md[MetadataRateLimit] = []string{f.Limit}
	}
	if d.Allowed {
		return md, nil
	}
	waits := d.RetryAfter > 0 && d.RetryAfter != sluice.Never
	var details []protoadapt.MessageV1
	if waits {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)})
	}
	if d.Degraded {
		if waits {
			md[MetadataRetryPushback] = []string{pushback(d.RetryAfter)}
		}
		if len(md) == 0 {
			md = nil
		}
		st, _ := status.New(in.degradedCode, "rate limiter degraded: the call cannot be admitted now").WithDetails(details...)
		return md, st.Err()
	}
	// The wait, or -1 (do not retry at all) when waiting cannot help.
	md[MetadataRetryPushback] = []string{pushback(d.RetryAfter)}
	qf := &errdetails.QuotaFailure{}
	for i, p := range d.Parts {
		if p.Allowed {
			continue
		}
		req := d.Requests[i]
		lim := p.Limit
		if lim.Validate() != nil {
			lim = req.Limit
		}
		desc := fmt.Sprintf("the call costs %d and %d of %d remain", req.Cost, max(p.Remaining, 0), lim.Capacity)
		if p.RetryAfter <= 0 || p.RetryAfter == sluice.Never {
			desc += "; waiting will not help"
		}
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{QuotaId: req.Policy, Description: desc, QuotaValue: lim.Capacity})
	}
	details = append(details, qf)
	policy := in.policies[0]
	if d.Denied >= 0 && d.Denied < len(d.Requests) {
		policy = d.Requests[d.Denied].Policy
	}
	msg := fmt.Sprintf("rate limit %q exceeded; retry after %v", policy, d.RetryAfter)
	if !waits {
		msg = fmt.Sprintf("rate limit %q exceeded; waiting will not help", policy)
	}
	st, _ := status.New(in.quotaCode, msg).WithDetails(details...)
	return md, st.Err()
}

// pushback returns the grpc-retry-pushback-ms value of a wait: whole
// milliseconds rounded up, or -1 (do not retry) for sluice.Never or no
// wait.
func pushback(wait time.Duration) string {
	if wait <= 0 || wait == sluice.Never {
		return "-1"
	}
	ms := wait / time.Millisecond
	if wait%time.Millisecond != 0 {
		ms++
	}
	return strconv.FormatInt(int64(ms), 10)
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
	switch limitcore.Classify(err, ErrNoKey, ErrStore) {
	case limitcore.BadRequest, limitcore.Conflict:
		return status.Error(codes.InvalidArgument, err.Error())
	case limitcore.Unavailable:
		return status.Error(codes.Unavailable, "rate limiter unavailable: the call was not admitted")
	}
	return status.Error(codes.Internal, "rate limiter misconfigured")
}
