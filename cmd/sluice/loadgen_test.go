package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// loadgenSummary is what the tests read of loadgen's JSON summary.
type loadgenSummary struct {
	Target             string            `json:"target"`
	Loop               string            `json:"loop"`
	Requests           int64             `json:"requests"`
	Decisions          int64             `json:"decisions"`
	DecisionsPerSecond float64           `json:"decisions_per_second"`
	Allowed            int64             `json:"allowed"`
	Denied             int64             `json:"denied"`
	Errors             int64             `json:"errors"`
	ErrorsByKind       map[string]int64  `json:"errors_by_kind"`
	ErrorSamples       map[string]string `json:"error_samples"`
	Late               int64             `json:"late"`
	LatencyRequests    int64             `json:"latency_requests"`
	Latency            struct {
		P50, P99, Max float64
	} `json:"latency_ms"`
	Service *struct {
		P50, P99, Max float64
	} `json:"service_time_ms"`
}

// runLoadgen runs "sluice loadgen args -json" and returns its summary, its
// stderr and its error.
func runLoadgen(t *testing.T, args ...string) (loadgenSummary, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := loadgen(t.Context(), append([]string{"-json"}, args...), strings.NewReader(""), &stdout, &stderr)
	var s loadgenSummary
	if stdout.Len() > 0 {
		if jerr := json.Unmarshal(stdout.Bytes(), &s); jerr != nil || bytes.Count(stdout.Bytes(), []byte("\n")) != 1 {
			t.Fatalf("loadgen -json printed %q, not one JSON object: %v", stdout.String(), jerr)
		}
	}
	return s, stderr.String(), err
}

var metricLine = regexp.MustCompile(`^(\w+)\{([^}]*)\} (\S+)$`)
var metricLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// decisionsByResult sums the server's sluice_decisions_total of op over
// the policies starting with policyPrefix, by result.
func decisionsByResult(t *testing.T, admin, op, policyPrefix string) map[string]int64 {
	t.Helper()
	code, text := get(t, admin+"/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1] != "sluice_decisions_total" {
			continue
		}
		labels := map[string]string{}
		for _, l := range metricLabel.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		if labels["op"] != op || !strings.HasPrefix(labels["policy"], policyPrefix) {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", sc.Text(), err)
		}
		out[labels["result"]] += int64(v)
	}
	return out
}

// checkAgainstServer fails t unless the summary's decisions are those the
// server counted, and the run made some of each.
func checkAgainstServer(t *testing.T, s loadgenSummary, server map[string]int64) {
	t.Helper()
	if s.Errors != 0 || s.Allowed == 0 || s.Denied == 0 || s.Allowed+s.Denied != s.Decisions {
		t.Fatalf("summary %+v: want allowed and denied takes, and no error", s)
	}
	others := 0
	for r, n := range server {
		if r != "allowed" && r != "denied" {
			others += int(n)
		}
	}
	if server["allowed"] != s.Allowed || server["denied"] != s.Denied || others != 0 {
		t.Fatalf("loadgen counted %d allowed, %d denied; the server's sluice_decisions_total %v", s.Allowed, s.Denied, server)
	}
}

func TestLoadgenHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := loadgen(t.Context(), []string{"-h"}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("loadgen -h: %v", err)
	}
	for _, want := range []string{"usage: sluice loadgen", "reads no standard input", "-token-env", "examples:", "sluice loadgen -target", "-allow-remote", "exit status: 0"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("loadgen -h printed no %q:\n%s", want, stdout.String())
		}
	}
	if stderr.Len() != 0 {
		t.Errorf("loadgen -h wrote to stderr: %q", stderr.String())
	}
}

