// Package rls answers Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the
// service core, by the envoyproxy/ratelimit rules of its table
// (service.Table.Envoy).
//
// One request's descriptors are decided together: each is matched to a
// rule, and the takes of all the matched rules are one all-or-nothing
// service.Core.TakeAll, so that a request denied by one descriptor costs
// the others nothing. The rest follows envoyproxy/ratelimit:
//
//   - the cost is the descriptor's hits_addend if set, else the request's,
//     else 1; a cost of 0 checks without taking (a peek of one token);
//   - a descriptor with no rule, or whose rule is unlimited or replaced by
//     another matched rule's "replaces", is OK without a store call; a rule
//     of requests_per_unit 0 is always OVER_LIMIT;
//   - a cost above the rule's capacity is OVER_LIMIT with no
//     duration_until_reset (waiting cannot help), never an error: Envoy
//     lets a request through when its rate-limit service fails;
//   - a shadow rule is decided and its denial counted, but answers OK;
//   - quota-mode rules fail a request only when every one of its
//     quota-mode descriptors is over its limit (then nothing is taken);
//     otherwise each is taken on its own once the rest passed, and one over
//     its limit answers OK;
//   - when the store cannot be reached and the failure mode denies, the
//     call fails with UNAVAILABLE, never a made-up OVER_LIMIT, so that
//     Envoy's own failure_mode_deny decides; a failure mode's allow is OK
//     with the request header x-sluice-degraded: true.
//
// Every answer carries the RateLimit and RateLimit-Policy fields in
// response_headers_to_add, one item per descriptor with a limit.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoyconf"
	"github.com/sluicehq/sluice/internal/limitcore"
	"github.com/sluicehq/sluice/internal/service"
)

// DegradedHeader is the request header added to a request that a failure
// mode allowed while the store could not be reached.
const DegradedHeader = "x-sluice-degraded"

// MaxDescriptors bounds the descriptors of one request.
const MaxDescriptors = 64

// Outcome names what became of one descriptor, for metrics.
type Outcome string

// The outcomes of a descriptor.
const (
	OutcomeNoRule    Outcome = "no_rule"    // no rule matched: OK
	OutcomeUnlimited Outcome = "unlimited"  // an unlimited rule: OK
	OutcomeReplaced  Outcome = "replaced"   // replaced by another matched rule: OK
	OutcomeOK        Outcome = "ok"         // decided, allowed
	OutcomeOverLimit Outcome = "over_limit" // decided, denied
	OutcomeShadow    Outcome = "shadow"     // a shadow rule's would-be denial: OK
	OutcomeQuota     Outcome = "quota"      // a quota-mode rule over its limit while another is not: OK
)

// Options configure a Server.
type Options struct {
	// LegacyHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (envoyproxy/ratelimit's names) to the RateLimit
	// fields.
	LegacyHeaders bool
	// Outcome, if set, is called once per descriptor of each answered
	// request. known reports whether the domain is one of the rules'
	// (a label may hold the domain only then: any caller can send any
	// domain).
	Outcome func(domain string, known bool, o Outcome)
	// Logger receives the failures the answer does not explain. Default:
	// slog.Default().
	Logger *slog.Logger
}

// Server is the Envoy rate-limit service over a service core.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	core *service.Core
	o    Options
	log  *slog.Logger
}

