package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// comparison is what the flags ask for: the runs, and the workload of
// each.
type comparison struct {
	servers  []string
	cells    []string
	rounds   int
	duration time.Duration
	calls    int64 // if above 0, each run makes this many calls instead of running for duration
	warmup   time.Duration
	waitIdle float64 // before each run, wait until the CPUs were this many percent idle (0: do not wait)
	// retryBusy, if above 0, runs a run again (at most maxRetries times)
	// when the other processes used more than that many cores over it.
	retryBusy float64
	// idleWindow is how long the idle share reported before each run is
	// measured over; 0: not measured.
	idleWindow time.Duration
	w          workload
	launcher   launcher
}

// maxRetries bounds the runs again of one run (retryBusy).
const maxRetries = 3

// runResult is one run's report, with the CPU time the server and every
// other process used over it.
type runResult struct {
	round       int
	cell        string
	server      string
	load        string  // the load averages before the run
	idle        float64 // percent of the CPUs idle over the idle window before; -1: not measured
	r           report
	serverCPU   time.Duration
	machineBusy time.Duration // of all processes
}

func (x runResult) rate() float64 { return float64(x.r.decisions) / x.r.elapsed.Seconds() }
func (x runResult) p50() time.Duration {
	return percentile(x.r.latencies, 0.50)
}
func (x runResult) p99() time.Duration {
	return percentile(x.r.latencies, 0.99)
}
func (x runResult) serverUs() float64 {
	return float64(x.serverCPU) / 1e3 / float64(max(x.r.decisions, 1))
}
func (x runResult) clientUs() float64 { return float64(x.r.cpu) / 1e3 / float64(max(x.r.decisions, 1)) }
func (x runResult) allowedPct() float64 {
	return 100 * float64(x.r.allowed) / float64(max(x.r.decisions, 1))
}

// otherCores is the CPU the processes other than the server and the
// generator used over the run, in cores.
func (x runResult) otherCores() float64 {
	return max(0, float64(x.machineBusy-x.serverCPU-x.r.cpu)/float64(x.r.elapsed))
}

// order is the servers of round r in the order they run: as given in odd
// rounds, reversed in even ones, so that neither always runs first.
func (c *comparison) order(r int) []string {
	s := slices.Clone(c.servers)
	if r%2 == 0 {
		slices.Reverse(s)
	}
	return s
}

// run runs every round, cell and server, printing each run's report to
// out as it ends, and returns the results.
func (c *comparison) run(ctx context.Context, out io.Writer) ([]runResult, error) {
	var results []runResult
	for round := 1; round <= c.rounds; round++ {
		for _, cell := range c.cells {
			for _, name := range c.order(round) {
				for attempt := 0; ; attempt++ {
					if err := c.waitForIdle(ctx, out); err != nil {
						return results, err
					}
					x, err := c.once(ctx, round, cell, name)
					if err != nil {
						return results, fmt.Errorf("round %d, %s, %s: %w", round, cell, name, err)
					}
					x.print(out, c)
					if c.retryBusy > 0 && x.otherCores() > c.retryBusy && attempt < maxRetries {
						fmt.Fprintf(out, "retry      other processes used %.2f cores, over %.2f: this run is dropped and run again\n", x.otherCores(), c.retryBusy)
						continue
					}
					results = append(results, x)
					break
				}
			}
		}
	}
	return results, nil
}

