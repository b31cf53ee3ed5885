// Package httplimit is net/http middleware that rate-limits requests with a
// sluice.Store: each request is charged to the bucket of its key under each
// of the middleware's named limits (Options.Policy, or several in
// Options.Limits, decided together: all charged or none), and a denied
// request is answered 429 Too Many Requests with Retry-After and the
// RateLimit-Policy and RateLimit fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers-11, in place of the handler.
//
// A request the limiter cannot decide is never passed through silently: a
// store failure is 503, a denial made by a failure policy while the store is
// unreachable (a decision with Degraded set) is 503 with the problem type
// "temporary-reduced-capacity", never 429. See docs/http.md for the mapping
// from a token bucket to the header fields and for choosing a key.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitcore"
)

// Errors passed to Options.ErrorHandler (wrapped; test with errors.Is). The
// store's own parameter errors (sluice.ErrInvalidKey, ErrInvalidCost,
// ErrInvalidLimit, ErrInvalidRequestID, ErrRequestIDConflict) are passed as
// they are. New and ClientIP refuse invalid options with
// sluice.ErrInvalidOption (and a policy name with sluice.ErrInvalidPolicy).
var (
	// ErrNoKey means the key function found nothing to key the request by
	// (a missing header, a RemoteAddr that is not an IP address). Default
	// answer: 400.
	ErrNoKey = errors.New("httplimit: request has no key")
	// ErrStore means the store failed to decide (it was unreachable,
	// timed out, was full with sluice.ErrTooManyKeys, or the request's
	// context ended); the request was not allowed. Default answer: 503.
	ErrStore = errors.New("httplimit: store failed")
)

