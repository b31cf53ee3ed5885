package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// statementLog records the SQL of every statement a pool sends, alone or
// in a batch.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

// count returns how many statements containing sub were sent.
func (l *statementLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.sql {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		l.add(q.SQL)
	}
	return ctx
}
func (l *statementLog) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// sessionPool returns a pool to the test database whose sessions carry
// o's timeouts (pgstore.SessionTimeouts), with hook as its AfterConnect,
// logging its statements to log; closed when t ends.
func sessionPool(t *testing.T, o pgstore.Options, hook func(context.Context, *pgx.Conn) error, log *statementLog) *pgxpool.Pool {
	t.Helper()
	pc := testPool.Config().Copy()
	pc.MaxConns, pc.MinConns = 2, 0
	pc.AfterConnect = hook
	if log != nil {
		pc.ConnConfig.Tracer = log
	}
	if err := pgstore.SessionTimeouts(pc, o); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestSessionTimeouts: on a pool whose sessions carry the store's
// timeouts, a decision sends nothing but its own statement, and both
// timeouts still bound it: a take of a bucket that another transaction
// holds for a second fails when the shorter of the two expires.
func TestSessionTimeouts(t *testing.T) {
	const hold = time.Second
	tests := []struct {
		name      string
		o         pgstore.Options
		code      string // the SQLSTATE of the failed take
		lockFails bool   // counted in Stats().LockTimeouts
	}{
		{"statement", pgstore.Options{StatementTimeout: 300 * time.Millisecond, LockTimeout: 5 * time.Second}, "57014", false},
		{"lock", pgstore.Options{StatementTimeout: 5 * time.Second, LockTimeout: 300 * time.Millisecond}, "55P03", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			log := &statementLog{}
			s, table := newStoreOn(t, sessionPool(t, tt.o, nil, log), tt.o)
			r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}
			// (The migration lifts the timeouts; a take of a new key that
			// tries the insert first calls set_config for a setting of
			// its own.)
			migrated := log.count("set_config('statement_timeout'") + log.count("set_config('lock_timeout'")
			for range 2 {
				if d, err := s.Take(ctx, r); err != nil || !d.Allowed {
					t.Fatalf("Take(%+v) = %+v, %v; want allowed", r, d, err)
				}
			}
			if n := log.count("set_config('statement_timeout'") + log.count("set_config('lock_timeout'") - migrated; n != 0 {
				t.Fatalf("%d statements setting a timeout sent for two takes; want none: the sessions carry the timeouts", n)
			}

			released := holdFor(t, hold, "SELECT 1 FROM "+qualified(table)+" WHERE key = $1 FOR UPDATE", []byte("k"))
			defer func() { <-released }()
			start := time.Now()
			_, err := s.Take(ctx, r)
			elapsed := time.Since(start)
			var pe *pgconn.PgError
			if !errors.Is(err, sluice.ErrUnavailable) || !errors.As(err, &pe) || pe.Code != tt.code {
				t.Fatalf("Take of a bucket held for %v: %v; want an error wrapping sluice.ErrUnavailable with SQLSTATE %s", hold, err, tt.code)
			}
			if lo, hi := 250*time.Millisecond, hold-100*time.Millisecond; elapsed < lo || elapsed > hi {
				t.Errorf("Take of a bucket held for %v failed after %v; want it at the 300ms timeout (between %v and %v)", hold, elapsed, lo, hi)
			}
			if got := s.Stats().LockTimeouts; got != uint64(one(tt.lockFails)) {
				t.Errorf("Stats().LockTimeouts = %d; want %d", got, one(tt.lockFails))
			}
		})
	}
}

// holdFor runs sql with args in a transaction of its own, which it rolls
// back after d; the channel is closed then.
func holdFor(t *testing.T, d time.Duration, sql string, args ...any) <-chan struct{} {
	t.Helper()
	tx, err := testPool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), sql, args...); err != nil {
		tx.Rollback(context.Background())
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(d)
		tx.Rollback(context.Background())
	}()
	return released
}

