package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// warmLimit is the limit of the warm-up tests' takes.
var warmLimit = sluice.Limit{Capacity: 5, Rate: sluice.Rate{Tokens: 1, Period: time.Hour}}

// firstTake opens a pool of one new connection to the test database, with
// hook as its AfterConnect, and makes its first decision on the table of
// o: a take of a new bucket, under o's timeouts, which the sessions carry
// if session is set (pgstore.SessionTimeouts). It returns the take's error.
func firstTake(t *testing.T, o pgstore.Options, session bool, hook func(context.Context, *pgx.Conn) error, key string) error {
	t.Helper()
	pool := warmPool(t, o, session, hook)
	defer pool.Close()
	// The connection is opened, and warmed, before the store takes.
	c, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatalf("acquiring the pool's connection: %v", err)
	}
	c.Release()
	s, err := pgstore.New(t.Context(), pool, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := s.Take(t.Context(), sluice.Request{Policy: "api", Key: key, Cost: 1, Limit: warmLimit})
	if err == nil && (!d.Allowed || d.Remaining != warmLimit.Capacity-1) {
		t.Fatalf("first take of %q: %+v, want allowed with %d left", key, d, warmLimit.Capacity-1)
	}
	return err
}

// warmPool returns a pool of at most one connection to the test database,
// opened when first acquired, with hook as its AfterConnect, whose sessions
// carry o's timeouts if session is set (pgstore.SessionTimeouts). The
// caller closes it.
func warmPool(t *testing.T, o pgstore.Options, session bool, hook func(context.Context, *pgx.Conn) error) *pgxpool.Pool {
	t.Helper()
	pc := testPool.Config().Copy()
	pc.MaxConns, pc.MinConns = 1, 0
	pc.AfterConnect = hook
	if session {
		if err := pgstore.SessionTimeouts(pc, o); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// A new connection's first decision runs cold: PostgreSQL compiles the
// take function and plans the statements that the store sends, and pgx
// prepares them, which takes milliseconds. With the AfterConnect hook the
// connection is warm before it serves: it has prepared, and run in its
// rolled-back transaction, every statement a decision sends (the take
// function, with and without a request ID; the insert-first pair of a new
// key; the peek; the multi-take), so the store's decisions on it prepare
// nothing more. The warm-up runs with no timeout also when the sessions
// carry the decisions' ones (SessionTimeouts), and leaves nothing in the
// tables or the store's counters.
//
// (The check is of the statements the connection prepared, not of a
// first decision's time: a cold first take here took 1.3 to 2.7 ms, too
// close to a warm one's 0.5 ms for a bound that also holds on a loaded
// machine.)
func TestAfterConnectWarms(t *testing.T) {
	s, table := newStoreTable(t, pgstore.Options{})
	o := pgstore.Options{Schema: testSchema, Table: table, SweepInterval: -1, StatementTimeout: time.Minute, LockTimeout: -1}
	hook, err := pgstore.AfterConnect(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, session := range []bool{false, true} {
		t.Run(fmt.Sprintf("timeouts in the session %v", session), func(t *testing.T) {
			pool := warmPool(t, o, session, hook)
			defer pool.Close()
			warmed := prepared(t, pool)
			for _, want := range []string{
				pgx.Identifier{testSchema, table + "_take"}.Sanitize() + "(",
				pgx.Identifier{testSchema, table + "_peek"}.Sanitize() + "(",
				pgx.Identifier{testSchema, table + "_take_all"}.Sanitize() + "(",
				"INSERT INTO " + qualified(table) + " AS b",
				"FROM " + qualified(table+"_floor") + " AS f",
			} {
				if !slices.ContainsFunc(warmed, func(sql string) bool { return strings.Contains(sql, want) }) {
					t.Errorf("after the warm-up the connection has not prepared a statement with %q; it has %q", want, warmed)
				}
			}
			st, err := pgstore.New(t.Context(), pool, o)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			pgstore.SetInsertFirst(st, true)
			r := sluice.Request{Policy: "api", Key: "warm-" + randomHex(4), Cost: 1, Limit: warmLimit}
			for _, decide := range []func() error{
				func() error { _, err := st.Take(t.Context(), r); return err }, // new: the insert first
				func() error { _, err := st.Take(t.Context(), r); return err }, // there: the function
				func() error { r := r; r.RequestID = "id"; _, err := st.Take(t.Context(), r); return err },
				func() error { _, err := st.Peek(t.Context(), r); return err },
				func() error {
					_, err := st.TakeAll(t.Context(), []sluice.Request{r, {Policy: "api", Key: "other", Cost: 1, Limit: warmLimit}})
					return err
				},
			} {
				if err := decide(); err != nil {
					t.Fatal(err)
				}
			}
			// The store's first call also reads the schema's version (and
			// the session's timeouts), once per store: not a decision's
			// statement, and not named after the store's tables.
			ours := func(sqls []string) []string {
				return slices.DeleteFunc(slices.Clone(sqls), func(sql string) bool { return !strings.Contains(sql, pgx.Identifier{testSchema}.Sanitize()+".") })
			}
			if before, after := ours(warmed), ours(prepared(t, pool)); !slices.Equal(before, after) {
				t.Errorf("the store's decisions on a warmed connection prepared statements: before them %q, after %q", before, after)
			}
		})
	}
	// Nothing of the warm-ups stays, nor counts.
	var n int
	if err := testPool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM "+qualified(table)+" WHERE policy = 'sluice.warm-up') + (SELECT count(*) FROM "+qualified(table+"_request_ids")+" WHERE policy = 'sluice.warm-up')").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows of the warm-ups' policy in the tables; want none", n)
	}
	if st := s.Stats(); st.LockWaits != 0 || st.Conversions != 0 {
		t.Errorf("Stats() = %+v after the warm-ups", st)
	}
}

// prepared returns the statements that the one connection of pool has
// prepared, read in the simple protocol so that reading them prepares
// nothing.
func prepared(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT statement FROM pg_prepared_statements ORDER BY statement", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A warm-up that the server refuses (no schema yet) leaves the connection
// good, and the store's first decision says what is wrong. One whose
// context has ended fails, and the pool discards the connection.
func TestAfterConnectErrors(t *testing.T) {
	o := pgstore.Options{Schema: testSchema, Table: "never_migrated_" + randomHex(4), SweepInterval: -1}
	hook, err := pgstore.AfterConnect(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := firstTake(t, o, false, hook, "k"); !errors.Is(err, sluice.ErrMisconfigured) {
		t.Errorf("take on a schema never migrated, after a warm-up: %v; want an error wrapping sluice.ErrMisconfigured", err)
	}

	conn, err := pgx.ConnectConfig(t.Context(), testPool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := hook(ctx, conn); !errors.Is(err, context.Canceled) {
		t.Errorf("warm-up with a cancelled context: %v, want context.Canceled", err)
	}

	for _, bad := range []pgstore.Options{{Schema: "no spaces"}, {Table: "x-y"}, {OnLimitChange: 99}} {
		if _, err := pgstore.AfterConnect(bad); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("AfterConnect(%+v): %v, want an error wrapping sluice.ErrInvalidOption", bad, err)
		}
	}
}