// Options configure a Middleware. It enforces either one limit, named by
// Policy and given by Limit or LimitFunc, or several, listed in Limits;
// the zero value of every other field means its documented default.
type Options struct {
	// Policy names the quota this middleware enforces ("api", "login"):
	// the bucket of a request is (Policy, key), and the name is reported
	// in the RateLimit-Policy and RateLimit fields and in problem bodies.
	// Required unless Limits is set, with no default: two middlewares
	// with different policies never share a bucket, even on one store and
	// one key, while two with the same policy share their buckets (one
	// quota over several routes). It must pass sluice.ValidatePolicy: 1
	// to sluice.MaxPolicyLen bytes of printable ASCII without spaces;
	// otherwise New returns an error wrapping sluice.ErrInvalidPolicy.
	Policy string
	// Key returns the key of a request's bucket within Policy (and within
	// each of Limits that has no Key of its own). Default: the client's
	// address as ClientIP with the zero ClientIPOptions keys it (the
	// connection's peer, IPv6 by /64, forwarding headers ignored).
	//
	// The key is passed to the store as it is (the store keeps the
	// policies apart), so it may be up to sluice.MaxKeyLen bytes; a
	// longer one is sluice.ErrInvalidKey (400). An empty key is ErrNoKey.
	Key KeyFunc
	// Limit is the limit of every request when LimitFunc is nil. New
	// checks it with sluice.CheckLimit, so a limit the store cannot
	// decide (such as one beyond the Redis store's exact range) fails
	// New rather than every request.
	Limit sluice.Limit
	// LimitFunc, when set, returns the limit of each request, for example
	// from the customer's plan: a key seen under another limit than
	// before keeps its bucket, converted as the store's conversion says.
	// An error it returns, or the store's error for a limit it cannot
	// decide, is passed to ErrorHandler (500 by default). Set Limit or
	// LimitFunc, not both.
	LimitFunc func(r *http.Request) (sluice.Limit, error)
	// Limits, instead of Policy, Limit and LimitFunc, are several named
	// limits every request must pass together: a per-second burst and a
	// daily quota, a per-client and a per-tenant limit. They are decided
	// in one all-or-nothing step (sluice.Operator.TakeAll): the request
	// is charged to every bucket if each covers its cost, and to none
	// otherwise, so a request one limit denies costs the others nothing.
	// The fields list one item per limit, in this order, and Retry-After
	// is the wait of the limit that denied (the longest).
	//
	// With more than one limit, New requires a store that implements
	// sluice.Operator, and refuses RequestIDHeader (a multi-take
	// remembers no request ID). 1 to sluice.MaxParts limits, with
	// distinct policies.
	Limits []Limit
	// Cost returns the tokens a request costs, 1 to the limit's capacity
	// (with Limits, the same cost in each, up to the smallest capacity).
	// Default: 1 for every request. A cost outside that range is
	// sluice.ErrInvalidCost (500 by default: it is a bug in Cost, not a
	// denial); any other error it returns is passed to ErrorHandler.
	Cost func(r *http.Request) (int64, error)
	// RequestIDHeader names a header (such as "Idempotency-Key") whose
	// value, when present, is the request ID of the take: a retry that
	// carries the same value for the same policy and key is not charged
	// again while the store remembers the first allowed decision; it gets
	// that decision's answer again. Default: none. Only with a single
	// limit.
	//
	// Set it only if the application itself deduplicates requests by this
	// header (answers a repeated value from its own record without doing
	// the work again): otherwise a client can send any number of
	// different requests under one value and be charged once. A denial
	// takes nothing and is not remembered, so a retry of a denied request
	// is decided afresh, and charged once if it is then allowed. The same
	// value with another cost or limit is sluice.ErrRequestIDConflict
	// (422 by default).
	RequestIDHeader string
	// Skip, when set, is asked first about every request: if it returns
	// true, the request goes to the next handler undecided (nothing is
	// charged, no field is set, no Decision is in its context). For
	// health checks, or internal callers identified by something a client
	// cannot forge. It is called concurrently and must not modify the
	// request.
	Skip func(r *http.Request) bool
	// DeniedHandler writes the answer to a denied request, in place of
	// the next handler, for example a 429 in the application's own error
	// format. It gets the decision (d.Degraded tells a failure policy's
	// denial, which must not be answered as a quota denial: use 503).
	// Retry-After and the RateLimit fields (and the legacy ones, if
	// LegacyHeaders) are already set on w when it is called; it may
	// change them. Default: DefaultDeniedHandler.
	DeniedHandler func(w http.ResponseWriter, r *http.Request, d Decision)
	// ErrorHandler writes the answer to a request that could not be
	// decided, with err wrapping ErrNoKey, ErrStore, a sluice parameter
	// error, or an error from Key, LimitFunc or Cost; the next handler is
	// not called. Default: DefaultErrorHandler. To let requests through
	// while the store is down, wrap the store in a failure policy (its
	// degraded allows pass) rather than passing them here.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
	// LegacyHeaders, when set, adds X-RateLimit-Limit, X-RateLimit-Remaining
	// and X-RateLimit-Reset beside the draft's fields, for clients that
	// parse only those: the capacity, the whole tokens remaining and the
	// seconds (rounded up) until the bucket is full again (left out if it
	// never refills). They describe one limit: the one that denied, or,
	// on an allowed request, the one with the fewest tokens remaining.
	// Like RateLimit, they are not sent on degraded decisions.
	LegacyHeaders bool
}

// Limit is one of the limits of Options.Limits.
type Limit struct {
	// Policy names the limit's quota, as Options.Policy does for a single
	// limit; required, and distinct within Options.Limits.
	Policy string
	// Limit is the limit of every request when LimitFunc is nil; New
	// checks it with sluice.CheckLimit.
	Limit sluice.Limit
	// LimitFunc, when set, returns the limit of each request. Set Limit
	// or LimitFunc, not both.
	LimitFunc func(r *http.Request) (sluice.Limit, error)
	// Key returns the key of a request's bucket within Policy, such as
	// the client's address for a per-client limit and its tenant for a
	// per-tenant one. Default: Options.Key.
	Key KeyFunc
}

