package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/pgstore"
)

// testPolicy is the policy of the tests' requests, unless a test says otherwise.
const testPolicy = "api"

var testLimit = sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}

// TestUnreachable: a database that does not answer is ErrUnavailable from
// every operation and Sweep, never a denial and never a parameter error.
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
		{"TakeAll", func() (sluice.Decision, error) {
			md, err := s.TakeAll(ctx, []sluice.Request{{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}})
			if md.Parts != nil {
				return sluice.Decision{Allowed: md.Allowed, Remaining: -1}, err
			}
			return sluice.Decision{}, err
		}},
		{"Drain", func() (sluice.Decision, error) {
			return s.Drain(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 100, Limit: testLimit})
		}},
		{"Refund", func() (sluice.Decision, error) {
			return s.Refund(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit, RequestID: "r"})
		}},
		{"Reset", func() (sluice.Decision, error) { return sluice.Decision{}, s.Reset(ctx, testPolicy, "k") }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			d, err := c.call()
			if !errors.Is(err, sluice.ErrUnavailable) || d != (sluice.Decision{}) {
				t.Fatalf("%s on a closed port = %+v, %v; want error %v", c.name, d, err, sluice.ErrUnavailable)
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
				if !errors.Is(err, sluice.ErrUnavailable) || !errors.As(err, &pe) || pe.Code != tt.code {
					t.Fatalf("Take on a locked bucket = %+v, %v; want error %v with SQLSTATE %s", d, err, sluice.ErrUnavailable, tt.code)
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

// TestMisconfigured: a database that answers but is not set up for the
// store (the schema, a table or a function missing, a schema of an older
// version, sessions at another isolation level, a role without
// privileges) is a deployment mistake, not an outage: every operation and
// Sweep return an error wrapping sluice.ErrMisconfigured, never
// sluice.ErrUnavailable, that says what to do, and a retry fails the same
// way.
func TestMisconfigured(t *testing.T) {
	ctx := context.Background()
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}
	// unmigrated returns a store of o's tables in schema, which it does
	// not migrate.
	unmigrated := func(t *testing.T, pool *pgxpool.Pool, schema, table string) *pgstore.Store {
		t.Helper()
		s, err := pgstore.New(ctx, pool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	// used returns a migrated store of its own schema that has decided
	// once, and the schema.
	used := func(t *testing.T) (*pgstore.Store, string) {
		t.Helper()
		schema := ownSchema(t)
		s := unmigrated(t, testPool, schema, "b")
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Take(ctx, r); err != nil {
			t.Fatal(err)
		}
		return s, schema
	}
	exec := func(t *testing.T, sql string) {
		t.Helper()
		if _, err := testPool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		new  func(t *testing.T) *pgstore.Store
		says string
		// takeOnly: only the operations that write are affected, not
		// Peek and Sweep.
		takeOnly bool
	}{
		{"never migrated", func(t *testing.T) *pgstore.Store {
			return unmigrated(t, testPool, testSchema, "never_migrated")
		}, "run Migrate", false},
		{"schema missing", func(t *testing.T) *pgstore.Store {
			return unmigrated(t, testPool, testSchema+"_missing", "b")
		}, "run Migrate", false},
		{"schema version 2", func(t *testing.T) *pgstore.Store {
			schema := ownSchema(t)
			applyOldSchema(t, 2, schema, "b")
			return unmigrated(t, testPool, schema, "b")
		}, "run Migrate", false},
		{"schema version 3", func(t *testing.T) *pgstore.Store {
			schema := ownSchema(t)
			applyOldSchema(t, 3, schema, "b")
			return unmigrated(t, testPool, schema, "b")
		}, "run Migrate", false},
		{"schema version 4", func(t *testing.T) *pgstore.Store {
			schema := ownSchema(t)
			applyOldSchema(t, 4, schema, "b")
			return unmigrated(t, testPool, schema, "b")
		}, "run Migrate", false},
		{"functions dropped after use", func(t *testing.T) *pgstore.Store {
			s, schema := used(t)
			dropFunctions(t, schema, "b")
			return s
		}, "run Migrate", false},
		{"tables dropped after use", func(t *testing.T) *pgstore.Store {
			s, schema := used(t)
			exec(t, "DROP TABLE "+pgx.Identifier{schema, "b"}.Sanitize()+", "+pgx.Identifier{schema, "b_request_ids"}.Sanitize()+" CASCADE")
			return s
		}, "run Migrate", false},
		{"schema dropped after use", func(t *testing.T) *pgstore.Store {
			s, schema := used(t)
			exec(t, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			return s
		}, "run Migrate", false},
		{"serializable sessions", func(t *testing.T) *pgstore.Store {
			cfg := testPool.Config()
			cfg.MaxConns = 2
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, _ := newStoreOn(t, pool, pgstore.Options{})
			return s
		}, "READ COMMITTED", true},
		{"role without privileges", func(t *testing.T) *pgstore.Store {
			_, schema := used(t)
			role := "sluice_test_nobody_" + randomHex(4)
			exec(t, "CREATE ROLE "+pgx.Identifier{role}.Sanitize())
			t.Cleanup(func() { testPool.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize()) })
			cfg := testPool.Config()
			cfg.MaxConns = 2
			cfg.ConnConfig.RuntimeParams["role"] = role
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return unmigrated(t, pool, schema, "b")
		}, "privilege", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.new(t)
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, sluice.ErrMisconfigured) || errors.Is(err, sluice.ErrUnavailable) || !strings.Contains(err.Error(), tt.says) {
					t.Errorf("%s = %v; want an error wrapping %v (and not %v) that says %q", op, err, sluice.ErrMisconfigured, sluice.ErrUnavailable, tt.says)
				}
			}
			for range 2 {
				d, err := s.Take(ctx, r)
				check("Take", err)
				if d != (sluice.Decision{}) {
					t.Errorf("Take = %+v with the error; want no decision", d)
				}
			}
			// The operations beyond a take run at READ COMMITTED too.
			md, err := s.TakeAll(ctx, []sluice.Request{r, {Policy: "other", Key: "k", Cost: 1, Limit: testLimit}})
			check("TakeAll", err)
			if md.Parts != nil {
				t.Errorf("TakeAll = %+v with the error; want no decision", md)
			}
			_, err = s.Drain(ctx, r)
			check("Drain", err)
			_, err = s.Refund(ctx, r)
			check("Refund", err)
			check("Reset", s.Reset(ctx, testPolicy, "k"))
			if tt.takeOnly {
				return
			}
			_, err = s.Peek(ctx, r)
			check("Peek", err)
			_, err = s.Sweep(ctx)
			check("Sweep", err)
		})
	}
}

// ownSchema returns the name of a schema for t alone, dropped when t ends.
func ownSchema(t *testing.T) string {
	t.Helper()
	schema := testSchema + "_" + randomHex(3)
	t.Cleanup(func() {
		testPool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return schema
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
	if _, err := s.TakeAll(ctx, []sluice.Request{{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("TakeAll with a canceled context = %v; want %v", err, context.Canceled)
	}
	if _, err := s.Drain(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Drain with a canceled context = %v; want %v", err, context.Canceled)
	}
	if _, err := s.Refund(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Refund with a canceled context = %v; want %v", err, context.Canceled)
	}
	if err := s.Reset(ctx, testPolicy, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reset with a canceled context = %v; want %v", err, context.Canceled)
	}
}

// TestUnavailableCauses: a database that cannot decide for the moment (a
// session ended by an administrator, a read-only server, as after a
// failover to a standby) is an error wrapping sluice.ErrUnavailable and
// not sluice.ErrMisconfigured, with its cause.
func TestUnavailableCauses(t *testing.T) {
	ctx := context.Background()
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}
	check := func(t *testing.T, op string, err error, code string) {
		t.Helper()
		var pe *pgconn.PgError
		if !errors.Is(err, sluice.ErrUnavailable) || errors.Is(err, sluice.ErrMisconfigured) {
			t.Fatalf("%s = %v; want an error wrapping %v and not %v", op, err, sluice.ErrUnavailable, sluice.ErrMisconfigured)
		}
		if code != "" && (!errors.As(err, &pe) || pe.Code != code) {
			t.Fatalf("%s = %v; want SQLSTATE %s", op, err, code)
		}
	}
	t.Run("read-only", func(t *testing.T) {
		cfg := testPool.Config()
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		_, table := newStoreTable(t, pgstore.Options{}) // migrated on a writable session
		s, err := pgstore.New(ctx, pool, pgstore.Options{Schema: testSchema, Table: table, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		_, err = s.Take(ctx, r)
		check(t, "Take on a read-only session", err, "25006")
		_, err = s.Sweep(ctx)
		check(t, "Sweep on a read-only session", err, "25006")
	})
	t.Run("session terminated", func(t *testing.T) {
		s, table := newStoreTable(t, pgstore.Options{StatementTimeout: time.Minute, LockTimeout: time.Minute})
		if _, err := s.Take(ctx, r); err != nil {
			t.Fatal(err)
		}
		tx, err := testPool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SELECT 1 FROM "+qualified(table)+" WHERE key = $1 FOR UPDATE", []byte("k")); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := s.Take(ctx, r)
			done <- err
		}()
		waitForLockWait(t, table)
		if _, err := testPool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
			"%"+pgx.Identifier{testSchema, table + "_take"}.Sanitize()+"%"); err != nil {
			t.Fatal(err)
		}
		check(t, "Take whose session was terminated", <-done, "")
	})
}

// TestNeverMigratedBehindFailOpen: a schema that was never migrated is a
// deployment mistake, not an outage, so a guard that fails open does not
// decide in its place: under "1 1/h", 100 requests are 100 errors wrapping
// sluice.ErrMisconfigured, none of them allowed.
func TestNeverMigratedBehindFailOpen(t *testing.T) {
	ctx := context.Background()
	s, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: testSchema, Table: "never_migrated_open", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g, err := guard.New(s, guard.Options{FailureMode: guard.FailOpen, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := sluice.ParseLimit("1 1/h")
	if err != nil {
		t.Fatal(err)
	}
	var allowed, misconfigured int
	for range 100 {
		d, err := g.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
		if d.Allowed {
			allowed++
		}
		if errors.Is(err, sluice.ErrMisconfigured) {
			misconfigured++
		}
	}
	if allowed != 0 || misconfigured != 100 {
		t.Fatalf("100 takes under %v on a never-migrated schema behind FailOpen: %d allowed, %d errors wrapping %v; want 0 and 100", l, allowed, misconfigured, sluice.ErrMisconfigured)
	}
}
