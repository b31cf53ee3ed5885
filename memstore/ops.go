package memstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// part is one bucket of a multi-take while its shards are locked.
type part struct {
	pn  policyName
	sh  *shard
	tg  uint32
	idx int32 // in sh.table.entries; -1 while missing
	// pr is the plan acquired for the request's limit when the bucket is
	// missing (fresh) or was last decided under another limit; nil when
	// the bucket keeps its plan.
	pr    *planRef
	fresh bool
}

// TakeAll implements sluice.Operator: it validates rs (sluice.ValidateAll),
// then decides every bucket in one step with all their shards locked. Each
// bucket is brought up to date as a Take of it would be (a missing one
// created full, one under another limit converted and counted in
// Stats.Conversions); if each covers its cost, each is charged, otherwise
// none is and each keeps its refilled state. A request that passes
// validation returns ctx.Err() if ctx is already done.
//
// The shards are locked in the order of their index, each once however
// many of the buckets it holds, so multi-takes never deadlock with each
// other; every other call holds one shard lock and waits for no other
// while holding it.
//
// Missing buckets need room: if the store refuses one (ErrTooManyKeys
// under RefuseNew), the multi-take fails and creates, charges and
// converts nothing; making room never reclaims or evicts one of its own
// buckets.
func (s *Store) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := sluice.ValidateAll(rs); err != nil {
		return sluice.MultiDecision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.MultiDecision{}, err
	}
	// Room for the usual few parts on the stack.
	var (
		partBuf  [4]part
		shardBuf [sluice.MaxParts]uint32
	)
	ps := partBuf[:0]
	if len(rs) > len(partBuf) {
		ps = make([]part, 0, len(rs))
	}
	order := shardBuf[:len(rs)]
	for i := range rs {
		pn, h := s.identify(rs[i].Policy, rs[i].Key)
		ps = append(ps, part{pn: pn, sh: &s.shards[h&s.mask], tg: tag(h, s.shardBits)})
		order[i] = uint32(h & s.mask)
	}
	slices.Sort(order)
	order = slices.Compact(order)
	for _, i := range order {
		s.shards[i].mu.Lock()
	}
	md, err := s.takeAll(rs, ps)
	for _, i := range order {
		s.shards[i].mu.Unlock()
	}
	return md, err
}

// takeAll is TakeAll with the shards of every part locked.
func (s *Store) takeAll(rs []sluice.Request, ps []part) (sluice.MultiDecision, error) {
	now := s.clock()
	// Everything that can fail comes first: plans for the buckets to
	// create or convert, then room for the new ones, all given back on
	// an error.
	var err error
	fresh := false
	for i := range ps {
		p := &ps[i]
		idx, _ := p.sh.table.find(p.pn, rs[i].Key, p.tg)
		p.idx = int32(idx)
		if idx >= 0 && p.sh.table.entries[idx].plan.plan.Limit() == rs[i].Limit {
			continue
		}
		p.fresh = idx < 0
		fresh = fresh || p.fresh
		if p.pr, err = p.sh.acquire(p.pn, rs[i].Limit); err != nil {
			break
		}
	}
	if err == nil && fresh {
		err = s.reserveAll(rs, ps, now)
	}
	if err != nil {
		for i := range ps {
			if ps[i].pr != nil {
				ps[i].sh.release(ps[i].pr)
			}
		}
		return sluice.MultiDecision{}, err
	}
	if fresh {
		// Making room dropped no part (they are pinned) but may have
		// moved them in their tables: find them again once all are
		// inserted, after which nothing moves until the shards are
		// unlocked.
		for i := range ps {
			if p := &ps[i]; p.fresh {
				s.insert(p.sh, p.pr, rs[i].Key, p.tg, now)
			}
		}
		for i := range ps {
			idx, _ := ps[i].sh.table.find(ps[i].pn, rs[i].Key, ps[i].tg)
			ps[i].idx = int32(idx)
		}
	}

	all := true
	for i := range ps {
		p := &ps[i]
		b := &p.sh.table.entries[p.idx]
		if p.pr != nil && !p.fresh {
			s.convert(p.sh, b, p.pr, now)
		}
		b.state = b.plan.plan.Refill(b.state, now)
		// A fraction is less than one token: the level covers the cost
		// iff its whole tokens do.
		all = all && b.state.Tokens >= rs[i].Cost
	}
	md := sluice.MultiDecision{Parts: make([]sluice.Decision, len(rs))}
	for i := range ps {
		p, d := &ps[i], &md.Parts[i]
		b := &p.sh.table.entries[p.idx]
		if all {
			b.plan.plan.Take(&b.state, now, rs[i].Cost, d)
		} else {
			*d = b.plan.plan.Peek(b.state, now, rs[i].Cost)
		}
		p.sh.noteFullAt(now, d.ResetAfter)
	}
	md.Combine()
	return md, nil
}

