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
	"sync/atomic"

	"github.com/sluicehq/sluice"
)

// ErrUnknownPolicy means a request named a policy the current config does
// not define.
var ErrUnknownPolicy = errors.New("service: unknown policy")

// Policy is a named quota as the service decides it.
type Policy struct {
	// Name is the policy name, the bucket namespace in the store.
	Name string
	// Limit is the limit of every key of the policy.
	Limit sluice.Limit
	// Shadow makes the policy decide and record, but always allow: a
	// denial is answered as allowed, with Result.ShadowDenied set, so a
	// limit can be tried on live traffic before it is enforced.
	Shadow bool
}

// Table is an immutable set of policies with the version of the config it
// came from.
type Table struct {
	version  string
	policies map[string]Policy
	names    []string
}

// NewTable returns a Table of policies, checked against store: every name
// must be a valid policy name, given once, and every limit one the store
// decides exactly (sluice.CheckLimit). version identifies the config (a
// content hash) in status answers and metrics.
func NewTable(store sluice.Store, version string, policies []Policy) (*Table, error) {
	t := &Table{version: version, policies: make(map[string]Policy, len(policies))}
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
		if err := sluice.CheckLimit(store, p.Limit); err != nil {
			errs = append(errs, fmt.Errorf("policy %q: %w", p.Name, err))
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
}

// Result is a decision of the core.
type Result struct {
	sluice.Decision
	// Policy is the policy the decision was made under.
	Policy Policy
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

// Store returns the store the core decides in.
func (c *Core) Store() sluice.Store { return c.store }

// Take takes r.Cost tokens from the bucket of (r.Policy, r.Key). The error
// wraps ErrUnknownPolicy, a sluice parameter error (sluice.IsInvalid), or
// the store's error.
func (c *Core) Take(ctx context.Context, r Request) (Result, error) {
	p, req, err := c.request(r)
	if err != nil {
		return Result{}, err
	}
	d, err := c.store.Take(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return c.result(p, d), nil
}

// Peek reports whether a take of r.Cost from the bucket of (r.Policy,
// r.Key) would be allowed now, without taking anything. r.RequestID must be
// empty.
func (c *Core) Peek(ctx context.Context, r Request) (Result, error) {
	p, req, err := c.request(r)
	if err != nil {
		return Result{}, err
	}
	d, err := c.store.Peek(ctx, req)
	if err != nil {
		return Result{}, err
	}
	// A peek reports what is, shadow or not: it allows nothing.
	return Result{Decision: d, Policy: p}, nil
}

func (c *Core) request(r Request) (Policy, sluice.Request, error) {
	p, ok := c.table.Load().Lookup(r.Policy)
	if !ok {
		if c.hooks.UnknownPolicy != nil {
			c.hooks.UnknownPolicy()
		}
		return Policy{}, sluice.Request{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, r.Policy)
	}
	return p, sluice.Request{Policy: p.Name, Key: r.Key, Cost: r.Cost, Limit: p.Limit, RequestID: r.RequestID}, nil
}

func (c *Core) result(p Policy, d sluice.Decision) Result {
	res := Result{Decision: d, Policy: p}
	// Shadow mode allows whatever the store (or, when it is down, the
	// failure policy) decided: the policy is recorded, not enforced.
	if p.Shadow && !d.Allowed {
		res.ShadowDenied = true
		res.Allowed = true
		res.RetryAfter = 0
		if c.hooks.ShadowDenied != nil {
			c.hooks.ShadowDenied(p.Name)
		}
	}
	return res
}
