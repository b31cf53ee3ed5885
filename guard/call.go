package guard

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// outcome is what one store call came to.
type outcome uint8

const (
	// answered: the store decided, or answered with an error to return.
	answered outcome = iota
	// callerGone: the caller's context ended first; its error is returned
	// and the breaker counts nothing.
	callerGone
	// failed: a store failure (a timeout included); the failure mode
	// decides and the breaker counts it.
	failed
)

// query is one call of an operation: what the guard asks the store and,
// for TakeAll, its answer.
type query struct {
	op Op
	r  sluice.Request       // every operation's but TakeAll's; Reset's Policy and Key
	rs []sluice.Request     // TakeAll's
	md sluice.MultiDecision // TakeAll's answer, set by invoke or degrade
}

// policy returns the policy name the hooks report for q: its request's,
// or a multi-take's first request's.
func (q *query) policy() string {
	if q.op == OpTakeAll {
		return q.rs[0].Policy
	}
	return q.r.Policy
}

// call makes one store call within the deadline and reports it to the
// breaker and the hooks. If failed, err is the cause to degrade with;
// otherwise (d, err), and q.md for TakeAll, is the answer to return.
func (s *Store) call(ctx context.Context, q *query, probe bool) (d sluice.Decision, isFailure bool, err error) {
	settled := false
	if probe {
		// A store that panics must not leave the breaker half-open for
		// ever: the panic goes on, and another call probes.
		defer func() {
			if !settled {
				s.br.abandon(s.now())
			}
		}()
	}
	var start time.Time // read only for the hook: the clock can cost more than a memstore decision
	if s.hooks.StoreCall != nil {
		start = s.now()
	}
	var out outcome
	if s.inline {
		d, out, err = s.callInline(ctx, q)
	} else {
		d, out, err = s.callAsync(ctx, q)
	}
	end := s.now()

	switch out {
	case answered:
		s.br.success(end, probe)
	case callerGone:
		// Nobody waits for a decision, and the store is not to blame. A
		// probe lets the next call probe again.
		if probe {
			s.br.abandon(end)
		}
	case failed:
		s.br.failure(end, probe, err)
	}
	settled = true
	if s.hooks.StoreCall != nil {
		s.hooks.StoreCall(ctx, Call{Op: q.op, Policy: q.policy(), Took: end.Sub(start), Err: err, Probe: probe})
	}
	return d, out == failed, err
}

// invoke calls the store's method for q.op. The operations beyond Take and
// Peek are called only if the store implements them (s.ops is set).
func (s *Store) invoke(ctx context.Context, q *query) (sluice.Decision, error) {
	switch q.op {
	case OpTake:
		return s.store.Take(ctx, q.r)
	case OpPeek:
		return s.store.Peek(ctx, q.r)
	case OpTakeAll:
		var err error
		q.md, err = s.ops.TakeAll(ctx, q.rs)
		return sluice.Decision{}, err
	case OpDrain:
		return s.ops.Drain(ctx, q.r)
	case OpRefund:
		return s.ops.Refund(ctx, q.r)
	}
	return sluice.Decision{}, s.ops.Reset(ctx, q.r.Policy, q.r.Key)
}

// callInline calls a NonBlocking store on the caller's goroutine, with the
// caller's context.
func (s *Store) callInline(ctx context.Context, q *query) (sluice.Decision, outcome, error) {
	d, err := s.invoke(ctx, q)
	switch {
	case err == nil || isAnswer(err):
		return d, answered, err
	case ctx.Err() != nil:
		return sluice.Decision{}, callerGone, ctx.Err()
	}
	return d, failed, err
}

// callAsync calls the store on a goroutine of its own and waits for it
// until the earlier of the caller's deadline and the guard's; at that
// moment it stops waiting, and the call, if still running, is abandoned
// (counted in s.stalled until it returns). The call has a copy of q (and of
// a multi-take's requests), so that the caller may reuse its own once it
// has its answer.
func (s *Store) callAsync(ctx context.Context, q *query) (sluice.Decision, outcome, error) {
	deadline := time.Now().Add(s.timeout)
	callerDeadline, callerFirst := ctx.Deadline()
	callerFirst = callerFirst && !deadline.Before(callerDeadline)
	storeCtx, wait := ctx, ctx.Done()
	var late <-chan time.Time // only for a caller's context with a deadline but no Done channel
	switch {
	case !callerFirst:
		var cancel context.CancelFunc
		storeCtx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		wait = storeCtx.Done()
	case wait == nil:
		t := time.NewTimer(time.Until(callerDeadline))
		defer t.Stop()
		late = t.C
	}

	c := &pending{s: s, ctx: storeCtx, q: *q, done: make(chan struct{}, 1)}
	if q.op == OpTakeAll {
		c.q.rs = slices.Clone(q.rs)
	}
	go c.run()
	stopped := false
	select {
	case <-c.done:
	case <-wait:
		stopped = true
	case <-late:
		stopped = true
	}
	if stopped {
		s.stalled.Add(1)
		if c.state.CompareAndSwap(running, abandoned) {
			// The store has not returned: answer now, without it.
			if ctx.Err() != nil || callerFirst {
				return sluice.Decision{}, callerGone, callerErr(ctx)
			}
			return sluice.Decision{}, failed, fmt.Errorf("%w (%v): the store had not returned: %w", ErrTimeout, s.timeout, context.DeadlineExceeded)
		}
		s.stalled.Add(-1) // it returned meanwhile: its result is in c
		<-c.done
	}
	d, err := c.d, c.err
	if c.panicked {
		panic(c.pv)
	}
	q.md = c.q.md
	if err == nil || isAnswer(err) {
		return d, answered, err
	}
	// The store failed. Whose deadline, if any, had passed when it did?
	// (A socket deadline set from the context fires at the same moment as
	// the context's timer, and may be seen first.)
	now := time.Now()
	switch {
	case ctx.Err() != nil, callerFirst && !now.Before(callerDeadline):
		return sluice.Decision{}, callerGone, callerErr(ctx)
	case !callerFirst && (storeCtx.Err() != nil || !now.Before(deadline)):
		return sluice.Decision{}, failed, fmt.Errorf("%w (%v): %w", ErrTimeout, s.timeout, err)
	}
	return d, failed, err
}

// callerErr returns the error of the caller's context, which has ended or
// whose deadline has passed (its timer may fire a moment after a socket
// deadline set from it).
func callerErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// States of a pending call.
const (
	running   uint32 = iota // the store has not returned; the caller waits
	finished                // the store returned; its result is in the call
	abandoned               // the caller stopped waiting; the goroutine owns the call
)

// pending is one store call running on its own goroutine. The caller and
// the goroutine settle through state who takes the result: whoever moves it
// from running. (The calls are not pooled: a channel made inside a
// testing/synctest bubble must not be used outside it.)
type pending struct {
	s     *Store
	ctx   context.Context
	q     query
	done  chan struct{} // one value once finished; buffered
	state atomic.Uint32

	d        sluice.Decision
	err      error
	panicked bool
	pv       any
}

// run calls the store and hands the result to the caller, or, if the
// caller stopped waiting, drops it. A panic of the store is raised again on
// the caller's goroutine if it still waits, else on this one.
func (c *pending) run() {
	ok := false
	defer func() {
		if !ok {
			c.panicked, c.pv = true, recover()
		}
		if c.state.CompareAndSwap(running, finished) {
			c.done <- struct{}{}
			return
		}
		c.s.stalled.Add(-1)
		if c.panicked {
			panic(c.pv) // nobody to hand it to
		}
	}()
	c.d, c.err = c.s.invoke(c.ctx, &c.q)
	ok = true
}
