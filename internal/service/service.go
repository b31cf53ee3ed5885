// Package service is the core of the Sluice service: it maps a request
// naming a policy and a key to one store operation, so that every API in
// front of it (HTTP JSON, and later gRPC and Envoy's rate-limit service)
// decides the same way. It holds the table of named policies, which a config
// reload swaps atomically, and applies each policy's shadow mode.
//
// The core does no I/O of its own and knows nothing of wire formats; the
// store behind it is already wrapped in a failure policy (package guard)
// and metrics (package promstore) by the caller.
package service

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoyconf"
)

// ErrUnknownPolicy means a request named a policy the current config does
// not define.
var ErrUnknownPolicy = errors.New("service: unknown policy")

// Policy is a named quota as the service decides it.
type Policy struct {
	// Name is the policy name, the name requests give.
	Name string
	// Limit is the policy's first limit: the only one of a policy with one.
	Limit sluice.Limit
	// Limits are all of the policy's limits, decided together: a take is
	// allowed only if every limit allows it, and then charged to all of
	// them (one all-or-nothing sluice.Operator.TakeAll). Limits[0] is
	// Limit. NewTable fills it from Limit when it is empty.
	Limits []sluice.Limit
	// Shadow makes the policy decide and record, but always allow: a
	// denial is answered as allowed, with Result.ShadowDenied set, so a
	// limit can be tried on live traffic before it is enforced.
	Shadow bool
	// buckets are the store's policy names of the limits: Name for the
	// first, Name/1, Name/2, ... for the others.
	buckets []string
}

// Bucket returns the store's policy name of the policy's i-th limit: the
// policy's name for the first, name/i for the others, so that adding a
// limit to a policy keeps the buckets of its first.
func (p Policy) Bucket(i int) string { return p.buckets[i] }

// bucketName is the store's policy name of limit i of policy name.
func bucketName(name string, i int) string {
	if i == 0 {
		return name
	}
	return name + "/" + strconv.Itoa(i)
}

// Table is an immutable set of policies with the version of the config it
// came from.
type Table struct {
	version  string
	policies map[string]Policy
	names    []string
	envoy    *envoyconf.Config
}

