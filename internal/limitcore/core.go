// Package limitcore is what httplimit and grpclimit share: it turns a
// request (an *http.Request, a gRPC call) into the sluice.Requests of the
// middleware's named limits, decides them in a store (one Take for one
// limit, one all-or-nothing TakeAll for several), classifies the errors,
// and formats the RateLimit fields of the decision. The packages keep only
// their transport: reading keys, writing headers or status details.
package limitcore

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// Limit is one named limit of a middleware, with its functions bound to the
// transport's request type R.
type Limit[R any] struct {
	// Option names the option the limit came from in error messages:
	// "Options" for the single-limit form, "Options.Limits[1]" for an
	// element of a list.
	Option string
	// Policy names the quota; it must pass sluice.ValidatePolicy.
	Policy string
	// Limit is the limit of every request when LimitFunc is nil.
	Limit sluice.Limit
	// LimitFunc, when set, returns the limit of each request.
	LimitFunc func(R) (sluice.Limit, error)
	// Key returns the key of a request's bucket within Policy. Required:
	// the transport fills in its default.
	Key func(R) (string, error)
}

// Config configures a Core.
type Config[R any] struct {
	// Limits are decided together, 1 to sluice.MaxParts of them, with
	// distinct policies.
	Limits []Limit[R]
	// Cost returns the tokens a request costs in every limit; nil: 1.
	Cost func(R) (int64, error)
	// RequestID returns the request ID of a request, "" for none; nil
	// when the transport's request-ID option is not set.
	RequestID func(R) string
	// RequestIDOption names that option in the error that refuses it
	// with several limits.
	RequestIDOption string
	// ErrNoKey and ErrStore are the transport's sentinels: an empty key
	// is reported wrapping ErrNoKey, a store failure wrapping ErrStore.
	ErrNoKey, ErrStore error
}

// Decision is the outcome of one request: the MultiDecision of its limits
// (with a single limit, the Take's Decision as its only part) and the
// requests that were decided, Requests[i] for Parts[i]. httplimit's
// Decision has the same fields.
type Decision struct {
	sluice.MultiDecision
	Requests []sluice.Request
}

// Core decides the requests of one middleware. It is safe for concurrent
// use if its store is.
type Core[R any] struct {
	store       sluice.Store
	ops         sluice.Operator // the store, with several limits
	limits      []limit[R]
	cost        func(R) (int64, error)
	requestID   func(R) string
	errNoKey    error
	errStore    error
	policyField string // RateLimit-Policy value when no limit comes from a LimitFunc
}

type limit[R any] struct {
	cfg    Limit[R]
	quoted string // cfg.Policy as a Structured Field String
}

// New returns a Core deciding in store under c. The error wraps
// sluice.ErrInvalidOption if store is nil, there are no limits or more
// than sluice.MaxParts, two limits share a policy, a limit sets both Limit
// and LimitFunc, several limits are configured with a request ID (a
// multi-take remembers none) or with a store that does not implement
// sluice.Operator; sluice.ErrInvalidPolicy if a policy name is empty or
// invalid; sluice.ErrInvalidLimit if a fixed limit is invalid or the store
// cannot decide it (sluice.CheckLimit).
func New[R any](store sluice.Store, c Config[R]) (*Core[R], error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", sluice.ErrInvalidOption)
	}
	switch n := len(c.Limits); {
	case n == 0:
		return nil, fmt.Errorf("%w: no limits", sluice.ErrInvalidOption)
	case n > sluice.MaxParts:
		return nil, fmt.Errorf("%w: Options.Limits has %d limits, more than %d (sluice.MaxParts, the most buckets one TakeAll decides)", sluice.ErrInvalidOption, n, sluice.MaxParts)
	}
	core := &Core[R]{
		store:     store,
		cost:      c.Cost,
		requestID: c.RequestID,
		errNoKey:  c.ErrNoKey,
		errStore:  c.ErrStore,
	}
	fixed := true
	for i, l := range c.Limits {
		if l.Policy == "" {
			return nil, fmt.Errorf("%w: %s.Policy is empty; name the quota (for example \"api\" or \"daily\"), so that it gets buckets of its own", sluice.ErrInvalidPolicy, l.Option)
		}
		if err := sluice.ValidatePolicy(l.Policy); err != nil {
			return nil, fmt.Errorf("%s.Policy: %w", l.Option, err)
		}
		for _, o := range c.Limits[:i] {
			if o.Policy == l.Policy {
				return nil, fmt.Errorf("%w: %s and %s both have policy %q; each limit needs a policy of its own, or they would share (and keep converting) one bucket per key", sluice.ErrInvalidOption, o.Option, l.Option, l.Policy)
			}
		}
		switch {
		case l.LimitFunc != nil && l.Limit != (sluice.Limit{}):
			return nil, fmt.Errorf("%w: %s: set Limit or LimitFunc, not both", sluice.ErrInvalidOption, l.Option)
		case l.LimitFunc == nil:
			if err := sluice.CheckLimit(store, l.Limit); err != nil {
				return nil, fmt.Errorf("%s.Limit: %w", l.Option, err)
			}
		default:
			fixed = false
		}
		if l.Key == nil {
			return nil, fmt.Errorf("%w: %s has no key function", sluice.ErrInvalidOption, l.Option)
		}
		core.limits = append(core.limits, limit[R]{cfg: l, quoted: QuoteString(l.Policy)})
	}
	if len(c.Limits) > 1 {
		if c.RequestID != nil {
			return nil, fmt.Errorf("%w: %s cannot be used with several limits: they are decided by one TakeAll, which remembers no request ID, so a retry would be charged again; deduplicate retries before the middleware, or use a single limit", sluice.ErrInvalidOption, c.RequestIDOption)
		}
		ops, ok := store.(sluice.Operator)
		if !ok {
			return nil, fmt.Errorf("%w: several limits are decided together by TakeAll, and the store (%T) does not implement sluice.Operator", sluice.ErrInvalidOption, store)
		}
		core.ops = ops
	}
	if fixed {
		var b []byte
		for i, l := range core.limits {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = AppendPolicyItem(b, l.quoted, l.cfg.Limit)
		}
		core.policyField = string(b)
	}
	return core, nil
}