// once starts a fresh server, warms it up, measures one run and stops it.
func (c *comparison) once(ctx context.Context, round int, cell, name string) (runResult, error) {
	x := runResult{round: round, cell: cell, server: name, load: loadAverage(), idle: -1}
	if c.idleWindow > 0 {
		idle, err := idleOver(ctx, c.idleWindow)
		if err != nil {
			return x, err
		}
		x.idle = idle
	}
	srv, err := c.launcher.start(ctx, name)
	if err != nil {
		return x, err
	}
	defer srv.stop()
	t, err := newTarget(ctx, srv, cell, c.w)
	if err != nil {
		return x, err
	}
	defer t.close()
	seed := uint64(round)
	if c.warmup > 0 {
		if _, err := t.run(ctx, c.warmup, 0, seed+1<<32, c.w.timeout); err != nil {
			return x, fmt.Errorf("warm-up: %w (server: %s)", err, srv.stderr)
		}
	}
	cpu0, err := procCPU(srv.pid())
	if err != nil {
		return x, err
	}
	busy0, _, err := machineCPU()
	if err != nil {
		return x, err
	}
	x.r, err = t.run(ctx, c.duration, c.calls, seed, c.w.timeout)
	if err != nil {
		return x, fmt.Errorf("%w (server: %s)", err, srv.stderr)
	}
	cpu1, err := procCPU(srv.pid())
	if err != nil {
		return x, err
	}
	busy1, _, err := machineCPU()
	if err != nil {
		return x, err
	}
	x.serverCPU, x.machineBusy = cpu1-cpu0, busy1-busy0
	return x, nil
}

// waitForIdle waits, if asked to, until the CPUs were c.waitIdle percent
// idle over 3 seconds, for at most 10 minutes.
func (c *comparison) waitForIdle(ctx context.Context, out io.Writer) error {
	if c.waitIdle <= 0 {
		return nil
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		idle, err := idleOver(ctx, 3*time.Second)
		if err != nil {
			return err
		}
		if idle >= c.waitIdle {
			return nil
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(out, "the CPUs were not %.0f%% idle within 10 minutes (%.0f%% over the last 3 s); running anyway\n", c.waitIdle, idle)
			return nil
		}
	}
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) + "ms" }

// print writes the report of one run.
func (x runResult) print(w io.Writer, c *comparison) {
	r := x.r
	secs := r.elapsed.Seconds()
	idle := ""
	if x.idle >= 0 {
		idle = fmt.Sprintf(", %.0f%% idle over %v", x.idle, c.idleWindow)
	}
	fmt.Fprintf(w, "\n== round %d, %s, %s; load average %s%s\n", x.round, x.cell, x.server, x.load, idle)
	fmt.Fprintf(w, "calls      %d (%.0f/s) of %d decisions, %d failed, %.2fs\n", r.calls, float64(r.calls)/secs, c.w.perCall(x.cell), r.failed, secs)
	fmt.Fprintf(w, "decisions  %d (%.0f/s): %d allowed (%.2f%%), %d denied, %d errors\n", r.decisions, x.rate(), r.allowed, x.allowedPct(), r.denied, r.errors)
	if r.errors > 0 {
		fmt.Fprintf(w, "errors     first: %s\n", r.firstErr)
	}
	var top time.Duration
	if len(r.latencies) > 0 {
		top = r.latencies[len(r.latencies)-1]
	}
	fmt.Fprintf(w, "latency    p50 %s, p90 %s, p99 %s, max %s (of a call)\n", ms(x.p50()), ms(percentile(r.latencies, 0.90)), ms(x.p99()), ms(top))
	fmt.Fprintf(w, "CPU        server %.2f cores (%.2fµs a decision), generator %.2f cores (%.2fµs a decision), other processes %.2f cores\n",
		float64(x.serverCPU)/float64(r.elapsed), x.serverUs(), float64(r.cpu)/float64(r.elapsed), x.clientUs(), x.otherCores())
	fmt.Fprintf(w, "result round=%d cell=%s server=%s decisions/s=%.0f allowed=%.2f%% errors=%d p50=%s p99=%s server-cpu-us=%.2f client-cpu-us=%.2f other-cores=%.2f\n",
		x.round, x.cell, x.server, x.rate(), x.allowedPct(), r.errors, ms(x.p50()), ms(x.p99()), x.serverUs(), x.clientUs(), x.otherCores())
}

// spread is the median, least and greatest of some values.
type spread struct{ med, lo, hi float64 }

