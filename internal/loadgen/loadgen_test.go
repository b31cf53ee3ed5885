package loadgen

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// fakeTarget answers every take at once, by a rule of its key, and counts
// what it was sent.
type fakeTarget struct {
	mu       sync.Mutex
	requests int64
	takes    map[Outcome]int64
	// delay, if set, is how long the request sent at the time it is
	// called with should take.
	delay func(sent time.Time) time.Duration
	// allowAll allows every take, instead of ruleOf.
	allowAll bool
}

func newFake() *fakeTarget { return &fakeTarget{takes: map[Outcome]int64{}} }

func (f *fakeTarget) Describe() string                           { return "fake" }
func (f *fakeTarget) Check(context.Context, string, int64) error { return nil }
func (f *fakeTarget) Close() error                               { return nil }
func (f *fakeTarget) Sender(int) Sender                          { return f }

func (f *fakeTarget) count() (int64, map[Outcome]int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests, maps.Clone(f.takes)
}

// ruleOf decides a take by its key's number: a multiple of 7 fails, an
// even one is allowed, an odd one denied.
func ruleOf(it Item) Result {
	n, err := strconv.Atoi(it.Key[strings.LastIndex(it.Key, "-")+1:])
	switch {
	case err != nil || n%7 == 0:
		return fail("boom", "key "+it.Key)
	case n%2 == 0:
		return Result{Outcome: Allowed}
	}
	return Result{Outcome: Denied}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *fakeTarget) Send(ctx context.Context, items []Item, out []Result) time.Time {
	if f.delay != nil {
		if d := f.delay(time.Now()); d > 0 && !sleepCtx(ctx, d) {
			setAll(out, fail("timeout", "fake"))
			return time.Time{}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	for i, it := range items {
		out[i] = ruleOf(it)
		if f.allowAll {
			out[i] = Result{Outcome: Allowed}
		}
		f.takes[out[i].Outcome]++
	}
	return time.Time{}
}

func options() Options {
	return Options{
		Concurrency: 4, Batch: 1, Timeout: 5 * time.Second, Seed: 1,
		Keys:  Keys{N: 10, Prefix: "k-", Dist: DistUniform},
		Costs: Costs{Min: 1, Max: 1},
	}
}

func TestLoadgenKeys(t *testing.T) {
	const draws = 100000
	tests := []struct {
		name  string
		keys  Keys
		check func(t *testing.T, share []float64)
	}{
		{"uniform", Keys{N: 10, Dist: DistUniform}, func(t *testing.T, share []float64) {
			for i, s := range share {
				if s < 0.09 || s > 0.11 {
					t.Errorf("key %d drawn %.3f of the time, want about 0.1", i, s)
				}
			}
		}},
		{"hot", Keys{N: 10, Dist: DistHot, HotShare: 0.9, HotKeys: 2}, func(t *testing.T, share []float64) {
			if hot := share[0] + share[1]; hot < 0.88 || hot > 0.92 {
				t.Errorf("the 2 hot keys drawn %.3f of the time, want about 0.9", hot)
			}
			for i := 2; i < 10; i++ {
				if share[i] < 0.1/8*0.8 || share[i] > 0.1/8*1.2 {
					t.Errorf("cold key %d drawn %.4f of the time, want about %.4f", i, share[i], 0.1/8)
				}
			}
		}},
		{"zipf", Keys{N: 1000, Dist: DistZipf, ZipfS: 1.5}, func(t *testing.T, share []float64) {
			for i := range 5 {
				if share[i] <= share[i+1] {
					t.Errorf("zipf: key %d drawn %.4f of the time, key %d %.4f; want fewer for each next key", i, share[i], i+1, share[i+1])
				}
			}
			if share[0] < 0.3 {
				t.Errorf("zipf s=1.5: key 0 drawn %.3f of the time, want above 0.3", share[0])
			}
		}},
		{"one key", Keys{N: 1, Dist: DistZipf, ZipfS: 2}, func(t *testing.T, share []float64) {
			if share[0] != 1 {
				t.Errorf("one key drawn %.3f of the time", share[0])
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.keys.check(); err != nil {
				t.Fatal(err)
			}
			p := newKeySpace(tt.keys).picker(rand.New(rand.NewPCG(1, 2)))
			counts := make([]int, tt.keys.N)
			for range draws {
				counts[p.next()]++
			}
			share := make([]float64, len(counts))
			for i, c := range counts {
				share[i] = float64(c) / draws
			}
			tt.check(t, share)
		})
	}
}

func TestLoadgenParseCosts(t *testing.T) {
	tests := []struct {
		in   string
		want Costs
		ok   bool
	}{
		{"uniform:1-5", Costs{1, 5}, true},
		{"uniform:3-3", Costs{3, 3}, true},
		{"uniform:0-5", Costs{}, false},
		{"uniform:5-1", Costs{}, false},
		{"uniform:1", Costs{}, false},
		{"zipf:1-5", Costs{}, false},
		{"uniform:a-b", Costs{}, false},
		{"uniform:1-2000000000000", Costs{}, false},
	}
	for _, tt := range tests {
		got, err := ParseCosts(tt.in)
		if tt.ok && (err != nil || got != tt.want) || !tt.ok && !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("ParseCosts(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
	rng := rand.New(rand.NewPCG(1, 1))
	seen := map[int64]bool{}
	for range 1000 {
		seen[Costs{2, 4}.draw(rng)] = true
	}
	if len(seen) != 3 || !seen[2] || !seen[3] || !seen[4] {
		t.Errorf("uniform:2-4 drew %v, want 2, 3 and 4", seen)
	}
}

func TestLoadgenOptionsCheck(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Options)
	}{
		{"no concurrency", func(o *Options) { o.Concurrency = 0 }},
		{"too much concurrency", func(o *Options) { o.Concurrency = MaxConcurrency + 1 }},
		{"negative rate", func(o *Options) { o.Rate = -1 }},
		{"rate too high", func(o *Options) { o.Rate = 2 * MaxRate }},
		{"unbounded", func(o *Options) { o.Duration, o.Count = 0, 0 }},
		{"negative count", func(o *Options) { o.Count = -1 }},
		{"batch 0", func(o *Options) { o.Batch = 0 }},
		{"batch too large", func(o *Options) { o.Batch = MaxBatch + 1 }},
		{"no timeout", func(o *Options) { o.Timeout = 0 }},
		{"negative warm-up", func(o *Options) { o.Warmup = -time.Second }},
		{"no keys", func(o *Options) { o.Keys.N = 0 }},
		{"unknown dist", func(o *Options) { o.Keys.Dist = "pareto" }},
		{"zipf s of 1", func(o *Options) { o.Keys.Dist, o.Keys.ZipfS = DistZipf, 1 }},
		{"hot share above 1", func(o *Options) { o.Keys.Dist, o.Keys.HotShare, o.Keys.HotKeys = DistHot, 1.5, 1 }},
		{"more hot keys than keys", func(o *Options) { o.Keys.Dist, o.Keys.HotShare, o.Keys.HotKeys = DistHot, 0.5, 11 }},
		{"cost 0", func(o *Options) { o.Costs = Costs{0, 0} }},
		{"fast progress", func(o *Options) { o.Progress, o.Interval = func(Snapshot) {}, time.Millisecond }},
	}
	for _, tt := range tests {
		o := options()
		o.Count = 1
		tt.edit(&o)
		if _, err := Run(t.Context(), newFake(), o); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("%s: Run error %v, want one wrapping ErrInvalidOption", tt.name, err)
		}
	}
	o := options()
	o.Count, o.Keys.Prefix = 1, strings.Repeat("x", sluice.MaxKeyLen)
	if _, err := Run(t.Context(), newFake(), o); !errors.Is(err, sluice.ErrInvalidKey) {
		t.Errorf("a prefix of %d bytes: Run error %v, want ErrInvalidKey", sluice.MaxKeyLen, err)
	}
}

// Every take sent is counted once, by outcome, in both loops.
func TestLoadgenCounts(t *testing.T) {
	for _, rate := range []float64{0, 4000} {
		f := newFake()
		o := options()
		o.Count, o.Batch, o.Rate = 500, 3, rate
		s, err := Run(t.Context(), f, o)
		if err != nil {
			t.Fatal(err)
		}
		requests, takes := f.count()
		if s.Requests != 500 || requests != 500 || s.Decisions != 1500 {
			t.Fatalf("rate %v: summary %d requests, %d decisions; target saw %d requests; want 500 of 3 takes", rate, s.Requests, s.Decisions, requests)
		}
		if s.Allowed != takes[Allowed] || s.Denied != takes[Denied] || s.Errors != takes[Failed] || s.ErrorsByKind["boom"] != takes[Failed] {
			t.Fatalf("rate %v: summary %d allowed, %d denied, %d errors %v; target %v", rate, s.Allowed, s.Denied, s.Errors, s.ErrorsByKind, takes)
		}
		if s.Allowed == 0 || s.Denied == 0 || s.Errors == 0 || s.ErrorSamples["boom"] == "" {
			t.Fatalf("rate %v: %d allowed, %d denied, %d errors (sample %q): want some of each", rate, s.Allowed, s.Denied, s.Errors, s.ErrorSamples["boom"])
		}
		if s.LatencyMS.P50 <= 0 || s.LatencyMS.Max < s.LatencyMS.P99 {
			t.Fatalf("rate %v: latency %+v", rate, s.LatencyMS)
		}
	}
}

// The warm-up's requests are counted apart; together with the measured
// ones they are all the target saw.
func TestLoadgenWarmup(t *testing.T) {
	for _, rate := range []float64{0, 2000} {
		f := newFake()
		f.delay = func(time.Time) time.Duration { return 200 * time.Microsecond }
		o := options()
		o.Rate, o.Warmup, o.Duration = rate, 200*time.Millisecond, 300*time.Millisecond
		s, err := Run(t.Context(), f, o)
		if err != nil {
			t.Fatal(err)
		}
		requests, _ := f.count()
		if s.Warmup == nil || s.Warmup.Requests == 0 || s.Requests == 0 || s.Warmup.Requests+s.Requests != requests {
			t.Fatalf("rate %v: warm-up %+v and %d measured requests; the target saw %d", rate, s.Warmup, s.Requests, requests)
		}
		if s.Seconds < 0.3 || s.Seconds > 1 || s.Warmup.Seconds < 0.2 || s.Warmup.Seconds > 0.25 {
			t.Fatalf("rate %v: measured %.3fs after a warm-up of %.3fs; want 0.3s after 0.2s", rate, s.Seconds, s.Warmup.Seconds)
		}
		if rate > 0 && (s.Requests < 500 || s.Requests > 601) {
			t.Fatalf("open loop at %v/s for 0.3s: %d requests, want about 600", rate, s.Requests)
		}
	}
}

// In an open loop a stall of the target is charged to every request due
// during it, from its intended send time; the service time alone, like a
// closed loop, sees one slow request.
func TestLoadgenOpenLoopCorrection(t *testing.T) {
	f := newFake()
	f.allowAll = true // every latency recorded
	var start atomic.Int64
	var stalled atomic.Bool
	f.delay = func(now time.Time) time.Duration {
		start.CompareAndSwap(0, now.UnixNano())
		if now.UnixNano()-start.Load() > int64(500*time.Millisecond) && stalled.CompareAndSwap(false, true) {
			return 200 * time.Millisecond
		}
		return 0
	}
	o := options()
	o.Rate, o.Count, o.Concurrency = 500, 1000, 1
	s, err := Run(t.Context(), f, o)
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 1000 || !stalled.Load() {
		t.Fatalf("%d requests (stalled %v), want 1000", s.Requests, stalled.Load())
	}
	// About 100 requests were due during the 200ms stall, waiting 200ms
	// down to 0: a tenth of the run, so p99 is near 200ms.
	if s.LatencyMS.P99 < 100 || s.LatencyMS.Max < 190 {
		t.Errorf("latency from the intended send %+v: want p99 of 100ms or more, max about 200ms", s.LatencyMS)
	}
	if s.ServiceTimeMS == nil || s.ServiceTimeMS.P99 > 50 || s.ServiceTimeMS.Max < 190 {
		t.Errorf("service time %+v: want p99 under 50ms (one slow request), max about 200ms", s.ServiceTimeMS)
	}
	if s.Late < 50 || s.MaxLateMS < 150 {
		t.Errorf("%d late requests, at most %.1fms; want about 100, up to about 200ms", s.Late, s.MaxLateMS)
	}
	if s.Seconds < 1.9 || s.Seconds > 2.5 {
		t.Errorf("1000 requests at 500/s took %.2fs, want about 2s", s.Seconds)
	}
}

// A request not sent within the timeout of its intended send time is an
// error of kind "overdue", not a request.
func TestLoadgenOverdue(t *testing.T) {
	f := newFake()
	f.delay = func(time.Time) time.Duration { return 50 * time.Millisecond }
	o := options()
	o.Rate, o.Count, o.Concurrency, o.Timeout = 1000, 200, 1, 100*time.Millisecond
	s, err := Run(t.Context(), f, o)
	if err != nil {
		t.Fatal(err)
	}
	requests, _ := f.count()
	if s.ErrorsByKind["overdue"] == 0 || s.Requests != 200 || requests+s.ErrorsByKind["overdue"] != 200 {
		t.Fatalf("%d requests, %d overdue, %d sent: want 200 in all, most overdue", s.Requests, s.ErrorsByKind["overdue"], requests)
	}
	// An overdue request's wait is its latency: the slow tail stays in.
	if s.LatencyRequests < s.ErrorsByKind["overdue"] || s.LatencyMS.Max < 100 {
		t.Fatalf("latencies of %d requests, max %.1fms; want the %d overdue among them, above the 100ms timeout", s.LatencyRequests, s.LatencyMS.Max, s.ErrorsByKind["overdue"])
	}
}

func TestLoadgenInterrupt(t *testing.T) {
	f := newFake()
	f.delay = func(time.Time) time.Duration { return time.Millisecond }
	o := options()
	o.Duration = time.Minute
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s, err := Run(ctx, f, o)
	if err != nil {
		t.Fatal(err)
	}
	requests, _ := f.count()
	if !s.Interrupted || time.Since(start) > 5*time.Second || s.Requests == 0 || s.Requests != requests {
		t.Fatalf("interrupted run: %+v after %v; the target saw %d requests", s, time.Since(start), requests)
	}
}

func TestLoadgenProgress(t *testing.T) {
	f := newFake()
	f.delay = func(time.Time) time.Duration { return time.Millisecond }
	o := options()
	o.Warmup, o.Duration, o.Interval = 150*time.Millisecond, 300*time.Millisecond, 50*time.Millisecond
	var mu sync.Mutex
	var snaps []Snapshot
	o.Progress = func(s Snapshot) {
		mu.Lock()
		snaps = append(snaps, s)
		mu.Unlock()
	}
	if _, err := Run(t.Context(), f, o); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(snaps) < 6 || !snaps[0].Warmup || snaps[len(snaps)-1].Warmup {
		t.Fatalf("%d snapshots, want about 9, the first of the warm-up, the last measured: %+v", len(snaps), snaps)
	}
	last := snaps[len(snaps)-1]
	prev := snaps[len(snaps)-2]
	line := last.Line(prev)
	for _, want := range []string{"decisions", "allowed", "denied", "errors", "p99", "in flight"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q has no %q", line, want)
		}
	}
	if last.Requests == 0 || last.P99 <= 0 || strings.Contains(line, "\n") {
		t.Errorf("last snapshot %+v, line %q", last, line)
	}
	if !strings.HasPrefix(snaps[0].Line(Snapshot{}), "warm-up") {
		t.Errorf("a warm-up line %q does not say so", snaps[0].Line(Snapshot{}))
	}
}

func TestLoadgenMemory(t *testing.T) {
	limit, err := sluice.ParseLimit("10 1/h")
	if err != nil {
		t.Fatal(err)
	}
	o := options()
	o.Keys.N, o.Count = 5, 100
	target, err := Open(t.Context(), TargetConfig{URL: "memory", Policy: "p", Limit: limit, Batch: 1, Slots: o.Concurrency, MaxKeys: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := target.Check(t.Context(), o.Keys.Name(0), 11); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Errorf("check of a cost above the capacity: %v, want ErrInvalidCost", err)
	}
	if err := target.Check(t.Context(), o.Keys.Name(0), 1); err != nil {
		t.Fatal(err)
	}
	s, err := Run(t.Context(), target, o)
	if err != nil {
		t.Fatal(err)
	}
	// Five buckets of ten tokens, refilled one an hour: exactly 50 allowed.
	if s.Allowed != 50 || s.Denied != 50 || s.Errors != 0 {
		t.Fatalf("100 takes on 5 keys of 10 tokens: %d allowed, %d denied, %d errors; want 50, 50, 0", s.Allowed, s.Denied, s.Errors)
	}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"memory", `limit "10 1/h"`, "closed loop, 4 in flight", "100 in", "50 allowed (50.00%), 50 denied, 0 errors", "p99.9"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary has no %q:\n%s", want, b.String())
		}
	}
}