// Bad usage is refused before any load, with one error that names the
// flag; nothing else is printed.
func TestLoadgenUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-concurrency", "0"}, "concurrency 0"},
		{[]string{"-frobnicate"}, "-frobnicate"},
		{[]string{"extra"}, "no arguments"},
		{[]string{"-dist", "pareto"}, `"pareto"`},
		{[]string{"-zipf-s", "2"}, "-zipf-s applies to -dist zipf"},
		{[]string{"-limit", "5 1/s"}, "-limit applies to the store targets"},
		{[]string{"-target", "memory", "-token-env", "X"}, "-token-env applies to service targets"},
		{[]string{"-target", "ftp://127.0.0.1:21"}, "want http://HOST:PORT"},
		{[]string{"-target", "memory", "-limit", "5 1/fortnight"}, "-limit"},
		{[]string{"-rate", "-1"}, "rate -1"},
		{[]string{"-cost", "2", "-cost-dist", "uniform:1-2"}, "give one"},
		{[]string{"-cost-dist", "normal:1-2"}, "uniform:MIN-MAX"},
		{[]string{"-max-errors", "5"}, "percentage"},
		{[]string{"-count", "0", "-duration", "0s"}, "neither a duration nor a count"},
		{[]string{"-target", "memory", "-batch", "2"}, "batches"},
		{[]string{"-target", "envoy://127.0.0.1:1"}, "-domain"},
		{[]string{"-target", "envoy://127.0.0.1:1", "-policy", "api", "-domain", "d", "-descriptor", "k"}, "-policy applies to"},
		{[]string{"-token-env", "SLUICE_LOADGEN_UNSET"}, "SLUICE_LOADGEN_UNSET is not set"},
		{[]string{"-interval", "1ms"}, "-interval"},
		{[]string{"-target", "memory", "-limit", "5 1/s", "-pg-per-transaction-timeouts"}, "-pg-per-transaction-timeouts applies to"},
		{[]string{"-target", "memory", "-limit", "5 1/s", "-store-batch", "1"}, "-store-batch applies to"},
		{[]string{"-target", "redis://127.0.0.1:1/0", "-limit", "5 1/s", "-store-batch", "0"}, "-store-batch 0: want 1 to 1000"},
		// Nothing answers on port 1 of loopback: the check fails before
		// any load.
		{[]string{"-target", "http://127.0.0.1:1"}, "cannot reach"},
		{[]string{"-target", "grpc://127.0.0.1:1"}, "cannot reach"},
		// A load generator refuses other hosts.
		{[]string{"-target", "http://192.0.2.1:8080"}, "-allow-remote"},
		{[]string{"-target", "grpc://[2001:db8::1]:8081"}, "-allow-remote"},
		{[]string{"-target", "redis://10.0.0.1:6379/0", "-limit", "5 1/s"}, "not a loopback address"},
		{[]string{"-target", "postgres://u@203.0.113.5/db", "-limit", "5 1/s"}, "not a loopback address"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := loadgen(t.Context(), append([]string{"-timeout", "2s"}, tt.args...), nil, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tt.want) || errors.Is(err, errDenied) {
			t.Errorf("loadgen %q: error %v, want one containing %q (exit 2)", tt.args, err, tt.want)
		}
		if stdout.Len() != 0 || stderr.Len() != 0 {
			t.Errorf("loadgen %q printed %q and %q; the error alone is printed, by main", tt.args, stdout.String(), stderr.String())
		}
	}
}

// Against a real sluice serve over HTTP, loadgen's counts are the server's.
// The limit lets 20 keys make at most 400 takes in the 2s run, so that a
// slow machine (CI under -race made 1,600/s) still sees denials.
func TestLoadgenHTTP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"10 5/s\"\n")
	s := startServe(t, "-config", path, "-watch=false")
	got, stderr, err := runLoadgen(t, "-target", s.api, "-policy", "api", "-concurrency", "4", "-duration", "2s", "-keys", "20", "-interval", "500ms")
	if err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr)
	}
	checkAgainstServer(t, got, decisionsByResult(t, s.admin, "take", "api"))
	if !strings.Contains(got.Target, "/v1/take") || got.Loop != "closed" || got.Latency.P50 <= 0 {
		t.Errorf("summary %+v", got)
	}
	// With -json the progress lines go to stderr; not a terminal, they
	// are plain lines.
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) < 2 || strings.Contains(stderr, "\r") || !strings.Contains(lines[0], "p99") {
		t.Errorf("progress on stderr: %q; want a line every 500ms, without \\r", stderr)
	}

	// Batches: /v1/take:batch of 10 takes, counted one by one.
	writeConfig(t, path, "  api:\n    limit: \"100 50/s\"\n  batch:\n    limit: \"50 10/s\"\n")
	s = startServe(t, "-config", path, "-watch=false")
	got, stderr, err = runLoadgen(t, "-target", s.api, "-policy", "batch", "-batch", "10", "-count", "100", "-keys", "20", "-quiet")
	if err != nil {
		t.Fatalf("loadgen -batch: %v\n%s", err, stderr)
	}
	if got.Requests != 100 || got.Decisions != 1000 || !strings.Contains(got.Target, "take:batch") {
		t.Fatalf("loadgen -batch 10 -count 100: %+v", got)
	}
	checkAgainstServer(t, got, decisionsByResult(t, s.admin, "take", "batch"))
}

