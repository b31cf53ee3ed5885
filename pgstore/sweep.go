package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// Swept counts what one Sweep deleted.
type Swept struct {
	// Buckets is the number of full buckets deleted.
	Buckets int64
	// RequestIDs is the number of expired request IDs deleted.
	RequestIDs int64
}

// Stats are counters of a Store since New: what its sweeps deleted, how
// its decisions (Take, TakeAll, Drain and Refund) waited for bucket row
// locks, and how many buckets they converted to another limit.
type Stats struct {
	// SweptBuckets is the number of full buckets deleted.
	SweptBuckets uint64
	// SweptRequestIDs is the number of expired request IDs deleted.
	SweptRequestIDs uint64
	// SweepErrors is the number of background sweeps that failed.
	SweepErrors uint64
	// LastSweepError is the error of the latest failed background sweep,
	// or nil if none failed.
	LastSweepError error
	// LockWaitSeconds is the total time, in seconds, that decisions waited
	// for bucket row locks held by other transactions (other decisions on
	// the same key, or any other session), measured by the database around
	// its locking statements (clock_timestamp(), microsecond resolution).
	// A decision that failed adds nothing, including one that gave up at
	// LockTimeout. A take or multi-take whose bucket a sweep (or Reset) is
	// deleting waits for that to commit and creates the bucket anew without
	// counting the wait; a refund counts it. A take that tries the insert
	// of a new bucket first does not count a wait for another session
	// inserting the same key (docs/postgres.md).
	LockWaitSeconds float64
	// LockWaits is the number of decisions that waited at all for a
	// bucket row lock (a wait of at least 1µs) and then decided. A
	// multi-take that waited for several of its buckets counts once, with
	// the sum of its waits in LockWaitSeconds.
	LockWaits uint64
	// LockTimeouts is the number of decisions that failed because the lock
	// timeout (Options.LockTimeout, SQLSTATE 55P03) expired; each returned
	// an error wrapping sluice.ErrUnavailable. Each of them waited about
	// LockTimeout, which LockWaitSeconds does not include.
	LockTimeouts uint64
	// Conversions is the number of buckets that a decision found stored
	// under another limit than the request's and converted
	// (Options.OnLimitChange): a take's, each of a multi-take's, a drain's,
	// a refund's that gave tokens back (not a replay, not a peek, not a
	// refund to a full bucket, which writes nothing). They come from
	// requests of one policy arriving with different limits, as when
	// processes disagree on a policy's limit, or while a changed limit
	// rolls out. A bucket swept
	// since its last decision is new again and not counted.
	Conversions uint64
	// InsertFirst is the number of takes that tried to create their bucket
	// with a plain insert before deciding, and InsertFirstMisses those of
	// them that created nothing, having found the bucket there, or the
	// sweep floor above their time (or having run outside READ COMMITTED,
	// which the take function then refuses), and were decided by the take
	// function in a second round trip
	// (docs/postgres.md, "Takes of new keys"). The store tries the insert first while most such tries
	// create their bucket.
	InsertFirst, InsertFirstMisses uint64
	// SharedTransactions is the number of transactions that decided
	// several queued takes together (Options.Batch), and SharedTakes the
	// takes they carried: a take sent again after another's error counts
	// again if it is shared again.
	SharedTransactions, SharedTakes uint64
}

// Stats returns the store's counters. It is safe to call concurrently.
func (s *Store) Stats() Stats {
	st := Stats{
		SweptBuckets:    s.sweptBuckets.Load(),
		SweptRequestIDs: s.sweptIDs.Load(),
		SweepErrors:     s.sweepErrors.Load(),
		LockWaitSeconds: float64(s.lockWaitMicros.Load()) / 1e6,
		LockWaits:       s.lockWaits.Load(),
		LockTimeouts:    s.lockTimeouts.Load(),
		Conversions:     s.conversions.Load(),

		InsertFirst:       s.insertFirstTries.Load(),
		InsertFirstMisses: s.insertFirstMisses.Load(),
	}
	if b := s.batcher; b != nil {
		st.SharedTransactions = b.batches.Load()
		st.SharedTakes = b.batched.Load()
	}
	if p := s.lastSweepErr.Load(); p != nil {
		st.LastSweepError = *p
	}
	return st
}

// Sweep deletes the buckets that are full and the request IDs that have
// expired at the store's time (the database clock, or Options.Now), in
// statements of at most Options.SweepBatch rows of each table, until a
// statement finds fewer. After each full batch it pauses as
// Options.SweepPauseRatio says. Deleting a full bucket changes no decision:
// a missing bucket starts full, and each statement raises the store's
// floor to its time, so that no bucket is created again with an earlier
// stamp (a take whose time was read before the sweep makes the bucket at
// the sweep's time, when it was full, not at its own, when it may not have
// been). Rows locked by decisions in progress are left for the next sweep.
// The background sweeper calls Sweep every Options.SweepInterval; call it
// directly when that is disabled. It returns what it deleted, also on
// error, which wraps sluice.ErrUnavailable (ctx ending during a pause is
// such an error) or sluice.ErrMisconfigured (the schema is missing or
// older than SchemaVersion).
func (s *Store) Sweep(ctx context.Context) (Swept, error) {
	var total Swept
	if err := s.checkSchema(ctx, "sweep"); err != nil {
		return total, err
	}
	for {
		var b, ids int64
		start := time.Now()
		// Under the timeouts that the pool's sessions carry for decisions
		// (SessionTimeouts), a sweep lifts them, as Migrate does.
		if err := s.queryRowAfter(ctx, s.lift, nil, s.sweepSQL, []any{&b, &ids}, s.nowMicros(), s.batch); err != nil {
			return total, s.dbError("sweep", err)
		}
		took := time.Since(start)
		total.Buckets += b
		total.RequestIDs += ids
		s.sweptBuckets.Add(uint64(b))
		s.sweptIDs.Add(uint64(ids))
		if b < int64(s.batch) && ids < int64(s.batch) {
			return total, nil
		}
		if err := s.pauseAfter(ctx, took); err != nil {
			return total, fmt.Errorf("%w: sweep: %w", sluice.ErrUnavailable, err)
		}
	}
}

// pauseAfter waits for s.pause times took, at most maxSweepPause, or until
// ctx ends, and returns ctx's error.
func (s *Store) pauseAfter(ctx context.Context, took time.Duration) error {
	if s.pause <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(time.Duration(min(float64(took)*s.pause, float64(maxSweepPause))))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return ctx.Err()
}

// sweeper runs Sweep every interval until ctx ends, then closes s.done.
func (s *Store) sweeper(ctx context.Context, interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.sweepErrors.Add(1)
			s.lastSweepErr.Store(&err)
		}
	}
}
