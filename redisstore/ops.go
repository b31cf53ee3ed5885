package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice"
)

// TakeAll implements sluice.Operator: the requests' buckets decided
// together, each cost taken if every bucket covers its own and none
// otherwise. Its errors are Take's; a request the store cannot decide
// (CheckLimit) is sluice.ErrInvalidLimit naming its index, and nothing is
// sent.
//
// On a standalone server, and on a Cluster when every bucket is in one
// slot, it is one script run: one atomic step, all or nothing, as Take is.
// Every policy of one key shares that key's slot (see docs/redis.md,
// "Keys"), so the common stacked limit (a burst and a daily quota of one
// user) is always one script.
//
// On a Cluster with buckets in several slots (on a Ring, under several
// keys) no script can see them all. TakeAll then decides the slots one
// after another, in ascending slot order, each all or nothing in one
// script; when a slot denies, it gives back exactly what the earlier slots
// took (a refund script, capped at capacity), decides the later slots
// without taking anything, and returns the denial, with each part as a
// Take of that bucket alone would have seen it had nothing been taken.
// This never oversells: what is given back is only what was taken. It can
// undersell for a moment: a caller that takes from an earlier slot's
// bucket between the take and the refund may be denied for want of tokens
// that come back a round trip later. If the refund cannot be sent (Redis
// unavailable, ctx ended), the tokens stay taken, as if used, and
// Stats().LostRefunds counts the call; the denial is still returned. An
// error in a later slot (Redis unavailable there, a foreign value) gives
// back what the earlier slots took and returns the error. Each slot is a
// round trip: Stats().CrossSlotTakes counts these calls, and
// docs/BENCHMARKS.md measures them.
func (s *Store) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := sluice.ValidateAll(rs); err != nil {
		return sluice.MultiDecision{}, err
	}
	specs := make([]string, len(rs))
	for i := range rs {
		pl, err := compile(rs[i].Limit)
		if err != nil {
			return sluice.MultiDecision{}, fmt.Errorf("bucket %d: %w", i, err)
		}
		specs[i] = s.spec(pl)
	}
	now, err := s.clock()
	if err != nil {
		return sluice.MultiDecision{}, err
	}
	m := multi{s: s, rs: rs, specs: specs, now: now, parts: make([]sluice.Decision, len(rs))}
	groups := s.groups(rs)
	if len(groups) > 1 {
		s.crossSlot.Add(1)
	}
	var took [][]int // the groups that took their costs
	for g, idx := range groups {
		allowed, err := m.decide(ctx, "all", idx)
		if err != nil {
			m.giveBack(ctx, took)
			return sluice.MultiDecision{}, err
		}
		if allowed {
			took = append(took, idx)
			continue
		}
		m.giveBack(ctx, took)
		for _, idx := range groups[g+1:] {
			if _, err := m.decide(ctx, "deny", idx); err != nil {
				return sluice.MultiDecision{}, err
			}
		}
		break
	}
	md := sluice.MultiDecision{Parts: m.parts}
	md.Combine()
	return md, nil
}

// multi is one TakeAll in progress: the requests, their specs, the time
// argument and the parts decided so far.
type multi struct {
	s     *Store
	rs    []sluice.Request
	specs []string
	now   any
	parts []sluice.Decision
}

// decide runs op ("all", "deny" or "giveback") on the parts idx, which
// share a slot, fills their decisions in m.parts and reports whether every
// part covered its cost (for "all": whether they were taken).
func (m *multi) decide(ctx context.Context, op string, idx []int) (bool, error) {
	keys := make([]string, len(idx))
	args := make([]any, 0, 2+2*len(idx))
	args = append(args, op, m.now)
	for j, i := range idx {
		keys[j] = m.s.bucketKey(m.rs[i].Policy, m.rs[i].Key)
		args = append(args, m.specs[i], m.rs[i].Cost)
	}
	reply, err := m.s.call(ctx, keys, args...)
	if err != nil {
		return false, err
	}
	if len(reply) != replyLen*len(idx) {
		return false, scriptErrorf("reply of %d values to %q of %d buckets", len(reply), op, len(idx))
	}
	all := true
	for j, i := range idx {
		one := reply[replyLen*j : replyLen*(j+1)]
		d, converted, err := decision(one, m.rs[i].Limit)
		if err == nil && (d.Replayed || op == "giveback" && (!d.Allowed || d.RetryAfter != 0)) {
			err = scriptErrorf("reply %q to %q is not the decision of a part", one, op)
		}
		if err != nil {
			return false, err
		}
		if converted {
			m.s.conversions.Add(1)
		}
		m.parts[i] = d
		all = all && d.Allowed
	}
	return all, nil
}

// giveBack gives back to the buckets of the groups that took their costs
// (at the call's time argument), and makes their parts the decisions after
// the refund: as if nothing had been taken, unless other callers used the
// buckets meanwhile. A group whose refund fails keeps its tokens taken and
// the decisions of the take; Stats().LostRefunds counts the call once.
func (m *multi) giveBack(ctx context.Context, took [][]int) {
	lost := false
	for _, idx := range took {
		before := make([]sluice.Decision, len(idx))
		for j, i := range idx {
			before[j] = m.parts[i]
		}
		if _, err := m.decide(ctx, "giveback", idx); err != nil {
			for j, i := range idx {
				m.parts[i] = before[j]
			}
			lost = true
		}
	}
	if lost {
		m.s.lostRefunds.Add(1)
	}
}

