// Command grpc (bench/grpc) is a load generator for the gRPC APIs of a
// running `sluice serve`: it keeps a fixed number of calls in flight over
// a few HTTP/2 connections, each asking for decisions on keys drawn
// uniformly from a fixed set, and prints decisions per second, the share
// allowed, the errors, and the latency of a call (p50, p90, p99, max).
//
//	go run ./grpc -addr 127.0.0.1:8081 -policy default -mode take -in-flight 64 -conns 2 -keys 10000 -duration 10s
//	go run ./grpc -addr 127.0.0.1:8081 -policy default -mode batch -batch 100 -calls 5000
//	go run ./grpc -addr 127.0.0.1:8081 -mode envoy -domain bench -descriptor user
//
// The modes:
//
//   - take: each call is one sluice.v1.RateLimiter/Take of the policy and
//     a key, one decision;
//   - batch: each call is one sluice.v1.RateLimiter/TakeBatch of -batch
//     takes, each of its own key;
//   - envoy: each call is one
//     envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit of the
//     domain with one descriptor of one entry, -descriptor and the key as
//     its value, one decision. The service's rules must have a rule for
//     that key (a key-only rule gives each value a bucket of its own); an
//     answer that no rule matched is counted as an error, since it was
//     decided without the store.
//
// Every decision asked for is counted as allowed, denied or an error (a
// call that failed, a batch item that is an error status, an envoy answer
// that is neither OK nor OVER_LIMIT or that no rule matched), so allowed +
// denied + errors is always the number of decisions asked for. The latency
// of a call runs from just before it is made to its answer, decoded; every
// call has one, a failed call's running to its error status. Each call has
// the deadline -timeout (sent as grpc-timeout, as Envoy sends its own).
//
// The calls in flight are spread evenly over -conns connections (gRPC
// ClientConns of one HTTP/2 connection each). The requests are encoded
// and the answers read by the generator itself (-client raw, the default),
// which costs less CPU time than the generated messages of
// google.golang.org/protobuf (-client proto): the generator shares the
// machine with the service, and the less it takes, the more of the
// machine the figures measure the service on. It also prints its own CPU
// time per decision.
//
// run.sh, beside it, builds sluice and this command, starts `sluice serve`
// with the memory store and an Envoy rule on free loopback ports, and runs
// the command against it.
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
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "the host:port of the service's gRPC listener")
	fs.StringVar(&c.mode, "mode", "take", "take: one sluice.v1 Take per call; batch: one TakeBatch of -batch takes; envoy: one ShouldRateLimit of one descriptor")
	fs.StringVar(&c.policy, "policy", "default", "the policy every take names (take and batch modes)")
	fs.StringVar(&c.domain, "domain", "bench", "the domain of every ShouldRateLimit (envoy mode)")
	fs.StringVar(&c.descriptor, "descriptor", "user", "the key of the descriptor's one entry, whose value is the key (envoy mode)")
	fs.IntVar(&c.batch, "batch", 100, "the takes of one TakeBatch (batch mode)")
	fs.IntVar(&c.inFlight, "in-flight", 64, "the calls in flight at once")
	fs.IntVar(&c.conns, "conns", 2, "the HTTP/2 connections the calls in flight are spread over")
	fs.IntVar(&c.keys, "keys", 10000, "the number of keys, drawn uniformly")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to make calls, if -calls is 0")
	fs.Int64Var(&c.calls, "calls", 0, "the number of calls to make; 0: make calls for -duration")
	fs.DurationVar(&c.warmup, "warmup", 0, "how long to make calls before measuring (their decisions are not counted)")
	fs.Uint64Var(&c.seed, "seed", 1, "the seed of the key sequence")
	fs.StringVar(&c.client, "client", "raw", "raw: requests and answers encoded by the generator; proto: the generated messages")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "the deadline of one call, after which it counts as an error")
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
	if err := c.check(); err != nil {
		return err
	}
	g, err := newGenerator(ctx, c)
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
	r, err := g.run(ctx, c.duration, c.calls)
	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return err
	}
	r.print(stdout, c)
	return nil
}