// New returns the rate-limit service deciding with core.
func New(core *service.Core, o Options) (*Server, error) {
	if core == nil {
		return nil, fmt.Errorf("%w: rls.New: nil core", sluice.ErrInvalidOption)
	}
	s := &Server{core: core, o: o, log: o.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s, nil
}

// Names of the response headers.
const (
	headerPolicy    = "RateLimit-Policy"
	headerRateLimit = "RateLimit"
	headerLimit     = "RateLimit-Limit"
	headerRemaining = "RateLimit-Remaining"
	headerReset     = "RateLimit-Reset"
)

// item is the work of one descriptor.
type item struct {
	rule    *envoyconf.Rule
	entries []envoyconf.Entry
	key     string // the bucket key, once request has encoded it
	cost    int64
	take    int // index in the TakeAll, or -1
	outcome Outcome
	status  *rlsv3.RateLimitResponse_DescriptorStatus
	res     service.Result
	decided bool // res holds a decision
}

// ShouldRateLimit decides one request of Envoy's rate-limit filter.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "the domain is empty; Envoy's rate-limit filter sets it from its domain setting")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "the request has no descriptors")
	}
	if len(ds) > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "the request has %d descriptors, more than %d", len(ds), MaxDescriptors)
	}
	core := s.core.Pin()
	rules := core.Table().Envoy()
	known := rules != nil && rules.HasDomain(req.GetDomain())
	items := make([]item, len(ds))
	var replaced map[string]bool // rule names other matched rules replace
	for i, d := range ds {
		it := &items[i]
		it.take = -1
		it.entries = make([]envoyconf.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			it.entries[j] = envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if len(it.entries) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has no entries", i)
		}
		cost, err := hits(req, d)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		it.cost = cost
		if lo := d.GetLimit(); lo != nil {
			// The descriptor brings its own limit: it is decided by that
			// alone, if the domain is one of the rules'.
			if known {
				r, err := envoyconf.OverrideRule(req.GetDomain(), lo.GetRequestsPerUnit(), strings.ToLower(lo.GetUnit().String()), lo.GetUnitMultiplier().GetValue())
				if err != nil {
					return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: its limit: %v", i, err)
				}
				it.rule = r
			}
			continue
		}
		if rules != nil {
			if r, ok := rules.Match(req.Domain, it.entries); ok {
				it.rule = r
				for _, name := range r.Replaces {
					if replaced == nil {
						replaced = map[string]bool{}
					}
					replaced[name] = true
				}
			}
		}
	}
	// The pre-decided descriptors, and the takes of the rest.
	var takes []service.Request
	var bucketTake map[string]int // the take of each bucket, by policy and key
	var quota []int               // the items of quota-mode rules with a bucket, decided last
	quotaOver := 0                // how many quota-mode descriptors are over their limits
	refused := false              // a descriptor is over its limit before any take
	for i := range items {
		it := &items[i]
		r := it.rule
		switch {
		case r == nil:
			it.outcome = OutcomeNoRule
			it.status = okStatus()
		case r.Name != "" && replaced[r.Name]:
			it.outcome = OutcomeReplaced
			it.status = okStatus()
			if r.Unlimited {
				it.status.LimitRemaining = math.MaxUint32
			}
		case r.Unlimited:
			it.outcome = OutcomeUnlimited
			it.status = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
		case r.Deny || it.cost > r.Limit.Capacity:
			it.status = overStatus(r, nil)
			switch {
			case r.Shadow:
				it.outcome, it.status.Code = OutcomeShadow, rlsv3.RateLimitResponse_OK
				core.RecordShadowDenial(r.Policy)
			case r.Quota:
				it.outcome = OutcomeQuota
				quota = append(quota, i)
				quotaOver++
			default:
				it.outcome = OutcomeOverLimit
				refused = true
			}
		case r.Quota && !r.Shadow:
			quota = append(quota, i)
		case it.cost == 0:
			// Decided below, with a peek.
		default:
			q := it.request(it.cost)
			// Descriptors of one bucket (two rate_limits actions making
			// the same descriptor, or values a share_threshold wildcard
			// joins) are one take of their summed cost, as the service
			// counts a repeated descriptor twice.
			bk := q.Policy + "\x00" + q.Key
			if j, ok := bucketTake[bk]; ok {
				takes[j].Cost += it.cost
				it.take = j
				continue
			}
			if bucketTake == nil {
				bucketTake = map[string]int{}
			}
			bucketTake[bk] = len(takes)
			it.take = len(takes)
			takes = append(takes, q)
		}
	}
	// A bucket asked for more than its capacity in all is over its limit
	// before any take.
	for j := range takes {
		if r := items[firstOf(items, j)].rule; takes[j].Cost <= r.Limit.Capacity {
			continue
		}
		for i := range items {
			if it := &items[i]; it.take == j {
				it.take = -1
				it.status = overStatus(it.rule, nil)
				if it.rule.Shadow {
					it.outcome, it.status.Code = OutcomeShadow, rlsv3.RateLimitResponse_OK
					core.RecordShadowDenial(it.rule.Policy)
				} else {
					it.outcome = OutcomeOverLimit
					refused = true
				}
			}
		}
		takes[j].Cost = 0 // not taken
	}
	if n := compact(items, takes); n < len(takes) {
		takes = takes[:n]
	}
	// Quota mode: the quota-mode descriptors fail the request only when
	// every one of them is over its limit. That is known before anything
	// is taken (a peek of each), so that such a failure takes nothing
	// either.
	degraded := false
	if len(quota) > 0 && !refused {
		for _, i := range quota {
			it := &items[i]
			if it.status != nil {
				continue
			}
			res, err := core.Peek(ctx, it.request(max(it.cost, 1)))
			if err != nil {
				return nil, s.failure(err)
			}
			it.res, it.decided = res, true
			degraded = degraded || res.Degraded
			if !res.Allowed {
				quotaOver++
			}
		}
	}
	quotaAll := len(quota) > 0 && quotaOver == len(quota)
	refused = refused || quotaAll
	var mr service.MultiResult
	if len(takes) > 0 && !refused {
		var err error
		if mr, err = core.TakeAll(ctx, takes); err != nil {
			return nil, s.failure(err)
		}
		degraded = degraded || mr.Degraded
	}
	passed := !refused && (len(takes) == 0 || mr.Allowed)
	for i := range items {
		it := &items[i]
		switch {
		case it.status != nil:
			continue
		case it.take >= 0 && !refused:
			it.res, it.decided = mr.Results[it.take], true
		case it.rule.Quota && !it.rule.Shadow:
			// Taken on its own once the rest passed; its denial alone
			// does not fail the request (not every quota-mode descriptor
			// was over).
			q := it.request(max(it.cost, 1))
			var res service.Result
			var err error
			switch {
			case passed && it.cost > 0:
				res, err = core.Take(ctx, q)
			case !it.decided:
				res, err = core.Peek(ctx, q)
			default:
				res = it.res // its peek above
			}
			if err != nil {
				return nil, s.failure(err)
			}
			it.res, it.decided = res, true
			degraded = degraded || res.Degraded
		default:
			// A check (cost 0), or a take not made because another
			// descriptor was over its limit: what a take of it would be.
			res, err := core.Peek(ctx, it.request(max(it.cost, 1)))
			if err != nil {
				return nil, s.failure(err)
			}
			if it.rule.Shadow && !res.Allowed {
				res.ShadowDenied, res.Allowed, res.RetryAfter = true, true, 0
				core.RecordShadowDenial(it.rule.Policy)
			}
			it.res, it.decided = res, true
			degraded = degraded || res.Degraded
		}
		it.status = s.decisionStatus(it.rule, it.res)
		switch {
		case it.res.ShadowDenied:
			it.outcome = OutcomeShadow
		case it.res.Allowed:
			it.outcome = OutcomeOK
		default:
			it.outcome = OutcomeOverLimit
		}
	}
	// A quota-mode descriptor over its limit is OK unless all of them are.
	for _, i := range quota {
		it := &items[i]
		if it.status.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		if quotaAll {
			it.outcome = OutcomeOverLimit
		} else {
			it.status.Code, it.outcome = rlsv3.RateLimitResponse_OK, OutcomeQuota
		}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	for i := range items {
		resp.Statuses[i] = items[i].status
		if items[i].status.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && onlyDegradedDenials(items) {
		// A failure mode denied: the store's state is not known. Envoy's
		// failure_mode_deny, not a made-up OVER_LIMIT, decides. A denial
		// that needed no store (a rule of 0, a cost above the capacity) or
		// that the store made stands, outage or not.
		return nil, status.Error(codes.Unavailable, "the limiter cannot reach its store, and its failure mode denies")
	}
	if degraded {
		resp.RequestHeadersToAdd = append(resp.RequestHeadersToAdd, &corev3.HeaderValue{Key: DegradedHeader, Value: "true"})
	} else {
		resp.ResponseHeadersToAdd = s.headers(items)
	}
	if s.o.Outcome != nil {
		for i := range items {
			s.o.Outcome(req.Domain, known, items[i].outcome)
		}
	}
	return resp, nil
}

// onlyDegradedDenials reports whether every OVER_LIMIT status of items
// comes from a decision a failure mode made.
func onlyDegradedDenials(items []item) bool {
	for i := range items {
		it := &items[i]
		if it.status.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !(it.decided && it.res.Degraded) {
			return false
		}
	}
	return true
}

// firstOf returns the index of the first item whose take is j.
func firstOf(items []item, j int) int {
	for i := range items {
		if items[i].take == j {
			return i
		}
	}
	return -1
}

// compact drops the takes of cost 0 (not to be made), renumbering the
// items' takes, and returns how many are left.
func compact(items []item, takes []service.Request) int {
	n := 0
	for j := range takes {
		if takes[j].Cost == 0 {
			continue
		}
		for i := range items {
			if items[i].take == j {
				items[i].take = n
			}
		}
		takes[n] = takes[j]
		n++
	}
	return n
}

// request is the core's request of the item's descriptor for cost. The
// bucket key is encoded once per item, however many calls it takes.
func (it *item) request(cost int64) service.Request {
	if it.key == "" {
		it.key = it.rule.Key(it.entries)
	}
	q := service.Request{Policy: it.rule.Policy, Key: it.key, Cost: cost}
	if it.rule.Override() {
		q.Limit = it.rule.Limit
	}
	return q
}

// hits returns the cost of descriptor d: its own hits_addend if set (0
// checks without taking), else the request's (0, the proto's unset, is
// 1).
func hits(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) (int64, error) {
	if d.GetIsNegativeHits() {
		return 0, errors.New("is_negative_hits (giving hits back) is not supported; use the sluice.v1 Refund call")
	}
	if h := d.GetHitsAddend(); h != nil {
		if h.GetValue() > math.MaxInt64 {
			return 0, fmt.Errorf("hits_addend %d is above %d", h.GetValue(), int64(math.MaxInt64))
		}
		return int64(h.GetValue()), nil
	}
	if n := req.GetHitsAddend(); n > 0 {
		return int64(n), nil
	}
	return 1, nil
}

func okStatus() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
}