// groups returns the indexes of rs grouped so that each group's buckets
// can be one script's keys: all of them on a standalone server; on a
// Cluster one group per slot, in ascending slot order; otherwise one group
// per key (whose buckets share a hash tag), ordered by slot and key. Within
// a group the indexes are in order.
func (s *Store) groups(rs []sluice.Request) [][]int {
	idx := make([]int, len(rs))
	one := true
	for i := range rs {
		idx[i] = i
		one = one && rs[i].Key == rs[0].Key
	}
	if s.spread == anyKeys || one {
		return [][]int{idx}
	}
	slots := make([]int, len(rs))
	for i := range rs {
		slots[i] = clusterSlot(rs[i].Key)
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if c := cmp.Compare(slots[a], slots[b]); c != 0 || s.spread == slotKeys {
			return c
		}
		return cmp.Compare(rs[a].Key, rs[b].Key)
	})
	var out [][]int
	for j, i := range idx {
		if j > 0 {
			prev := idx[j-1]
			if slots[prev] == slots[i] && (s.spread == slotKeys || rs[prev].Key == rs[i].Key) {
				last := out[len(out)-1]
				out[len(out)-1] = append(last, i)
				continue
			}
		}
		out = append(out, []int{i})
	}
	return out
}

// Drain implements sluice.Operator: one script run, which takes the
// smaller of r.Cost and the bucket's whole tokens. A cost above the
// capacity takes what is there and is never allowed (RetryAfter
// sluice.Never). Its errors are Take's (a drain takes no request ID).
func (s *Store) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	pl, err := compile(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	now, err := s.clock()
	if err != nil {
		return sluice.Decision{}, err
	}
	// The script's numbers stay within the capacity: a larger cost takes
	// what a cost of the capacity takes, and is never all there.
	cost := min(r.Cost, r.Limit.Capacity)
	reply, err := s.call(ctx, []string{s.bucketKey(r.Policy, r.Key)}, "drain", now, s.spec(pl), cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	d, moved, converted, err := movedDecision(reply, r.Limit)
	if err == nil && (d.Replayed || moved > cost || d.Allowed != (moved == cost)) {
		err = scriptErrorf("reply %q is not the decision of a drain of %d", reply, cost)
	}
	if err != nil {
		return sluice.Decision{}, err
	}
	if converted {
		s.conversions.Add(1)
	}
	if r.Cost > r.Limit.Capacity {
		d.Allowed, d.RetryAfter = false, sluice.Never
	}
	d.Taken = moved
	return d, nil
}

// Refund implements sluice.Operator: one script run, which gives r.Cost
// tokens back to the bucket, never above its capacity; a missing bucket is
// full and stays missing. With a request ID, it undoes the allowed take of
// that ID the store remembers for (r.Policy, r.Key), in the same script
// that marks its record refunded: the first refund gives back r.Cost (at
// most the take's cost, under the take's limit, else
// sluice.ErrRequestIDConflict), a second is Replayed and gives nothing, an
// ID not remembered (never taken, denied, past Options.RequestIDTTL) is
// sluice.ErrUnknownRequestID. Neither error changes anything. Its other
// errors are Take's.
func (s *Store) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	pl, err := compile(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	now, err := s.clock()
	if err != nil {
		return sluice.Decision{}, err
	}
	keys := []string{s.bucketKey(r.Policy, r.Key)}
	args := []any{"refund", now, s.spec(pl), r.Cost}
	if r.RequestID != "" {
		keys = append(keys, s.recordKey(r.Policy, r.Key, r.RequestID))
		args = append(args, s.idTTL)
	}
	reply, err := s.call(ctx, keys, args...)
	if err != nil {
		return sluice.Decision{}, err
	}
	if r.RequestID != "" {
		switch {
		case len(reply) == 1 && reply[0] == kindUnknown:
			return sluice.Decision{}, fmt.Errorf("%w: redisstore: no allowed take of policy %q key %q with request ID %q is remembered (never taken, denied, or older than the request-ID TTL)",
				sluice.ErrUnknownRequestID, r.Policy, r.Key, r.RequestID)
		case len(reply) == replyLen && reply[0] == kindConflict:
			return sluice.Decision{}, fmt.Errorf("%w: request ID %q of policy %q key %q took %v under limit %s; a refund of %d under %q does not undo it",
				sluice.ErrRequestIDConflict, r.RequestID, r.Policy, r.Key, reply[1], recordLimit(reply[2:]), r.Cost, r.Limit)
		}
	}
	d, moved, converted, err := movedDecision(reply, r.Limit)
	if err == nil && (!d.Allowed || d.RetryAfter != 0 || moved > r.Cost || d.Replayed && (moved != 0 || r.RequestID == "")) {
		err = scriptErrorf("reply %q is not the decision of a refund of %d", reply, r.Cost)
	}
	if err != nil {
		return sluice.Decision{}, err
	}
	if converted {
		s.conversions.Add(1)
	}
	d.Taken = -moved
	return d, nil
}

// Reset implements sluice.Operator: one script run, which makes the
// bucket of (policy, key), if there is one, full under the limit it is
// stored under, stamped at now or at its stamp if that is later, and
// keeps the request-ID records; a missing bucket stays missing. Errors:
// sluice.ErrInvalidPolicy or sluice.ErrInvalidKey (nothing sent), and
// Take's store errors.
func (s *Store) Reset(ctx context.Context, policy, key string) error {
	if err := sluice.ValidateReset(policy, key); err != nil {
		return err
	}
	now, err := s.clock()
	if err != nil {
		return err
	}
	reply, err := s.call(ctx, []string{s.bucketKey(policy, key)}, "reset", now, s.minTTL)
	if err != nil {
		return err
	}
	if len(reply) == 1 {
		if n, ok := reply[0].(int64); ok && (n == 0 || n == 1) {
			return nil
		}
	}
	return scriptErrorf("reply %q is not the outcome of a reset", reply)
}