func spreadOf(v []float64) spread {
	s := slices.Sorted(slices.Values(v))
	if len(s) == 0 {
		return spread{}
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

func (s spread) format(prec int) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	return f(s.med) + " (" + f(s.lo) + "–" + f(s.hi) + ")"
}

// cellSummary is the spread of each measure of one server in one cell.
type cellSummary struct {
	rate, p50, p99, serverUs, clientUs, allowed spread
	runs                                        int
}

func summarize(results []runResult, cell, name string) cellSummary {
	var rate, p50, p99, su, cu, al []float64
	for _, x := range results {
		if x.cell != cell || x.server != name {
			continue
		}
		rate = append(rate, x.rate())
		p50 = append(p50, float64(x.p50())/1e6)
		p99 = append(p99, float64(x.p99())/1e6)
		su = append(su, x.serverUs())
		cu = append(cu, x.clientUs())
		al = append(al, x.allowedPct())
	}
	return cellSummary{spreadOf(rate), spreadOf(p50), spreadOf(p99), spreadOf(su), spreadOf(cu), spreadOf(al), len(rate)}
}

// printSummary writes the median and range of each measure by cell and
// server, and, when both servers ran, sluice's decisions/s as a multiple
// of gubernator's and whether it met the target: at least twice the
// decisions/s at a lower p99 (medians).
func (c *comparison) printSummary(w io.Writer, results []runResult) {
	fmt.Fprintf(w, "\n== medians (least–greatest) of %d rounds\n", c.rounds)
	fmt.Fprintf(w, "%-12s %-10s %-28s %-22s %-22s %-22s %-22s %s\n", "cell", "server", "decisions/s", "p50 ms", "p99 ms", "server µs/decision", "client µs/decision", "allowed %")
	both := slices.Contains(c.servers, sluiceServer) && slices.Contains(c.servers, gubernatorServer)
	for _, cell := range c.cells {
		for _, name := range c.servers {
			s := summarize(results, cell, name)
			if s.runs == 0 {
				continue
			}
			fmt.Fprintf(w, "%-12s %-10s %-28s %-22s %-22s %-22s %-22s %s\n", cell, name,
				s.rate.format(0), s.p50.format(3), s.p99.format(3), s.serverUs.format(2), s.clientUs.format(2), s.allowed.format(1))
		}
	}
	if !both {
		return
	}
	fmt.Fprintln(w)
	for _, cell := range c.cells {
		sl, gu := summarize(results, cell, sluiceServer), summarize(results, cell, gubernatorServer)
		if sl.runs == 0 || gu.runs == 0 || gu.rate.med == 0 {
			continue
		}
		ratio := sl.rate.med / gu.rate.med
		verdict := "target met"
		if ratio < 2 || sl.p99.med >= gu.p99.med {
			verdict = "target missed"
		}
		fmt.Fprintf(w, "%-12s sluice %.2f× gubernator's decisions/s, p99 %.3f ms against %.3f ms, server CPU %.2f against %.2f µs a decision: %s\n",
			cell, ratio, sl.p99.med, gu.p99.med, sl.serverUs.med, gu.serverUs.med, verdict)
	}
}

// header describes the comparison.
func (c *comparison) header(w io.Writer, sluiceLimit string, procs int) {
	calls := c.duration.String()
	if c.calls > 0 {
		calls = fmt.Sprintf("%d calls", c.calls)
	}
	host, _ := os.Hostname()
	fmt.Fprintf(w, "servers %s; cells %s; %d rounds of %s after %s of warm-up\n", strings.Join(c.servers, ", "), strings.Join(c.cells, ", "), c.rounds, calls, c.warmup)
	fmt.Fprintf(w, "%d in flight (gRPC over %d connections, HTTP one connection each), %d keys drawn uniformly, batches of %d\n", c.w.inFlight, c.w.conns, c.w.keys, c.w.batch)
	fmt.Fprintf(w, "sluice: memory store, policy %q limit %q; gubernator: single node, %s, hits 1\n", policyName, sluiceLimit, c.w.gub)
	fmt.Fprintf(w, "generator on %d P; host %s, load average %s\n", procs, host, loadAverage())
}
