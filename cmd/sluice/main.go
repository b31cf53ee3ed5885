// Command sluice runs the Sluice rate-limit service and its tools.
// Subcommands:
//
//	sluice serve [-config sluice.yaml] [-drain 10s] [-watch=true]
//	sluice take POLICY KEY [-cost N] [-request-id ID] [-server URL] [-token-env VAR] [-json]
//	sluice status [-server URL] [-token-env VAR] [-json]
//	sluice migrate -config sluice.yaml
//	sluice config check sluice.yaml
//	sluice simulate -limit "10 1/s" [-compare LIMIT | -compare-fixed-window] [-svg DIR] [-json] [TRACE]
//	sluice loadgen [-target URL] [-policy P] [-concurrency N | -rate R] [-duration D] [-count N] [-json]
//
// serve runs the service: the HTTP JSON API (docs/service.md) on
// listen.http, the gRPC API and Envoy's rate-limit service (docs/envoy.md)
// on listen.grpc, and Prometheus metrics on listen.admin, deciding in the
// configured store behind a failure mode and a circuit breaker. Without a
// config it runs the in-memory store and the policy "default" of "100 10/s".
// SIGHUP, and a change of the config file (its directory is watched, so a
// Kubernetes ConfigMap's symlink swap is seen), reload the policies (a bad
// config is refused and logged); SIGTERM drops readiness and lets requests
// in flight finish.
//
// take is a client of a running service: it takes from the bucket of
// (POLICY, KEY) and prints the decision in words, or with -json the
// service's JSON answer. It exits 0 if the take was allowed, 1 if it was
// denied (a degraded denial too), and 2 if there was no decision: bad
// input, an unknown policy, a wrong token, an unreachable or failing
// service.
//
// status prints the config version and the policies of a running service,
// in words or with -json as the service answers them.
//
// migrate creates or upgrades the PostgreSQL schema of the config's store;
// serve never does (a PostgreSQL store that was not migrated answers every
// decision with a 500 that says to run it).
//
// config check validates a config file (docs/config.md) and prints what
// it would run, with warnings; it exits 2 if the file is not valid.
//
// simulate replays a trace (a file, stdin, or -generate) under proposed
// limits, a config's policy or an Envoy rule, decided as serve decides
// them, and reports per key what was allowed and denied; beside a second
// limit or envoyproxy/ratelimit's fixed window it lists the requests
// decided differently. See docs/choosing-a-limit.md.
//
// loadgen sends load to a running service (HTTP, sluice.v1 gRPC, or Envoy's
// rate-limit service) or to a store directly, in a closed loop or at a
// target rate with latencies measured from each request's due time, and
// reports decisions/s, allowed and denied, errors and latency percentiles.
// It refuses a host that is not loopback unless -allow-remote. See
// docs/loadgen.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, errDenied) {
		os.Exit(1)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(2)
	}
}

const usage = `usage: sluice <command> [flags]

commands:
  serve          run the rate-limit service (HTTP JSON and gRPC APIs, Envoy's rate-limit service, metrics)
  take           take from a bucket of a running service (exit 0 allowed, 1 denied, 2 error)
  status         the config version and policies of a running service
  migrate        create or upgrade the PostgreSQL schema of a config's store
  config check   validate a config file and print what it would run
  simulate       try a limit on a recorded or generated trace before deploying it
  loadgen        send load to a running service or a store; report decisions and latency

Run "sluice <command> -h" for a command's flags.`

var errUsage = errors.New("unknown or missing command")

// run parses args and runs one subcommand. A subcommand's -h prints its
// help and succeeds.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if err := runCommand(ctx, args, stdin, stdout, stderr); !errors.Is(err, errHelp) {
		return err
	}
	return nil
}

func runCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "take":
		return takeCommand(ctx, args[1:], stdout, stderr)
	case "status":
		return statusCommand(ctx, args[1:], stdout, stderr)
	case "migrate":
		return migrateCommand(ctx, args[1:], stdout, stderr)
	case "config":
		return configCommand(args[1:], stdout, stderr)
	case "simulate":
		return simulate(ctx, args[1:], stdin, stdout, stderr)
	case "loadgen":
		return loadgen(ctx, args[1:], stdin, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	fmt.Fprintln(stderr, usage)
	return fmt.Errorf("%w: %q", errUsage, args[0])
}
