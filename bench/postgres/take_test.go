package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// defaultURL is the server used when SLUICE_POSTGRES_URL is not set.
const defaultURL = "postgres://postgres@127.0.0.1:5432/test"

// callers is the number of concurrent callers, and of pool connections.
const callers = 16

var (
	// serverURL is the server's URL; schema is this run's schema in it.
	serverURL string
	schema    string
	// skipReason, if not empty, is why the benchmarks are skipped.
	skipReason string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx := context.Background()
	serverURL = os.Getenv("SLUICE_POSTGRES_URL")
	if serverURL == "" {
		serverURL = defaultURL
	}
	if err := ping(ctx, serverURL, 3*time.Second); err != nil {
		msg := fmt.Sprintf("bench/postgres: no PostgreSQL answers at SLUICE_POSTGRES_URL (default %s): %v", defaultURL, err)
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, msg)
			return 1
		}
		skipReason = msg + "; skipping (set CI=true to fail instead)"
		fmt.Println(skipReason)
		return m.Run()
	}
	b := make([]byte, 6)
	rand.Read(b)
	schema = "sluice_bench_" + hex.EncodeToString(b)
	defer func() {
		c, err := pgx.Connect(ctx, serverURL)
		if err == nil {
			_, err = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			c.Close(ctx)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench/postgres: dropping the schema %s: %v\n", schema, err)
		}
	}()
	return m.Run()
}

// ping connects to url and runs one query within timeout.
func ping(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.Ping(ctx)
}

// newStore returns a pool of callers connections with synchronous_commit
// set to sync, and a store of the migrated table in this run's schema. Both
// are closed when tb ends; the table is dropped with the schema.
func newStore(tb testing.TB, table, sync string) *pgstore.Store {
	tb.Helper()
	return newStoreConns(tb, table, sync, callers)
}

// newStoreConns is newStore with a pool of conns connections.
func newStoreConns(tb testing.TB, table, sync string, conns int32) *pgstore.Store {
	tb.Helper()
	return newStoreWith(tb, table, sync, conns, false, pgstore.Options{})
}

// newStoreWith is newStoreConns whose pool's sessions carry the timeouts
// (pgstore.SessionTimeouts) if session is set, with o's Batch and
// Transactions.
func newStoreWith(tb testing.TB, table, sync string, conns int32, session bool, o pgstore.Options) *pgstore.Store {
	tb.Helper()
	if skipReason != "" {
		tb.Skip(skipReason)
	}
	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		tb.Fatalf("SLUICE_POSTGRES_URL: %v", err)
	}
	cfg.MaxConns = conns
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = sync
	// Generous timeouts: a hot key's callers queue on its row lock, and the
	// benchmark measures throughput, not fail-fast behaviour.
	o = pgstore.Options{
		Schema: schema, Table: table,
		StatementTimeout: 10 * time.Second, LockTimeout: 10 * time.Second,
		SweepInterval: -1,
		Batch:         o.Batch, Transactions: o.Transactions,
	}
	if session {
		if err := pgstore.SessionTimeouts(cfg, o); err != nil {
			tb.Fatal(err)
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	s, err := pgstore.New(context.Background(), pool, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s
}

// TestTake is a smoke test: one decision, allowed, in a fresh table.
func TestTake(t *testing.T) {
	s := newStore(t, "smoke", "on")
	d, err := s.Take(context.Background(), sluice.Request{Policy: "bench", Key: "k", Cost: 1, Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Take = %+v, want allowed with 1 remaining", d)
	}
}

// BenchmarkTake measures decisions with 16 concurrent callers on 16
// connections, on spread keys (1M, so nearly every take creates a bucket)
// and on one hot key, with synchronous_commit on (every decision durable at
// commit) and off. Every decision is allowed. It reports decisions/s; the
// same workload as pgstore's BenchmarkTake. Run it for 5s or more:
//
//	cd bench && go test -run '^$' -bench . -benchtime 5s ./postgres/
func BenchmarkTake(b *testing.B) {
	for _, sync := range []string{"on", "off"} {
		b.Run("sync="+sync, func(b *testing.B) {
			s := newStore(b, "take_sync_"+sync, sync)
			l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 30)}
			for _, keys := range []int{1 << 20, 1} {
				name := "spread"
				if keys == 1 {
					name = "hot"
				}
				b.Run(name, func(b *testing.B) {
					var n atomic.Int64
					b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
					b.ReportAllocs()
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						ctx := context.Background()
						for pb.Next() {
							k := n.Add(1) % int64(keys)
							if _, err := s.Take(ctx, sluice.Request{Policy: "bench", Key: "key" + strconv.FormatInt(k, 10), Cost: 1, Limit: l}); err != nil {
								b.Error(err)
								return
							}
						}
					})
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				})
			}
		})
	}
}