// Decision is what the middleware decided for a request: the
// MultiDecision of its limits (with a single limit, the store's Decision
// as its only part) and the requests it decided, Requests[i] for Parts[i],
// in the order of Options.Limits. Denied indexes both: Requests[Denied].Policy
// is the policy that denied. It is in the context of every request the
// middleware decided (FromContext) and is passed to Options.DeniedHandler;
// its slices must not be modified.
type Decision struct {
	sluice.MultiDecision
	Requests []sluice.Request
}

// Middleware charges each request to its key's buckets in a store and
// answers denied requests itself. Create one with New; it is safe for
// concurrent use if its store is.
type Middleware struct {
	core     *limitcore.Core[*http.Request]
	policies []string
	skip     func(*http.Request) bool
	onDenied func(http.ResponseWriter, *http.Request, Decision)
	onError  func(http.ResponseWriter, *http.Request, error)
	legacy   bool
}

// New returns a Middleware that decides with store under o. The error
// wraps sluice.ErrInvalidOption if store is nil or o is not valid (both
// Policy and Limits set, more than sluice.MaxParts limits, two with one
// policy, several limits with RequestIDHeader or with a store that does not
// implement sluice.Operator), sluice.ErrInvalidPolicy if a policy name is
// empty or not valid, or sluice.ErrInvalidLimit if a fixed limit is not
// valid or store cannot decide it exactly (sluice.CheckLimit).
func New(store sluice.Store, o Options) (*Middleware, error) {
	key := o.Key
	if key == nil {
		ip, err := ClientIP(ClientIPOptions{})
		if err != nil {
			return nil, err
		}
		key = ip
	}
	c := limitcore.Config[*http.Request]{
		Cost:            o.Cost,
		RequestIDOption: "Options.RequestIDHeader",
		ErrNoKey:        ErrNoKey,
		ErrStore:        ErrStore,
	}
	if o.RequestIDHeader != "" {
		name := http.CanonicalHeaderKey(o.RequestIDHeader)
		c.RequestID = func(r *http.Request) string { return r.Header.Get(name) }
	}
	switch {
	case len(o.Limits) == 0:
		c.Limits = []limitcore.Limit[*http.Request]{{
			Option: "Options", Policy: o.Policy, Limit: o.Limit, LimitFunc: o.LimitFunc, Key: key,
		}}
	case o.Policy != "" || o.Limit != (sluice.Limit{}) || o.LimitFunc != nil:
		return nil, fmt.Errorf("%w: set Policy (with Limit or LimitFunc) for one limit, or Limits for several, not both", sluice.ErrInvalidOption)
	default:
		for i, l := range o.Limits {
			k := l.Key
			if k == nil {
				k = key
			}
			c.Limits = append(c.Limits, limitcore.Limit[*http.Request]{
				Option: fmt.Sprintf("Options.Limits[%d]", i), Policy: l.Policy, Limit: l.Limit, LimitFunc: l.LimitFunc, Key: k,
			})
		}
	}
	core, err := limitcore.New(store, c)
	if err != nil {
		return nil, err
	}
	m := &Middleware{
		core:     core,
		policies: core.Policies(),
		skip:     o.Skip,
		onDenied: o.DeniedHandler,
		onError:  o.ErrorHandler,
		legacy:   o.LegacyHeaders,
	}
	if m.onDenied == nil {
		m.onDenied = DefaultDeniedHandler
	}
	if m.onError == nil {
		m.onError = DefaultErrorHandler
	}
	return m, nil
}

// Policy returns the name of the quota m enforces: its first, if it
// enforces several (see Policies).
func (m *Middleware) Policy() string { return m.policies[0] }

// Policies returns the names of the quotas m enforces, in order.
func (m *Middleware) Policies() []string { return append([]string(nil), m.policies...) }

