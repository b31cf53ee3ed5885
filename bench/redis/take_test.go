package redis

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// defaultURL is the server used when SLUICE_REDIS_URL is not set.
const defaultURL = "redis://127.0.0.1:6379/15"

// spreadKeys is the number of keys of the spread workload.
const spreadKeys = 100_000

// The limit of every workload: a burst of 1,000 and 1,000 tokens a second,
// so the hot key both allows and denies under load.
const (
	burst = 1000
	rate  = 1000
)

var (
	// opts are the client options of every benchmark; skipReason, if not
	// empty, is why they are skipped.
	opts       *redis.Options
	skipReason string
	keys       = func() []string {
		k := make([]string, spreadKeys)
		for i := range k {
			k[i] = "user:" + strconv.Itoa(i)
		}
		return k
	}()
)

func TestMain(m *testing.M) {
	url := os.Getenv("SLUICE_REDIS_URL")
	if url == "" {
		url = defaultURL
	}
	o, err := redis.ParseURL(url)
	if err == nil {
		c := redis.NewClient(o)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = c.Ping(ctx).Err()
		cancel()
		c.Close()
	}
	if err != nil {
		msg := fmt.Sprintf("bench/redis: no Redis answers at SLUICE_REDIS_URL (default %s): %v", defaultURL, err)
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, msg)
			os.Exit(1)
		}
		skipReason = msg + "; skipping (set CI=true to fail instead)"
		fmt.Println(skipReason)
	}
	opts = o
	os.Exit(m.Run())
}

// decider makes one decision on a key.
type decider func(ctx context.Context, key string) (bool, error)

// limiter is one implementation under test: setup returns its decider and
// a function that releases what it made.
type limiter struct {
	name  string
	setup func(tb testing.TB, callers int) (decider, func())
}

// newClient returns a client with a connection per caller, so that no
// caller waits for a connection, no retries (neither limiter may send a
// decision twice), and the caller's deadline on its sockets, which
// redisstore requires.
func newClient(callers int) *redis.Client {
	o := *opts
	o.PoolSize = callers
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	return redis.NewClient(&o)
}

var limiters = []limiter{
	{"redis_rate", redisRate(rate, burst)},
	sluiceDefault,
	{"sluice-unbatched", func(tb testing.TB, callers int) (decider, func()) {
		c := newClient(callers)
		return sluiceDecider(tb, c, 1), func() { c.Close() }
	}},
}

// redisRate returns the setup of go-redis/redis_rate under a burst of
// burst and rate tokens a second.
func redisRate(rate, burst int) func(tb testing.TB, callers int) (decider, func()) {
	return func(tb testing.TB, callers int) (decider, func()) {
		c := newClient(callers)
		l := redis_rate.NewLimiter(c)
		lim := redis_rate.Limit{Rate: rate, Burst: burst, Period: time.Second}
		return func(ctx context.Context, key string) (bool, error) {
			r, err := l.Allow(ctx, key, lim)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}, func() { c.Close() }
	}
}

// sluiceDefault is redisstore as New makes it by default: concurrent
// decisions share pipelines and script calls (Options.Batch 0, which is
// redisstore.DefaultBatch with a go-redis client).
var sluiceDefault = limiter{"sluice", func(tb testing.TB, callers int) (decider, func()) {
	c := newClient(callers)
	return sluiceDecider(tb, c, 0), func() { c.Close() }
}}

// sluiceDecider returns a redisstore decider on c with Options.Batch batch.
func sluiceDecider(tb testing.TB, c redisstore.Client, batch int) decider {
	s := sluiceStore(tb, c, batch)
	lim := sluice.Limit{Capacity: burst, Rate: sluice.PerSecond(rate)}
	return func(ctx context.Context, key string) (bool, error) {
		d, err := s.Take(ctx, sluice.Request{Policy: "bench", Key: key, Cost: 1, Limit: lim})
		return d.Allowed, err
	}
}

