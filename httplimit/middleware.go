// Package httplimit is net/http middleware that rate-limits requests with a
// sluice.Store: each request is charged to the bucket of its key under the
// middleware's named policy (Options.Policy), and a denied request is
// answered 429 Too Many Requests with Retry-After and the RateLimit-Policy
// and RateLimit fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers-11, in place of the handler.
//
// A request the limiter cannot decide is never passed through silently: a
// store failure is 503, a denial made by a failure policy while the store is
// unreachable (a Decision with Degraded set) is 503 with the problem type
// "temporary-reduced-capacity", never 429. See docs/http.md for the mapping
// from a token bucket to the header fields and for choosing a key.
package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
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

// Options configure a Middleware. Policy is required, and so is one of
// Limit and LimitFunc; the zero value of every other field means its
// documented default.
type Options struct {
	// Policy names the quota this middleware enforces ("api", "login"):
	// the bucket of a request is (Policy, key), and the name is reported
	// in the RateLimit-Policy and RateLimit fields and in problem bodies.
	// Required, with no default: two middlewares with different policies
	// never share a bucket, even on one store and one key, while two with
	// the same policy share their buckets (one quota over several routes).
	// It must pass sluice.ValidatePolicy: 1 to sluice.MaxPolicyLen bytes
	// of printable ASCII without spaces; otherwise New returns an error
	// wrapping sluice.ErrInvalidPolicy.
	Policy string
	// Key returns the key of a request's bucket within Policy. Default:
	// the client's address as ClientIP with the zero ClientIPOptions keys
	// it (the connection's peer, IPv6 by /64, forwarding headers ignored).
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
	// Cost returns the tokens a request costs, 1 to the limit's capacity.
	// Default: 1 for every request. A cost outside that range is
	// sluice.ErrInvalidCost (500 by default: it is a bug in Cost, not a
	// denial); any other error it returns is passed to ErrorHandler.
	Cost func(r *http.Request) (int64, error)
	// RequestIDHeader names a header (such as "Idempotency-Key") whose
	// value, when present, is the request ID of the take: a retry that
	// carries the same value for the same policy and key is not charged
	// again while the store remembers the first allowed decision; it gets
	// that decision's answer again. Default: none.
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
	// ErrorHandler writes the answer to a request that could not be
	// decided, with err wrapping ErrNoKey, ErrStore, a sluice parameter
	// error, or an error from Key, LimitFunc or Cost; the next handler is
	// not called. Default: DefaultErrorHandler. To let requests through
	// while the store is down, wrap the store in a failure policy (its
	// degraded allows pass) rather than passing them here.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
}

// Middleware charges each request to its key's bucket in a store and
// answers denied requests itself. Create one with New; it is safe for
// concurrent use if its store is.
type Middleware struct {
	store      sluice.Store
	key        KeyFunc
	limit      sluice.Limit
	limitFunc  func(*http.Request) (sluice.Limit, error)
	cost       func(*http.Request) (int64, error)
	policy     string
	quoted     string // policy as a Structured Field String
	policyItem string // RateLimit-Policy value under limit (when fixed)
	idHeader   string
	onError    func(http.ResponseWriter, *http.Request, error)
}

// New returns a Middleware that decides with store under o. The error
// wraps sluice.ErrInvalidOption if store is nil or o is not valid,
// sluice.ErrInvalidPolicy if o.Policy is empty or not a valid policy name,
// or sluice.ErrInvalidLimit if o.Limit is set and not valid or store cannot
// decide it exactly (sluice.CheckLimit).
func New(store sluice.Store, o Options) (*Middleware, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", sluice.ErrInvalidOption)
	}
	if err := checkPolicy(o.Policy); err != nil {
		return nil, err
	}
	m := &Middleware{
		store:     store,
		key:       o.Key,
		limit:     o.Limit,
		limitFunc: o.LimitFunc,
		cost:      o.Cost,
		policy:    o.Policy,
		idHeader:  o.RequestIDHeader,
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
	m.quoted = quoteString(m.policy)
	if o.LimitFunc == nil {
		m.policyItem = string(appendPolicyField(nil, m.quoted, m.limit))
	}
	if m.key == nil {
		key, err := ClientIP(ClientIPOptions{})
		if err != nil {
			return nil, err
		}
		m.key = key
	}
	if m.onError == nil {
		m.onError = DefaultErrorHandler
	}
	return m, nil
}

// checkPolicy checks Options.Policy with sluice.ValidatePolicy, naming the
// option when it was left empty.
func checkPolicy(p string) error {
	if p == "" {
		return fmt.Errorf("%w: Options.Policy is empty; name the quota this middleware enforces (for example \"api\" or \"login\"), so that it gets buckets of its own", sluice.ErrInvalidPolicy)
	}
	return sluice.ValidatePolicy(p)
}

