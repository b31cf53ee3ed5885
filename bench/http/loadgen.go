package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/bench/internal/rawhttp"
)

// Bounds of the flags.
const (
	maxInFlight = 10000
	maxKeys     = 1 << 24
	maxBatch    = 100000
)

// config is what the flags ask for.
type config struct {
	url      string // the base URL, without a trailing slash
	policy   string
	token    string // the bearer token; empty: none
	mode     string // "single" or "batch"
	batch    int    // takes per batch request
	inFlight int
	keys     int
	duration time.Duration // used when requests is 0
	requests int64
	warmup   time.Duration
	seed     uint64
	client   string        // "raw" or "net/http"
	timeout  time.Duration // of one request
}

// check reports the first flag out of its range.
func (c config) check() error {
	u, err := url.Parse(c.url)
	switch {
	case err != nil:
		return fmt.Errorf("-url %q: %w", c.url, err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("-url %q: want http://host:port or https://host:port", c.url)
	case c.policy == "":
		return fmt.Errorf("-policy is empty: name a policy of the service")
	case c.mode != "single" && c.mode != "batch":
		return fmt.Errorf("-mode %q: want single or batch", c.mode)
	case c.batch < 1 || c.batch > maxBatch:
		return fmt.Errorf("-batch %d: want 1 to %d", c.batch, maxBatch)
	case c.inFlight < 1 || c.inFlight > maxInFlight:
		return fmt.Errorf("-in-flight %d: want 1 to %d", c.inFlight, maxInFlight)
	case c.keys < 1 || c.keys > maxKeys:
		return fmt.Errorf("-keys %d: want 1 to %d", c.keys, maxKeys)
	case c.requests < 0:
		return fmt.Errorf("-requests %d: want 0 (run for -duration) or more", c.requests)
	case c.requests == 0 && c.duration <= 0:
		return fmt.Errorf("-duration %v: want a positive duration, or give -requests", c.duration)
	case c.client != "raw" && c.client != "net/http":
		return fmt.Errorf("-client %q: want raw or net/http", c.client)
	case c.timeout <= 0:
		return fmt.Errorf("-timeout %v: want a positive duration", c.timeout)
	case c.warmup < 0:
		return fmt.Errorf("-warmup %v: want 0 or a positive duration", c.warmup)
	}
	return nil
}

// perRequest is the number of decisions one request asks for.
func (c config) perRequest() int {
	if c.mode == "batch" {
		return c.batch
	}
	return 1
}

// generator sends the load of a config. Its connections live across runs
// (a warm-up, then the measured run).
type generator struct {
	c config
	// keys are the keys as JSON strings; bodies the /v1/take body of
	// each key (single mode).
	keys   [][]byte
	bodies [][]byte
	// batchPrefix and itemPrefix start a batch body and each item of it.
	batchPrefix, itemPrefix []byte
	// senders are the request slots' clients, one each.
	senders []sender
}

// A sender sends one request body to the endpoint and reads the answer.
type sender interface {
	// send posts body and appends the answer's body to answer, returning
	// its status; an error means there was no answer.
	Send(body []byte, answer *bytes.Buffer) (status int, err error)
	Close()
}

func newGenerator(c config) (*generator, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	g := &generator{c: c}
	policy, err := json.Marshal(c.policy)
	if err != nil {
		return nil, err
	}
	g.itemPrefix = slices.Concat([]byte(`{"policy":`), policy, []byte(`,"key":`))
	g.batchPrefix = []byte(`{"requests":[`)
	g.keys = make([][]byte, c.keys)
	for i := range g.keys {
		g.keys[i] = strconv.AppendQuote(nil, "k"+strconv.Itoa(i))
	}
	path := "/v1/take"
	if c.mode == "batch" {
		path = "/v1/take:batch"
	} else {
		g.bodies = make([][]byte, c.keys)
		for i, k := range g.keys {
			g.bodies[i] = slices.Concat(g.itemPrefix, k, []byte("}"))
		}
	}
	u, err := url.Parse(c.url + path)
	if err != nil {
		return nil, fmt.Errorf("-url %q: %w", c.url, err)
	}
	switch c.client {
	case "raw":
		if u.Scheme != "http" {
			return nil, fmt.Errorf("-url %q: -client raw speaks http only; use -client net/http for %s", c.url, u.Scheme)
		}
		for range c.inFlight {
			g.senders = append(g.senders, rawhttp.New(u, c.token, c.timeout))
		}
	default:
		s := newStdSender(u.String(), c.token, c.inFlight, c.timeout)
		for range c.inFlight {
			g.senders = append(g.senders, s)
		}
	}
	return g, nil
}

// close closes the connections.
func (g *generator) close() {
	for _, s := range g.senders {
		s.Close()
	}
}

// report is the outcome of one run.
type report struct {
	requests  int64 // sent, answered or not
	decisions int64 // asked for: allowed + denied + errors
	allowed   int64
	denied    int64
	errors    int64 // decisions that got no answer, a non-200, or a problem item
	failed    int64 // requests without an answer (transport errors)
	statuses  map[int]int64
	firstErr  string
	elapsed   time.Duration
	cpu       time.Duration // of this process over the run
	latencies []time.Duration
}

// worker is the state of one request slot.
type worker struct {
	s    sender
	rng  *rand.Rand
	buf  bytes.Buffer
	body []byte
	outs []outcome
	r    report
}

// run sends requests for d, or until n requests were sent if n > 0, and
// returns what came back. It returns an error if ctx ends, or if not one
// decision was made.
func (g *generator) run(ctx context.Context, d time.Duration, n int64) (report, error) {
	var stop atomic.Bool
	var sent atomic.Int64
	if n == 0 {
		t := time.AfterFunc(d, func() { stop.Store(true) })
		defer t.Stop()
	}
	cancel := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer cancel()

	workers := make([]*worker, g.c.inFlight)
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{s: g.senders[i], rng: rand.New(rand.NewPCG(g.c.seed, uint64(i))), r: report{statuses: map[int]int64{}}}
		workers[i] = w
		wg.Go(func() {
			for !stop.Load() && (n == 0 || sent.Add(1) <= n) {
				g.request(w)
			}
		})
	}
	wg.Wait()
	r := report{elapsed: time.Since(start), cpu: cpuTime() - cpu0, statuses: map[int]int64{}}
	for _, w := range workers {
		r.requests += w.r.requests
		r.decisions += w.r.decisions
		r.allowed += w.r.allowed
		r.denied += w.r.denied
		r.errors += w.r.errors
		r.failed += w.r.failed
		for s, k := range w.r.statuses {
			r.statuses[s] += k
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
		return r, fmt.Errorf("no decision in %d requests (first error: %s)", r.requests, r.firstErr)
	}
	return r, nil
}

// request sends one request and counts its decisions.
func (g *generator) request(w *worker) {
	per := int64(g.c.perRequest())
	w.r.requests++
	w.r.decisions += per
	var body []byte
	if g.c.mode == "batch" {
		// A new buffer each time: net/http's transport may still hold the
		// last one when its answer is in.
		w.body = make([]byte, 0, cap(w.body))
		w.body = append(w.body, g.batchPrefix...)
		for i := range g.c.batch {
			if i > 0 {
				w.body = append(w.body, ',')
			}
			w.body = append(w.body, g.itemPrefix...)
			w.body = append(w.body, g.keys[w.rng.IntN(len(g.keys))]...)
			w.body = append(w.body, '}')
		}
		w.body = append(w.body, "]}"...)
		body = w.body
	} else {
		body = g.bodies[w.rng.IntN(len(g.bodies))]
	}
	w.buf.Reset()
	start := time.Now()
	status, err := w.s.Send(body, &w.buf)
	if err != nil {
		w.r.failed++
		w.bad(per, err.Error())
		return
	}
	w.r.latencies = append(w.r.latencies, time.Since(start))
	if status != http.StatusOK {
		w.r.statuses[status]++
		w.bad(per, fmt.Sprintf("status %d: %.200s", status, w.buf.Bytes()))
		return
	}
	if g.c.mode == "single" {
		o, err := readDecision(w.buf.Bytes())
		if err != nil {
			w.bad(1, fmt.Sprintf("answer %.200q is not a decision: %v", w.buf.Bytes(), err))
			return
		}
		w.count(o)
		return
	}
	outs, err := readBatch(w.buf.Bytes(), w.outs)
	w.outs = outs
	if err != nil || len(outs) != int(per) {
		w.bad(per, fmt.Sprintf("answer %.200q is not %d results: %v", w.buf.Bytes(), per, err))
		return
	}
	for _, o := range outs {
		w.count(o)
	}
}

// count counts one outcome.
func (w *worker) count(o outcome) {
	switch {
	case !o.decided:
		w.r.statuses[o.status]++
		w.bad(1, fmt.Sprintf("batch item: status %d", o.status))
	case o.allowed:
		w.r.allowed++
	default:
		w.r.denied++
	}
}

// bad counts decisions that were not made.
func (w *worker) bad(decisions int64, msg string) {
	w.r.errors += decisions
	if w.r.firstErr == "" {
		w.r.firstErr = msg
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

func (r report) print(w io.Writer, c config) {
	path := "/v1/take"
	if c.mode == "batch" {
		path = fmt.Sprintf("/v1/take:batch of %d", c.batch)
	}
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
	fmt.Fprintf(w, "POST %s, %d in flight, %d keys (uniform), policy %q, %.2fs\n", path, c.inFlight, c.keys, c.policy, secs)
	fmt.Fprintf(w, "requests   %d (%.0f/s), %d without an answer\n", r.requests, rate(r.requests), r.failed)
	fmt.Fprintf(w, "decisions  %d (%.0f/s): %d allowed (%.2f%%), %d denied, %d errors\n", r.decisions, rate(r.decisions), r.allowed, pct, r.denied, r.errors)
	if r.errors > 0 {
		var st []string
		for _, s := range slices.Sorted(maps.Keys(r.statuses)) {
			st = append(st, fmt.Sprintf("%d × status %d", r.statuses[s], s))
		}
		fmt.Fprintf(w, "errors     %s; first: %s\n", strings.Join(st, ", "), r.firstErr)
	}
	fmt.Fprintf(w, "latency    p50 %s, p90 %s, p99 %s, max %s (of a request)\n", ms(p50), ms(p90), ms(p99), ms(top))
	fmt.Fprintf(w, "client CPU %.2fµs a decision (%.2f cores)\n", cpuPer, float64(r.cpu)/float64(r.elapsed))
	fmt.Fprintf(w, "result mode=%s decisions/s=%.0f allowed=%.2f%% errors=%d p50=%s p90=%s p99=%s max=%s client-cpu-us=%.2f\n",
		c.mode, rate(r.decisions), pct, r.errors, ms(p50), ms(p90), ms(p99), ms(top), cpuPer)
}
