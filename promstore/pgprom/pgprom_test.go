package pgprom_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/internal/promtest"
	"github.com/sluicehq/sluice/promstore/pgprom"
	"github.com/sluicehq/sluice/sluicetest"
)

var limit = sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}

// newClock returns a manual clock at 2026-01-01 UTC.
func newClock() *sluicetest.Clock {
	return sluicetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// defaultPostgresURL is the server of the tests when SLUICE_POSTGRES_URL is
// not set. Each test works in a schema of its own; with CI=true a missing
// server fails the tests instead of skipping them (see newPgstore).
const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test"

// newPgstore returns a migrated pgstore.Store configured by o, in a schema
// of its own that is dropped when t ends, on the server at
// SLUICE_POSTGRES_URL (default defaultPostgresURL); also its pool and its
// options with the schema and table set. Its sweeper is off. If no server
// answers, t is skipped, or fails with CI=true.
func newPgstore(t *testing.T, o pgstore.Options) (*pgstore.Store, *pgxpool.Pool, pgstore.Options) {
	t.Helper()
	url := os.Getenv("SLUICE_POSTGRES_URL")
	if url == "" {
		url = defaultPostgresURL
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no PostgreSQL at SLUICE_POSTGRES_URL (default %s), and CI=true makes that a failure: %v", defaultPostgresURL, err)
		}
		t.Skipf("no PostgreSQL at SLUICE_POSTGRES_URL (default %s): %v", defaultPostgresURL, err)
	}
	var b [6]byte
	rand.Read(b[:])
	o.Schema = "sluice_pgprom_" + hex.EncodeToString(b[:])
	o.Table = "buckets"
	o.SweepInterval = -1
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{o.Schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping the schema %s: %v", o.Schema, err)
		}
		pool.Close()
	})
	s, err := pgstore.New(t.Context(), pool, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, pool, o
}

