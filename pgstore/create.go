package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Takes of new keys.
//
// A take that creates its bucket is the common case where keys are many
// (each client's first request, and every bucket the sweeper deleted full),
// and the take function spends most of its time there on being a function:
// PL/pgSQL starts an executor for each of its statements (a probe that finds
// nothing, the insert, a read of the sweep floor) on top of the call. So a
// take may instead send, in one round trip and one transaction, two plain
// statements:
//
//  1. createSQL inserts the bucket as the function would create it (full
//     at now, less the cost, which a request's validation keeps at most the
//     capacity), returning its stamp (now); ON CONFLICT DO NOTHING leaves an
//     existing bucket alone and returns no row, and so does a NOT EXISTS
//     guard, which sees a bucket that exists without waiting for a lock on
//     it. It also sets the stamp as a setting of the transaction
//     (stampSetting) for statement 2, at the latest before it inserts (a
//     bucket that the guard finds there may leave it unset: then there is
//     nothing to check).
//  2. floorSQL checks the stamp against the sweep floor: if a sweep has
//     raised the floor above it, it fails (floorMarker), which rolls the
//     transaction back, and the take goes to the function, which creates
//     the bucket at the floor. It is a statement of its own so that, at
//     READ COMMITTED, its snapshot is taken after the insert: a sweep that
//     deleted the bucket while the insert waited for it has committed by
//     then, and its floor is seen. It reads one row of one table, which
//     costs less than a statement that would move the stamp to the floor
//     in place (an UPDATE of the bucket).
//
// The decision of a created bucket needs no read: it is allowed, with
// capacity - cost left, and full again reset µs after now, which Go
// computes as the function does. When statement 1 finds the bucket, or
// statement 2 the floor above the stamp, the take is decided by the
// function in a second round trip, so that path is
// slower than the function alone: the store tries the insert first only
// while most of its recent tries created their bucket (insertFirst), and
// takes with a request ID (which must find a remembered decision even when
// the bucket was swept), or under a limit whose arithmetic needs numeric,
// always go to the function.
//
// Statement 1 inserts nothing outside READ COMMITTED, so that the function,
// called next, refuses the isolation level as it always does.

// stampSetting is the transaction's setting by which statement 1 hands its
// stamp to statement 2.
const stampSetting = "sluice_pgstore.stamp"

// floorMarker starts the text that statement 2 fails to read as a number
// (SQLSTATE 22P02) when the sweep floor is above the new bucket's stamp.
const floorMarker = "sluice pgstore: a new bucket stamped before the sweep floor"

// isFloorCheck reports whether err is statement 2's failure.
func isFloorCheck(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, floorMarker)
}

// The insert-first score: a created bucket adds 1, a bucket found existing
// subtracts insertFirstMissCost, within [insertFirstMin, insertFirstMax].
// Takes try the insert first while the score is above 0, so while at least
// insertFirstMissCost/(insertFirstMissCost+1) of the tries create (3/4,
// about where a try that finds the bucket, an insert and a round trip
// more than the function alone, costs as much as the creations save).
// Below that, every insertFirstProbe-th take tries it anyway, so that the
// store notices when new keys come back: from the floor of the score,
// (1-insertFirstMin) creating tries in a row, insertFirstProbe takes
// apart, bring it back above 0.
const (
	insertFirstStart    = 1
	insertFirstMax      = 8
	insertFirstMin      = -4
	insertFirstMissCost = 3
	insertFirstProbe    = 32
)

// The modes of Store.insertFirstMode: adaptive (the default), or one path
// always, for tests.
const (
	insertFirstAdaptive = iota
	insertFirstAlways
	insertFirstNever
)

// insertFirst reports whether a take eligible for the insert-first path
// should try it.
func (s *Store) insertFirst() bool {
	switch s.insertFirstMode {
	case insertFirstAlways:
		return true
	case insertFirstNever:
		return false
	}
	if s.insertScore.Load() > 0 {
		return true
	}
	return s.insertProbe.Add(1)%insertFirstProbe == 0
}