// With bearer tokens, loadgen sends the one -token-env names.
func TestLoadgenToken(t *testing.T) {
	const token = "loadgen-token-0123456789abcdef"
	t.Setenv("SLUICE_TEST_TOKENS", token)
	t.Setenv("SLUICE_LOADGEN_TOKEN", token)
	s := serveEnvoy(t, 1, "", rulesDir(t, edgeRules), "auth:\n  bearer_tokens_env: SLUICE_TEST_TOKENS\n")[0]
	for i, target := range []string{s.api, "grpc://" + s.grpc} {
		if _, _, err := runLoadgen(t, "-target", target, "-policy", "api", "-count", "10"); err == nil || !strings.Contains(err.Error(), "-token-env") {
			t.Errorf("%s without a token: %v, want an error naming -token-env", target, err)
		}
		got, stderr, err := runLoadgen(t, "-target", target, "-policy", "api", "-count", "10", "-keys", "1", "-key-prefix", fmt.Sprintf("k%d-", i),
			"-token-env", "SLUICE_LOADGEN_TOKEN", "-quiet")
		if err != nil || got.Allowed != 3 || got.Denied != 7 {
			// The policy api is "3 1/h".
			t.Errorf("%s with the token: %+v, %v\n%s; want 3 allowed, 7 denied", target, got, err, stderr)
		}
	}
}

// Against a real sluice serve over gRPC (sluice.v1), loadgen's counts are
// the server's, for Take and TakeBatch.
func TestLoadgenGRPC(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"10 5/s\"\n  batch:\n    limit: \"50 10/s\"\n")
	s := startServe(t, "-config", path, "-watch=false")
	got, stderr, err := runLoadgen(t, "-target", "grpc://"+s.grpc, "-policy", "api", "-concurrency", "4", "-conns", "2", "-duration", "2s", "-keys", "20", "-quiet")
	if err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr)
	}
	checkAgainstServer(t, got, decisionsByResult(t, s.admin, "take", "api"))

	got, stderr, err = runLoadgen(t, "-target", "grpc://"+s.grpc, "-policy", "batch", "-batch", "10", "-count", "100", "-keys", "20", "-quiet")
	if err != nil {
		t.Fatalf("loadgen -batch: %v\n%s", err, stderr)
	}
	if got.Requests != 100 || got.Decisions != 1000 || !strings.Contains(got.Target, "TakeBatch") {
		t.Fatalf("loadgen -batch 10 -count 100: %+v", got)
	}
	checkAgainstServer(t, got, decisionsByResult(t, s.admin, "take", "batch"))

	if _, _, err := runLoadgen(t, "-target", "grpc://"+s.grpc, "-policy", "nope", "-count", "1"); err == nil || !strings.Contains(err.Error(), `no policy "nope"`) {
		t.Errorf("an unknown policy: %v, want it named", err)
	}
}

// Against Envoy's rate-limit API, loadgen's counts are the server's.
func TestLoadgenEnvoy(t *testing.T) {
	rules := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n"
	s := serveEnvoy(t, 1, "", rulesDir(t, rules), "")[0]
	got, stderr, err := runLoadgen(t, "-target", "envoy://"+s.grpc, "-domain", "edge", "-descriptor", "remote_address",
		"-concurrency", "4", "-duration", "2s", "-keys", "20", "-quiet")
	if err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr)
	}
	checkAgainstServer(t, got, decisionsByResult(t, s.admin, "take", "envoy/edge/"))

	// A descriptor no rule matches would measure nothing: refused.
	_, _, err = runLoadgen(t, "-target", "envoy://"+s.grpc, "-domain", "edge", "-descriptor", "path", "-count", "1")
	if err == nil || !strings.Contains(err.Error(), "no rule with a limit") {
		t.Errorf("a descriptor of no rule: %v, want it refused", err)
	}
}

// fakeService answers /v1/peek and /v1/take like the service, allowing
// everything, with the answer to a take delayed or failed as the test
// says; it counts the takes.
type fakeService struct {
	addr  string
	takes atomic.Int64
	// answer, if set, is called for take n (from 1) and returns its delay
	// and status.
	answer func(n int64) (time.Duration, int)
}

