package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	lg "github.com/sluicehq/sluice/internal/loadgen"
)

// errTooManyErrors ends a run whose share of errors is above -max-errors.
// It wraps errDenied, for which main exits 1 without a message: loadgen
// has printed the summary and the reason already.
var errTooManyErrors = fmt.Errorf("loadgen: errors above -max-errors: %w", errDenied)

const loadgenUsage = `usage: sluice loadgen [-target URL] [-policy P] [-concurrency N | -rate R] [-duration D] [-count N] [flags]

loadgen sends takes to a running sluice service, over its HTTP API, its
sluice.v1 gRPC API or Envoy's rate-limit API, or directly to a store in this
process, and reports the decisions and the latency (docs/loadgen.md). It
reads no standard input: only its flags, and the bearer token from the
environment variable that -token-env names. It sends load only to loopback
addresses unless -allow-remote is given.

targets:
  http://HOST:PORT     POST /v1/take (with -batch N: /v1/take:batch); https:// too
  grpc://HOST:PORT     sluice.v1 Take (with -batch N: TakeBatch)
  envoy://HOST:PORT    Envoy's ShouldRateLimit: -domain D, -descriptor KEY (the take's key is the value)
  memory               the in-memory store in this process, under -limit
  redis://HOST:PORT/DB the Redis store in this process, under -limit
  postgres://USER@HOST/DB  the PostgreSQL store in this process, under -limit (schema migrated first)

examples:
  sluice loadgen -target http://127.0.0.1:8080 -policy api -concurrency 32 -duration 30s
  sluice loadgen -target grpc://127.0.0.1:8081 -policy api -rate 5000 -duration 1m -warmup 5s -keys 100000 -dist zipf
  sluice loadgen -target envoy://127.0.0.1:8081 -domain edge -descriptor remote_address -rate 1000 -count 10000
  sluice loadgen -target memory -limit "100 10/s" -count 1000000 -json

flags:`

const loadgenExit = `exit status: 0 the run finished with errors within -max-errors; 1 it finished
with more errors than -max-errors (default 0%: any error); 2 bad usage, a
refused target, a target that failed the first check, or an interrupted run.`

