package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
)

// Bounds of the flags.
const (
	maxInFlight = 10000
	maxConns    = 1000
	maxKeys     = 1 << 24
	maxBatch    = 100000
)

// config is what the flags ask for.
type config struct {
	addr       string // host:port
	token      string // the bearer token; empty: none
	mode       string // "take", "batch" or "envoy"
	policy     string // take and batch modes
	domain     string // envoy mode
	descriptor string // envoy mode: the entry's key
	batch      int    // takes per TakeBatch
	inFlight   int
	conns      int
	keys       int
	duration   time.Duration // used when calls is 0
	calls      int64
	warmup     time.Duration
	seed       uint64
	client     string        // "raw" or "proto"
	timeout    time.Duration // of one call
}

// check reports the first flag out of its range.
func (c config) check() error {
	host, port, err := net.SplitHostPort(c.addr)
	switch {
	case err != nil || host == "" || port == "":
		return fmt.Errorf("-addr %q: want host:port", c.addr)
	case c.mode != "take" && c.mode != "batch" && c.mode != "envoy":
		return fmt.Errorf("-mode %q: want take, batch or envoy", c.mode)
	case c.mode != "envoy" && c.policy == "":
		return fmt.Errorf("-policy is empty: name a policy of the service")
	case c.mode == "envoy" && c.domain == "":
		return fmt.Errorf("-domain is empty: name a domain of the service's rules")
	case c.mode == "envoy" && c.descriptor == "":
		return fmt.Errorf("-descriptor is empty: name the key of a rule of the domain")
	case c.batch < 1 || c.batch > maxBatch:
		return fmt.Errorf("-batch %d: want 1 to %d", c.batch, maxBatch)
	case c.inFlight < 1 || c.inFlight > maxInFlight:
		return fmt.Errorf("-in-flight %d: want 1 to %d", c.inFlight, maxInFlight)
	case c.conns < 1 || c.conns > min(c.inFlight, maxConns):
		return fmt.Errorf("-conns %d: want 1 to %d (at most -in-flight)", c.conns, min(c.inFlight, maxConns))
	case c.keys < 1 || c.keys > maxKeys:
		return fmt.Errorf("-keys %d: want 1 to %d", c.keys, maxKeys)
	case c.calls < 0:
		return fmt.Errorf("-calls %d: want 0 (run for -duration) or more", c.calls)
	case c.calls == 0 && c.duration <= 0:
		return fmt.Errorf("-duration %v: want a positive duration, or give -calls", c.duration)
	case c.client != "raw" && c.client != "proto":
		return fmt.Errorf("-client %q: want raw or proto", c.client)
	case c.timeout <= 0:
		return fmt.Errorf("-timeout %v: want a positive duration", c.timeout)
	case c.warmup < 0:
		return fmt.Errorf("-warmup %v: want 0 or a positive duration", c.warmup)
	}
	return nil
}

// perCall is the number of decisions one call asks for.
func (c config) perCall() int {
	if c.mode == "batch" {
		return c.batch
	}
	return 1
}

// keyName is the name of key i.
func keyName(i int) string { return "k" + strconv.Itoa(i) }

// report is the outcome of one run.
type report struct {
	calls     int64 // made, answered or not
	decisions int64 // asked for: allowed + denied + errors
	allowed   int64
	denied    int64
	errors    int64 // decisions that got no decision: a failed call, an error item, an envoy answer that is neither
	failed    int64 // calls that ended in an error status
	codes     map[codes.Code]int64
	unmatched int64 // envoy descriptors no rule matched
	firstErr  string
	elapsed   time.Duration
	cpu       time.Duration // of this process over the run
	latencies []time.Duration
}

// worker is the state of one call slot.
type worker struct {
	c   caller
	rng *rand.Rand
	r   report
}

// A caller makes the calls of one slot.
type caller interface {
	// call makes one call for the keys drawn from rng, and counts its
	// decisions in r (all but r.calls, r.decisions and r.latencies).
	call(ctx context.Context, rng *rand.Rand, r *report)
}

