package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// testPolicy is the policy of the tests' requests, unless a test says otherwise.
const testPolicy = "api"

var testLimit = sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}

// TestUnreachable: a database that does not answer is ErrUnavailable from
// Take, Peek and Sweep, never a denial and never a parameter error.
func TestUnreachable(t *testing.T) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/none?connect_timeout=2", port))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := pgstore.New(context.Background(), pool, pgstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	calls := []struct {
		name string
		call func() (sluice.Decision, error)
	}{
		{"Take", func() (sluice.Decision, error) {
			return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit})
		}},
		{"Take with request ID", func() (sluice.Decision, error) {
			return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit, RequestID: "r"})
		}},
		{"Peek", func() (sluice.Decision, error) {
			return s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit})
		}},
		{"Sweep", func() (sluice.Decision, error) { _, err := s.Sweep(ctx); return sluice.Decision{}, err }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			d, err := c.call()
			if !errors.Is(err, pgstore.ErrUnavailable) || d != (sluice.Decision{}) {
				t.Fatalf("%s on a closed port = %+v, %v; want error %v", c.name, d, err, pgstore.ErrUnavailable)
			}
			if errors.Is(err, sluice.ErrInvalidLimit) || errors.Is(err, sluice.ErrInvalidKey) {
				t.Fatalf("%s: %v is also a parameter error", c.name, err)
			}
		})
	}
	// Parameters are checked before the database is asked.
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 11, Limit: testLimit}); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("Take(cost 11 > capacity 10) = %v; want %v", err, sluice.ErrInvalidCost)
	}
}

// TestTimeouts: a bucket locked by another transaction makes Take fail
// with the lock timeout (or, with no lock timeout, the statement timeout),
// wrapped in ErrUnavailable, soon, and without changing the bucket. Only
// the lock timeouts count in Stats().LockTimeouts, and neither counts as a
// lock wait.
func TestTimeouts(t *testing.T) {
	tests := []struct {
		name            string
		statement, lock time.Duration
		code            string // SQLSTATE
		lockTimeouts    uint64 // per failed take
	}{
		{"lock_timeout", time.Minute, 50 * time.Millisecond, "55P03", 1},
		{"statement_timeout", 50 * time.Millisecond, -1, "57014", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			// One connection, so that the check of its settings below
			// sees the session the take ran in.
			cfg := testPool.Config()
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s, table := newStoreOn(t, pool, pgstore.Options{StatementTimeout: tt.statement, LockTimeout: tt.lock})
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 3, Limit: testLimit}); err != nil {
				t.Fatal(err)
			}
			before, _ := readRow(t, table, "k")
			tx, err := testPool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SELECT 1 FROM "+qualified(table)+" WHERE key = $1 FOR UPDATE", []byte("k")); err != nil {
				t.Fatal(err)
			}
			for i := range uint64(2) {
				start := time.Now()
				d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit})
				elapsed := time.Since(start)
				var pe *pgconn.PgError
				if !errors.Is(err, pgstore.ErrUnavailable) || !errors.As(err, &pe) || pe.Code != tt.code {
					t.Fatalf("Take on a locked bucket = %+v, %v; want error %v with SQLSTATE %s", d, err, pgstore.ErrUnavailable, tt.code)
				}
				if elapsed > 5*time.Second {
					t.Errorf("Take on a locked bucket took %v with a 50ms timeout", elapsed)
				}
				if st, want := s.Stats(), tt.lockTimeouts*(i+1); st.LockTimeouts != want || st.LockWaits != 0 || st.LockWaitSeconds != 0 {
					t.Errorf("after %d failed takes, Stats() = %+v; want LockTimeouts %d and no lock waits", i+1, st, want)
				}
			}
			tx.Rollback(ctx)
			if after, _ := readRow(t, table, "k"); after != before {
				t.Fatalf("the failed take changed the bucket from %+v to %+v", before, after)
			}
			// The timeouts were set for that transaction only, not for the
			// session.
			var st, lt string
			if err := pool.QueryRow(ctx, "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt); err != nil {
				t.Fatal(err)
			}
			if st != "0" || lt != "0" {
				t.Errorf("after the take, a pooled session has statement_timeout %q and lock_timeout %q; want the defaults \"0\"", st, lt)
			}
		})
	}
}

// TestNotMigrated: a store whose tables do not exist says so.
func TestNotMigrated(t *testing.T) {
	s, err := pgstore.New(context.Background(), testPool, pgstore.Options{Schema: testSchema, Table: "never_migrated", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Take(context.Background(), sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit})
	if !errors.Is(err, pgstore.ErrUnavailable) || !strings.Contains(err.Error(), "run Migrate") {
		t.Fatalf("Take before Migrate = %v; want %v saying to run Migrate", err, pgstore.ErrUnavailable)
	}
}

// TestCanceledContext: a context that has ended is its error, before any
// I/O.
func TestCanceledContext(t *testing.T) {
	s := newStore(t, pgstore.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take with a canceled context = %v; want %v", err, context.Canceled)
	}
	if _, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Peek with a canceled context = %v; want %v", err, context.Canceled)
	}
}

// TestIsolation: a pool whose sessions default to SERIALIZABLE gets a clear
// error, not serialization failures under load.
func TestIsolation(t *testing.T) {
	ctx := context.Background()
	cfg := testPool.Config()
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, _ := newStoreOn(t, pool, pgstore.Options{})
	_, err = s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit})
	if !errors.Is(err, pgstore.ErrUnavailable) || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Fatalf("Take at SERIALIZABLE = %v; want %v saying READ COMMITTED", err, pgstore.ErrUnavailable)
	}
}