func one(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSessionTimeoutsLifted: the decisions' timeouts that a pool's
// sessions carry do not bound a migration or a sweep, which lift them: each
// waits for a lock held longer than the sessions' lock timeout, and
// succeeds.
func TestSessionTimeoutsLifted(t *testing.T) {
	const hold = 500 * time.Millisecond
	o := pgstore.Options{StatementTimeout: 5 * time.Second, LockTimeout: 50 * time.Millisecond}
	s, table := newStoreOn(t, sessionPool(t, o, nil, nil), o)
	ctx := t.Context()
	tests := []struct {
		name string
		lock string // taken in another transaction for hold
		run  func() error
	}{
		{"Migrate", "SELECT pg_advisory_xact_lock(hashtextextended('sluice.pgstore:' || $1, 0))", func() error { return s.Migrate(ctx) }},
		{"Sweep", "SELECT 1 FROM " + qualified(table+"_floor") + " WHERE $1::text IS NOT NULL FOR UPDATE", func() error { _, err := s.Sweep(ctx); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			released := holdFor(t, hold, tt.lock, qualified(table))
			defer func() { <-released }()
			start := time.Now()
			if err := tt.run(); err != nil {
				t.Fatalf("%s while another transaction holds its lock for %v, on sessions with a lock timeout of %v: %v; want it to wait", tt.name, hold, o.LockTimeout, err)
			}
			if elapsed := time.Since(start); elapsed < hold-50*time.Millisecond {
				t.Errorf("%s returned after %v; want it to wait for the lock held for %v", tt.name, elapsed, hold)
			}
		})
	}
	if st := s.Stats(); st.SweepErrors != 0 {
		t.Errorf("Stats() = %+v", st)
	}
}

// TestSessionTimeoutsChecked: sessions that do not carry the timeouts
// their pool's startup parameters set (as behind a connection pooler that
// drops them) make the store fail as misconfigured, naming the setting and
// what to do, rather than decide with no timeout: on its first statement,
// and, with the AfterConnect warm-up, on every new connection after it.
func TestSessionTimeoutsChecked(t *testing.T) {
	o := pgstore.Options{StatementTimeout: 300 * time.Millisecond, LockTimeout: 100 * time.Millisecond}
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}
	misconfigured := func(t *testing.T, setting string, err error) {
		t.Helper()
		if !errors.Is(err, sluice.ErrMisconfigured) || errors.Is(err, sluice.ErrUnavailable) ||
			!strings.Contains(err.Error(), setting) || !strings.Contains(err.Error(), "per_transaction_timeouts") {
			t.Fatalf("Take on a session that lost its %s: %v; want an error wrapping sluice.ErrMisconfigured (only) that names %s and per_transaction_timeouts", setting, err, setting)
		}
	}
	for _, setting := range []string{"statement_timeout", "lock_timeout"} {
		drop := func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET "+setting+" = 0")
			return err
		}
		t.Run(setting+"/first statement", func(t *testing.T) {
			s, _ := newStoreOn(t, sessionPool(t, o, drop, nil), o)
			for range 2 {
				_, err := s.Take(t.Context(), r)
				misconfigured(t, setting, err)
			}
		})
		t.Run(setting+"/new connection", func(t *testing.T) {
			_, table := newStoreTable(t, pgstore.Options{})
			so := o
			so.Schema, so.Table, so.SweepInterval = testSchema, table, -1
			warm, err := pgstore.AfterConnect(so)
			if err != nil {
				t.Fatal(err)
			}
			// The pool's first connection keeps its timeouts, the ones
			// after it lose them.
			var opened atomic.Int32
			hook := func(ctx context.Context, c *pgx.Conn) error {
				if opened.Add(1) > 1 {
					if err := drop(ctx, c); err != nil {
						return err
					}
				}
				return warm(ctx, c)
			}
			pool := sessionPool(t, so, hook, nil)
			s, err := pgstore.New(t.Context(), pool, so)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if d, err := s.Take(t.Context(), r); err != nil || !d.Allowed {
				t.Fatalf("Take on the first connection = %+v, %v; want allowed", d, err)
			}
			// Hold it, so that the next take opens another.
			held, err := pool.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release()
			_, err = s.Take(t.Context(), r)
			misconfigured(t, setting, err)
		})
	}
}