func TestLoadgenRemote(t *testing.T) {
	refused := []string{
		"http://192.0.2.1:8080",
		"https://10.0.0.1",
		"grpc://[2001:db8::1]:8081",
		"envoy://172.16.0.1:8081",
		"redis://198.51.100.7:6379/0",
		"postgres://u@203.0.113.5/db",
		"postgres://u@127.0.0.1,203.0.113.5/db",
	}
	for _, url := range refused {
		c := TargetConfig{URL: url, Policy: "p", Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}, Batch: 1, Slots: 1, Domain: "d", Descriptor: "k"}
		target, err := Open(t.Context(), c)
		if err == nil {
			target.Close()
		}
		if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "-allow-remote") {
			t.Errorf("Open(%s): %v, want ErrRemote naming -allow-remote", url, err)
		}
	}
	for _, host := range []string{"127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"} {
		if err := checkHost(t.Context(), "x", host, false); err != nil {
			t.Errorf("checkHost(%s): %v", host, err)
		}
	}
	if err := checkHost(t.Context(), "x", "192.0.2.1", true); err != nil {
		t.Errorf("checkHost with allow: %v", err)
	}

	// The dial of a loopback address passes the check of each connection.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := checkedDial("x", false, time.Second)(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dialing %s: %v", ln.Addr(), err)
	}
	conn.Close()
}

