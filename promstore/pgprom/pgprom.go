// Package pgprom exports the counters of a pgstore.Store as Prometheus
// metrics, in a registry the caller supplies.
//
// It is apart from package promstore so that a program that uses only
// memstore (and promstore for it) never compiles a PostgreSQL client: only
// a program that imports this package, and so pgstore, does.
//
// Wire it next to the decision metrics:
//
//	store, err := promstore.New(ps, reg, promstore.Options{})
//	err = pgprom.Register(reg, promstore.Options{}, ps.Stats)
//
// Errors of the store's decisions are counted by promstore.New and
// promstore.GuardHooks by their cause (see promstore.Kind): a lock or
// statement timeout is "timeout", a connection failure "unavailable".
package pgprom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/promstore"
)

// Register registers with reg a collector that reads stats (a
// pgstore.Store's Stats) at every scrape:
//
//   - <ns>_pgstore_swept_buckets_total: counter of full buckets deleted
//     by sweeps (lossless: a missing bucket starts full).
//   - <ns>_pgstore_swept_request_ids_total: counter of expired request
//     IDs deleted by sweeps.
//   - <ns>_pgstore_sweep_errors_total: counter of background sweeps that
//     failed (the store keeps the latest error in Stats.LastSweepError).
//   - <ns>_pgstore_lock_wait_seconds_total: counter of the seconds
//     decisions waited for a bucket's row lock held by another
//     transaction (a decision on the same key, a sweep), as measured by
//     the database, counting only the waits that ended in a decision.
//   - <ns>_pgstore_lock_waits_total: counter of the decisions that waited
//     for a bucket's row lock, then decided.
//   - <ns>_pgstore_lock_timeouts_total: counter of the decisions that
//     gave up at pgstore.Options.LockTimeout; each returned an error
//     wrapping sluice.ErrUnavailable, and its wait is not in
//     lock_wait_seconds_total.
//   - <ns>_pgstore_conversions_total: counter of the takes that found
//     their bucket stored under another limit of the same policy and
//     converted it; a steady rate with no config change means processes
//     disagree on a policy's limit.
//   - <ns>_pgstore_insert_first_total: counter of the takes that tried
//     to create their bucket with a plain insert before deciding
//     (pgstore.Stats.InsertFirst), and
//     <ns>_pgstore_insert_first_misses_total those of them that created
//     nothing (the bucket was there, or the sweep floor above their time)
//     and were decided by the take function in a second round trip. The store tries the insert first while most tries
//     create their bucket.
//
// <ns> is o.Namespace (default promstore.DefaultNamespace, "sluice"), and
// o.ConstLabels are added to every metric; the other fields of o are not
// used. The rate of lock_wait_seconds_total over that of lock_waits_total
// is the mean wait of a decision that waited: decisions on a hot key queue
// on its row.
//
// Register several stores in one registry with distinct
// Options.ConstLabels. It returns an error if reg or stats is nil or reg
// refuses the collector (the same names and labels registered twice).
func Register(reg prometheus.Registerer, o promstore.Options, stats func() pgstore.Stats) error {
	switch {
	case reg == nil:
		return errors.New("pgprom: the registerer is nil; pass one explicitly (the global registry is never used)")
	case stats == nil:
		return errors.New("pgprom: the stats function is nil; pass the store's Stats method")
	}
	ns := o.Namespace
	if ns == "" {
		ns = promstore.DefaultNamespace
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "pgstore", name), help, nil, o.ConstLabels)
	}
	return reg.Register(&collector{
		stats: stats,
		sweptBuckets: desc("swept_buckets_total",
			"Full buckets deleted by the PostgreSQL store's sweeps."),
		sweptIDs: desc("swept_request_ids_total",
			"Expired request IDs deleted by the PostgreSQL store's sweeps."),
		sweepErrors: desc("sweep_errors_total",
			"Background sweeps of the PostgreSQL store that failed."),
		lockWait: desc("lock_wait_seconds_total",
			"Time decisions of the PostgreSQL store waited for a bucket's row lock held by another transaction before deciding, in seconds; waits that ended at the lock timeout are not included."),
		lockWaits: desc("lock_waits_total",
			"Decisions of the PostgreSQL store that waited for a bucket's row lock, then decided."),
		lockTimeouts: desc("lock_timeouts_total",
			"Decisions of the PostgreSQL store that gave up waiting for a bucket's row lock at the lock timeout."),
		conversions: desc("conversions_total",
			"Takes of the PostgreSQL store that converted a bucket stored under another limit of the same policy; a steady rate means processes disagree on a limit."),
		insertFirst: desc("insert_first_total",
			"Takes of the PostgreSQL store that tried to create their bucket with a plain insert before deciding."),
		insertFirstMisses: desc("insert_first_misses_total",
			"Takes of the PostgreSQL store that tried to create their bucket with a plain insert, created nothing (the bucket was there, or the sweep floor above their time), and were decided by the take function in a second round trip."),
		sharedTransactions: desc("shared_transactions_total",
			"Transactions of the PostgreSQL store that decided several concurrent takes together."),
		sharedTakes: desc("shared_takes_total",
			"Takes of the PostgreSQL store decided in a transaction shared with other takes; one sent again in a shared transaction after another take's error counts again."),
	})
}

// collector exports pgstore.Stats as constant metrics, read at scrape
// time.
type collector struct {
	stats                                                                  func() pgstore.Stats
	sweptBuckets, sweptIDs, sweepErrors, lockWait, lockWaits, lockTimeouts *prometheus.Desc
	conversions, insertFirst, insertFirstMisses                            *prometheus.Desc
	sharedTransactions, sharedTakes                                        *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sweptBuckets
	ch <- c.sweptIDs
	ch <- c.sweepErrors
	ch <- c.lockWait
	ch <- c.lockWaits
	ch <- c.lockTimeouts
	ch <- c.conversions
	ch <- c.insertFirst
	ch <- c.insertFirstMisses
	ch <- c.sharedTransactions
	ch <- c.sharedTakes
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.sweptBuckets, prometheus.CounterValue, float64(st.SweptBuckets))
	ch <- prometheus.MustNewConstMetric(c.sweptIDs, prometheus.CounterValue, float64(st.SweptRequestIDs))
	ch <- prometheus.MustNewConstMetric(c.sweepErrors, prometheus.CounterValue, float64(st.SweepErrors))
	ch <- prometheus.MustNewConstMetric(c.lockWait, prometheus.CounterValue, st.LockWaitSeconds)
	ch <- prometheus.MustNewConstMetric(c.lockWaits, prometheus.CounterValue, float64(st.LockWaits))
	ch <- prometheus.MustNewConstMetric(c.lockTimeouts, prometheus.CounterValue, float64(st.LockTimeouts))
	ch <- prometheus.MustNewConstMetric(c.conversions, prometheus.CounterValue, float64(st.Conversions))
	ch <- prometheus.MustNewConstMetric(c.insertFirst, prometheus.CounterValue, float64(st.InsertFirst))
	ch <- prometheus.MustNewConstMetric(c.insertFirstMisses, prometheus.CounterValue, float64(st.InsertFirstMisses))
	ch <- prometheus.MustNewConstMetric(c.sharedTransactions, prometheus.CounterValue, float64(st.SharedTransactions))
	ch <- prometheus.MustNewConstMetric(c.sharedTakes, prometheus.CounterValue, float64(st.SharedTakes))
}