// TestSessionTimeoutsOptions: SessionTimeouts sets the enabled timeouts,
// rounded up to whole milliseconds, leaves a disabled one as the config
// has it, and refuses what New refuses.
func TestSessionTimeoutsOptions(t *testing.T) {
	pc, err := pgxpool.ParseConfig("postgres://u@127.0.0.1/db?lock_timeout=7s")
	if err != nil {
		t.Fatal(err)
	}
	if err := pgstore.SessionTimeouts(pc, pgstore.Options{StatementTimeout: 1500 * time.Microsecond, LockTimeout: -1}); err != nil {
		t.Fatal(err)
	}
	if got := pc.ConnConfig.RuntimeParams; got["statement_timeout"] != "2ms" || got["lock_timeout"] != "7s" {
		t.Errorf("RuntimeParams = %v; want statement_timeout 2ms and the URL's lock_timeout 7s", got)
	}
	pc, _ = pgxpool.ParseConfig("postgres://u@127.0.0.1/db?Statement_Timeout=0")
	if err := pgstore.SessionTimeouts(pc, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if got := pc.ConnConfig.RuntimeParams; len(got) != 2 || got["statement_timeout"] != "200ms" || got["lock_timeout"] != "100ms" {
		t.Errorf("RuntimeParams = %v; want the defaults alone, statement_timeout 200ms and lock_timeout 100ms", got)
	}
	for _, bad := range []pgstore.Options{{StatementTimeout: pgstore.MaxTimeout + time.Millisecond}, {LockTimeout: pgstore.MaxTimeout + time.Millisecond}} {
		pc, _ := pgxpool.ParseConfig("postgres://u@127.0.0.1/db")
		if err := pgstore.SessionTimeouts(pc, bad); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("SessionTimeouts(%+v): %v; want an error wrapping sluice.ErrInvalidOption", bad, err)
		}
		if _, ok := pc.ConnConfig.RuntimeParams["statement_timeout"]; ok {
			t.Errorf("SessionTimeouts(%+v) failed but set statement_timeout", bad)
		}
	}
	if err := pgstore.SessionTimeouts(nil, pgstore.Options{}); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("SessionTimeouts(nil): %v; want an error wrapping sluice.ErrInvalidOption", err)
	}
}

// TestAfterConnectLiftsSessionTimeouts: the warm-up of a new connection
// runs with no timeout but its context's, also when the sessions carry the
// decisions' timeouts: it waits for a lock held longer than the sessions'
// lock timeout instead of giving up, unseen, and leaving the connection
// cold.
func TestAfterConnectLiftsSessionTimeouts(t *testing.T) {
	const hold = 400 * time.Millisecond
	_, table := newStoreTable(t, pgstore.Options{})
	o := pgstore.Options{Schema: testSchema, Table: table, StatementTimeout: 5 * time.Second, LockTimeout: 50 * time.Millisecond}
	hook, err := pgstore.AfterConnect(o)
	if err != nil {
		t.Fatal(err)
	}
	pc := testPool.Config().Copy()
	if err := pgstore.SessionTimeouts(pc, o); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(t.Context(), pc.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The warm-up's takes need the table in ROW EXCLUSIVE mode, which a
	// SHARE lock holds off.
	released := holdFor(t, hold, "LOCK TABLE "+qualified(table)+" IN SHARE MODE")
	defer func() { <-released }()
	start := time.Now()
	if err := hook(t.Context(), conn); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < hold-50*time.Millisecond {
		t.Errorf("the warm-up returned after %v, while the table was locked for %v; want it to wait for the lock, past the sessions' lock timeout of %v", elapsed, hold, o.LockTimeout)
	}
}