func startFakeService(t *testing.T, answer func(n int64) (time.Duration, int)) *fakeService {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeService{addr: "http://" + ln.Addr().String(), answer: answer}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // the body is not read
		status := 200
		if r.URL.Path == "/v1/take" {
			n := f.takes.Add(1)
			if f.answer != nil {
				var d time.Duration
				d, status = f.answer(n)
				time.Sleep(d)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status == 200 {
			fmt.Fprint(w, `{"allowed":true,"remaining":1}`)
		} else {
			fmt.Fprint(w, `{"type":"about:blank","title":"the limiter failed","status":500,"detail":"injected"}`)
		}
	})}
	go srv.Serve(ln) //nolint:errcheck // closed by the cleanup
	t.Cleanup(func() { srv.Close() })
	return f
}

// An open loop charges a stall of the target to every request due during
// it: measured from the intended send time, p99 shows the stall, while
// the service time (what a closed loop measures) shows one slow request.
func TestLoadgenOpenLoopDelay(t *testing.T) {
	f := startFakeService(t, func(n int64) (time.Duration, int) {
		if n == 100 { // 0.5s into the run
			return 300 * time.Millisecond, 200
		}
		return 0, 200
	})
	got, stderr, err := runLoadgen(t, "-target", f.addr, "-rate", "200", "-count", "400", "-concurrency", "1", "-quiet")
	if err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr)
	}
	if got.Requests != 400 || f.takes.Load() != 400 || got.Loop != "open" {
		t.Fatalf("%d requests, %d takes served, loop %s; want 400 of an open loop", got.Requests, f.takes.Load(), got.Loop)
	}
	// About 60 requests were due during the 300ms stall, waiting from
	// 300ms down: 15% of the run, so p99 is near 300ms.
	if got.Latency.P99 < 150 || got.Latency.Max < 290 {
		t.Errorf("latency from the intended send time %+v: want p99 of 150ms or more and max about 300ms", got.Latency)
	}
	if got.Service == nil || got.Service.P99 > 100 || got.Service.Max < 290 {
		t.Errorf("service time %+v: want p99 under 100ms (one slow request of 400), max about 300ms", got.Service)
	}
	if got.Late < 30 {
		t.Errorf("%d requests late, want about 60", got.Late)
	}
}

// Errors above -max-errors (default none) make exit status 1, after the
// summary; within it, 0.
func TestLoadgenMaxErrors(t *testing.T) {
	f := startFakeService(t, func(n int64) (time.Duration, int) {
		if n%5 == 0 {
			return 0, 500
		}
		return 0, 200
	})
	got, stderr, err := runLoadgen(t, "-target", f.addr, "-count", "100", "-concurrency", "1", "-quiet")
	if !errors.Is(err, errDenied) || got.Errors != 20 || got.ErrorsByKind["http 500"] != 20 || !strings.Contains(stderr, "above -max-errors 0%") {
		t.Fatalf("20 errors in 100: %v, %+v, stderr %q; want exit 1 with the reason on stderr", err, got, stderr)
	}
	if !strings.Contains(got.ErrorSamples["http 500"], "injected") {
		t.Errorf("error samples %v, want the problem's detail", got.ErrorSamples)
	}
	// The latencies are those of the decisions, not of the error statuses.
	if got.LatencyRequests != 80 {
		t.Errorf("latencies of %d requests, want the 80 decided", got.LatencyRequests)
	}
	if _, stderr, err := runLoadgen(t, "-target", f.addr, "-count", "100", "-concurrency", "1", "-quiet", "-max-errors", "25%"); err != nil || stderr != "" {
		t.Fatalf("20%% errors within -max-errors 25%%: %v, stderr %q", err, stderr)
	}
}

func TestLoadgenMemoryTarget(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"-target", "memory", "-limit", "10 1/h", "-keys", "5", "-count", "100", "-concurrency", "4", "-quiet"}
	if err := loadgen(t.Context(), args, nil, &stdout, &stderr); err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr.String())
	}
	// Five buckets of ten tokens, refilled one an hour: exactly 50 allowed.
	for _, want := range []string{"memstore", "100 in", "50 allowed (50.00%), 50 denied, 0 errors", "latency    p50"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("summary has no %q:\n%s", want, stdout.String())
		}
	}
	got, _, err := runLoadgen(t, "-target", "memory", "-limit", "10 1/h", "-keys", "5", "-count", "40", "-cost-dist", "uniform:1-3", "-quiet")
	if err != nil || got.Decisions != 40 || got.Errors != 0 || got.Allowed == 0 || got.Denied == 0 {
		t.Fatalf("costs of 1 to 3: %+v, %v", got, err)
	}
}

