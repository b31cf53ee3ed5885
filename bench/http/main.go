// Command http (bench/http) is a load generator for the HTTP API of a
// running `sluice serve`: it keeps a fixed number of requests in flight
// over HTTP/1.1 keep-alive connections, each asking for decisions on keys
// drawn uniformly from a fixed set, and prints decisions per second, the
// share allowed, the errors, and the latency of a request (p50, p90, p99,
// max).
//
//	go run ./http -url http://127.0.0.1:8080 -policy default -mode single -in-flight 64 -keys 10000 -duration 10s
//	go run ./http -url http://127.0.0.1:8080 -policy default -mode batch -batch 100 -requests 5000
//
// In single mode each request is one POST /v1/take; in batch mode each is
// one POST /v1/take:batch of -batch takes. Every answer is read in full and
// decoded, and every decision asked for is counted as allowed, denied or an
// error (a transport error, a status other than 200, a batch item that is a
// problem), so allowed + denied + errors is always the number of decisions
// asked for. The latency of a request runs from just before it is sent to
// the end of its answer's body.
//
// By default (-client raw) each request slot has one connection of its own
// and speaks a minimal HTTP/1.1 on it, which costs less CPU time per
// request than net/http's client (-client net/http): the generator shares
// the machine with the service, and the less it takes, the more of the
// machine the figures measure the service on. It also prints its own CPU
// time per decision.
//
// run.sh, beside it, builds sluice and this command, starts `sluice serve`
// with the memory store on free loopback ports, and runs the command
// against it; docs/BENCHMARKS.md ("Service over HTTP") has the figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
		}
		os.Exit(2)
	}
}

// run parses the flags, runs the load and prints its report to stdout.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8080", "the base URL of the service's HTTP API")
	fs.StringVar(&c.policy, "policy", "default", "the policy every take names")
	fs.StringVar(&c.mode, "mode", "single", "single: one POST /v1/take per request; batch: one POST /v1/take:batch of -batch takes")
	fs.IntVar(&c.batch, "batch", 100, "the takes of one batch request (batch mode)")
	fs.IntVar(&c.inFlight, "in-flight", 64, "the requests in flight at once, each on its own keep-alive connection")
	fs.IntVar(&c.keys, "keys", 10000, "the number of keys, drawn uniformly")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to send requests, if -requests is 0")
	fs.Int64Var(&c.requests, "requests", 0, "the number of requests to send; 0: send for -duration")
	fs.DurationVar(&c.warmup, "warmup", 0, "how long to send requests before measuring (their decisions are not counted)")
	fs.Uint64Var(&c.seed, "seed", 1, "the seed of the key sequence")
	fs.StringVar(&c.client, "client", "raw", "raw: a minimal HTTP/1.1 client, one connection per request in flight; net/http: Go's client")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long one request may take before it counts as an error")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the measured run (not the warm-up) to this file")
	tokenEnv := fs.String("token-env", "", "the environment variable holding the bearer token, if the service requires one")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("loadgen takes no arguments, got %q", fs.Args())
	}
	if *tokenEnv != "" {
		v, ok := os.LookupEnv(*tokenEnv)
		if !ok || v == "" {
			return fmt.Errorf("-token-env: the variable %s is not set", *tokenEnv)
		}
		c.token = v
	}
	c.url = strings.TrimRight(c.url, "/")
	if err := c.check(); err != nil {
		return err
	}
	g, err := newGenerator(c)
	if err != nil {
		return err
	}
	defer g.close()
	if c.warmup > 0 {
		if _, err := g.run(ctx, c.warmup, 0); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	r, err := g.run(ctx, c.duration, c.requests)
	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return err
	}
	r.print(stdout, c)
	return nil
}