// loadgen runs "sluice loadgen": it checks the target once, sends the
// load, prints progress lines while it runs and the summary at the end, and
// returns errTooManyErrors if the errors are above -max-errors.
func loadgen(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	// The flag package would print its error and the usage on stderr, and
	// main prints the error again: the error is printed once, by main.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var (
		tc lg.TargetConfig
		o  lg.Options
	)
	fs.StringVar(&tc.URL, "target", "http://127.0.0.1:8080", "the target: http://HOST:PORT, grpc://HOST:PORT, envoy://HOST:PORT, memory, redis://HOST:PORT/DB or postgres://USER@HOST/DB")
	fs.StringVar(&tc.Policy, "policy", "default", "the policy every take names (for a store target: the name of its buckets)")
	limit := fs.String("limit", "100 10/s", "the limit of a store target's policy (a service's config has its own)")
	fs.StringVar(&tc.Domain, "domain", "", "envoy: the domain of the requests")
	fs.StringVar(&tc.Descriptor, "descriptor", "", "envoy: the key of the descriptor's one entry; the take's key is its value")
	tokenEnv := fs.String("token-env", "", "the environment variable holding the bearer token, if the service requires one")
	fs.BoolVar(&tc.AllowRemote, "allow-remote", false, "allow a target that is not a loopback address")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "the requests in flight (closed loop); with -rate, the most in flight, 256 unless given")
	fs.Float64Var(&o.Rate, "rate", 0, "requests a second, sent on schedule whatever the answers (open loop); 0: a closed loop")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "how long to measure; with -count alone, no bound by time")
	fs.Int64Var(&o.Count, "count", 0, "the requests to measure; with -duration, whichever ends first")
	fs.DurationVar(&o.Warmup, "warmup", 0, "how long to send before measuring (counted apart)")
	fs.IntVar(&o.Keys.N, "keys", 1000, "the number of distinct keys")
	fs.StringVar(&o.Keys.Dist, "dist", lg.DistUniform, "how keys are drawn: uniform, hot (-hot-share of the requests on -hot-keys keys) or zipf (-zipf-s)")
	fs.Float64Var(&o.Keys.ZipfS, "zipf-s", 1.1, "zipf: the exponent, above 1 (larger: more skewed)")
	fs.Float64Var(&o.Keys.HotShare, "hot-share", 0.9, "hot: the share of the requests on the hot keys, 0 to 1")
	fs.IntVar(&o.Keys.HotKeys, "hot-keys", 1, "hot: the number of hot keys")
	fs.StringVar(&o.Keys.Prefix, "key-prefix", "loadgen-", "the keys are this prefix and a number, 0 to -keys minus 1")
	cost := fs.Int64("cost", 1, "the cost of every take")
	costDist := fs.String("cost-dist", "", "draw each take's cost instead: uniform:MIN-MAX")
	fs.IntVar(&o.Batch, "batch", 1, "http and grpc: the takes of one request, 1 to 1000 (a batch call above 1)")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Second, "how long one request may take before it counts as an error")
	fs.IntVar(&tc.Conns, "conns", 1, "grpc and envoy: the HTTP/2 connections the requests share")
	fs.Uint64Var(&o.Seed, "seed", 1, "the seed of the keys and costs drawn")
	interval := fs.Duration("interval", 0, "the time between progress lines (default 1s on a terminal, 5s otherwise)")
	quiet := fs.Bool("quiet", false, "print no progress lines, only the summary")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object (progress lines go to stderr)")
	maxErrors := fs.String("max-errors", "0%", "the share of takes that may be errors, as a percentage, before the exit status is 1")
	fs.StringVar(&tc.PGSchema, "pg-schema", "", "postgres: the schema of the store's tables (default public)")
	fs.StringVar(&tc.PGTable, "pg-table", "", "postgres: the store's table (default sluice_buckets)")
	fs.BoolVar(&tc.PGPerTransactionTimeouts, "pg-per-transaction-timeouts", false, "postgres: set the timeouts in each decision's transaction, not in the sessions (behind PgBouncer)")
	fs.IntVar(&tc.StoreBatch, "store-batch", 0, "redis and postgres: the most concurrent decisions the store sends together, 1 to 1000 (1: each alone; default: the store's, 64)")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, loadgenUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			fmt.Fprintln(stdout, loadgenExit)
			return nil
		}
		return fmt.Errorf("loadgen: %w (sluice loadgen -h lists the flags)", err)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("loadgen takes no arguments, got %q (sluice loadgen -h lists the flags)", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := loadgenFlags(&tc, &o, set, *limit, *tokenEnv, *cost, *costDist); err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if err := o.Check(); err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	errLimit, err := parsePercent(*maxErrors)
	if err != nil {
		return fmt.Errorf("loadgen: -max-errors %q: %w", *maxErrors, err)
	}
	if *interval < 0 || *interval > 0 && *interval < lg.MinInterval {
		return fmt.Errorf("loadgen: -interval %v: want at least %v, or 0 for the default", *interval, lg.MinInterval)
	}

	target, err := lg.Open(ctx, tc)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	defer target.Close()
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	err = target.Check(cctx, o.Keys.Name(0), o.Costs.Max)
	cancel()
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}

	progress := stdout
	if *asJSON {
		progress = stderr
	}
	tty := isTerminal(progress)
	printed := false
	if !*quiet {
		o.Interval = *interval
		if o.Interval == 0 {
			o.Interval = 5 * time.Second
			if tty {
				o.Interval = time.Second
			}
		}
		var prev lg.Snapshot
		o.Progress = func(s lg.Snapshot) {
			if tty {
				// Rewritten in place: back to the start, the line, and
				// the rest of the old one cleared.
				fmt.Fprintf(progress, "\r%s\x1b[K", s.Line(prev))
			} else {
				fmt.Fprintln(progress, s.Line(prev))
			}
			prev, printed = s, true
		}
	}
	summary, err := lg.Run(ctx, target, o)
	if err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if tty && printed {
		fmt.Fprint(progress, "\r\x1b[K")
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(summary); err != nil {
			return err
		}
	} else if err := summary.WriteText(stdout); err != nil {
		return err
	}
	switch {
	case summary.Interrupted:
		return errors.New("loadgen: interrupted: the summary covers the requests made until then")
	case summary.Decisions == 0:
		return errors.New("loadgen: no request was made")
	case summary.Errors > 0 && summary.ErrorPercent > errLimit:
		fmt.Fprintf(stderr, "sluice: loadgen: %d of %d takes were errors (%.3f%%), above -max-errors %s\n", summary.Errors, summary.Decisions, summary.ErrorPercent, *maxErrors)
		return errTooManyErrors
	}
	return nil
}