// Policies returns the policy names of c's limits, in order.
func (c *Core[R]) Policies() []string {
	ps := make([]string, len(c.limits))
	for i, l := range c.limits {
		ps[i] = l.cfg.Policy
	}
	return ps
}

// Decide builds the requests of r, one per limit, and decides them in the
// store: with one limit by Take (with the request ID, if any), with several
// by one TakeAll that charges every bucket or none. It fills d, reusing the
// capacity of d.Requests and d.Parts. The error is the key, limit or cost
// function's; one wrapping ErrNoKey for an empty key; a sluice parameter
// error (sluice.IsInvalid); one wrapping errors.ErrUnsupported from a
// store wrapper whose own store cannot take several buckets; or, for any
// other store error, one wrapping ErrStore and the store's error.
func (c *Core[R]) Decide(ctx context.Context, r R, d *Decision) error {
	reqs := d.Requests[:0]
	for i := range c.limits {
		l := &c.limits[i].cfg
		key, err := l.Key(r)
		if err != nil {
			return err
		}
		if key == "" {
			if len(c.limits) > 1 {
				return fmt.Errorf("%w: the key function of policy %q returned an empty key", c.errNoKey, l.Policy)
			}
			return fmt.Errorf("%w: the key function returned an empty key", c.errNoKey)
		}
		lim := l.Limit
		if l.LimitFunc != nil {
			if lim, err = l.LimitFunc(r); err != nil {
				return err
			}
		}
		reqs = append(reqs, sluice.Request{Policy: l.Policy, Key: key, Limit: lim})
	}
	cost := int64(1)
	if c.cost != nil {
		var err error
		if cost, err = c.cost(r); err != nil {
			return err
		}
	}
	if c.requestID != nil { // one limit: New refuses request IDs with several
		reqs[0].RequestID = c.requestID(r)
	}
	for i := range reqs {
		reqs[i].Cost = cost
		if err := reqs[i].Validate(); err != nil {
			if len(reqs) > 1 {
				return fmt.Errorf("policy %q: %w", reqs[i].Policy, err)
			}
			return err
		}
	}
	d.Requests = reqs
	if c.ops == nil {
		part, err := c.store.Take(ctx, reqs[0])
		if err != nil {
			return c.storeErr(err)
		}
		d.MultiDecision = sluice.MultiDecision{Parts: append(d.Parts[:0], part), Degraded: part.Degraded}
		d.Combine()
		return nil
	}
	md, err := c.ops.TakeAll(ctx, reqs)
	if err != nil {
		return c.storeErr(err)
	}
	if len(md.Parts) != len(reqs) {
		return fmt.Errorf("%w: the store answered %d parts for a multi-take of %d buckets", c.errStore, len(md.Parts), len(reqs))
	}
	d.MultiDecision = md
	return nil
}

// storeErr returns a store's error as Decide reports it: parameter errors
// and errors.ErrUnsupported as they are, anything else wrapped with
// ErrStore.
func (c *Core[R]) storeErr(err error) error {
	if sluice.IsInvalid(err) || errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	return fmt.Errorf("%w: %w", c.errStore, err)
}
