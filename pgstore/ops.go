package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// TakeAll implements sluice.Operator. It validates rs with
// sluice.ValidateAll (a limit that CheckLimit refuses is
// sluice.ErrInvalidLimit, naming the bucket), then decides every bucket in
// one statement: each request's cost is taken from its bucket if every
// bucket covers its own cost, and from none otherwise. The buckets' rows
// are locked in the order of (policy, key), whatever the order of rs, so
// that multi-takes naming the same buckets in different orders never
// deadlock. A denied multi-take writes every bucket back as a denied Take
// of it would (refilled, converted, created full if it was missing), so
// that the next decisions are those of a store that had decided each
// bucket alone. Each of md.Parts is the decision of its bucket alone, with
// Taken 0. Errors are otherwise those of Take.
func (s *Store) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := sluice.ValidateAll(rs); err != nil {
		return sluice.MultiDecision{}, err
	}
	ps := make([]bucket.Plan, len(rs))
	for i, r := range rs {
		p, err := plan(r.Limit)
		if err != nil {
			return sluice.MultiDecision{}, fmt.Errorf("bucket %d: %w", i, err)
		}
		ps[i] = p
	}
	parts, err := s.takeAll(ctx, "take all", rs, ps, false)
	if err != nil {
		return sluice.MultiDecision{}, err
	}
	md := sluice.MultiDecision{Parts: parts}
	md.Combine()
	return md, nil
}

// Drain implements sluice.Operator: it validates r with ValidateDrain (its
// cost may exceed the capacity; no request ID), then takes the smaller of
// r.Cost and the bucket's whole tokens in one statement, creating a
// missing bucket as Take does. Taken is what it took; Allowed reports
// whether that was all of r.Cost, and RetryAfter, when not, is the wait
// until r.Cost tokens are there, Never if r.Cost exceeds the capacity.
// Errors are those of Take.
func (s *Store) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := plan(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	parts, err := s.takeAll(ctx, "drain", []sluice.Request{r}, []bucket.Plan{p}, true)
	if err != nil {
		return sluice.Decision{}, err
	}
	return parts[0], nil
}

// takeAll decides rs, whose plans are ps, with the multi-take function:
// all or nothing, or, with drain, each bucket giving what it has up to its
// cost (and Taken set to that).
func (s *Store) takeAll(ctx context.Context, op string, rs []sluice.Request, ps []bucket.Plan, drain bool) ([]sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.checkSchema(ctx, op); err != nil {
		return nil, err
	}
	n := len(rs)
	var (
		policies = make([]string, n)
		keys     = make([][]byte, n)
		costs    = make([]int64, n)
		caps     = make([]int64, n)
		tokens   = make([]int64, n)
		periods  = make([]int64, n)
		units    = make([]int64, n)
		scales   = make([]int64, n)
	)
	for i, r := range rs {
		policies[i], keys[i], costs[i] = r.Policy, []byte(r.Key), r.Cost
		caps[i], tokens[i], periods[i] = r.Limit.Capacity, r.Limit.Rate.Tokens, int64(r.Limit.Rate.Period/time.Microsecond)
		units[i], scales[i] = int64(ps[i].RefillUnits()), int64(ps[i].Scale())
	}
	var (
		allowed                       []bool
		remaining, retry, reset, took []int64
		lockWait                      int64
		conversions                   int32
	)
	err := s.queryRow(ctx, s.takeAllSQL, []any{&allowed, &remaining, &retry, &reset, &took, &lockWait, &conversions},
		policies, keys, costs, caps, tokens, periods, units, scales, s.conv, drain, s.nowMicros())
	if err != nil {
		return nil, s.decisionError(op, err)
	}
	s.count(lockWait, conversions)
	if len(allowed) != n || len(remaining) != n || len(retry) != n || len(reset) != n || len(took) != n {
		return nil, fmt.Errorf("%w: %s: %s decided %d buckets of %d; it is not this version's function (run Migrate)", sluice.ErrMisconfigured, op, s.names.TakeAll, len(allowed), n)
	}
	ds := make([]sluice.Decision, n)
	for i, r := range rs {
		ds[i] = sluice.Decision{
			Allowed:    allowed[i],
			Remaining:  remaining[i],
			RetryAfter: wait(retry[i]),
			ResetAfter: wait(reset[i]),
			Limit:      r.Limit,
		}
		if drain {
			ds[i].Taken = took[i]
		}
	}
	return ds, nil
}