// reserveAll reserves room for the fresh parts of a multi-take (their
// shards locked by the caller), all or none: without room for one, it
// gives back what it reserved and returns the error. Making room never
// drops a bucket of the multi-take.
func (s *Store) reserveAll(rs []sluice.Request, ps []part, now int64) error {
	var buf [sluice.MaxParts]pin
	pins := buf[:len(ps)]
	for i := range ps {
		pins[i] = pin{policy: ps[i].pn, key: rs[i].Key}
	}
	var reserved int64
	for i := range ps {
		if !ps[i].fresh {
			continue
		}
		if err := s.reserveKey(ps[i].sh, now, pins); err != nil {
			s.keys.Add(-reserved)
			return err
		}
		reserved++
	}
	return nil
}

// Drain implements sluice.Operator: it validates r (ValidateDrain: the
// cost may exceed the capacity), then takes the smaller of r.Cost and the
// bucket's whole tokens. The bucket is brought up to date as by Take,
// created (if the store has room) or converted. Allowed reports whether
// all of r.Cost was there, Taken what was taken; RetryAfter (when not
// allowed) is the wait until r.Cost tokens are there, Never if r.Cost
// exceeds the capacity.
func (s *Store) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateDrain(); err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	pn, h := s.identify(r.Policy, r.Key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.clock()
	b, err := s.bucket(sh, &r, pn, tag(h, s.shardBits), now)
	if err != nil {
		return sluice.Decision{}, err
	}
	var d sluice.Decision
	b.plan.plan.Drain(&b.state, now, r.Cost, &d)
	sh.noteFullAt(now, d.ResetAfter)
	return d, nil
}