// twoLimitCallers is the number of concurrent callers, and of pool
// connections, of BenchmarkTwoLimits.
const twoLimitCallers = 64

// twoLimitKeys is the number of keys of BenchmarkTwoLimits' spread
// workload.
const twoLimitKeys = 100_000

// BenchmarkTwoLimits measures a decision under two limits at once, a
// TakeAll of the buckets of one key under two policies ("burst" and
// "daily", as a burst limit and a daily quota are stacked), next to a
// single Take of the key under one policy ("burst"), with 64 callers on 64
// connections, on one hot key and on 100,000 keys drawn at random, with
// synchronous_commit on and off. The spread workload's buckets are created
// (full) before it starts, so that every decision updates existing rows,
// as under steady traffic (except in a run of -benchtime 1x, a smoke
// test). Every decision is allowed. It reports
// decisions/s (a multi-take is one decision). Run each cell in its own
// process, alternating their order, and compare medians:
//
//	cd bench && go test -run '^$' -bench 'TwoLimits/sync=on/hot/take$' -benchtime 3s ./postgres/
func BenchmarkTwoLimits(b *testing.B) {
	l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 30)}
	for _, sync := range []string{"on", "off"} {
		b.Run("sync="+sync, func(b *testing.B) {
			table := "two_limits_sync_" + sync
			s := newStoreConns(b, table, sync, twoLimitCallers)
			for _, keys := range []int{1, twoLimitKeys} {
				name := "hot"
				if keys > 1 {
					name = "keys=" + strconv.Itoa(keys)
				}
				b.Run(name, func(b *testing.B) {
					if keys > 1 && !smokeRun() {
						createBuckets(b, table, l, []string{"burst", "daily"}, keys)
					}
					benchTwoLimits(b, s, l, keys)
				})
			}
		})
	}
}

// benchTwoLimits runs the sub-benchmarks "take" and "two-limits" of
// BenchmarkTwoLimits on keys keys.
func benchTwoLimits(b *testing.B, s *pgstore.Store, l sluice.Limit, keys int) {
	for _, op := range []string{"take", "two-limits"} {
		b.Run(op, func(b *testing.B) {
			b.SetParallelism((twoLimitCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				rng := mrand.New(mrand.NewPCG(mrand.Uint64(), mrand.Uint64()))
				rs := []sluice.Request{{Policy: "burst", Cost: 1, Limit: l}, {Policy: "daily", Cost: 1, Limit: l}}
				for pb.Next() {
					key := "key0"
					if keys > 1 {
						key = "key" + strconv.Itoa(rng.IntN(keys))
					}
					var err error
					if op == "take" {
						_, err = s.Take(ctx, sluice.Request{Policy: "burst", Key: key, Cost: 1, Limit: l})
					} else {
						rs[0].Key, rs[1].Key = key, key
						var md sluice.MultiDecision
						md, err = s.TakeAll(ctx, rs)
						if err == nil && !md.Allowed {
							err = fmt.Errorf("TakeAll(%q) denied: %+v", key, md)
						}
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// smokeRun reports whether the benchmarks run once each (-benchtime 1x,
// the smoke run of .ci/run), which need no buckets created beforehand.
func smokeRun() bool {
	f := flag.Lookup("test.benchtime")
	return f != nil && f.Value.String() == "1x"
}

// createBuckets inserts into table the full buckets under l of every
// policy of policies for the keys "key0" to "key<n-1>", stamped at the
// database clock, as the store would have left them.
func createBuckets(b *testing.B, table string, l sluice.Limit, policies []string, n int) {
	b.Helper()
	c, err := pgx.Connect(context.Background(), serverURL)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	q := pgx.Identifier{schema, table}.Sanitize()
	if _, err := c.Exec(context.Background(), "INSERT INTO "+q+` (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at)
		SELECT p, convert_to('key' || i, 'UTF8'), $3, 0, t.now, $3, $4, $5, t.now
		FROM unnest($1::text[]) AS p, generate_series(0, $2 - 1) AS i,
			(SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now) AS t
		ON CONFLICT (policy, key) DO NOTHING`,
		policies, n, l.Capacity, l.Rate.Tokens, int64(l.Rate.Period/time.Microsecond)); err != nil {
		b.Fatalf("creating %d buckets: %v", n, err)
	}
	if _, err := c.Exec(context.Background(), "VACUUM ANALYZE "+q); err != nil {
		b.Fatal(err)
	}
}