// overStatus is the OVER_LIMIT status of rule r; wait, if not nil, is the
// time after which the request would be allowed.
func overStatus(r *envoyconf.Rule, wait *durationpb.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
		CurrentLimit:       currentLimit(r),
		DurationUntilReset: wait,
	}
}

// decisionStatus is the status of a decision of rule r: when allowed, the
// time until the bucket is full again is its duration_until_reset (as a
// window's end is envoyproxy/ratelimit's); when denied, the time until the
// request would be allowed, none if waiting cannot help.
func (s *Server) decisionStatus(r *envoyconf.Rule, res service.Result) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:           rlsv3.RateLimitResponse_OK,
		CurrentLimit:   currentLimit(r),
		LimitRemaining: uint32(min(max(res.Remaining, 0), math.MaxUint32)),
	}
	if res.Degraded {
		st.LimitRemaining = 0
	}
	switch {
	case res.Allowed:
		if res.ResetAfter > 0 && res.ResetAfter < sluice.Never {
			st.DurationUntilReset = durationpb.New(res.ResetAfter)
		}
	default:
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if res.RetryAfter > 0 && res.RetryAfter < sluice.Never {
			st.DurationUntilReset = durationpb.New(res.RetryAfter)
		}
	}
	return st
}

// currentLimit is the rule's limit as envoyproxy/ratelimit reports it.
func currentLimit(r *envoyconf.Rule) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: unit(r.Unit)}
}