// The o_status of the refund function.
const (
	refundGiven    = 0
	refundReplayed = 1
	refundConflict = 2
	refundUnknown  = 3
)

// Refund implements sluice.Operator: it validates r with ValidateRefund
// (the cost, the tokens to give back, is 1 to the capacity), then, in one
// statement, raises the whole tokens t of the bucket by
// a = min(r.Cost, capacity - t), a level that reaches the capacity being
// exactly full; Taken is -a. A bucket that is full at now is left as it
// is, unwritten, and so is a missing one (which is full): nothing is given
// back, and nothing is created.
//
// With a request ID, the refund undoes the allowed take remembered for
// that ID (for Options.RequestIDTTL), once: the record is marked refunded
// in the same statement, and a second refund of the ID is Replayed, with
// Taken 0 and the bucket's current Remaining and ResetAfter, changing
// nothing. An ID that is not remembered for the bucket (never taken, only
// denied, or expired) is sluice.ErrUnknownRequestID; a refund under
// another limit than the take's, or of more than its cost, is
// sluice.ErrRequestIDConflict; neither changes anything. A replay of the
// take itself is still its remembered decision. Errors are otherwise those
// of Take.
func (s *Store) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := plan(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.checkSchema(ctx, "refund"); err != nil {
		return sluice.Decision{}, err
	}
	var id []byte
	if r.RequestID != "" {
		id = []byte(r.RequestID)
	}
	var (
		status                                 int32
		remaining, reset, added                int64
		idCost, idCapacity, idTokens, idPeriod int64
		lockWait                               int64
		converted                              bool
	)
	l := r.Limit
	err = s.queryRow(ctx, s.refundSQL,
		[]any{&status, &remaining, &reset, &added, &idCost, &idCapacity, &idTokens, &idPeriod, &lockWait, &converted},
		r.Policy, []byte(r.Key), r.Cost, l.Capacity, l.Rate.Tokens, int64(l.Rate.Period/time.Microsecond), int64(p.RefillUnits()), int64(p.Scale()),
		s.conv, id, s.nowMicros())
	if err != nil {
		return sluice.Decision{}, s.decisionError("refund", err)
	}
	s.count(lockWait, one(converted))
	switch status {
	case refundGiven, refundReplayed:
		return sluice.Decision{
			Allowed:    true,
			Remaining:  remaining,
			ResetAfter: wait(reset),
			Taken:      -added,
			Limit:      l,
			Replayed:   status == refundReplayed,
		}, nil
	case refundUnknown:
		return sluice.Decision{}, fmt.Errorf("%w: no allowed take of policy %q key %q with request ID %q is remembered (never taken, denied, or older than the request-ID TTL of %v)",
			sluice.ErrUnknownRequestID, r.Policy, r.Key, r.RequestID, time.Duration(s.idTTL)*time.Microsecond)
	case refundConflict:
		first := sluice.Limit{Capacity: idCapacity, Rate: sluice.Rate{Tokens: idTokens, Period: time.Duration(idPeriod) * time.Microsecond}}
		return sluice.Decision{}, fmt.Errorf("%w: request ID %q of policy %q key %q took %d under %v; a refund of %d under %v does not undo it (refund at most %d, under that limit)",
			sluice.ErrRequestIDConflict, r.RequestID, r.Policy, r.Key, idCost, first, r.Cost, l, idCost)
	}
	return sluice.Decision{}, fmt.Errorf("%w: refund: %s returned the status %d; it is not this version's function (run Migrate)", sluice.ErrMisconfigured, s.names.Refund, status)
}

// Reset implements sluice.Operator: it validates policy and key
// (sluice.ValidateReset), then, in one statement, makes the bucket full
// under the limit it was last decided under, stamped at the store's time
// or at its stamp if that is later. The row is kept, not deleted, so that
// a decision whose time is behind the stamp refills from the stamp as it
// would have; the sweeper deletes it, full, like any other. A bucket that
// is full at that time already, or missing, is left as it is, and request
// IDs are kept (a retry of a take before the reset is still a replay).
// Reset waits for the bucket's row lock like a decision, up to
// Options.LockTimeout. Errors are those of Take.
func (s *Store) Reset(ctx context.Context, policy, key string) error {
	if err := sluice.ValidateReset(policy, key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.checkSchema(ctx, "reset"); err != nil {
		return err
	}
	var reset bool
	if err := s.queryRow(ctx, s.resetSQL, []any{&reset}, policy, []byte(key), s.nowMicros()); err != nil {
		return s.dbError("reset", err)
	}
	return nil
}