func TestLoadgenOpenErrors(t *testing.T) {
	lim := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	tests := []struct {
		c    TargetConfig
		want string
	}{
		{TargetConfig{URL: "ftp://127.0.0.1"}, "want http://HOST:PORT"},
		{TargetConfig{URL: "http://127.0.0.1:8080/v1"}, "without a path"},
		{TargetConfig{URL: "grpc://127.0.0.1"}, "grpc://HOST:PORT"},
		{TargetConfig{URL: "envoy://127.0.0.1:8081"}, "-domain"},
		{TargetConfig{URL: "memory", Batch: 2}, "batches of takes"},
		{TargetConfig{URL: "memory", Limit: sluice.Limit{}}, "invalid limit"},
		{TargetConfig{URL: "grpc://127.0.0.1:1", Conns: 5}, "connections"},
		{TargetConfig{URL: "redis://:secret@127.0.0.1:6379/x"}, "not a valid Redis URL"},
	}
	for _, tt := range tests {
		c := tt.c
		c.Policy, c.Slots = "p", 2
		if c.Batch == 0 {
			c.Batch = 1
		}
		if c.Limit == (sluice.Limit{}) && !strings.Contains(tt.want, "limit") {
			c.Limit = lim
		}
		target, err := Open(t.Context(), c)
		if err == nil {
			target.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%+v): %v, want an error containing %q (and no password)", tt.c, err, tt.want)
		}
	}
}

// A PostgreSQL target's pool is warmed and carries the store's timeouts in
// its sessions, unless PGPerTransactionTimeouts leaves them to each
// decision.
func TestReadyPool(t *testing.T) {
	for _, perTx := range []bool{false, true} {
		pc, err := pgxpool.ParseConfig("postgres://u@127.0.0.1/db")
		if err != nil {
			t.Fatal(err)
		}
		if err := readyPool(pc, pgstore.Options{}, perTx); err != nil {
			t.Fatal(err)
		}
		st, lt := pc.ConnConfig.RuntimeParams["statement_timeout"], pc.ConnConfig.RuntimeParams["lock_timeout"]
		if perTx && (st != "" || lt != "") || !perTx && (st != "200ms" || lt != "100ms") || pc.AfterConnect == nil {
			t.Errorf("per-transaction %v: statement_timeout %q, lock_timeout %q, warmed %v; want pgstore's defaults in the sessions unless per-transaction, and the warm-up", perTx, st, lt, pc.AfterConnect != nil)
		}
	}
}