// lockRow makes a take of key on s, which creates its bucket, then locks
// the bucket's row FOR UPDATE in a transaction of pool, which it returns.
// The transaction is rolled back when t ends, if not before.
func lockRow(t *testing.T, s *pgstore.Store, pool *pgxpool.Pool, o pgstore.Options, key string) pgx.Tx {
	t.Helper()
	ctx := t.Context()
	if _, err := s.Take(ctx, sluice.Request{Policy: "api", Key: key, Cost: 1, Limit: limit}); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	table := pgx.Identifier{o.Schema, o.Table}.Sanitize()
	if _, err := tx.Exec(ctx, "SELECT FROM "+table+" WHERE key = $1 FOR UPDATE", []byte(key)); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestStats exports every field of pgstore.Stats under its name.
func TestStats(t *testing.T) {
	reg := prometheus.NewRegistry()
	stats := func() pgstore.Stats {
		return pgstore.Stats{
			SweptBuckets:    7,
			SweptRequestIDs: 3,
			SweepErrors:     2,
			LastSweepError:  errors.New("not exported"),
			LockWaitSeconds: 1.5,
			LockWaits:       12,
			LockTimeouts:    4,
			Conversions:     5,

			InsertFirst:       9,
			InsertFirstMisses: 6,

			SharedTransactions: 8,
			SharedTakes:        30,
		}
	}
	if err := pgprom.Register(reg, promstore.Options{Namespace: "app", ConstLabels: prometheus.Labels{"store": "pg"}}, stats); err != nil {
		t.Fatal(err)
	}
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP app_pgstore_conversions_total Takes of the PostgreSQL store that converted a bucket stored under another limit of the same policy; a steady rate means processes disagree on a limit.
# TYPE app_pgstore_conversions_total counter
app_pgstore_conversions_total{store="pg"} 5
# HELP app_pgstore_insert_first_misses_total Takes of the PostgreSQL store that tried to create their bucket with a plain insert, created nothing (the bucket was there, or the sweep floor above their time), and were decided by the take function in a second round trip.
# TYPE app_pgstore_insert_first_misses_total counter
app_pgstore_insert_first_misses_total{store="pg"} 6
# HELP app_pgstore_insert_first_total Takes of the PostgreSQL store that tried to create their bucket with a plain insert before deciding.
# TYPE app_pgstore_insert_first_total counter
app_pgstore_insert_first_total{store="pg"} 9
# HELP app_pgstore_shared_takes_total Takes of the PostgreSQL store decided in a transaction shared with other takes; one sent again in a shared transaction after another take's error counts again.
# TYPE app_pgstore_shared_takes_total counter
app_pgstore_shared_takes_total{store="pg"} 30
# HELP app_pgstore_shared_transactions_total Transactions of the PostgreSQL store that decided several concurrent takes together.
# TYPE app_pgstore_shared_transactions_total counter
app_pgstore_shared_transactions_total{store="pg"} 8
# HELP app_pgstore_lock_timeouts_total Decisions of the PostgreSQL store that gave up waiting for a bucket's row lock at the lock timeout.
# TYPE app_pgstore_lock_timeouts_total counter
app_pgstore_lock_timeouts_total{store="pg"} 4
# HELP app_pgstore_lock_wait_seconds_total Time decisions of the PostgreSQL store waited for a bucket's row lock held by another transaction before deciding, in seconds; waits that ended at the lock timeout are not included.
# TYPE app_pgstore_lock_wait_seconds_total counter
app_pgstore_lock_wait_seconds_total{store="pg"} 1.5
# HELP app_pgstore_lock_waits_total Decisions of the PostgreSQL store that waited for a bucket's row lock, then decided.
# TYPE app_pgstore_lock_waits_total counter
app_pgstore_lock_waits_total{store="pg"} 12
# HELP app_pgstore_sweep_errors_total Background sweeps of the PostgreSQL store that failed.
# TYPE app_pgstore_sweep_errors_total counter
app_pgstore_sweep_errors_total{store="pg"} 2
# HELP app_pgstore_swept_buckets_total Full buckets deleted by the PostgreSQL store's sweeps.
# TYPE app_pgstore_swept_buckets_total counter
app_pgstore_swept_buckets_total{store="pg"} 7
# HELP app_pgstore_swept_request_ids_total Expired request IDs deleted by the PostgreSQL store's sweeps.
# TYPE app_pgstore_swept_request_ids_total counter
app_pgstore_swept_request_ids_total{store="pg"} 3
`))
	if err != nil {
		t.Error(err)
	}
}

// TestSweep counts what a real sweep deletes.
func TestSweep(t *testing.T) {
	c := newClock()
	ps, _, _ := newPgstore(t, pgstore.Options{Now: c.Now, RequestIDTTL: time.Minute})
	reg := prometheus.NewRegistry()
	if err := pgprom.Register(reg, promstore.Options{}, ps.Stats); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, r := range []sluice.Request{
		{Policy: "api", Key: "a", Cost: 1, Limit: limit},
		{Policy: "api", Key: "b", Cost: 1, Limit: limit, RequestID: "r1"},
		{Policy: "api", Key: "b", Cost: 1, Limit: limit, RequestID: "r2"},
		{Policy: "api", Key: "c", Cost: 3, Limit: limit},
	} {
		if _, err := ps.Take(ctx, r); err != nil {
			t.Fatalf("Take(%+v): %v", r, err)
		}
	}
	// One hour later a, whose one token came back, is full and the request
	// IDs have expired; b and c are still refilling.
	c.Advance(time.Hour)
	if _, err := ps.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		want float64
	}{
		{"sluice_pgstore_swept_buckets_total", 1},
		{"sluice_pgstore_swept_request_ids_total", 2},
		{"sluice_pgstore_sweep_errors_total", 0},
	} {
		if got := promtest.Value(t, reg, tt.name, nil); got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestLocks: with a bucket's row locked by another transaction, a
// store with a short LockTimeout gives up and one with a long one waits,
// then decides.
func TestLocks(t *testing.T) {
	ctx := t.Context()
	patient, pool, o := newPgstore(t, pgstore.Options{LockTimeout: time.Minute})
	o.LockTimeout = 50 * time.Millisecond
	impatient, err := pgstore.New(ctx, pool, o) // the same tables
	if err != nil {
		t.Fatal(err)
	}
	defer impatient.Close()
	reg := prometheus.NewRegistry()
	for name, s := range map[string]*pgstore.Store{"patient": patient, "impatient": impatient} {
		if err := pgprom.Register(reg, promstore.Options{ConstLabels: prometheus.Labels{"store": name}}, s.Stats); err != nil {
			t.Fatal(err)
		}
	}
	take := sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: limit}
	tx := lockRow(t, patient, pool, o, take.Key)

	if _, err := impatient.Take(ctx, take); !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("Take on a locked row with a 50ms lock timeout: %v, want an error wrapping %v", err, sluice.ErrUnavailable)
	}

	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := patient.Take(ctx, take)
		done <- err
	}()
	// Release the row 50ms after the take is seen waiting for it.
	for {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND strpos(query, $1) > 0)`, o.Schema).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Take on a locked row returned %v without waiting", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	time.Sleep(50 * time.Millisecond)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Take after the row was released: %v", err)
	}
	took := time.Since(start).Seconds()

	for _, tt := range []struct {
		store, name string
		min, max    float64
	}{
		{"impatient", "sluice_pgstore_lock_timeouts_total", 1, 1},
		{"impatient", "sluice_pgstore_lock_waits_total", 0, 0},
		{"impatient", "sluice_pgstore_lock_wait_seconds_total", 0, 0},
		{"patient", "sluice_pgstore_lock_timeouts_total", 0, 0},
		{"patient", "sluice_pgstore_lock_waits_total", 1, 1},
		{"patient", "sluice_pgstore_lock_wait_seconds_total", 0.05, took},
	} {
		if got := promtest.Value(t, reg, tt.name, map[string]string{"store": tt.store}); got < tt.min || got > tt.max {
			t.Errorf("%s{store=%q} = %v, want %v to %v", tt.name, tt.store, got, tt.min, tt.max)
		}
	}
}