// run makes calls for d, or until n calls were made if n > 0, and returns
// what came back. It returns an error if ctx ends, or if not one decision
// was made.
func (g *generator) run(ctx context.Context, d time.Duration, n int64) (report, error) {
	var stop atomic.Bool
	var made atomic.Int64
	if n == 0 {
		t := time.AfterFunc(d, func() { stop.Store(true) })
		defer t.Stop()
	}
	cancel := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer cancel()

	per := int64(g.c.perCall())
	workers := make([]*worker, g.c.inFlight)
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{c: g.callers[i], rng: rand.New(rand.NewPCG(g.c.seed, uint64(i))), r: report{codes: map[codes.Code]int64{}}}
		workers[i] = w
		wg.Go(func() {
			for !stop.Load() && (n == 0 || made.Add(1) <= n) {
				w.r.calls++
				w.r.decisions += per
				callCtx, cancel := context.WithTimeout(g.ctx, g.c.timeout)
				t0 := time.Now()
				w.c.call(callCtx, w.rng, &w.r)
				w.r.latencies = append(w.r.latencies, time.Since(t0))
				cancel()
			}
		})
	}
	wg.Wait()
	r := report{elapsed: time.Since(start), cpu: cpuTime() - cpu0, codes: map[codes.Code]int64{}}
	for _, w := range workers {
		r.calls += w.r.calls
		r.decisions += w.r.decisions
		r.allowed += w.r.allowed
		r.denied += w.r.denied
		r.errors += w.r.errors
		r.failed += w.r.failed
		r.unmatched += w.r.unmatched
		for c, k := range w.r.codes {
			r.codes[c] += k
		}
		if r.firstErr == "" {
			r.firstErr = w.r.firstErr
		}
		r.latencies = append(r.latencies, w.r.latencies...)
	}
	slices.Sort(r.latencies)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if r.allowed+r.denied == 0 {
		return r, fmt.Errorf("no decision in %d calls (first error: %s)", r.calls, r.firstErr)
	}
	return r, nil
}

// fail counts a call that ended in err: all its decisions are errors.
func (r *report) fail(decisions int64, err error) {
	r.failed++
	r.codes[codeOf(err)]++
	r.bad(decisions, err.Error())
}

// bad counts decisions that were not made.
func (r *report) bad(decisions int64, msg string) {
	r.errors += decisions
	if r.firstErr == "" {
		r.firstErr = msg
	}
}

// count counts one decision.
func (r *report) count(allowed bool) {
	if allowed {
		r.allowed++
	} else {
		r.denied++
	}
}

// cpuTime returns the user and system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// percentile returns the p-th percentile (0 < p <= 1) of sorted latencies,
// nearest rank; 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// method names the calls of a mode in the report.
func (c config) method() string {
	switch c.mode {
	case "batch":
		return fmt.Sprintf("sluice.v1 TakeBatch of %d, policy %q", c.batch, c.policy)
	case "envoy":
		return fmt.Sprintf("Envoy ShouldRateLimit, domain %q, descriptor %q", c.domain, c.descriptor)
	}
	return fmt.Sprintf("sluice.v1 Take, policy %q", c.policy)
}

func (r report) print(w io.Writer, c config) {
	secs := r.elapsed.Seconds()
	rate := func(n int64) float64 { return float64(n) / secs }
	pct := 0.0
	if r.decisions > 0 {
		pct = 100 * float64(r.allowed) / float64(r.decisions)
	}
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) + "ms" }
	p50, p90, p99 := percentile(r.latencies, 0.50), percentile(r.latencies, 0.90), percentile(r.latencies, 0.99)
	var top time.Duration
	if len(r.latencies) > 0 {
		top = r.latencies[len(r.latencies)-1]
	}
	cpuPer := 0.0
	if r.decisions > 0 {
		cpuPer = float64(r.cpu) / 1e3 / float64(r.decisions)
	}
	fmt.Fprintf(w, "%s, %d in flight over %d connections, %d keys (uniform), client %s, %.2fs\n", c.method(), c.inFlight, c.conns, c.keys, c.client, secs)
	fmt.Fprintf(w, "calls      %d (%.0f/s), %d failed\n", r.calls, rate(r.calls), r.failed)
	fmt.Fprintf(w, "decisions  %d (%.0f/s): %d allowed (%.2f%%), %d denied, %d errors\n", r.decisions, rate(r.decisions), r.allowed, pct, r.denied, r.errors)
	if r.errors > 0 {
		var st []string
		for _, k := range slices.Sorted(maps.Keys(r.codes)) {
			st = append(st, fmt.Sprintf("%d × %v", r.codes[k], k))
		}
		if r.unmatched > 0 {
			st = append(st, fmt.Sprintf("%d × no rule matched", r.unmatched))
		}
		fmt.Fprintf(w, "errors     %s; first: %s\n", strings.Join(st, ", "), r.firstErr)
	}
	fmt.Fprintf(w, "latency    p50 %s, p90 %s, p99 %s, max %s (of a call)\n", ms(p50), ms(p90), ms(p99), ms(top))
	fmt.Fprintf(w, "client CPU %.2fµs a decision (%.2f cores)\n", cpuPer, float64(r.cpu)/float64(r.elapsed))
	fmt.Fprintf(w, "result mode=%s decisions/s=%.0f allowed=%.2f%% errors=%d p50=%s p90=%s p99=%s max=%s client-cpu-us=%.2f\n",
		c.mode, rate(r.decisions), pct, r.errors, ms(p50), ms(p90), ms(p99), ms(top), cpuPer)
}
