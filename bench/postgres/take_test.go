package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
	if skipReason != "" {
		tb.Skip(skipReason)
	}
	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		tb.Fatalf("SLUICE_POSTGRES_URL: %v", err)
	}
	cfg.MaxConns = callers
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = sync
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	// Generous timeouts: a hot key's callers queue on its row lock, and the
	// benchmark measures throughput, not fail-fast behaviour.
	s, err := pgstore.New(context.Background(), pool, pgstore.Options{
		Schema: schema, Table: table,
		StatementTimeout: 10 * time.Second, LockTimeout: 10 * time.Second,
		SweepInterval: -1,
	})
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
