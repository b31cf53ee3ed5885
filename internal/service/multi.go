package service

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
)

// MultiResult is the outcome of one Core.TakeAll.
type MultiResult struct {
	// Results holds one Result per request, in order. Each says whether
	// that request's own buckets covered its cost: a request that would
	// have been allowed alone is Allowed even when another denied the
	// whole, and then nothing was taken from it either. Remaining and
	// ResetAfter are after the take when the whole was allowed, as they
	// were when it was denied.
	Results []Result
	// Allowed reports whether every enforced request was allowed, so that
	// all were charged. When false, none was.
	Allowed bool
	// Denied is the index in Results of the request that decided the
	// denial (of the enforced requests that could not cover their cost,
	// the one with the longest RetryAfter), or -1.
	Denied int
	// Degraded reports that a failure policy decided some of it.
	Degraded bool
}

// TakeAll decides several requests, of one policy or of several, as one:
// the requests of enforced policies are taken together, all or nothing
// (one sluice.Operator.TakeAll over all their limits), so that a request
// denied by one consumes nothing from the others. Requests of shadow
// policies never deny the others: once the enforced ones are allowed, each
// is taken on its own and its would-be denial recorded; when they are
// denied, the shadow ones are only peeked. Request IDs are refused (a
// multi-take has none), and all the limits together number at most
// sluice.MaxParts.
func (c *Core) TakeAll(ctx context.Context, rs []Request) (MultiResult, error) {
	t := c.table.Load()
	out := MultiResult{Results: make([]Result, len(rs)), Denied: -1, Allowed: true}
	ps := make([]Policy, len(rs))
	var enforced []sluice.Request
	owner := make([]int, 0, len(rs)) // enforced[j] belongs to rs[owner[j]]
	for i, r := range rs {
		p, err := c.lookup(t, r)
		if err != nil {
			return MultiResult{}, fmt.Errorf("request %d: %w", i, err)
		}
		if r.RequestID != "" {
			return MultiResult{}, fmt.Errorf("request %d: %w: requests decided together take no request ID", i, sluice.ErrInvalidRequestID)
		}
		ps[i] = p
		if p.Shadow {
			continue
		}
		for _, q := range parts(p, r) {
			enforced = append(enforced, q)
			owner = append(owner, i)
		}
	}
	if len(enforced) > sluice.MaxParts {
		return MultiResult{}, fmt.Errorf("%w: %d requests with %d limits in all, more than %d", sluice.ErrInvalidMulti, len(rs), len(enforced), sluice.MaxParts)
	}
	if len(enforced) > 0 {
		md, err := c.takeParts(ctx, enforced)
		if err != nil {
			return MultiResult{}, err
		}
		out.Allowed, out.Degraded = md.Allowed, md.Degraded
		if md.Denied >= 0 {
			out.Denied = owner[md.Denied]
		}
		// Each request's part of the decisions, combined as Take does.
		for j := 0; j < len(enforced); {
			i := owner[j]
			n := len(ps[i].Limits)
			ds := md.Parts[j : j+n]
			if n == 1 {
				out.Results[i] = Result{Decision: ds[0], Policy: ps[i], Denied: denied(ds[0])}
			} else {
				sub := sluice.MultiDecision{Parts: ds}
				sub.Combine()
				out.Results[i] = combine(ps[i], ds, sub.Denied)
			}
			out.Results[i].Degraded = md.Degraded
			j += n
		}
	}
	for i, r := range rs {
		if !ps[i].Shadow {
			continue
		}
		var res Result
		var err error
		if out.Allowed {
			res, err = c.Take(ctx, r)
		} else {
			res, err = c.Peek(ctx, r)
			if err == nil {
				res = c.shadow(res)
			}
		}
		if err != nil {
			return MultiResult{}, fmt.Errorf("request %d: %w", i, err)
		}
		out.Results[i] = res
		out.Degraded = out.Degraded || res.Degraded
	}
	return out, nil
}

// takeParts takes the store requests qs together: with the store's
// TakeAll, or with a plain take (the same decision, on the stores' fastest
// path) when there is one request.
func (c *Core) takeParts(ctx context.Context, qs []sluice.Request) (sluice.MultiDecision, error) {
	if len(qs) != 1 {
		ops, ok := c.store.(sluice.Operator)
		if !ok {
			return sluice.MultiDecision{}, fmt.Errorf("%w: the store (%T) cannot decide several limits together", sluice.ErrInvalidOption, c.store)
		}
		return ops.TakeAll(ctx, qs)
	}
	d, err := c.store.Take(ctx, qs[0])
	if err != nil {
		return sluice.MultiDecision{}, err
	}
	md := sluice.MultiDecision{Parts: []sluice.Decision{d}, Degraded: d.Degraded}
	md.Combine()
	return md, nil
}