// Refund implements sluice.Operator: it validates r (ValidateRefund), then
// raises the bucket's whole tokens by r.Cost, never above the capacity (a
// level that reaches it is exactly full); Taken is minus what was given
// back. A bucket under another limit is converted first, as by Take. A
// bucket that is full at now (as a missing one is) is left exactly as it
// was: nothing is written, converted or created.
//
// With a request ID, the refund undoes the allowed take that the store
// remembers with that ID for (r.Policy, r.Key), once: a second refund is a
// replay (Replayed, Taken 0, the bucket as it is now) and changes nothing.
// It returns ErrUnknownRequestID if no such take is remembered (never
// taken, denied, or its RequestIDTTL is over), ErrRequestIDConflict if
// r.Limit is not the take's limit or r.Cost exceeds its cost. A replay of
// the take itself is still answered as before, charging nothing.
func (s *Store) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidateRefund(); err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	pn, h := s.identify(r.Policy, r.Key)
	sh := &s.shards[h&s.mask]
	tg := tag(h, s.shardBits)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.clock()
	var rec *idRecord
	if r.RequestID != "" {
		rec = sh.ids.records[idKey{r.Policy, r.Key, r.RequestID}]
		if rec == nil || now >= rec.expires {
			return sluice.Decision{}, fmt.Errorf("%w: no allowed take of policy %q with request ID %q is remembered for this key (never taken, denied, or older than the request-ID TTL, %v)",
				sluice.ErrUnknownRequestID, r.Policy, r.RequestID, time.Duration(s.idTTL))
		}
		if rec.decision.Limit != r.Limit || r.Cost > rec.cost {
			return sluice.Decision{}, fmt.Errorf("%w: request ID %q of policy %q took %d under limit %v from this key; a refund of it gives back 1 to %d under that limit, not %d under %v",
				sluice.ErrRequestIDConflict, r.RequestID, r.Policy, rec.cost, rec.decision.Limit, rec.cost, r.Cost, r.Limit)
		}
		if rec.refunded {
			return s.refundReplay(sh, &r, pn, tg, now)
		}
	}
	var d sluice.Decision
	idx, _ := sh.table.find(pn, r.Key, tg)
	switch {
	case idx >= 0 && sh.table.entries[idx].plan.plan.Limit() == r.Limit:
		b := &sh.table.entries[idx]
		if b.plan.plan.Refund(&b.state, now, r.Cost, &d) {
			sh.noteFullAt(now, d.ResetAfter)
		}
	case idx >= 0:
		// Converted, unless the converted bucket is full: then nothing
		// is written.
		b := &sh.table.entries[idx]
		pr, err := sh.acquire(pn, r.Limit)
		if err != nil {
			return sluice.Decision{}, err
		}
		old := &b.plan.plan
		st := pr.plan.Convert(old.Refill(b.state, now), old, s.conversion)
		if !pr.plan.Refund(&st, now, r.Cost, &d) {
			sh.release(pr)
			break
		}
		sh.release(b.plan)
		b.state, b.plan = st, pr
		s.conversions.Add(1)
		sh.noteFullAt(now, d.ResetAfter)
	default:
		// Full: nothing to give back, and nothing to create.
		pl, err := bucket.NewPlan(r.Limit, time.Nanosecond)
		if err != nil {
			return sluice.Decision{}, err
		}
		st := pl.Full(max(now, sh.floor))
		pl.Refund(&st, now, r.Cost, &d)
	}
	if rec != nil {
		rec.refunded = true
	}
	return d, nil
}

// refundReplay answers a refund whose request ID was refunded already
// (sh locked by the caller): the bucket as a take of r would see it now,
// and nothing changed.
func (s *Store) refundReplay(sh *shard, r *sluice.Request, pn policyName, tg uint32, now int64) (sluice.Decision, error) {
	var d sluice.Decision
	idx, _ := sh.table.find(pn, r.Key, tg)
	if idx >= 0 && sh.table.entries[idx].plan.plan.Limit() == r.Limit {
		b := &sh.table.entries[idx]
		d = b.plan.plan.Peek(b.state, now, 1)
	} else {
		pl, err := bucket.NewPlan(r.Limit, time.Nanosecond)
		if err != nil {
			return sluice.Decision{}, err
		}
		st := pl.Full(max(now, sh.floor))
		if idx >= 0 {
			old := &sh.table.entries[idx]
			st = pl.Convert(old.plan.plan.Refill(old.state, now), &old.plan.plan, s.conversion)
		}
		d = pl.Peek(st, now, 1)
	}
	d.Allowed, d.RetryAfter, d.Replayed = true, 0, true
	return d, nil
}

// Reset implements sluice.Operator: it validates policy and key
// (sluice.ValidateReset), then makes their bucket full under the limit it
// was last decided under, as if it had never been used. Request IDs are
// kept. A bucket that is full at now (as a missing one is) is left as it
// is.
//
// The bucket is kept, stamped at the later of now and its stamp, rather
// than dropped: a later reading from a clock that stepped back must not
// recreate it at an earlier time (see SweepNow).
func (s *Store) Reset(ctx context.Context, policy, key string) error {
	if err := sluice.ValidateReset(policy, key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	pn, h := s.identify(policy, key)
	sh := &s.shards[h&s.mask]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.clock()
	if idx, _ := sh.table.find(pn, key, tag(h, s.shardBits)); idx >= 0 {
		if b := &sh.table.entries[idx]; b.plan.plan.Reset(&b.state, now) {
			sh.noteFullAt(now, 0)
		}
	}
	return nil
}
