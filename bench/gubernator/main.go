// Command gubernator (bench/gubernator) compares `sluice serve` with
// gubernator (github.com/gubernator-io/gubernator/v2, a single node) on
// the same workload, from one load-generator process: for each round, each
// cell and each server it starts a fresh server on free loopback ports,
// warms it up, measures one run and stops it, and at the end prints the
// median and range of each measure by cell and server.
//
//	go run ./gubernator -sluice /path/to/sluice -rounds 3 -duration 10s
//	go run ./gubernator -sluice /path/to/sluice -cells grpc-batch -servers sluice
//
// The four cells, each asking for decisions on keys drawn uniformly from
// -keys, with -in-flight calls in flight:
//
//   - http-single: one decision a request over HTTP/1.1 (sluice's POST
//     /v1/take; gubernator's POST /v1/GetRateLimits, its grpc-gateway JSON,
//     of one request item), each request slot on a keep-alive connection
//     of its own;
//   - grpc-single: one decision a call over gRPC (sluice.v1 Take;
//     pb.gubernator.V1/GetRateLimits of one item), over -conns HTTP/2
//     connections;
//   - http-batch: -batch decisions a request (sluice's POST /v1/take:batch;
//     GetRateLimits of -batch items);
//   - grpc-batch: -batch decisions a call (sluice.v1 TakeBatch;
//     GetRateLimits of -batch items).
//
// Both servers are asked for the same keys in the same order in a round
// (each call slot's keys come from a PCG seeded with the round and the
// slot), and the servers take turns going first: in odd rounds in the
// order of -servers, in even ones reversed. Every decision asked for is
// counted as allowed, denied or an error (a call without a usable answer,
// an item that failed), so allowed + denied + errors is always the number
// asked for. The latency of a call runs from just before it is made to its
// answer, read.
//
// The limit: sluice's policy "bench" has -limit ("100 10/s", a bucket of
// 100 refilled at 10 a second), and gubernator's request items the
// closest it has, LEAKY_BUCKET with burst and limit the capacity and
// duration the time to refill from empty (limit.go says why that is the
// same shape); -algorithm token asks for its TOKEN_BUCKET instead, which
// is not.
//
// Each run's report gives the CPU time of the server process over the
// measured run (from /proc/PID/stat), of the generator (getrusage) and of
// every other process (/proc/stat less both), as cores and as microseconds
// a decision; and the load average and idle share of the CPUs before it,
// since the machine may be shared (-wait-idle waits for a quiet machine
// before each run; -retry-busy runs again a run that other processes
// disturbed). The generator runs on -procs Ps (1 by
// default: on a small machine it then leaves more of it to the servers);
// the servers get the machine's GOMAXPROCS.
//
// sluice is started as `SLUICE serve -config FILE -watch=false` with the
// memory store; gubernator by running this program again as its daemon
// (daemon.go has its settings). run.sh, beside it, builds sluice and this
// command and runs the comparison.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice"
)

// Bounds of the flags.
const (
	maxInFlight = 10000
	maxConns    = 1000
	maxKeys     = 1 << 24
	maxBatch    = 1000 // gubernator's most items a GetRateLimits takes, and sluice's
	maxRounds   = 1000
)

func main() {
	ctx, stop := signalContext()
	var err error
	if os.Getenv(daemonEnv) == "1" {
		err = serveGubernator(ctx, os.Stdout, os.Stderr)
	} else {
		err = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gubernator:", err)
		}
		os.Exit(2)
	}
}

// signalContext is a context that ends with SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// run parses the flags, runs the comparison and prints its reports to
// stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, procs, limitText, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	}
	dir, err := os.MkdirTemp("", "bench-gubernator-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	c.launcher.dir = dir
	c.header(stdout, limitText, runtime.GOMAXPROCS(0))
	results, err := c.run(ctx, stdout)
	if len(results) > 0 {
		c.printSummary(stdout, results)
	}
	return err
}

