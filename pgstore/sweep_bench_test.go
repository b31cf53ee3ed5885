package pgstore_test

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// Sizes of BenchmarkTakeDuringSweep.
const (
	sweepBenchRows    = 200_000 // full buckets for the sweeper to delete
	sweepBenchCallers = 16
)

// BenchmarkTakeDuringSweep measures whether the sweeper hurts the hot path.
// Each sub-benchmark uses a fresh table holding 200,000 buckets that are
// full at the store's (explicit) time, then makes a fixed number of
// decisions (16,000 on spread keys, 4,000 on one hot key) from 16 concurrent
// callers, either with no sweep running ("idle") or while Sweep runs over
// and over in another goroutine until the 200,000 rows are gone: paced by
// the default Options.SweepPauseRatio ("sweeping"), or with no pause
// ("sweeping-unpaced", SweepPauseRatio -1). It reports p50, p99 and max
// decision latency and decisions/s; for the sweeping modes these are of
// the decisions that started before the sweep ended (%in-sweep of them),
// over the time both ran, and it reports how long the sweep took
// (sweep-s) and what it deleted (rows-swept). %lock-waits is the share of
// all decisions that waited for their bucket's row lock (Stats.LockWaits)
// and lock-wait-ms their mean wait. The pool has 16 connections for the
// callers and one for the sweeper; synchronous_commit is on (the server's
// default). Each of the b.N rounds fills a fresh table and takes several
// seconds, so run it once:
//
//	go test -run '^$' -bench BenchmarkTakeDuringSweep -benchtime 1x ./pgstore/
func BenchmarkTakeDuringSweep(b *testing.B) {
	cfg := testPool.Config()
	cfg.MaxConns = sweepBenchCallers + 1
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for _, keys := range []int{1 << 20, 1} {
		name, decisions := "spread", 16_000
		if keys == 1 {
			name, decisions = "hot", 4_000
		}
		for _, mode := range []struct {
			name     string
			sweeping bool
			pause    float64 // Options.SweepPauseRatio
		}{
			{"idle", false, 0},
			{"sweeping-unpaced", true, -1},
			{"sweeping", true, 0},
		} {
			b.Run(name+"/"+mode.name, func(b *testing.B) {
				benchTakeDuringSweep(b, pool, keys, decisions, mode.sweeping, mode.pause)
			})
		}
	}
}

// benchTakeDuringSweep runs b.N rounds of the workload, each on a fresh
// table, and reports the metrics of all of them.
func benchTakeDuringSweep(b *testing.B, pool *pgxpool.Pool, keys, decisions int, sweeping bool, pause float64) {
	b.StopTimer()
	var (
		all, measured             []sample
		elapsed, window, sweepDur time.Duration
		swept                     int64
		lockWaits                 uint64
		lockWaitSeconds           float64
	)
	for range b.N {
		r := sweepRound(b, pool, keys, decisions, sweeping, pause)
		all = append(all, r.samples...)
		elapsed += r.elapsed
		swept += r.swept
		sweepDur += r.sweepDur
		window += min(r.sweepDur, r.elapsed)
		lockWaits += r.stats.LockWaits
		lockWaitSeconds += r.stats.LockWaitSeconds
	}
	measured = all
	if sweeping {
		measured = nil
		for _, x := range all {
			if x.inSweep {
				measured = append(measured, x)
			}
		}
	} else {
		window = elapsed
	}
	if len(measured) == 0 {
		b.Fatal("no decisions measured")
	}
	slices.SortFunc(measured, func(x, y sample) int { return cmp.Compare(x.d, y.d) })
	q := func(p float64) float64 {
		return float64(measured[min(len(measured)-1, int(p*float64(len(measured))))].d) / float64(time.Millisecond)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(measured[len(measured)-1].d)/float64(time.Millisecond), "max-ms")
	b.ReportMetric(float64(len(measured))/window.Seconds(), "decisions/s")
	b.ReportMetric(float64(swept)/float64(b.N), "rows-swept")
	b.ReportMetric(float64(lockWaits)/float64(len(all))*100, "%lock-waits")
	if lockWaits > 0 {
		b.ReportMetric(lockWaitSeconds/float64(lockWaits)*1000, "lock-wait-ms")
	}
	b.Logf("%d rounds: %d decisions in %v", b.N, len(all), elapsed.Round(time.Millisecond))
	if sweeping {
		b.ReportMetric(sweepDur.Seconds()/float64(b.N), "sweep-s")
		b.ReportMetric(float64(len(measured))/float64(len(all))*100, "%in-sweep")
		b.Logf("swept %d rows in %v; %d decisions started during the sweep", swept, sweepDur.Round(time.Millisecond), len(measured))
	}
}