// Policy returns the name of the quota m enforces.
func (m *Middleware) Policy() string { return m.policy }

// Handler returns a handler that decides each request and calls next only
// for allowed ones (including those a failure policy allowed while the
// store was degraded), with the RateLimit-Policy and RateLimit fields set on
// the response. A denied request is answered 429 (503 if the denial is
// degraded) with a problem body; one that cannot be decided goes to
// Options.ErrorHandler. Degraded answers carry no RateLimit field, and a
// RateLimit-Policy only if the failure policy decided under a reduced
// limit.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, req, err := m.decide(r)
		if err != nil {
			m.onError(w, r, err)
			return
		}
		h := w.Header()
		retry, hasRetry := retryAfterSeconds(d.RetryAfter)
		if d.Degraded {
			// A failure policy decided: its numbers do not describe the
			// shared bucket, so RateLimit is not sent. A reduced limit it
			// decided under is shown as the draft allows, as a temporarily
			// lower quota.
			if d.Limit.Validate() == nil && d.Limit != req.Limit {
				h["Ratelimit-Policy"] = []string{string(appendPolicyField(nil, m.quoted, d.Limit))}
			}
		} else {
			lim := d.Limit
			if lim.Validate() != nil {
				lim = req.Limit // a store that did not report its limit
			}
			m.setFields(h, d, lim, retry)
		}
		if d.Allowed {
			next.ServeHTTP(w, r)
			return
		}
		if hasRetry {
			h.Set(HeaderRetryAfter, strconv.FormatInt(retry, 10))
		}
		if d.Degraded {
			writeProblem(w, http.StatusServiceUnavailable, problem{
				Type:             ProblemReducedCapacity,
				Title:            "Temporarily reduced capacity",
				Detail:           "the rate limiter is degraded and cannot admit this request now",
				ViolatedPolicies: []string{m.policy},
			})
			return
		}
		detail := fmt.Sprintf("the request costs %d and %d of %d remain", req.Cost, max(d.Remaining, 0), req.Limit.Capacity)
		if !hasRetry {
			detail += "; waiting will not help"
		}
		writeProblem(w, http.StatusTooManyRequests, problem{
			Type:             ProblemQuotaExceeded,
			Title:            "Quota exceeded",
			Detail:           detail,
			ViolatedPolicies: []string{m.policy},
		})
	})
}

// setFields sets RateLimit-Policy and RateLimit for d under l.
func (m *Middleware) setFields(h http.Header, d sluice.Decision, l sluice.Limit, retryAfter int64) {
	var buf [128]byte
	policy := m.policyItem
	if policy == "" || l != m.limit {
		policy = string(appendPolicyField(buf[:0], m.quoted, l))
	}
	// The canonical forms, written directly: Header.Set would allocate
	// to canonicalize the names on every request.
	h["Ratelimit-Policy"] = []string{policy}
	h["Ratelimit"] = []string{string(appendLimitField(buf[:0], m.quoted, d, l, retryAfter))}
}

// decide builds the request's sluice.Request and takes it from the store.
func (m *Middleware) decide(r *http.Request) (sluice.Decision, sluice.Request, error) {
	var req sluice.Request
	key, err := m.key(r)
	if err != nil {
		return sluice.Decision{}, req, err
	}
	if key == "" {
		return sluice.Decision{}, req, fmt.Errorf("%w: the key function returned an empty key", ErrNoKey)
	}
	req.Policy = m.policy
	req.Key = key
	req.Limit = m.limit
	if m.limitFunc != nil {
		if req.Limit, err = m.limitFunc(r); err != nil {
			return sluice.Decision{}, req, err
		}
	}
	req.Cost = 1
	if m.cost != nil {
		if req.Cost, err = m.cost(r); err != nil {
			return sluice.Decision{}, req, err
		}
	}
	if m.idHeader != "" {
		req.RequestID = r.Header.Get(m.idHeader)
	}
	if err := req.Validate(); err != nil {
		return sluice.Decision{}, req, err
	}
	d, err := take(r, m.store, req)
	return d, req, err
}

// take takes req from store. Errors that are not parameter errors are
// wrapped with ErrStore.
func take(r *http.Request, store sluice.Store, req sluice.Request) (sluice.Decision, error) {
	d, err := store.Take(r.Context(), req)
	if err != nil && !sluice.IsInvalid(err) {
		err = fmt.Errorf("%w: %w", ErrStore, err)
	}
	return d, err
}
