package loadgen

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Summary is the outcome of a run. Its JSON form is the summary of
// `sluice loadgen -json`; docs/loadgen.md describes each field.
type Summary struct {
	Target      string  `json:"target"`
	Loop        string  `json:"loop"` // "closed" or "open"
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"rate,omitempty"` // asked for, requests a second
	Batch       int     `json:"batch"`
	Keys        string  `json:"keys"`
	Cost        string  `json:"cost"`

	// The measured phase.
	Seconds            float64           `json:"seconds"`
	Requests           int64             `json:"requests"`
	RequestsPerSecond  float64           `json:"requests_per_second"`
	Decisions          int64             `json:"decisions"` // takes asked for: allowed + denied + errors
	DecisionsPerSecond float64           `json:"decisions_per_second"`
	Allowed            int64             `json:"allowed"`
	AllowedPercent     float64           `json:"allowed_percent"`
	Denied             int64             `json:"denied"`
	Errors             int64             `json:"errors"`
	ErrorPercent       float64           `json:"error_percent"`
	Degraded           int64             `json:"degraded"`
	ShadowDenied       int64             `json:"shadow_denied"`
	ErrorsByKind       map[string]int64  `json:"errors_by_kind"`
	ErrorSamples       map[string]string `json:"error_samples,omitempty"`
	// LatencyMS is the latency of a request: from its intended send time
	// in an open loop (see the package documentation), from its send in a
	// closed one.
	LatencyMS Percentiles `json:"latency_ms"`
	// LatencyRequests is the number of requests the latencies are of:
	// those that got a decision or timed out.
	LatencyRequests int64 `json:"latency_requests"`
	// ServiceTimeMS (open loop only) is the latency from the actual send.
	ServiceTimeMS *Percentiles `json:"service_time_ms,omitempty"`
	// Late (open loop) is the requests that left 1ms or more after their
	// intended send time because every slot was busy; MaxLateMS the
	// longest such wait.
	Late      int64   `json:"late,omitempty"`
	MaxLateMS float64 `json:"max_late_ms,omitempty"`

	Warmup *PhaseCounts `json:"warmup,omitempty"`

	// The generator's own CPU time over the whole run, warm-up included,
	// and the cores that is on average.
	GeneratorCPUSeconds float64 `json:"generator_cpu_seconds"`
	GeneratorCores      float64 `json:"generator_cores"`
	// Interrupted reports a run stopped before its bounds.
	Interrupted bool `json:"interrupted,omitempty"`
}

// PhaseCounts are the counts of the warm-up.
type PhaseCounts struct {
	Seconds   float64 `json:"seconds"`
	Requests  int64   `json:"requests"`
	Decisions int64   `json:"decisions"`
	Allowed   int64   `json:"allowed"`
	Denied    int64   `json:"denied"`
	Errors    int64   `json:"errors"`
}

func (e *engine) summary(end time.Time) *Summary {
	var warm, meas counts
	lat, svc := newHist(), newHist()
	var maxLat, maxSvc time.Duration
	for _, sh := range e.shards {
		sh.mu.Lock()
		warm.add(&sh.warmup.counts)
		meas.add(&sh.meas.counts)
		lat.Merge(sh.meas.latency)
		maxLat = max(maxLat, sh.meas.maxLat)
		if sh.meas.service != nil {
			svc.Merge(sh.meas.service)
			maxSvc = max(maxSvc, sh.meas.maxSvc)
		}
		sh.mu.Unlock()
	}
	s := &Summary{
		Target:          e.t.Describe(),
		Loop:            "closed",
		Concurrency:     e.o.Concurrency,
		Rate:            e.o.Rate,
		Batch:           e.o.Batch,
		Keys:            e.o.Keys.String(),
		Cost:            e.o.Costs.String(),
		Requests:        meas.requests,
		Decisions:       meas.decisions,
		Allowed:         meas.allowed,
		Denied:          meas.denied,
		Errors:          meas.errors,
		Degraded:        meas.degraded,
		ShadowDenied:    meas.shadowDenied,
		ErrorsByKind:    meas.byKind,
		ErrorSamples:    meas.samples,
		LatencyMS:       percentiles(lat, maxLat),
		LatencyRequests: meas.timed,
		Interrupted:     e.interrupted.Load(),
	}
	if s.ErrorsByKind == nil {
		s.ErrorsByKind = map[string]int64{}
	}
	if e.o.Rate > 0 {
		s.Loop = "open"
		p := percentiles(svc, maxSvc)
		s.ServiceTimeMS = &p
		s.Late, s.MaxLateMS = meas.late, float64(meas.maxLate)/1e6
	}
	if end.After(e.measure) {
		s.Seconds = end.Sub(e.measure).Seconds()
		s.RequestsPerSecond = float64(s.Requests) / s.Seconds
		s.DecisionsPerSecond = float64(s.Decisions) / s.Seconds
	}
	if s.Decisions > 0 {
		s.AllowedPercent = 100 * float64(s.Allowed) / float64(s.Decisions)
		s.ErrorPercent = 100 * float64(s.Errors) / float64(s.Decisions)
	}
	if e.o.Warmup > 0 {
		warmEnd := e.measure
		if end.Before(warmEnd) {
			warmEnd = end
		}
		s.Warmup = &PhaseCounts{
			Seconds:  warmEnd.Sub(e.start).Seconds(),
			Requests: warm.requests, Decisions: warm.decisions,
			Allowed: warm.allowed, Denied: warm.denied, Errors: warm.errors,
		}
	}
	return s
}

// ms formats milliseconds with three decimals: 0.123ms.
func ms(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) + "ms" }

// rate formats a count a second.
func rate(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "/s" }

// WriteText writes the summary in words, a line per subject.
func (s *Summary) WriteText(w io.Writer) error {
	var b strings.Builder
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-10s %s\n", label, fmt.Sprintf(format, args...))
	}
	line("target", "%s", s.Target)
	load := fmt.Sprintf("closed loop, %d in flight", s.Concurrency)
	if s.Loop == "open" {
		load = fmt.Sprintf("open loop at %s, at most %d in flight", rate(s.Rate), s.Concurrency)
	}
	if s.Batch > 1 {
		load += fmt.Sprintf(", %d takes a request", s.Batch)
	}
	line("load", "%s; %s; cost %s", load, s.Keys, s.Cost)
	if s.Interrupted {
		line("stopped", "interrupted: the counts below are those of the requests made until then")
	}
	line("requests", "%d in %.2fs (%s)", s.Requests, s.Seconds, rate(s.RequestsPerSecond))
	line("decisions", "%d (%s): %d allowed (%.2f%%), %d denied, %d errors (%.2f%%)",
		s.Decisions, rate(s.DecisionsPerSecond), s.Allowed, s.AllowedPercent, s.Denied, s.Errors, s.ErrorPercent)
	if s.Degraded > 0 || s.ShadowDenied > 0 {
		line("", "%d degraded (decided by the service's failure mode, its store unreachable), %d denials of a shadow policy answered allowed", s.Degraded, s.ShadowDenied)
	}
	for _, k := range slices.Sorted(maps.Keys(s.ErrorsByKind)) {
		line("errors", "%d %s: %s", s.ErrorsByKind[k], k, s.ErrorSamples[k])
	}
	p := s.LatencyMS
	from := "from the send"
	if s.Loop == "open" {
		from = "from the intended send time"
	}
	if s.LatencyRequests != s.Requests {
		from += fmt.Sprintf("; of the %d requests that got a decision or timed out", s.LatencyRequests)
	}
	line("latency", "p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (a request, %s)", ms(p.P50), ms(p.P90), ms(p.P99), ms(p.P999), ms(p.Max), from)
	if q := s.ServiceTimeMS; q != nil {
		line("service", "p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (from the actual send)", ms(q.P50), ms(q.P90), ms(q.P99), ms(q.P999), ms(q.Max))
	}
	if s.Loop == "open" {
		if s.Late > 0 {
			line("schedule", "%d requests left 1ms or more late, at most %s: every slot was busy (the latency above counts the wait; raise -concurrency if the target is not saturated)", s.Late, ms(s.MaxLateMS))
		}
		if s.Seconds > 0 && !s.Interrupted && s.RequestsPerSecond < 0.9*s.Rate {
			line("schedule", "%s sent of the %s asked for: the target or the generator could not keep up", rate(s.RequestsPerSecond), rate(s.Rate))
		}
	}
	if wu := s.Warmup; wu != nil {
		line("warm-up", "%d requests, %d decisions (%d allowed, %d denied, %d errors) in %.2fs, not counted above", wu.Requests, wu.Decisions, wu.Allowed, wu.Denied, wu.Errors, wu.Seconds)
	}
	if s.GeneratorCPUSeconds > 0 {
		line("generator", "%.2fs of CPU (%.2f cores) over the run", s.GeneratorCPUSeconds, s.GeneratorCores)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Line is the progress of s in one line, without a line end: the
// decisions a second since prev (the snapshot before, if of the same
// phase), the counts and the 99th percentile so far.
func (s Snapshot) Line(prev Snapshot) string {
	var b strings.Builder
	if s.Warmup {
		b.WriteString("warm-up ")
	}
	if prev.Warmup != s.Warmup || prev.Elapsed > s.Elapsed {
		prev = Snapshot{Warmup: s.Warmup}
	}
	r := 0.0
	if d := (s.Elapsed - prev.Elapsed).Seconds(); d > 0 {
		r = float64(s.Decisions-prev.Decisions) / d
	}
	fmt.Fprintf(&b, "%6.1fs  %.0f decisions/s  allowed %d  denied %d  errors %d", s.Elapsed.Seconds(), r, s.Allowed, s.Denied, s.Errors)
	if !s.Warmup {
		fmt.Fprintf(&b, "  p99 %s", ms(float64(s.P99)/1e6))
	}
	fmt.Fprintf(&b, "  %d in flight", s.InFlight)
	return b.String()
}
