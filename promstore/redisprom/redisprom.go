// Package redisprom exports the counters of a redisstore.Store as
// Prometheus metrics, in a registry the caller supplies.
//
// It is apart from package promstore so that a program that uses only
// memstore (and promstore for it) never compiles a Redis client: only a
// program that imports this package, and so redisstore, does.
//
// Wire it next to the decision metrics:
//
//	store, err := promstore.New(rs, reg, promstore.Options{})
//	err = redisprom.Register(reg, promstore.Options{}, rs.Stats)
//
// Errors of the store's script are counted by promstore.New and
// promstore.GuardHooks, under the kind "script" (see promstore.Kind).
package redisprom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/redisstore"
)

// Register registers with reg a collector that reads stats (a
// redisstore.Store's Stats) at every scrape:
//
//   - <ns>_redisstore_script_loads_total: counter of the times a Redis
//     server did not have the decision script cached (its first use on
//     that server, a restart, a failover, SCRIPT FLUSH) and the store sent
//     it in full with EVAL.
//
//   - <ns>_redisstore_conversions_total: counter of the takes that found
//     their bucket stored under another limit of the same policy and
//     converted it. A steady rate with no config change means processes
//     disagree on a policy's limit, and each converts the others' buckets.
//
//   - <ns>_redisstore_cross_slot_takes_total: counter of the multi-takes
//     (TakeAll) whose buckets lay in several Redis Cluster slots (on a
//     Ring, under several keys), decided slot by slot, one round trip
//     each, taking and giving back if a later slot denied. Always 0 on a
//     standalone server. A high rate is a latency cost: keep the buckets
//     of one call under one key (every policy of a key shares its slot).
//
//   - <ns>_redisstore_lost_refunds_total: counter of those multi-takes
//     that a later slot denied (or failed in) and whose giving back of
//     what the earlier slots took could not be sent: those tokens stay
//     taken, as if used, until the buckets refill. Any increase deserves
//     a look (Redis failing between the slots of one call).
//
// <ns> is o.Namespace (default promstore.DefaultNamespace, "sluice"), and
// o.ConstLabels are added to the metric; the other fields of o are not
// used. One load per server after a deploy, a restart or a failover is
// expected; a steady rate means the servers keep losing the script, and
// each load costs the decision that met it a second round trip carrying the
// whole script.
//
// Register several stores in one registry with distinct
// Options.ConstLabels. It returns an error if reg or stats is nil or reg
// refuses the collector (the same name and labels registered twice).
func Register(reg prometheus.Registerer, o promstore.Options, stats func() redisstore.Stats) error {
	switch {
	case reg == nil:
		return errors.New("redisprom: the registerer is nil; pass one explicitly (the global registry is never used)")
	case stats == nil:
		return errors.New("redisprom: the stats function is nil; pass the store's Stats method")
	}
	ns := o.Namespace
	if ns == "" {
		ns = promstore.DefaultNamespace
	}
	return reg.Register(&collector{
		stats: stats,
		loads: prometheus.NewDesc(prometheus.BuildFQName(ns, "redisstore", "script_loads_total"),
			"Times a Redis server did not have the decision script cached (first use, restart, failover, SCRIPT FLUSH) and the store sent it in full with EVAL.",
			nil, o.ConstLabels),
		conversions: prometheus.NewDesc(prometheus.BuildFQName(ns, "redisstore", "conversions_total"),
			"Takes that converted a bucket stored under another limit of the same policy; a steady rate means processes disagree on a limit.",
			nil, o.ConstLabels),
		crossSlot: prometheus.NewDesc(prometheus.BuildFQName(ns, "redisstore", "cross_slot_takes_total"),
			"Multi-takes whose buckets lay in several Redis Cluster slots, decided slot by slot with one round trip each.",
			nil, o.ConstLabels),
		lostRefunds: prometheus.NewDesc(prometheus.BuildFQName(ns, "redisstore", "lost_refunds_total"),
			"Cross-slot multi-takes denied by a later slot whose giving back of the earlier slots' tokens could not be sent; those tokens stay taken.",
			nil, o.ConstLabels),
	})
}

// collector exports redisstore.Stats as constant metrics, read at scrape
// time.
type collector struct {
	stats                                      func() redisstore.Stats
	loads, conversions, crossSlot, lostRefunds *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.loads
	ch <- c.conversions
	ch <- c.crossSlot
	ch <- c.lostRefunds
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.loads, prometheus.CounterValue, float64(st.ScriptLoads))
	ch <- prometheus.MustNewConstMetric(c.conversions, prometheus.CounterValue, float64(st.Conversions))
	ch <- prometheus.MustNewConstMetric(c.crossSlot, prometheus.CounterValue, float64(st.CrossSlotTakes))
	ch <- prometheus.MustNewConstMetric(c.lostRefunds, prometheus.CounterValue, float64(st.LostRefunds))
}