// sluiceStore returns the redisstore of the benchmarks on c with
// Options.Batch batch.
func sluiceStore(tb testing.TB, c redisstore.Client, batch int) *redisstore.Store {
	s, err := redisstore.New(c, redisstore.Options{Prefix: "sluice-bench:", Batch: batch})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// BenchmarkDecisions runs b.N decisions from a fixed number of concurrent
// callers, on one hot key or on keys drawn in turn from 100,000, and
// reports decisions/s, the share allowed, the Redis CPU per decision and
// the script calls per decision (below 1 where a batch shares calls).
//
//	cd bench && go test -run '^$' -bench Decisions -benchtime 30000x ./redis/
func BenchmarkDecisions(b *testing.B) {
	runLimiters(b, limiters)
}

// twoLimitLimiters decide each request under two limits of its key, a
// burst (the limit of every workload) and a daily quota of 1,000,000,
// next to sluice's single take under the burst alone.
var twoLimitLimiters = []limiter{
	sluiceDefault,
	{"sluice-takeall", func(tb testing.TB, callers int) (decider, func()) {
		c := newClient(callers)
		s := sluiceStore(tb, c, 0)
		return func(ctx context.Context, key string) (bool, error) {
			md, err := s.TakeAll(ctx, []sluice.Request{
				{Policy: "bench", Key: key, Cost: 1, Limit: burstLimit},
				{Policy: "bench-daily", Key: key, Cost: 1, Limit: dailyLimit},
			})
			return md.Allowed, err
		}, func() { c.Close() }
	}},
	// Two takes one after the other, as a caller without TakeAll would
	// make them: two script calls, and not atomic (the daily quota is
	// charged when the burst then denies). For reference only.
	{"sluice-two-takes", func(tb testing.TB, callers int) (decider, func()) {
		c := newClient(callers)
		s := sluiceStore(tb, c, 0)
		return func(ctx context.Context, key string) (bool, error) {
			d, err := s.Take(ctx, sluice.Request{Policy: "bench-daily", Key: key, Cost: 1, Limit: dailyLimit})
			if err != nil || !d.Allowed {
				return false, err
			}
			d, err = s.Take(ctx, sluice.Request{Policy: "bench", Key: key, Cost: 1, Limit: burstLimit})
			return d.Allowed, err
		}, func() { c.Close() }
	}},
}

// The limits of the two-limit workload: the burst of every workload, and a
// daily quota that the benchmark never exhausts.
var (
	burstLimit = sluice.Limit{Capacity: burst, Rate: sluice.PerSecond(rate)}
	dailyLimit = sluice.Limit{Capacity: 1_000_000, Rate: sluice.Per(1_000_000, 24*time.Hour)}
)

// BenchmarkTwoLimits runs the workloads of BenchmarkDecisions at 1 and 64
// callers with each decision under two limits of its key (TakeAll), next
// to a single take and to two takes in a row.
//
//	cd bench && go test -run '^$' -bench TwoLimits -benchtime 30000x ./redis/
func BenchmarkTwoLimits(b *testing.B) {
	runCells(b, twoLimitLimiters, []int{1, 64})
}

// runLimiters runs benchDecisions for each workload, number of callers
// (1, 16 and 64) and limiter.
func runLimiters(b *testing.B, limiters []limiter) {
	runCells(b, limiters, []int{1, 16, 64})
}

// runCells runs benchDecisions for each workload, number of callers and
// limiter.
func runCells(b *testing.B, limiters []limiter, callerCounts []int) {
	if skipReason != "" {
		b.Skip(skipReason)
	}
	// The limiters of one cell run one after another, so that the machine
	// drifts least between the figures compared.
	for _, spread := range []bool{false, true} {
		for _, callers := range callerCounts {
			for _, l := range limiters {
				name := fmt.Sprintf("%s/hot/callers=%d", l.name, callers)
				if spread {
					name = fmt.Sprintf("%s/spread/callers=%d", l.name, callers)
				}
				b.Run(name, func(b *testing.B) { benchDecisions(b, l, spread, callers) })
			}
		}
	}
}

func benchDecisions(b *testing.B, l limiter, spread bool, callers int) {
	ctx := context.Background()
	admin := redis.NewClient(opts)
	defer admin.Close()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	decide, done := l.setup(b, callers)
	defer done()
	// Warm up: load the script and open the connections.
	var warm sync.WaitGroup
	for range callers {
		warm.Go(func() {
			if _, err := decide(ctx, "warm"); err != nil {
				b.Error(err)
			}
		})
	}
	warm.Wait()
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0, err := serverCPU(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	var next, allowed atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				key := "hot"
				if spread {
					key = keys[i%spreadKeys]
				}
				ok, err := decide(ctx, key)
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if ok {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if p := firstErr.Load(); p != nil {
		b.Fatal(*p)
	}
	cpu1, err := serverCPU(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	usec, calls, err := scriptCPU(ctx, admin)
	if err != nil {
		b.Fatal(err)
	}
	if calls == 0 {
		b.Fatalf("Redis counted no script calls for %d decisions", b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(100*float64(allowed.Load())/float64(b.N), "%allowed")
	b.ReportMetric(usec/float64(b.N), "script-µs/decision")
	b.ReportMetric(float64(calls)/float64(b.N), "calls/decision")
	b.ReportMetric((cpu1-cpu0)*1e6/float64(b.N), "redis-cpu-µs/decision")
}

// serverCPU returns the CPU seconds the Redis server has used, user and
// system, from INFO cpu: its work on scripts and on network I/O.
func serverCPU(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	var found int
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu %q: %w", line, err)
			}
			sum += f
			found++
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu has no used_cpu_user and used_cpu_sys: %q", info)
	}
	return sum, nil
}

// scriptCPU returns the microseconds Redis spent in EVALSHA and EVAL since
// the last CONFIG RESETSTAT, and the number of those calls.
func scriptCPU(ctx context.Context, c *redis.Client) (usec float64, calls int64, err error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		_, fields, _ := strings.Cut(line, ":")
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("commandstats %q: %w", line, err)
				}
				calls += n
			case "usec":
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("commandstats %q: %w", line, err)
				}
				usec += n
			}
		}
	}
	return usec, calls, nil
}