func unit(u string) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch u {
	case "second":
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case "minute":
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case "hour":
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case "day":
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case "week":
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	case "month":
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	case "year":
		return rlsv3.RateLimitResponse_RateLimit_YEAR
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// headers returns the RateLimit fields of the decided descriptors: one
// item per descriptor with a limit, named by the rule's name or, without
// one, its policy.
func (s *Server) headers(items []item) []*corev3.HeaderValue {
	var pol, lim []byte
	least := -1
	for i := range items {
		it := &items[i]
		if it.rule == nil || it.outcome == OutcomeReplaced || it.rule.Unlimited {
			continue
		}
		name := it.rule.Name
		if name == "" {
			name = it.rule.Policy
		}
		quoted := limitcore.QuoteString(name)
		if len(pol) > 0 {
			pol, lim = append(pol, ", "...), append(lim, ", "...)
		}
		l := it.rule.Limit
		if it.rule.Deny {
			pol = append(pol, quoted...)
			pol = append(pol, ";q=0"...)
			lim = append(lim, quoted...)
			lim = append(lim, ";r=0"...)
			continue
		}
		pol = limitcore.AppendPolicyItem(pol, quoted, l)
		d := it.res.Decision
		if !it.decided {
			d = sluice.Decision{Remaining: 0, Limit: l}
		}
		var retry int64
		if !d.Allowed {
			retry, _ = limitcore.RetryAfterSeconds(d.RetryAfter)
		}
		lim = limitcore.AppendLimitItem(lim, quoted, d, l, retry)
		if it.decided && (least < 0 || d.Remaining < items[least].res.Remaining) {
			least = i
		}
	}
	if len(pol) == 0 {
		return nil
	}
	hs := []*corev3.HeaderValue{{Key: headerPolicy, Value: string(pol)}, {Key: headerRateLimit, Value: string(lim)}}
	if s.o.LegacyHeaders && least >= 0 {
		it := &items[least]
		reset := int64(0)
		if w := it.res.ResetAfter; !it.res.Allowed {
			reset, _ = limitcore.RetryAfterSeconds(it.res.RetryAfter)
		} else if w > 0 && w < sluice.Never {
			reset = limitcore.CeilSeconds(w)
		}
		hs = append(hs,
			&corev3.HeaderValue{Key: headerLimit, Value: strconv.FormatUint(uint64(it.rule.RequestsPerUnit), 10)},
			&corev3.HeaderValue{Key: headerRemaining, Value: strconv.FormatInt(max(it.res.Remaining, 0), 10)},
			&corev3.HeaderValue{Key: headerReset, Value: strconv.FormatInt(reset, 10)},
		)
	}
	return hs
}

// failure maps a core error to a gRPC status. A request's own mistake is
// INVALID_ARGUMENT; a store that cannot be reached, or a request that ended,
// UNAVAILABLE or the context's code; anything else INTERNAL, logged.
func (s *Server) failure(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case sluice.IsInvalid(err), errors.Is(err, sluice.ErrInvalidMulti):
		return status.Error(codes.InvalidArgument, err.Error())
	case sluice.IsUnavailable(err), errors.Is(err, sluice.ErrTooManyKeys):
		s.log.Warn("envoy rate-limit decision failed", "error", err)
		return status.Error(codes.Unavailable, err.Error())
	}
	s.log.Error("envoy rate-limit decision failed", "error", err)
	return status.Error(codes.Internal, err.Error())
}
