package redis

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bench/internal/benchtab"
	"github.com/sluicehq/sluice/redisstore"
)

// The flags of TestTable, which runs only when -table is given:
//
//	cd bench && go test -run Table -count 1 -timeout 30m ./redis/ -args -table -rounds 5 -decisions 20000
var (
	tableFlag     = flag.Bool("table", false, "run TestTable, the interleaved table of docs/BENCHMARKS.md")
	tableRounds   = flag.Int("rounds", 5, "TestTable: rounds")
	tableN        = flag.Int("decisions", 20_000, "TestTable: decisions per limiter, cell and round")
	tableCallers  = flag.String("callers", "1,16,64", "TestTable: the numbers of concurrent callers")
	tableLimiters = flag.String("limiters", "redis_rate,sluice,sluice-batch1", "TestTable: the limiters, in the order of each round")
)

// The limit of TestTable: a burst of 100 and 10 tokens a second, so the hot
// key is denied almost always once its burst is gone.
const (
	tableBurst = 100
	tableRate  = 10
)

// tableLimiterSet holds the limiters TestTable can run, by name.
var tableLimiterSet = map[string]limiter{
	"redis_rate":        {"redis_rate", redisRate(tableRate, tableBurst)},
	"sluice":            {"sluice", tableSluice(redisstore.Options{})},
	"sluice-batch1":     {"sluice-batch1", tableSluice(redisstore.Options{Batch: 1})},
	"sluice-pipelines1": {"sluice-pipelines1", tableSluice(redisstore.Options{Pipelines: 1})},
	"sluice-pipelines3": {"sluice-pipelines3", tableSluice(redisstore.Options{Pipelines: 3})},
}

// tableSluice returns the setup of a redisstore limiter with options o
// (and the benchmarks' prefix) under the limit of TestTable.
func tableSluice(o redisstore.Options) func(tb testing.TB, callers int) (decider, func()) {
	return func(tb testing.TB, callers int) (decider, func()) {
		c := newClient(callers)
		o.Prefix = "sluice-bench:"
		s, err := redisstore.New(c, o)
		if err != nil {
			tb.Fatal(err)
		}
		lim := sluice.Limit{Capacity: tableBurst, Rate: sluice.PerSecond(tableRate)}
		return func(ctx context.Context, key string) (bool, error) {
			d, err := s.Take(ctx, sluice.Request{Policy: "bench", Key: key, Cost: 1, Limit: lim})
			return d.Allowed, err
		}, func() { c.Close() }
	}
}

// cellResult is what one limiter did in one cell and round.
type cellResult struct {
	perSecond float64 // decisions a second
	cpu       float64 // Redis CPU microseconds a decision, user + system
	client    float64 // this process's CPU microseconds a decision
}