// round is what one round of BenchmarkTakeDuringSweep measured.
type round struct {
	samples  []sample
	elapsed  time.Duration // of all the decisions
	swept    int64
	sweepDur time.Duration // from the start of the decisions to the end of the sweep
	stats    pgstore.Stats // the store's, at the end
}

// sweepRound fills a fresh table and measures the decisions on it, with
// the timer running only during the decisions.
func sweepRound(b *testing.B, pool *pgxpool.Pool, keys, decisions int, sweeping bool, pause float64) round {
	ctx := context.Background()
	// The store's clock is the real one shifted by shift, so that the
	// filler rows can be written an hour in the past.
	var shift atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	s, table := newStoreOn(b, pool, pgstore.Options{Now: now, StatementTimeout: 10 * time.Second, LockTimeout: 10 * time.Second, SweepPauseRatio: pause})

	// One real decision an hour ago under 10 tokens/s leaves a bucket
	// full 100ms later; clone its row 200,000 times.
	shift.Store(int64(-time.Hour))
	small := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "template", Cost: 1, Limit: small}); err != nil {
		b.Fatal(err)
	}
	shift.Store(0)
	t := qualified(table)
	if _, err := pool.Exec(ctx, "INSERT INTO "+t+" (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) "+
		"SELECT policy, convert_to('fill' || i, 'UTF8'), tokens, frac, stamp, capacity, rate_tokens, period_us, full_at "+
		"FROM "+t+", generate_series(1, $1) AS i WHERE key = convert_to('template', 'UTF8')", sweepBenchRows); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+t); err != nil {
		b.Fatal(err)
	}
	countRows := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+t+" WHERE key >= convert_to('fill', 'UTF8') AND key < convert_to('film', 'UTF8')").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	if n := countRows(); n != sweepBenchRows {
		b.Fatalf("filled %d rows, want %d", n, sweepBenchRows)
	}

	// The measured decisions never empty or fill their buckets.
	l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.Rate{Tokens: 1, Period: time.Hour}}
	var (
		next      atomic.Int64
		lat       [sweepBenchCallers][]sample
		wg        sync.WaitGroup
		sweepWG   sync.WaitGroup
		swept     int64
		sweepDur  time.Duration
		sweepErr  error
		sweepDone atomic.Bool
		stop      = make(chan struct{})
	)
	b.StartTimer()
	start := time.Now()
	if sweeping {
		sweepWG.Add(1)
		go func() {
			defer sweepWG.Done()
			defer func() {
				sweepDur = time.Since(start)
				sweepDone.Store(true)
			}()
			for swept < sweepBenchRows {
				select {
				case <-stop:
					return
				default:
				}
				w, err := s.Sweep(ctx)
				swept += w.Buckets
				if err != nil {
					sweepErr = err
					return
				}
				if w.Buckets == 0 {
					break
				}
			}
		}()
	}
	for c := range sweepBenchCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat[c] = make([]sample, 0, decisions/sweepBenchCallers*2)
			for {
				i := next.Add(1)
				if i > int64(decisions) {
					return
				}
				inSweep := sweeping && !sweepDone.Load()
				key := "k" + strconv.FormatInt(i%int64(keys), 10)
				t0 := time.Now()
				if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l}); err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], sample{time.Since(t0), inSweep})
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(stop)
	sweepWG.Wait()
	if sweepErr != nil {
		b.Fatalf("Sweep: %v", sweepErr)
	}

	if sweeping {
		if left := countRows(); left != 0 {
			b.Errorf("%d filler rows left after the sweep", left)
		}
	}
	return round{samples: slices.Concat(lat[:]...), elapsed: elapsed, swept: swept, sweepDur: sweepDur, stats: s.Stats()}
}

// sample is one decision's latency, and whether it started before the
// sweep ended.
type sample struct {
	d       time.Duration
	inSweep bool
}
