package promstore

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/memstore"
)

// RegisterMemstore registers with reg a collector that reads stats (a
// memstore.Store's Stats, or a guard.Store's LocalStats) at every scrape:
//
//   - <ns>_memstore_buckets: gauge of the buckets held.
//   - <ns>_memstore_request_ids: gauge of the request IDs remembered.
//   - <ns>_memstore_evictions_total{reason}: counter of buckets dropped:
//     "full" (reclaimed at no loss) or "lru" (evicted before full; each
//     may have granted its key one extra burst).
//   - <ns>_memstore_request_id_evictions_total: counter of request IDs
//     forgotten before their TTL.
//   - <ns>_memstore_refused_total: counter of requests for new keys
//     refused with sluice.ErrTooManyKeys (request IDs are never refused:
//     a full memory of them forgets the oldest).
//   - <ns>_memstore_conversions_total: counter of takes that found their
//     bucket stored under another limit than the request's and converted
//     it (memstore.Options.OnLimitChange). A steady rate means that callers
//     disagree on a policy's limit (two processes with different
//     configs); a limit change shows as a burst.
//
// Register several stores in one registry with distinct
// Options.ConstLabels (for example {"store": "local"}). It returns an error
// if reg or stats is nil or an option is out of range (errors wrapping
// sluice.ErrInvalidOption), or if reg refuses the collector.
func RegisterMemstore(reg prometheus.Registerer, o Options, stats func() memstore.Stats) error {
	if stats == nil {
		return errNilStats
	}
	if err := o.check(); err != nil {
		return err
	}
	name := func(n string) string { return prometheus.BuildFQName(o.Namespace, "memstore", n) }
	c := &memstoreCollector{
		stats: stats,
		buckets: prometheus.NewDesc(name("buckets"),
			"Buckets held by the in-memory store.", nil, o.ConstLabels),
		ids: prometheus.NewDesc(name("request_ids"),
			"Request IDs remembered by the in-memory store.", nil, o.ConstLabels),
		evictions: prometheus.NewDesc(name("evictions_total"),
			"Buckets dropped by the in-memory store, by reason: full (reclaimed at no loss) or lru (evicted before full).", []string{"reason"}, o.ConstLabels),
		idEvictions: prometheus.NewDesc(name("request_id_evictions_total"),
			"Request IDs forgotten by the in-memory store before their TTL.", nil, o.ConstLabels),
		refused: prometheus.NewDesc(name("refused_total"),
			"Requests for new keys the in-memory store refused because it held its maximum of keys and found none to reclaim.", nil, o.ConstLabels),
		conversions: prometheus.NewDesc(name("conversions_total"),
			"Takes that found their bucket stored under another limit than the request's and converted it; a steady rate means callers disagree on a policy's limit.", nil, o.ConstLabels),
	}
	return register(reg, c)
}

// memstoreCollector exports memstore.Stats as constant metrics, read at
// scrape time.
type memstoreCollector struct {
	stats                                                      func() memstore.Stats
	buckets, ids, evictions, idEvictions, refused, conversions *prometheus.Desc
}

func (c *memstoreCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.buckets
	ch <- c.ids
	ch <- c.evictions
	ch <- c.idEvictions
	ch <- c.refused
	ch <- c.conversions
}

func (c *memstoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.buckets, prometheus.GaugeValue, float64(st.Buckets))
	ch <- prometheus.MustNewConstMetric(c.ids, prometheus.GaugeValue, float64(st.RequestIDs))
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(st.Reclaimed), "full")
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(st.Evicted), "lru")
	ch <- prometheus.MustNewConstMetric(c.idEvictions, prometheus.CounterValue, float64(st.EvictedRequestIDs))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.Refused))
	ch <- prometheus.MustNewConstMetric(c.conversions, prometheus.CounterValue, float64(st.Conversions))
}