// NewTable returns a Table of policies, checked against store: every name
// must be a valid policy name, given once, and every limit one the store
// decides exactly (sluice.CheckLimit). version identifies the config (a
// content hash) in status answers and metrics.
func NewTable(store sluice.Store, version string, policies []Policy) (*Table, error) {
	t := &Table{version: version, policies: make(map[string]Policy, len(policies))}
	owner := map[string]string{} // store policy name -> the policy it belongs to
	var errs []error
	for _, p := range policies {
		if err := sluice.ValidatePolicy(p.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := t.policies[p.Name]; dup {
			errs = append(errs, fmt.Errorf("%w: policy %q is defined twice", sluice.ErrInvalidOption, p.Name))
			continue
		}
		if len(p.Limits) == 0 {
			p.Limits = []sluice.Limit{p.Limit}
		}
		p.Limits = append([]sluice.Limit(nil), p.Limits...)
		p.Limit = p.Limits[0]
		if len(p.Limits) > sluice.MaxParts {
			errs = append(errs, fmt.Errorf("%w: policy %q has %d limits, more than %d", sluice.ErrInvalidOption, p.Name, len(p.Limits), sluice.MaxParts))
			continue
		}
		if _, ok := store.(sluice.Operator); len(p.Limits) > 1 && !ok {
			errs = append(errs, fmt.Errorf("%w: policy %q has %d limits, and the store (%T) cannot decide several limits together", sluice.ErrInvalidOption, p.Name, len(p.Limits), store))
			continue
		}
		bad := false
		p.buckets = make([]string, len(p.Limits))
		for i, l := range p.Limits {
			b := bucketName(p.Name, i)
			p.buckets[i] = b
			if err := sluice.ValidatePolicy(b); err != nil {
				errs = append(errs, fmt.Errorf("policy %q, limit %d: its bucket name %q: %w", p.Name, i, b, err))
				bad = true
			}
			if o, dup := owner[b]; dup {
				errs = append(errs, fmt.Errorf("%w: policy %q's limit %d has the bucket name %q, which policy %q uses; rename one", sluice.ErrInvalidOption, p.Name, i, b, o))
				bad = true
			}
			owner[b] = p.Name
			if err := sluice.CheckLimit(store, l); err != nil {
				errs = append(errs, fmt.Errorf("policy %q: %w", p.Name, err))
				bad = true
			}
		}
		if bad {
			continue
		}
		t.policies[p.Name] = p
		t.names = append(t.names, p.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Strings(t.names)
	return t, nil
}

// WithEnvoy returns a copy of t that carries the Envoy rules c, whose
// policies t must hold: the rules and the policies they decide by are
// swapped together by SetTable, so that a request is never matched against
// one config and decided under another.
func (t *Table) WithEnvoy(c *envoyconf.Config) *Table {
	u := *t
	u.envoy = c
	return &u
}

// Envoy returns the Envoy rules of the table, nil if it has none.
func (t *Table) Envoy() *envoyconf.Config { return t.envoy }

// Version returns the version the table was built with.
func (t *Table) Version() string { return t.version }

// Policies returns the policies in name order.
func (t *Table) Policies() []Policy {
	out := make([]Policy, len(t.names))
	for i, n := range t.names {
		out[i] = t.policies[n]
	}
	return out
}

// Lookup returns the policy named name.
func (t *Table) Lookup(name string) (Policy, bool) {
	p, ok := t.policies[name]
	return p, ok
}

// Request is one decision asked of the core.
type Request struct {
	Policy string
	Key    string
	// Cost is the tokens to take (or, for Peek, to ask about), 1 to the
	// policy's capacity.
	Cost int64
	// RequestID makes a take idempotent (sluice.Request.RequestID).
	RequestID string
	// Limit, when not zero, is a limit that comes with the request
	// instead of from the config, as Envoy's descriptor overrides do: the
	// request is decided under it in a policy of one limit named Policy,
	// which the table must not define (so that the config's buckets are
	// never converted by a request). The caller keeps such buckets apart
	// per limit, in the key, and bounds the names.
	Limit sluice.Limit
}

// Result is a decision of the core.
type Result struct {
	// Decision is the policy's decision. For a policy of several limits it
	// combines the parts: Allowed if all allowed; Remaining the least of
	// theirs; RetryAfter the longest wait of a denying limit; ResetAfter
	// the longest; Limit that of the denying limit (Denied), or of the
	// limit with the fewest tokens left when allowed; Taken, for a drain,
	// the least any limit took.
	sluice.Decision
	// Policy is the policy the decision was made under.
	Policy Policy
	// Parts holds each limit's own decision, in the order of
	// Policy.Limits, for a policy of several limits; nil for one.
	Parts []sluice.Decision
	// Denied is the index in Parts of the limit that decided a denial, or
	// -1.
	Denied int
	// ShadowDenied reports that the store denied the request and the
	// policy's shadow mode allowed it anyway.
	ShadowDenied bool
}

// Hooks observe the core's decisions, for metrics. Nil hooks are skipped.
// They run on the request's goroutine and must not block.
type Hooks struct {
	// ShadowDenied is called for each denial that shadow mode allowed.
	ShadowDenied func(policy string)
	// UnknownPolicy is called for each request naming an unknown policy.
	UnknownPolicy func()
}

// Core decides requests of named policies against one store. It is safe
// for concurrent use; SetTable swaps the policies atomically while
// requests are being decided.
type Core struct {
	store sluice.Store
	table atomic.Pointer[Table]
	hooks Hooks
}

// New returns a Core deciding in store under the policies of t.
func New(store sluice.Store, t *Table, hooks Hooks) (*Core, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", sluice.ErrInvalidOption)
	}
	if t == nil {
		return nil, fmt.Errorf("%w: policy table is nil", sluice.ErrInvalidOption)
	}
	c := &Core{store: store, hooks: hooks}
	c.table.Store(t)
	return c, nil
}

// Table returns the current policy table.
func (c *Core) Table() *Table { return c.table.Load() }

// SetTable replaces the policy table. Requests already being decided finish
// under the old one; a bucket whose policy's limit changed is converted
// lazily by the store on its next take.
func (c *Core) SetTable(t *Table) { c.table.Store(t) }

// Pin returns a Core that decides under the table in use now, whatever
// SetTable later sets on c: for an API that reads the table (its Envoy
// rules) and must decide by the same one.
func (c *Core) Pin() *Core {
	p := &Core{store: c.store, hooks: c.hooks}
	p.table.Store(c.table.Load())
	return p
}

// Store returns the store the core decides in.
func (c *Core) Store() sluice.Store { return c.store }

// Take takes r.Cost tokens from the bucket of (r.Policy, r.Key), or from
// the buckets of all of the policy's limits at once, all or nothing. The
// error wraps ErrUnknownPolicy, a sluice parameter error (sluice.IsInvalid;
// a request ID for a policy of several limits is
// sluice.ErrInvalidRequestID), or the store's error.
func (c *Core) Take(ctx context.Context, r Request) (Result, error) {
	p, req, err := c.request(r)
	if err != nil {
		return Result{}, err
	}
	if len(p.Limits) > 1 {
		if r.RequestID != "" {
			return Result{}, fmt.Errorf("%w: policy %q has %d limits decided together, which take no request ID", sluice.ErrInvalidRequestID, p.Name, len(p.Limits))
		}
		ops, err := c.operator(p)
		if err != nil {
			return Result{}, err
		}
		md, err := ops.TakeAll(ctx, parts(p, r))
		if err != nil {
			return Result{}, err
		}
		res := combine(p, md.Parts, md.Denied)
		res.Degraded = md.Degraded
		return c.shadow(res), nil
	}
	d, err := c.store.Take(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return c.shadow(Result{Decision: d, Policy: p, Denied: denied(d)}), nil
}

// Peek reports whether a take of r.Cost from the bucket(s) of (r.Policy,
// r.Key) would be allowed now, without taking anything. r.RequestID must be
// empty.
func (c *Core) Peek(ctx context.Context, r Request) (Result, error) {
	p, req, err := c.request(r)
	if err != nil {
		return Result{}, err
	}
	// A peek reports what is, shadow or not: it allows nothing.
	if len(p.Limits) > 1 {
		if r.RequestID != "" {
			return Result{}, fmt.Errorf("%w: a peek takes no request ID (got %d bytes)", sluice.ErrInvalidRequestID, len(r.RequestID))
		}
		ds := make([]sluice.Decision, len(p.Limits))
		for i, q := range parts(p, r) {
			if ds[i], err = c.store.Peek(ctx, q); err != nil {
				return Result{}, fmt.Errorf("limit %d of policy %q: %w", i, p.Name, err)
			}
		}
		md := sluice.MultiDecision{Parts: ds}
		md.Combine()
		return combine(p, ds, md.Denied), nil
	}
	d, err := c.store.Peek(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return Result{Decision: d, Policy: p, Denied: denied(d)}, nil
}

// Drain takes what is there, up to r.Cost (which may exceed a capacity),
// from the bucket of each of the policy's limits: a charge made after the
// fact is charged to every limit, each as far as it can. Allowed reports
// whether every limit had all of r.Cost. r.RequestID must be empty.
func (c *Core) Drain(ctx context.Context, r Request) (Result, error) {
	p, _, err := c.request(r)
	if err != nil {
		return Result{}, err
	}
	ops, err := c.operator(p)
	if err != nil {
		return Result{}, err
	}
	ds := make([]sluice.Decision, len(p.Limits))
	for i, q := range parts(p, r) {
		if ds[i], err = ops.Drain(ctx, q); err != nil {
			return Result{}, limitErr(p, i, err)
		}
	}
	return c.shadow(c.resultOf(p, ds)), nil
}

// Refund gives r.Cost tokens back to the bucket of each of the policy's
// limits, never above a capacity. With r.RequestID (a policy of one limit
// only: several limits take no request ID) it undoes that take, once.
func (c *Core) Refund(ctx context.Context, r Request) (Result, error) {
	p, _, err := c.request(r)
	if err != nil {
		return Result{}, err
	}
	if len(p.Limits) > 1 && r.RequestID != "" {
		return Result{}, fmt.Errorf("%w: policy %q has %d limits decided together, whose takes have no request ID to refund", sluice.ErrInvalidRequestID, p.Name, len(p.Limits))
	}
	ops, err := c.operator(p)
	if err != nil {
		return Result{}, err
	}
	ds := make([]sluice.Decision, len(p.Limits))
	for i, q := range parts(p, r) {
		if ds[i], err = ops.Refund(ctx, q); err != nil {
			return Result{}, limitErr(p, i, err)
		}
	}
	return c.resultOf(p, ds), nil
}

// Reset makes the bucket of key under each of the policy's limits full.
func (c *Core) Reset(ctx context.Context, policy, key string) (Policy, error) {
	p, ok := c.table.Load().Lookup(policy)
	if !ok {
		if c.hooks.UnknownPolicy != nil {
			c.hooks.UnknownPolicy()
		}
		return Policy{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, policy)
	}
	ops, err := c.operator(p)
	if err != nil {
		return Policy{}, err
	}
	for i := range p.Limits {
		if err := ops.Reset(ctx, p.Bucket(i), key); err != nil {
			return Policy{}, limitErr(p, i, err)
		}
	}
	return p, nil
}

// operator returns the store as a sluice.Operator, or an error if it is
// not one.
func (c *Core) operator(p Policy) (sluice.Operator, error) {
	ops, ok := c.store.(sluice.Operator)
	if !ok {
		return nil, fmt.Errorf("%w: the store (%T) has no drain, refund, reset or multi-limit take (policy %q)", sluice.ErrInvalidOption, c.store, p.Name)
	}
	return ops, nil
}

// limitErr names the limit an error of a policy of several limits came
// from.
func limitErr(p Policy, i int, err error) error {
	if len(p.Limits) == 1 {
		return err
	}
	return fmt.Errorf("limit %d of policy %q: %w", i, p.Name, err)
}

func (c *Core) request(r Request) (Policy, sluice.Request, error) {
	p, err := c.lookup(c.table.Load(), r)
	if err != nil {
		return Policy{}, sluice.Request{}, err
	}
	return p, sluice.Request{Policy: p.Name, Key: r.Key, Cost: r.Cost, Limit: p.Limit, RequestID: r.RequestID}, nil
}

// lookup returns the policy of r in t, or the policy of r's own limit.
func (c *Core) lookup(t *Table, r Request) (Policy, error) {
	p, ok := t.Lookup(r.Policy)
	if r.Limit != (sluice.Limit{}) {
		if ok {
			return Policy{}, fmt.Errorf("%w: policy %q is defined by the config; a request that brings its own limit names a policy the config does not define", sluice.ErrInvalidPolicy, r.Policy)
		}
		if err := sluice.ValidatePolicy(r.Policy); err != nil {
			return Policy{}, err
		}
		if err := sluice.CheckLimit(c.store, r.Limit); err != nil {
			return Policy{}, err
		}
		return Policy{Name: r.Policy, Limit: r.Limit, Limits: []sluice.Limit{r.Limit}, buckets: []string{r.Policy}}, nil
	}
	if !ok {
		if c.hooks.UnknownPolicy != nil {
			c.hooks.UnknownPolicy()
		}
		return Policy{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, r.Policy)
	}
	return p, nil
}

// parts returns the store requests of r under each of p's limits. A take
// or peek of several limits refuses a request ID before it gets here.
func parts(p Policy, r Request) []sluice.Request {
	rs := make([]sluice.Request, len(p.Limits))
	for i, l := range p.Limits {
		rs[i] = sluice.Request{Policy: p.Bucket(i), Key: r.Key, Cost: r.Cost, Limit: l, RequestID: r.RequestID}
	}
	return rs
}

// resultOf is the result of per-limit decisions made one by one (drain,
// refund), for a policy of one limit or several.
func (c *Core) resultOf(p Policy, ds []sluice.Decision) Result {
	if len(ds) == 1 {
		return Result{Decision: ds[0], Policy: p, Denied: denied(ds[0])}
	}
	md := sluice.MultiDecision{Parts: ds}
	md.Combine()
	res := combine(p, ds, md.Denied)
	for _, d := range ds {
		res.Degraded = res.Degraded || d.Degraded
	}
	return res
}

func denied(d sluice.Decision) int {
	if d.Allowed {
		return -1
	}
	return 0
}

// combine is the Result of a policy of several limits from their
// decisions; den is the index of the denying limit, or -1.
func combine(p Policy, ds []sluice.Decision, den int) Result {
	res := Result{Policy: p, Parts: ds, Denied: den}
	d := sluice.Decision{Allowed: den < 0, Remaining: ds[0].Remaining, Limit: ds[0].Limit, Taken: ds[0].Taken}
	least := 0
	for i, x := range ds {
		if x.Remaining < ds[least].Remaining {
			least = i
		}
		d.Remaining = min(d.Remaining, x.Remaining)
		d.ResetAfter = max(d.ResetAfter, x.ResetAfter)
		d.Replayed = d.Replayed || x.Replayed
		if x.Taken >= 0 {
			d.Taken = min(d.Taken, x.Taken)
		} else {
			d.Taken = max(d.Taken, x.Taken) // a refund: the least given back
		}
	}
	if den >= 0 {
		d.RetryAfter = ds[den].RetryAfter
		d.Limit = ds[den].Limit
	} else {
		d.Limit = ds[least].Limit
	}
	res.Decision = d
	return res
}

// RecordShadowDenial counts a would-be denial of the shadow policy named
// policy that an API decided without the core (a rule that denies
// everything, a cost no bucket of it can cover).
func (c *Core) RecordShadowDenial(policy string) {
	if c.hooks.ShadowDenied != nil {
		c.hooks.ShadowDenied(policy)
	}
}

// shadow applies the policy's shadow mode to res: whatever the store (or,
// when it is down, the failure policy) decided, the request is allowed and
// the would-be denial recorded.
func (c *Core) shadow(res Result) Result {
	if res.Policy.Shadow && !res.Allowed {
		res.ShadowDenied = true
		res.Allowed = true
		res.RetryAfter = 0
		if c.hooks.ShadowDenied != nil {
			c.hooks.ShadowDenied(res.Policy.Name)
		}
	}
	return res
}
