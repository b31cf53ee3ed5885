package postgres

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bench/internal/benchtab"
	"github.com/sluicehq/sluice/pgstore"
)

// The flags of TestTable, which runs only when -table is given:
//
//	cd bench && go test -v -run Table -count 1 -timeout 30m ./postgres/ -args -table -rounds 5 -seconds 5
var (
	tableFlag     = flag.Bool("table", false, "run TestTable, the interleaved table of docs/BENCHMARKS.md")
	tableRounds   = flag.Int("rounds", 5, "TestTable: rounds")
	tableSeconds  = flag.Float64("seconds", 5, "TestTable: seconds per limiter, cell and round")
	tableSync     = flag.String("sync", "on", "TestTable: synchronous_commit")
	tableLimiters = flag.String("limiters", "upsert,sluice,sluice-batch1", "TestTable: the limiters, in the order of each round")
	tableTx       = flag.Int("transactions", 0, "TestTable: pgstore.Options.Transactions of sluice and sluice-session (0: the default)")
)

// A tableLimiter makes one decision for a key; setup returns it, and the
// tables it writes (emptied before each round).
type tableLimiter struct {
	name  string
	setup func(tb testing.TB) (decide func(ctx context.Context, key string) error, tables []string)
}

// tableLimiterSet holds the limiters TestTable can run, by name:
//
//   - upsert, the ceiling: one bare INSERT ... ON CONFLICT DO UPDATE ...
//     RETURNING of a counter in a table of (key, counter), the least a
//     durable per-key counter in PostgreSQL can cost per decision;
//   - sluice, pgstore's Take as New makes it (concurrent takes share
//     transactions), with the timeouts of newStore (so each transaction
//     sets them);
//   - sluice-session, the same store on a pool whose sessions start with
//     those timeouts (pgstore.SessionTimeouts), so no statement precedes
//     a decision;
//   - sluice-batch1, the same store as sluice without shared transactions
//     (Options.Batch 1), every take its own transaction;
//   - sluice-notimeouts, the same store with no statement or lock timeout.
var tableLimiterSet = map[string]tableLimiter{
	"upsert": {"upsert", func(tb testing.TB) (func(ctx context.Context, key string) error, []string) {
		pool := tablePool(tb)
		table := pgx.Identifier{schema, "upsert_ceiling"}.Sanitize()
		if _, err := pool.Exec(context.Background(), "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()+"; CREATE TABLE IF NOT EXISTS "+table+" (key bytea PRIMARY KEY, n bigint NOT NULL)"); err != nil {
			tb.Fatal(err)
		}
		sql := "INSERT INTO " + table + " AS c (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = c.n + 1 RETURNING n"
		return func(ctx context.Context, key string) error {
			var n int64
			return pool.QueryRow(ctx, sql, []byte(key)).Scan(&n)
		}, []string{table}
	}},
	"sluice": {"sluice", func(tb testing.TB) (func(ctx context.Context, key string) error, []string) {
		return tableSluice(newStoreWith(tb, "table_sluice", *tableSync, callers, false, pgstore.Options{Transactions: *tableTx}), "table_sluice")
	}},
	"sluice-session": {"sluice-session", func(tb testing.TB) (func(ctx context.Context, key string) error, []string) {
		return tableSluice(newStoreWith(tb, "table_session", *tableSync, callers, true, pgstore.Options{Transactions: *tableTx}), "table_session")
	}},
	"sluice-batch1": {"sluice-batch1", func(tb testing.TB) (func(ctx context.Context, key string) error, []string) {
		return tableSluice(newStoreWith(tb, "table_batch1", *tableSync, callers, false, pgstore.Options{Batch: 1}), "table_batch1")
	}},
	"sluice-notimeouts": {"sluice-notimeouts", func(tb testing.TB) (func(ctx context.Context, key string) error, []string) {
		pool := tablePool(tb)
		s, err := pgstore.New(context.Background(), pool, pgstore.Options{Schema: schema, Table: "table_notimeouts", StatementTimeout: -1, LockTimeout: -1, SweepInterval: -1})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		if err := s.Migrate(context.Background()); err != nil {
			tb.Fatal(err)
		}
		return tableSluice(s, "table_notimeouts")
	}},
}