// loadgenFlags completes tc and o from the flags, and refuses a flag that
// does not apply to the target (it would be silently ignored).
func loadgenFlags(tc *lg.TargetConfig, o *lg.Options, set map[string]bool, limit, tokenEnv string, cost int64, costDist string) error {
	kind := lg.Kind(tc.URL)
	store := kind == lg.KindMemory || kind == lg.KindRedis || kind == lg.KindPostgres
	only := func(flag string, ok bool, where string) error {
		if set[flag] && !ok {
			return fmt.Errorf("-%s applies to %s only, not to -target %s", flag, where, tc.URL)
		}
		return nil
	}
	for _, c := range []struct {
		flag  string
		ok    bool
		where string
	}{
		{"limit", store, "the store targets (memory, redis://, postgres://)"},
		{"token-env", !store, "service targets (http://, grpc://, envoy://)"},
		{"domain", kind == lg.KindEnvoy, "envoy:// targets"},
		{"descriptor", kind == lg.KindEnvoy, "envoy:// targets"},
		{"policy", kind != lg.KindEnvoy, "targets other than envoy:// (Envoy's rules name the policy)"},
		{"conns", kind == lg.KindGRPC || kind == lg.KindEnvoy, "grpc:// and envoy:// targets"},
		{"pg-schema", kind == lg.KindPostgres, "postgres:// targets"},
		{"pg-table", kind == lg.KindPostgres, "postgres:// targets"},
		{"pg-per-transaction-timeouts", kind == lg.KindPostgres, "postgres:// targets"},
		{"store-batch", kind == lg.KindRedis || kind == lg.KindPostgres, "redis:// and postgres:// targets"},
		{"zipf-s", o.Keys.Dist == lg.DistZipf, "-dist zipf"},
		{"hot-share", o.Keys.Dist == lg.DistHot, "-dist hot"},
		{"hot-keys", o.Keys.Dist == lg.DistHot, "-dist hot"},
	} {
		if err := only(c.flag, c.ok, c.where); err != nil {
			return err
		}
	}
	if set["store-batch"] && (tc.StoreBatch < 1 || tc.StoreBatch > 1000) {
		return fmt.Errorf("-store-batch %d: want 1 to 1000", tc.StoreBatch)
	}
	if kind == lg.KindEnvoy {
		tc.Policy = "envoy" // not sent: the rules name the policy
	}
	if store {
		l, err := sluice.ParseLimit(limit)
		if err != nil {
			return fmt.Errorf("-limit %q: %w", limit, err)
		}
		tc.Limit = l
	}
	if tokenEnv != "" {
		v, ok := os.LookupEnv(tokenEnv)
		if !ok || v == "" {
			return fmt.Errorf("-token-env: the variable %s is not set", tokenEnv)
		}
		tc.Token = v
	}
	switch {
	case costDist != "" && set["cost"]:
		return errors.New("-cost and -cost-dist are two ways of saying the cost: give one")
	case costDist != "":
		c, err := lg.ParseCosts(costDist)
		if err != nil {
			return fmt.Errorf("-cost-dist: %w", err)
		}
		o.Costs = c
	default:
		o.Costs = lg.Costs{Min: cost, Max: cost}
	}
	if set["count"] && !set["duration"] {
		o.Duration = 0 // bounded by the count alone
	}
	if o.Rate > 0 && !set["concurrency"] {
		o.Concurrency = 256
	}
	tc.Batch, tc.Slots, tc.Timeout, tc.MaxKeys = o.Batch, o.Concurrency, o.Timeout, o.Keys.N
	return nil
}

// parsePercent parses "N%" into N; "0" alone is 0 too.
func parsePercent(s string) (float64, error) {
	if s == "0" {
		return 0, nil
	}
	num, ok := strings.CutSuffix(s, "%")
	if !ok {
		return 0, fmt.Errorf("%w: want a percentage, as 1%% or 0.1%%", sluice.ErrInvalidOption)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || !(v >= 0 && v <= 100) {
		return 0, fmt.Errorf("%w: want a percentage from 0%% to 100%%", sluice.ErrInvalidOption)
	}
	return v, nil
}

// isTerminal reports whether w is a terminal (a character device), where
// a progress line is rewritten in place. A variable, for the tests.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