// TestTable runs every limiter on every cell (one hot key or 100,000 keys,
// at each number of callers) once per round, the limiters of a cell one
// after another within the round, so that the figures compared are seconds
// apart; it prints the medians over the rounds as the Markdown table of
// docs/BENCHMARKS.md.
func TestTable(t *testing.T) {
	if !*tableFlag {
		t.Skip("the interleaved table runs only with -args -table")
	}
	if skipReason != "" {
		t.Skip(skipReason)
	}
	var ls []limiter
	for _, name := range strings.Split(*tableLimiters, ",") {
		l, ok := tableLimiterSet[name]
		if !ok {
			t.Fatalf("-limiters: unknown limiter %q", name)
		}
		ls = append(ls, l)
	}
	var callerCounts []int
	for _, s := range strings.Split(*tableCallers, ",") {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil || n < 1 {
			t.Fatalf("-callers: %q is not a positive number", s)
		}
		callerCounts = append(callerCounts, n)
	}
	type cell struct {
		spread  bool
		callers int
	}
	var cells []cell
	for _, spread := range []bool{false, true} {
		for _, c := range callerCounts {
			cells = append(cells, cell{spread, c})
		}
	}
	results := make(map[cell]map[string][]cellResult)
	for r := range *tableRounds {
		for _, c := range cells {
			if results[c] == nil {
				results[c] = make(map[string][]cellResult)
			}
			for _, l := range ls {
				res, err := runCell(t, l, c.spread, c.callers, *tableN)
				if err != nil {
					t.Fatalf("round %d, %s, spread=%v, callers=%d: %v", r+1, l.name, c.spread, c.callers, err)
				}
				results[c][l.name] = append(results[c][l.name], res)
				fmt.Fprintf(os.Stderr, "round %d %s spread=%v callers=%d: %.0f/s, Redis %.2f µs, client %.2f µs\n", r+1, l.name, c.spread, c.callers, res.perSecond, res.cpu, res.client)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| keys | callers |")
	for _, l := range ls {
		fmt.Fprintf(&b, " %s dec/s |", l.name)
	}
	for _, l := range ls[1:] {
		fmt.Fprintf(&b, " %s ÷ %s |", l.name, ls[0].name)
	}
	for _, l := range ls {
		fmt.Fprintf(&b, " %s Redis CPU µs |", l.name)
	}
	for _, l := range ls {
		fmt.Fprintf(&b, " %s client CPU µs |", l.name)
	}
	b.WriteString("\n|---|---:|")
	b.WriteString(strings.Repeat("---:|", 4*len(ls)-1))
	b.WriteString("\n")
	for _, c := range cells {
		keys := "one hot key"
		if c.spread {
			keys = "100,000 keys"
		}
		fmt.Fprintf(&b, "| %s | %d |", keys, c.callers)
		med := func(name string, f func(cellResult) float64) float64 {
			var v []float64
			for _, r := range results[c][name] {
				v = append(v, f(r))
			}
			return benchtab.Median(v)
		}
		rate := func(r cellResult) float64 { return r.perSecond }
		for _, l := range ls {
			fmt.Fprintf(&b, " %s |", benchtab.Thousands(med(l.name, rate)))
		}
		for _, l := range ls[1:] {
			// The median of the ratios within a round: the figures of a
			// round are seconds apart, those of two rounds minutes.
			var v []float64
			for i, r := range results[c][l.name] {
				v = append(v, r.perSecond/results[c][ls[0].name][i].perSecond)
			}
			fmt.Fprintf(&b, " %.2f× |", benchtab.Median(v))
		}
		for _, l := range ls {
			fmt.Fprintf(&b, " %.1f |", med(l.name, func(r cellResult) float64 { return r.cpu }))
		}
		for _, l := range ls {
			fmt.Fprintf(&b, " %.1f |", med(l.name, func(r cellResult) float64 { return r.client }))
		}
		b.WriteString("\n")
	}
	fmt.Print(b.String())
}

// runCell makes n decisions with l from callers concurrent callers, on one
// hot key or on keys taken in turn from 100,000, on an empty database.
func runCell(tb testing.TB, l limiter, spread bool, callers, n int) (cellResult, error) {
	ctx := context.Background()
	admin := redis.NewClient(opts)
	defer admin.Close()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		return cellResult{}, err
	}
	decide, done := l.setup(tb, callers)
	defer done()
	var warm sync.WaitGroup
	var warmErr atomic.Pointer[error]
	for range callers {
		warm.Go(func() {
			if _, err := decide(ctx, "warm"); err != nil {
				warmErr.CompareAndSwap(nil, &err)
			}
		})
	}
	warm.Wait()
	if p := warmErr.Load(); p != nil {
		return cellResult{}, *p
	}
	cpu0, err := serverCPU(ctx, admin)
	if err != nil {
		return cellResult{}, err
	}
	self0 := selfCPU(tb)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				key := "hot"
				if spread {
					key = keys[i%spreadKeys]
				}
				if _, err := decide(ctx, key); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	self1 := selfCPU(tb)
	if p := firstErr.Load(); p != nil {
		return cellResult{}, *p
	}
	cpu1, err := serverCPU(ctx, admin)
	if err != nil {
		return cellResult{}, err
	}
	return cellResult{
		perSecond: float64(n) / elapsed.Seconds(),
		cpu:       (cpu1 - cpu0) * 1e6 / float64(n),
		client:    (self1 - self0).Seconds() * 1e6 / float64(n),
	}, nil
}

// selfCPU returns the CPU time this process has used, user and system.
func selfCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