// tableSluice returns a decider that takes one token of a key from s,
// under a limit that allows every decision, and s's tables, whose bucket
// table is table.
func tableSluice(s *pgstore.Store, table string) (func(ctx context.Context, key string) error, []string) {
	l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 30)}
	return func(ctx context.Context, key string) error {
			_, err := s.Take(ctx, sluice.Request{Policy: "bench", Key: key, Cost: 1, Limit: l})
			return err
		}, []string{
			pgx.Identifier{schema, table}.Sanitize(),
			pgx.Identifier{schema, table + "_request_ids"}.Sanitize(),
		}
}

// tablePool returns a pool of callers connections with synchronous_commit
// set by -sync, closed when tb ends.
func tablePool(tb testing.TB) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		tb.Fatalf("SLUICE_POSTGRES_URL: %v", err)
	}
	cfg.MaxConns = callers
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = *tableSync
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// TestTable runs every limiter with 16 callers on spread keys (every
// decision a key never decided before, so each creates its row) and on one
// hot key, once per round, the limiters of a cell back to back, each on
// tables of its own that every round empties first, and prints the medians
// over the rounds as the Markdown table of docs/BENCHMARKS.md.
func TestTable(t *testing.T) {
	if !*tableFlag {
		t.Skip("the interleaved table runs only with -args -table")
	}
	if skipReason != "" {
		t.Skip(skipReason)
	}
	var ls []tableLimiter
	for _, name := range strings.Split(*tableLimiters, ",") {
		l, ok := tableLimiterSet[name]
		if !ok {
			t.Fatalf("-limiters: unknown limiter %q", name)
		}
		ls = append(ls, l)
	}
	deciders := make(map[string]func(context.Context, string) error)
	var tables []string
	for _, l := range ls {
		decide, ts := l.setup(t)
		deciders[l.name] = decide
		tables = append(tables, ts...)
	}
	pool := tablePool(t)
	d := time.Duration(*tableSeconds * float64(time.Second))
	workloads := []string{"spread", "hot"}
	results := make(map[string]map[string][]float64)
	for r := range *tableRounds {
		// Every limiter starts the round on empty tables, with no
		// checkpoint due: a table that grew in earlier cells makes its
		// inserts slower, and a checkpoint slows whichever cell it falls
		// in.
		if _, err := pool.Exec(context.Background(), "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(context.Background(), "CHECKPOINT"); err != nil {
			t.Fatalf("CHECKPOINT (the benchmark's role must be allowed it): %v", err)
		}
		for _, w := range workloads {
			if results[w] == nil {
				results[w] = make(map[string][]float64)
			}
			for _, l := range ls {
				rate, err := runTableCell(deciders[l.name], w, fmt.Sprintf("r%d-%s-", r, l.name), d)
				if err != nil {
					t.Fatalf("round %d, %s, %s: %v", r+1, l.name, w, err)
				}
				results[w][l.name] = append(results[w][l.name], rate)
				fmt.Fprintf(os.Stderr, "round %d %s %s: %.0f/s\n", r+1, l.name, w, rate)
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
	b.WriteString("\n|---|---:|" + strings.Repeat("---:|", 2*len(ls)-1) + "\n")
	for _, w := range workloads {
		fmt.Fprintf(&b, "| %s | %d |", w, callers)
		for _, l := range ls {
			fmt.Fprintf(&b, " %s |", benchtab.Thousands(benchtab.Median(results[w][l.name])))
		}
		for _, l := range ls[1:] {
			var v []float64
			for i, x := range results[w][l.name] {
				v = append(v, x/results[w][ls[0].name][i])
			}
			fmt.Fprintf(&b, " %.2f× |", benchtab.Median(v))
		}
		b.WriteString("\n")
	}
	fmt.Print(b.String())
}

// runTableCell makes decisions with decide from callers concurrent callers
// for d, on fresh keys named prefix and a number (spread) or on one key of
// that prefix (hot), and returns the decisions a second.
func runTableCell(decide func(context.Context, string) error, workload, prefix string, d time.Duration) (float64, error) {
	ctx := context.Background()
	hot := prefix + "hot"
	if err := decide(ctx, hot); err != nil { // create the hot row
		return 0, err
	}
	var n atomic.Int64
	var firstErr atomic.Pointer[error]
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for !stop.Load() {
				i := n.Add(1)
				key := hot
				if workload == "spread" {
					key = prefix + strconv.FormatInt(i, 10)
				}
				if err := decide(ctx, key); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	if p := firstErr.Load(); p != nil {
		return 0, *p
	}
	return float64(n.Load()) / elapsed.Seconds(), nil
}