// TestTimeoutKind: a take on a row locked by another transaction fails at
// the lock timeout (SQLSTATE 55P03) or, with none, at the statement timeout
// (57014); promstore.New counts either as an error of kind "timeout",
// although pgstore wraps it in sluice.ErrUnavailable.
func TestTimeoutKind(t *testing.T) {
	for _, tt := range []struct {
		name            string
		statement, lock time.Duration
		lockTimeouts    float64
	}{
		{"lock_timeout", time.Minute, 50 * time.Millisecond, 1},
		{"statement_timeout", 50 * time.Millisecond, -1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ps, pool, o := newPgstore(t, pgstore.Options{StatementTimeout: tt.statement, LockTimeout: tt.lock})
			reg := prometheus.NewRegistry()
			s, err := promstore.New(ps, reg, promstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := pgprom.Register(reg, promstore.Options{}, ps.Stats); err != nil {
				t.Fatal(err)
			}
			take := sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: limit}
			lockRow(t, ps, pool, o, take.Key)

			_, err = s.Take(t.Context(), take)
			if !errors.Is(err, sluice.ErrUnavailable) {
				t.Fatalf("Take on a locked row = %v, want an error wrapping %v", err, sluice.ErrUnavailable)
			}
			if got := promstore.Kind(err); got != promstore.KindTimeout {
				t.Errorf("Kind(%v) = %q, want %q", err, got, promstore.KindTimeout)
			}
			for _, m := range []struct {
				name   string
				labels map[string]string
				want   float64
			}{
				{"sluice_errors_total", map[string]string{"op": "take", "kind": promstore.KindTimeout}, 1},
				{"sluice_errors_total", map[string]string{"op": "take", "kind": promstore.KindUnavailable}, 0},
				{"sluice_errors_total", map[string]string{"op": "take", "kind": promstore.KindServer}, 0},
				{"sluice_errors_total", map[string]string{"op": "take", "kind": promstore.KindOther}, 0},
				{"sluice_pgstore_lock_timeouts_total", nil, tt.lockTimeouts},
			} {
				if got := promtest.Value(t, reg, m.name, m.labels); got != m.want {
					t.Errorf("%s with labels %v = %v, want %v", m.name, m.labels, got, m.want)
				}
			}
		})
	}
}

// TestRegisterErrors: no nil registerer or stats, no double registration,
// distinct constant labels share a registry.
func TestRegisterErrors(t *testing.T) {
	stats := func() pgstore.Stats { return pgstore.Stats{} }
	if err := pgprom.Register(nil, promstore.Options{}, stats); err == nil {
		t.Error("Register with a nil registerer succeeded, want an error")
	}
	if err := pgprom.Register(prometheus.NewRegistry(), promstore.Options{}, nil); err == nil {
		t.Error("Register with nil stats succeeded, want an error")
	}
	reg := prometheus.NewRegistry()
	if err := pgprom.Register(reg, promstore.Options{}, stats); err != nil {
		t.Fatal(err)
	}
	var already prometheus.AlreadyRegisteredError
	if err := pgprom.Register(reg, promstore.Options{}, stats); !errors.As(err, &already) {
		t.Errorf("second Register on one registry: %v, want prometheus.AlreadyRegisteredError", err)
	}
	reg = prometheus.NewRegistry()
	for _, name := range []string{"a", "b"} {
		if err := pgprom.Register(reg, promstore.Options{ConstLabels: prometheus.Labels{"store": name}}, stats); err != nil {
			t.Errorf("Register with store=%q: %v", name, err)
		}
	}
}

// TestOperations: promstore in front of a real pgstore is a
// sluice.Operator that forwards every operation and counts it.
func TestOperations(t *testing.T) {
	ps, _, _ := newPgstore(t, pgstore.Options{})
	reg := prometheus.NewRegistry()
	s, err := promstore.New(ps, reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	promtest.Operations(t, s, reg, limit)
}