// noteInsertFirst adds the outcome of an insert-first try to the score and
// to Stats.
func (s *Store) noteInsertFirst(created bool) {
	s.insertFirstTries.Add(1)
	d := int32(1)
	if !created {
		s.insertFirstMisses.Add(1)
		d = -insertFirstMissCost
	}
	for {
		old := s.insertScore.Load()
		v := min(max(old+d, insertFirstMin), insertFirstMax)
		if v == old || s.insertScore.CompareAndSwap(old, v) {
			return
		}
	}
}

// createReset returns the µs from a new bucket's stamp until it is full
// again after a take of cost, as the take function computes it for a
// bucket it creates: ceil(cost * p' / n'), or ok false (never: SQL NULL)
// when the limit does not refill. The cost is in [1, capacity], as
// sluice.Request.Validate keeps it, and the plan small (smallPlan), so
// that cost * p' fits in 62 bits.
func createReset(p bucket.Plan, cost int64) (c int64, ok bool) {
	n, per := int64(p.RefillUnits()), int64(p.Scale())
	if n == 0 {
		return 0, false
	}
	x := cost * per
	c = x / n
	if x%n != 0 {
		c++
	}
	return c, true
}

// smallPlan reports whether every deficit of l, (C - tokens) * p' - frac,
// fits in 62 bits, as the take function's v_small does.
func smallPlan(l sluice.Limit, p bucket.Plan) bool {
	return l.Capacity <= maxSmall/int64(p.Scale())
}

// maxSmall is 2^62 - 1.
const maxSmall = 1<<62 - 1

// maxWaitMicros is the longest wait a time.Duration holds, in whole µs; a
// longer one is reported as never, as by the schema's wait function.
const maxWaitMicros = int64(1<<63-1) / int64(time.Microsecond)

// createdDecision returns the decision of a take of r that created its
// bucket, with c, ok from createReset: the function's decision for a bucket
// it creates at now.
func createdDecision(r sluice.Request, c int64, ok bool) sluice.Decision {
	d := sluice.Decision{Allowed: true, Remaining: r.Limit.Capacity - r.Cost, Limit: r.Limit}
	if !ok || c > maxWaitMicros {
		d.ResetAfter = sluice.Never
	} else {
		d.ResetAfter = time.Duration(c) * time.Microsecond
	}
	return d
}

// takeNew tries a take of r as the insert of a new bucket (see "Takes of
// new keys" above). It returns the decision and true if it created the
// bucket, false if the bucket exists (nothing was written; decide with the
// function).
func (s *Store) takeNew(ctx context.Context, r sluice.Request, p bucket.Plan, key []byte, now any) (sluice.Decision, bool, error) {
	c, ok := createReset(p, r.Cost)
	var reset any // SQL NULL: never full again
	if ok {
		reset = c
	}
	var created bool
	b := &pgx.Batch{}
	if s.prelude != "" {
		b.Queue(s.prelude, s.timeouts...)
	}
	b.Queue(s.createSQL, r.Policy, key, r.Cost, r.Limit.Capacity, r.Limit.Rate.Tokens, int64(r.Limit.Rate.Period/time.Microsecond), reset, now).
		QueryRow(func(row pgx.Row) error {
			var stamp int64
			err := row.Scan(&stamp)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			created = err == nil
			return err
		})
	b.Queue(s.floorSQL)
	err := s.pool.SendBatch(ctx, b).Close()
	switch {
	case isFloorCheck(err):
		// Rolled back: the function creates the bucket at the floor.
		created, err = false, nil
	case err != nil:
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code != "42501" && (strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "42")) {
			// The table refused a row of this version's columns, or the
			// statements do not fit it: a later version's Migrate may
			// have changed it since the store read its version. Read it
			// again on the next call, which leaves takes to the function
			// if it is no longer this version's.
			s.ready.Store(false)
		}
		return sluice.Decision{}, false, s.decisionError("take", err)
	}
	s.noteInsertFirst(created)
	if !created {
		return sluice.Decision{}, false, nil
	}
	return createdDecision(r, c, ok), true, nil
}

// insertFirstScore is the adaptive state of the insert-first path.
type insertFirstScore struct {
	insertFirstMode int
	insertScore     atomic.Int32
	insertProbe     atomic.Uint32

	insertFirstTries, insertFirstMisses atomic.Uint64
}
