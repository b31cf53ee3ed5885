package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// TestServerRestart restarts a private PostgreSQL (a fast shutdown, then a
// start on the same port and data) while 8 goroutines take tokens from 4
// keys. While it is down every call fails with ErrUnavailable, never a
// denial; within 5 seconds of it accepting connections again every
// goroutine's calls succeed; and the stored state is whole: every bucket
// row is valid, and a key's consumed tokens are at least the takes its
// callers saw allowed and at most those plus the calls that failed (a call
// whose connection broke after its commit was decided without its caller
// knowing).
func TestServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL")
	}
	srv, err := startServer()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("starting a private PostgreSQL: %v", err)
		}
		t.Skipf("cannot start a private PostgreSQL: %v", err)
	}
	defer srv.stop()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(srv.url + "?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := pgstore.New(ctx, pool, pgstore.Options{SweepInterval: -1, StatementTimeout: time.Second, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	// No refill: every token consumed stays consumed.
	l := sluice.Limit{Capacity: sluice.MaxCapacity, Rate: sluice.Per(0, time.Second)}
	const workers, keys = 8, 4
	type result struct {
		at      time.Time
		key     int
		allowed bool
		err     error
	}
	var (
		mu      sync.Mutex
		results []result
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		// lastOK is, per worker, the time of its latest allowed take.
		lastOK [workers]atomic.Int64
	)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := rng.IntN(keys)
				r := sluice.Request{Policy: testPolicy, Key: fmt.Sprint("key", k), Cost: 1, Limit: l}
				if i%3 == 0 {
					r.RequestID = fmt.Sprintf("w%d-%d", w, i)
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				d, err := s.Take(cctx, r)
				cancel()
				now := time.Now()
				mu.Lock()
				results = append(results, result{now, k, d.Allowed, err})
				mu.Unlock()
				if err == nil {
					lastOK[w].Store(now.UnixNano())
				}
				if err != nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}

	time.Sleep(500 * time.Millisecond)
	srv.shutdown()
	down := time.Now()
	time.Sleep(time.Second)
	if err := srv.start(); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("restarting PostgreSQL: %v", err)
	}
	up := time.Now()
	// Run until every worker has been allowed a take after the restart,
	// for at most 5s, and then a little longer.
	for deadline := up.Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		recovered := true
		for w := range lastOK {
			recovered = recovered && lastOK[w].Load() > up.UnixNano()
		}
		if recovered {
			break
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	var (
		okBefore, errDown, okAfter int
		lastErr                    time.Time
		allowed, failed            [keys]int64
	)
	for _, r := range results {
		switch {
		case r.err != nil:
			if !errors.Is(r.err, sluice.ErrUnavailable) {
				t.Fatalf("a take failed with %v, which does not wrap %v", r.err, sluice.ErrUnavailable)
			}
			failed[r.key]++
			lastErr = r.at
			if r.at.After(down) && r.at.Before(up) {
				errDown++
			}
		case !r.allowed:
			t.Fatalf("a take was denied with tokens to spare")
		default:
			allowed[r.key]++
			if r.at.Before(down) {
				okBefore++
			} else if r.at.After(up) {
				okAfter++
			}
		}
	}
	t.Logf("%d takes: %d allowed before the shutdown, %d errors while down, %d allowed after the restart; last error %v after the server accepted connections",
		len(results), okBefore, errDown, okAfter, lastErr.Sub(up).Round(time.Millisecond))
	if okBefore == 0 || errDown == 0 || okAfter == 0 {
		t.Fatalf("want takes allowed before the shutdown, errors while down and takes allowed after the restart")
	}
	if recovery := lastErr.Sub(up); recovery > 5*time.Second {
		t.Fatalf("takes still failed %v after the server accepted connections; want recovery within 5s", recovery)
	}
	for w := range lastOK {
		if at := time.Unix(0, lastOK[w].Load()); !at.After(up) {
			t.Fatalf("worker %d was not allowed a take within 5s after the restart", w)
		}
	}

	for k := range keys {
		key := fmt.Sprint("key", k)
		var tokens, frac, stamp, capacity int64
		var fullAt *int64
		err := pool.QueryRow(ctx, "SELECT tokens, frac, stamp, capacity, full_at FROM public.sluice_buckets WHERE key = $1", []byte(key)).
			Scan(&tokens, &frac, &stamp, &capacity, &fullAt)
		if err != nil {
			t.Fatalf("reading bucket %q: %v", key, err)
		}
		if capacity != l.Capacity || tokens < 0 || tokens > capacity || frac != 0 || fullAt != nil {
			t.Fatalf("bucket %q is tokens %d, frac %d, capacity %d, full_at %v: not a valid bucket of %v", key, tokens, frac, capacity, fullAt, l)
		}
		consumed := capacity - tokens
		if consumed < allowed[k] || consumed > allowed[k]+failed[k] {
			t.Fatalf("bucket %q: %d tokens consumed, but callers saw %d allowed and %d failed", key, consumed, allowed[k], failed[k])
		}
	}
}
