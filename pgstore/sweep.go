package pgstore

import (
	"context"
	"fmt"
	"time"
)

// Swept counts what one Sweep deleted.
type Swept struct {
	// Buckets is the number of full buckets deleted.
	Buckets int64
	// RequestIDs is the number of expired request IDs deleted.
	RequestIDs int64
}

// Stats are counters of a Store's sweeping since New.
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
}

// Stats returns the store's counters. It is safe to call concurrently.
func (s *Store) Stats() Stats {
	st := Stats{
		SweptBuckets:    s.sweptBuckets.Load(),
		SweptRequestIDs: s.sweptIDs.Load(),
		SweepErrors:     s.sweepErrors.Load(),
	}
	if p := s.lastSweepErr.Load(); p != nil {
		st.LastSweepError = *p
	}
	return st
}

// Sweep deletes the buckets that are full and the request IDs that have
// expired at the store's time (the database clock, or Options.Now), in
// statements of at most Options.SweepBatch rows of each table, until a
// statement finds fewer. Deleting a full bucket changes no decision: a
// missing bucket starts full. Rows locked by decisions in progress are left
// for the next sweep. The background sweeper calls Sweep every
// Options.SweepInterval; call it directly when that is disabled. It returns
// what it deleted, also on error (which wraps ErrUnavailable).
func (s *Store) Sweep(ctx context.Context) (Swept, error) {
	var total Swept
	for {
		var b, ids int64
		if err := s.pool.QueryRow(ctx, s.sweepSQL, s.nowMicros(), s.batch).Scan(&b, &ids); err != nil {
			return total, s.unavailable("sweep", err)
		}
		total.Buckets += b
		total.RequestIDs += ids
		s.sweptBuckets.Add(uint64(b))
		s.sweptIDs.Add(uint64(ids))
		if b < int64(s.batch) && ids < int64(s.batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("%w: sweep: %w", ErrUnavailable, err)
		}
	}
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
