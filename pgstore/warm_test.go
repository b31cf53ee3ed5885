package pgstore_test

import (
	"context"
	"errors"
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

// A new connection's first decision runs cold: PostgreSQL compiles the
// take function and plans its statements, which takes milliseconds. With
// the AfterConnect hook the connection is warm before it serves, and its
// first decision fits a timeout that a cold one does not. The warm-up
// runs with no timeout also when the sessions carry the decisions' ones
// (SessionTimeouts).
func TestAfterConnectWarms(t *testing.T) {
	s, table := newStoreTable(t, pgstore.Options{})
	// The table's first pages are written here, not in a measured take: a
	// file extension on a busy machine can take longer than the timeout.
	if _, err := s.Take(t.Context(), sluice.Request{Policy: "api", Key: "pages", Cost: 1, Limit: warmLimit}); err != nil {
		t.Fatal(err)
	}
	if _, err := testPool.Exec(t.Context(), "DELETE FROM "+qualified(table)); err != nil {
		t.Fatal(err)
	}
	o := pgstore.Options{Schema: testSchema, Table: table, SweepInterval: -1, StatementTimeout: 5 * time.Millisecond, LockTimeout: -1}
	hook, err := pgstore.AfterConnect(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		session := i%2 == 1
		if err := firstTake(t, o, session, hook, "warm-"+randomHex(4)); err != nil {
			t.Errorf("connection %d (timeouts in the session: %v): a warmed connection's first take: %v; want it within %v", i, session, err, o.StatementTimeout)
		}
	}
	// Nothing of the warm-ups stays, nor counts.
	var n int
	if err := testPool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM "+qualified(table)+") + (SELECT count(*) FROM "+qualified(table+"_request_ids")+")").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Errorf("%d rows in the tables after 5 takes on warmed connections; want their 5 buckets alone", n)
	}
	if st := s.Stats(); st.LockWaits != 0 || st.Conversions != 0 {
		t.Errorf("Stats() = %+v after the warm-ups", st)
	}
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