// parseFlags reads the flags into a comparison, checking each against its
// bounds.
func parseFlags(args []string, stderr io.Writer) (c *comparison, procs int, limitText string, err error) {
	fs := flag.NewFlagSet("gubernator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c = &comparison{idleWindow: time.Second}
	servers := fs.String("servers", sluiceServer+","+gubernatorServer, "the servers to compare, in the order of odd rounds")
	cells := fs.String("cells", strings.Join(allCells, ","), "the cells to run: http-single, grpc-single, http-batch, grpc-batch")
	fs.StringVar(&c.launcher.sluiceBin, "sluice", "", "the sluice binary (go build ./cmd/sluice)")
	fs.IntVar(&c.rounds, "rounds", 3, "the rounds; each runs every cell against every server")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long each run measures, if -calls is 0")
	fs.Int64Var(&c.calls, "calls", 0, "the calls of each measured run; 0: run for -duration")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "how long each run sends calls before measuring (not counted)")
	fs.Float64Var(&c.waitIdle, "wait-idle", 0, "before each run, wait (at most 10 minutes) until the CPUs were this many percent idle over 3 s; 0: do not wait")
	fs.Float64Var(&c.retryBusy, "retry-busy", 0, "run a run again (at most 3 times) if the other processes used more than this many cores over it; 0: never")
	fs.IntVar(&c.w.inFlight, "in-flight", 64, "the calls in flight at once")
	fs.IntVar(&c.w.conns, "conns", 4, "the HTTP/2 connections the gRPC calls in flight are spread over")
	fs.IntVar(&c.w.keys, "keys", 10000, "the number of keys, drawn uniformly")
	fs.IntVar(&c.w.batch, "batch", 100, "the decisions of a batch call")
	fs.DurationVar(&c.w.timeout, "timeout", 10*time.Second, "how long one call may take before it counts as an error")
	fs.StringVar(&limitText, "limit", "100 10/s", "the limit of every key, as sluice writes it")
	algorithm := fs.String("algorithm", "leaky", "gubernator's algorithm: leaky (LEAKY_BUCKET, the shape of -limit) or token (TOKEN_BUCKET, a fixed window)")
	fs.IntVar(&procs, "procs", 1, "the generator's GOMAXPROCS; 0: leave it")
	if err := fs.Parse(args); err != nil {
		return nil, 0, "", err
	}
	if fs.NArg() != 0 {
		return nil, 0, "", fmt.Errorf("the command takes no arguments, got %q", fs.Args())
	}
	c.servers = splitList(*servers)
	c.cells = splitList(*cells)
	limit, err := sluice.ParseLimit(limitText)
	if err != nil {
		return nil, 0, "", fmt.Errorf("-limit: %w", err)
	}
	if c.w.gub, err = gubernatorShape(limit, *algorithm); err != nil {
		return nil, 0, "", fmt.Errorf("-limit %q, -algorithm %q: %w", limitText, *algorithm, err)
	}
	c.launcher.limit = limitText
	if c.launcher.exe, err = os.Executable(); err != nil {
		return nil, 0, "", fmt.Errorf("finding this program to run gubernator: %w", err)
	}
	if err := c.check(procs); err != nil {
		return nil, 0, "", err
	}
	return c, procs, limitText, nil
}

// splitList splits a comma-separated flag, dropping empty elements.
func splitList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// check reports the first flag out of its range.
func (c *comparison) check(procs int) error {
	if len(c.servers) == 0 {
		return fmt.Errorf("-servers is empty: want %s, %s or both", sluiceServer, gubernatorServer)
	}
	for i, s := range c.servers {
		if s != sluiceServer && s != gubernatorServer || slices.Contains(c.servers[:i], s) {
			return fmt.Errorf("-servers %q: want %s, %s or both, each once", strings.Join(c.servers, ","), sluiceServer, gubernatorServer)
		}
	}
	if len(c.cells) == 0 {
		return fmt.Errorf("-cells is empty: want some of %s", strings.Join(allCells, ", "))
	}
	for i, cell := range c.cells {
		if !slices.Contains(allCells, cell) || slices.Contains(c.cells[:i], cell) {
			return fmt.Errorf("-cells %q: want some of %s, each once", strings.Join(c.cells, ","), strings.Join(allCells, ", "))
		}
	}
	switch {
	case slices.Contains(c.servers, sluiceServer) && c.launcher.sluiceBin == "":
		return errors.New("-sluice is empty: give the sluice binary (go build ./cmd/sluice)")
	case c.rounds < 1 || c.rounds > maxRounds:
		return fmt.Errorf("-rounds %d: want 1 to %d", c.rounds, maxRounds)
	case c.calls < 0:
		return fmt.Errorf("-calls %d: want 0 (run for -duration) or more", c.calls)
	case c.calls == 0 && c.duration <= 0:
		return fmt.Errorf("-duration %v: want a positive duration, or give -calls", c.duration)
	case c.warmup < 0:
		return fmt.Errorf("-warmup %v: want 0 or a positive duration", c.warmup)
	case c.waitIdle < 0 || c.waitIdle > 100:
		return fmt.Errorf("-wait-idle %v: want 0 to 100 (percent)", c.waitIdle)
	case c.retryBusy < 0 || c.retryBusy > float64(runtime.NumCPU()):
		return fmt.Errorf("-retry-busy %v: want 0 (never) to %d (cores)", c.retryBusy, runtime.NumCPU())
	case c.w.inFlight < 1 || c.w.inFlight > maxInFlight:
		return fmt.Errorf("-in-flight %d: want 1 to %d", c.w.inFlight, maxInFlight)
	case c.w.conns < 1 || c.w.conns > min(c.w.inFlight, maxConns):
		return fmt.Errorf("-conns %d: want 1 to %d (at most -in-flight)", c.w.conns, min(c.w.inFlight, maxConns))
	case c.w.keys < 1 || c.w.keys > maxKeys:
		return fmt.Errorf("-keys %d: want 1 to %d", c.w.keys, maxKeys)
	case c.w.batch < 1 || c.w.batch > maxBatch:
		return fmt.Errorf("-batch %d: want 1 to %d", c.w.batch, maxBatch)
	case c.w.timeout <= 0:
		return fmt.Errorf("-timeout %v: want a positive duration", c.w.timeout)
	case procs < 0:
		return fmt.Errorf("-procs %d: want 0 (leave GOMAXPROCS) or more", procs)
	}
	if c.launcher.sluiceBin != "" {
		if _, err := os.Stat(c.launcher.sluiceBin); err != nil {
			return fmt.Errorf("-sluice: %w", err)
		}
	}
	return nil
}