// Handler returns a handler that decides each request and calls next only
// for allowed ones (including those a failure policy allowed while the
// store was degraded), with the RateLimit-Policy and RateLimit fields set on
// the response and the Decision in the request's context (FromContext). A
// denied request goes to Options.DeniedHandler (by default 429, or 503 if
// the denial is degraded, with a problem body); one that cannot be decided
// goes to Options.ErrorHandler. Degraded answers carry no RateLimit field,
// and a RateLimit-Policy only for limits a failure policy decided under a
// reduced limit. A request Options.Skip skips goes to next as it is.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.skip != nil && m.skip(r) {
			next.ServeHTTP(w, r)
			return
		}
		ctx := newDecisionContext(r.Context())
		d := &ctx.d
		if err := m.core.Decide(r.Context(), r, d); err != nil {
			m.onError(w, r, err)
			return
		}
		f := m.core.Fields(d)
		// The canonical forms, written directly: Header.Set would
		// allocate to canonicalize the names on every request.
		h := w.Header()
		if f.Policy != "" {
			h["Ratelimit-Policy"] = []string{f.Policy}
		}
		if f.Limit != "" {
			h["Ratelimit"] = []string{f.Limit}
		}
		if m.legacy && !d.Degraded {
			setLegacy(h, d)
		}
		r = r.WithContext(ctx)
		if d.Allowed {
			next.ServeHTTP(w, r)
			return
		}
		if f.RetryAfter > 0 {
			h["Retry-After"] = []string{strconv.FormatInt(f.RetryAfter, 10)}
		}
		m.onDenied(w, r, Decision(*d))
	})
}

// decisionContext is a request's context with the middleware's Decision
// and room for one limit's request and decision, so that a request under a
// single limit costs one allocation for all three.
type decisionContext struct {
	context.Context
	d     limitcore.Decision
	reqs  [1]sluice.Request
	parts [1]sluice.Decision
}

type decisionKey struct{}

func newDecisionContext(parent context.Context) *decisionContext {
	c := &decisionContext{Context: parent}
	c.d.Requests, c.d.Parts = c.reqs[:0], c.parts[:0]
	return c
}

func (c *decisionContext) Value(key any) any {
	if key == (decisionKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// FromContext returns the Decision the middleware made for the request
// whose context is ctx, and whether there is one: there is none before the
// middleware has run, for a request Options.Skip skipped, or one that
// could not be decided. Under two nested middlewares it is the inner one's.
func FromContext(ctx context.Context) (Decision, bool) {
	c, ok := ctx.Value(decisionKey{}).(*decisionContext)
	if !ok {
		return Decision{}, false
	}
	return Decision(c.d), true
}

// Legacy header names (Options.LegacyHeaders).
const (
	// HeaderXRateLimitLimit is the capacity of the reported limit.
	HeaderXRateLimitLimit = "X-RateLimit-Limit"
	// HeaderXRateLimitRemaining is the whole tokens it has left.
	HeaderXRateLimitRemaining = "X-RateLimit-Remaining"
	// HeaderXRateLimitReset is the seconds until it is full again.
	HeaderXRateLimitReset = "X-RateLimit-Reset"
)

// setLegacy sets the X-RateLimit fields of one limit of d: the one that
// denied, or the one with the fewest tokens remaining (of equal ones, the
// one that takes longest to fill).
func setLegacy(h http.Header, d *limitcore.Decision) {
	i := d.Denied
	if i < 0 || i >= len(d.Parts) {
		i = 0
		for j, p := range d.Parts {
			if q := d.Parts[i]; p.Remaining < q.Remaining || p.Remaining == q.Remaining && p.ResetAfter > q.ResetAfter {
				i = j
			}
		}
	}
	p := d.Parts[i]
	l := p.Limit
	if l.Validate() != nil {
		l = d.Requests[i].Limit
	}
	h["X-Ratelimit-Limit"] = []string{strconv.FormatInt(l.Capacity, 10)}
	h["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(max(p.Remaining, 0), 10)}
	if p.ResetAfter >= 0 && p.ResetAfter != sluice.Never {
		var s int64
		if p.ResetAfter > 0 {
			s = limitcore.CeilSeconds(p.ResetAfter)
		}
		h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(s, 10)}
	}
}
