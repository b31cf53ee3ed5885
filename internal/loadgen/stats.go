package loadgen

import (
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// The histograms' range and precision: 1ns to 10 minutes at 3 significant
// digits (a value is off by at most 0.1%). A longer latency is recorded as
// 10 minutes; the exact maximum is kept beside.
const (
	histMin    = 1
	histMax    = int64(10 * time.Minute)
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

func clampHist(d time.Duration) int64 { return min(max(int64(d), histMin), histMax) }

// counts are the counts of one phase of a run.
type counts struct {
	requests     int64
	decisions    int64 // takes asked for: allowed + denied + errors
	allowed      int64
	denied       int64
	errors       int64
	degraded     int64
	shadowDenied int64
	timed        int64         // requests whose latency was recorded
	late         int64         // open loop: requests that left lateAfter or more behind their time
	maxLate      time.Duration // open loop: the longest such wait
	byKind       map[string]int64
	samples      map[string]string // the first message of each kind
}

func (c *counts) add(o *counts) {
	c.requests += o.requests
	c.decisions += o.decisions
	c.allowed += o.allowed
	c.denied += o.denied
	c.errors += o.errors
	c.degraded += o.degraded
	c.shadowDenied += o.shadowDenied
	c.timed += o.timed
	c.late += o.late
	c.maxLate = max(c.maxLate, o.maxLate)
	for k, n := range o.byKind {
		if c.byKind == nil {
			c.byKind = map[string]int64{}
			c.samples = map[string]string{}
		}
		c.byKind[k] += n
		if _, ok := c.samples[k]; !ok {
			c.samples[k] = o.samples[k]
		}
	}
}

// phase is what a run records of one phase: counts, and for the measured
// phase the histograms.
type phase struct {
	counts
	latency *hdrhistogram.Histogram // from the intended send time
	service *hdrhistogram.Histogram // from the actual send (open loop)
	maxLat  time.Duration           // exact
	maxSvc  time.Duration
}

// shard is the recording state some request slots share: one lock for a
// few slots keeps recording cheap without a histogram per slot (about
// 250 KB each).
type shard struct {
	mu     sync.Mutex
	warmup phase
	meas   phase
}

func newShard(open bool) *shard {
	s := &shard{}
	s.meas.latency = newHist()
	if open {
		s.meas.service = newHist()
	}
	return s
}

// record counts one request of out's takes. Its latency is recorded if it
// got a decision, or timed out (or, overdue, was never sent within the
// timeout): a request that failed otherwise (a refused connection, an
// error status, an answer that is not one) is an error only, since its
// latency is not that of a decision and a fast failure would pull the
// percentiles down.
func (s *shard) record(measured bool, out []Result, latency, service, late time.Duration, isLate bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := &s.warmup
	if measured {
		p = &s.meas
	}
	p.requests++
	p.decisions += int64(len(out))
	timed := false
	for i := range out {
		r := &out[i]
		switch r.Outcome {
		case Allowed:
			p.allowed++
			timed = true
		case Denied:
			p.denied++
			timed = true
		default:
			p.errors++
			kind := r.Kind
			timed = timed || kind == kindTimeout || kind == kindOverdue
			if kind == "" {
				kind = "no answer"
			}
			if p.byKind == nil {
				p.byKind = map[string]int64{}
				p.samples = map[string]string{}
			}
			if _, ok := p.samples[kind]; !ok {
				p.samples[kind] = truncate(r.Detail, 300)
			}
			p.byKind[kind]++
		}
		if r.Degraded {
			p.degraded++
		}
		if r.ShadowDenied {
			p.shadowDenied++
		}
	}
	if isLate {
		p.late++
		p.maxLate = max(p.maxLate, late)
	}
	if !measured || !timed {
		return
	}
	p.timed++
	p.latency.RecordValue(clampHist(latency)) //nolint:errcheck // clamped into range
	p.maxLat = max(p.maxLat, latency)
	if p.service != nil {
		p.service.RecordValue(clampHist(service)) //nolint:errcheck // clamped into range
		p.maxSvc = max(p.maxSvc, service)
	}
}

// Percentiles are latencies of a run, in milliseconds.
type Percentiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99.9"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func percentiles(h *hdrhistogram.Histogram, exactMax time.Duration) Percentiles {
	if h.TotalCount() == 0 {
		return Percentiles{}
	}
	ms := func(v int64) float64 { return float64(v) / 1e6 }
	return Percentiles{
		P50:  ms(h.ValueAtQuantile(50)),
		P90:  ms(h.ValueAtQuantile(90)),
		P99:  ms(h.ValueAtQuantile(99)),
		P999: ms(h.ValueAtQuantile(99.9)),
		Max:  ms(int64(exactMax)),
		Mean: h.Mean() / 1e6,
	}
}