// On a terminal the progress line is rewritten in place, and cleared
// before the summary.
func TestLoadgenTerminal(t *testing.T) {
	defer func(f func(io.Writer) bool) { isTerminal = f }(isTerminal)
	isTerminal = func(io.Writer) bool { return true }
	var stdout, stderr bytes.Buffer
	args := []string{"-target", "memory", "-keys", "5", "-duration", "400ms", "-interval", "100ms", "-rate", "1000"}
	if err := loadgen(t.Context(), args, nil, &stdout, &stderr); err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	progress, summary, ok := strings.Cut(out, "\r\x1b[K"+"target")
	if !ok || strings.Count(progress, "\r") < 2 || strings.Contains(progress, "\n") || !strings.Contains(progress, "p99") {
		t.Fatalf("terminal output %q: want progress lines each starting with \\r, then the summary", out)
	}
	if !strings.Contains(summary, "open loop at 1000.0/s") {
		t.Errorf("summary %q", summary)
	}
}

// The store targets take in Redis and PostgreSQL themselves; PostgreSQL's
// schema must be migrated first, and the error says so.
func TestLoadgenStores(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		o := redistest.Options(t)
		if o.Password != "" || o.Network == "unix" {
			t.Skip("the test Redis needs a password or a socket")
		}
		url := fmt.Sprintf("redis://%s/%d", o.Addr, o.DB)
		got, stderr, err := runLoadgen(t, "-target", url, "-policy", "loadgen-test-"+randomName(t), "-limit", "10 1/h", "-keys", "5", "-count", "100", "-quiet")
		if err != nil || got.Allowed != 50 || got.Denied != 50 || got.Errors != 0 {
			t.Fatalf("loadgen: %+v, %v\n%s; want 50 allowed, 50 denied", got, err, stderr)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		section := postgresSection(t, false)
		url := regexp.MustCompile(`url: "([^"]+)"`).FindStringSubmatch(section)[1]
		schema := regexp.MustCompile(`schema: (\S+)`).FindStringSubmatch(section)[1]
		args := []string{"-target", url, "-pg-schema", schema, "-limit", "10 1/h", "-keys", "5", "-count", "100", "-quiet"}
		if _, _, err := runLoadgen(t, args...); err == nil || !strings.Contains(err.Error(), "sluice migrate") {
			t.Fatalf("a schema never migrated: %v, want an error saying to run sluice migrate", err)
		}
		postgresMigrate(t, section)
		got, stderr, err := runLoadgen(t, args...)
		if err != nil || got.Allowed != 50 || got.Denied != 50 || got.Errors != 0 {
			t.Fatalf("loadgen: %+v, %v\n%s; want 50 allowed, 50 denied", got, err, stderr)
		}
		// The same with the timeouts set in each transaction, on keys of
		// their own (that the flag reaches the pool is TestReadyPool's).
		args = append(args, "-pg-per-transaction-timeouts", "-policy", "loadgen-per-tx")
		got, stderr, err = runLoadgen(t, args...)
		if err != nil || got.Allowed != 50 || got.Denied != 50 || got.Errors != 0 {
			t.Fatalf("loadgen -pg-per-transaction-timeouts: %+v, %v\n%s; want 50 allowed, 50 denied", got, err, stderr)
		}
		// And with every take in a transaction of its own.
		args = append(args[:len(args)-2], "-store-batch", "1", "-policy", "loadgen-batch1")
		got, stderr, err = runLoadgen(t, args...)
		if err != nil || got.Allowed != 50 || got.Denied != 50 || got.Errors != 0 {
			t.Fatalf("loadgen -store-batch 1: %+v, %v\n%s; want 50 allowed, 50 denied", got, err, stderr)
		}
	})
}

// postgresMigrate runs "sluice migrate" on the store section.
func postgresMigrate(t *testing.T, section string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "migrate.yaml")
	if err := writeFile(path, section+"policies:\n  api:\n    limit: \"1 1/s\"\n"); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), []string{"migrate", "-config", path}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("sluice migrate: %v\n%s", err, stderr.String())
	}
}
