package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sluicehq/sluice"
)

// warmPolicy is the policy of the buckets a warm-up takes from. They live
// only in the warm-up's transaction, which is rolled back.
const warmPolicy = "sluice.warm-up"

// AfterConnect returns a hook for pgxpool.Config.AfterConnect that readies
// each new connection of a pool for decisions on the tables named by o (only
// o's Schema, Table, OnLimitChange and timeouts matter; the error is New's
// for a bad one).
//
// A connection's first call of a function costs PostgreSQL several
// milliseconds of CPU: it compiles the function and plans each statement
// the first time it runs. A pool that opens many connections at once, as a
// service restarted under load does, pays that many times over at the
// moment the server is busiest, and a first decision can outlast
// StatementTimeout and fail as unavailable. The hook pays it before the
// connection serves, with no timeout but ctx's: in one transaction that it
// rolls back, it takes from a new bucket, takes from it again with a
// request ID, takes from a third bucket as a new key's take that tries the
// insert first does, peeks at the first and takes from it and a second
// bucket in one multi-take. The buckets are keyed by the connection's backend process ID,
// so no two connections wait on each other's warm-up, and nothing of it
// stays in the tables.
//
// On a pool whose startup parameters carry o's timeouts (SessionTimeouts),
// the hook first checks that the new session has them: a session without
// them fails the hook with an error wrapping sluice.ErrMisconfigured, so no
// decision runs on it, and a decision still waiting for that connection
// gets the error (one whose context ended first gets its context's error).
// Then the warm-up itself runs with both timeouts lifted.
//
// A warm-up that PostgreSQL refuses, because the schema is missing or
// older than SchemaVersion, is not the hook's error: the connection is
// still good, and the store's first decision reports the schema. Otherwise
// the hook fails only when ctx ends, the connection breaks, or the check
// of the session's timeouts fails or cannot run; the pool then discards
// the connection.
func AfterConnect(o Options) (func(context.Context, *pgx.Conn) error, error) {
	if err := o.checkTables(); err != nil {
		return nil, err
	}
	if err := o.OnLimitChange.Validate(); err != nil {
		return nil, fmt.Errorf("%w (Options.OnLimitChange)", err)
	}
	if err := o.checkTimeouts(); err != nil {
		return nil, err
	}
	q := newQueries(newNames(o.Schema, o.Table))
	conv := int32(o.OnLimitChange)
	return func(ctx context.Context, conn *pgx.Conn) error {
		// The timeouts a store of o relies on this session to carry.
		_, _, session := prelude(o.StatementTimeout, o.LockTimeout, conn.Config().RuntimeParams)
		return warm(ctx, conn, q, conv, session)
	}, nil
}

func warm(ctx context.Context, conn *pgx.Conn, q queries, conv int32, session []sessionTimeout) error {
	b, err := warmBatch(q, conv, conn.PgConn().PID())
	if err != nil {
		return err // not reached: the limit is valid
	}
	if len(session) > 0 {
		// The session must carry the timeouts its startup parameters set,
		// or the store's decisions on it would run with none.
		var statement, lock string
		if err := conn.QueryRow(ctx, sessionTimeoutsSQL, pgx.QueryExecModeSimpleProtocol).Scan(&statement, &lock); err != nil {
			return fmt.Errorf("pgstore: warm-up: %w", err)
		}
		if err := checkSessionTimeouts(session, statement, lock); err != nil {
			return fmt.Errorf("pgstore: warm-up: %w", err)
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	// With no timeout but ctx's, also on a pool whose sessions carry the
	// decisions' timeouts (SessionTimeouts): a cold compile under load is
	// what the warm-up is for. Sent on its own, in the simple protocol,
	// so that nothing is prepared under the session's timeouts.
	_, err = tx.Exec(ctx, liftNames(timeoutNames))
	if err == nil {
		err = tx.SendBatch(ctx, b).Close()
	}
	// The rollback must run even when ctx has ended: a connection left in
	// a transaction is no use to the pool.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := tx.Rollback(rctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
		return fmt.Errorf("pgstore: rolling back the warm-up: %w", rerr)
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case conn.IsClosed():
		return fmt.Errorf("pgstore: warm-up: %w", err)
	case errors.As(err, &pgErr):
		return nil // the server refused it; the store's first decision says why
	default:
		return fmt.Errorf("pgstore: warm-up: %w", err)
	}
}

// warmBatch returns the warm-up's decisions, on buckets keyed by pid.
func warmBatch(q queries, conv int32, pid uint32) (*pgx.Batch, error) {
	l := sluice.Limit{Capacity: 2, Rate: sluice.Rate{Tokens: 1, Period: time.Hour}}
	p, err := plan(l)
	if err != nil {
		return nil, err
	}
	period, units, scale := int64(l.Rate.Period/time.Microsecond), int64(p.RefillUnits()), int64(p.Scale())
	key := fmt.Appendf(nil, "backend %d", pid)
	key2 := fmt.Appendf(nil, "backend %d (2)", pid)
	b := &pgx.Batch{}
	take := func(id []byte) {
		b.Queue(q.takeSQL, warmPolicy, key, int64(1), l.Capacity, l.Rate.Tokens, period, units, scale, conv, id, int64(time.Minute/time.Microsecond), nil)
	}
	take(nil)
	take([]byte("warm-up"))
	b.Queue(q.peekSQL, warmPolicy, key, int64(1), l.Capacity, l.Rate.Tokens, period, units, scale, conv, nil)
	b.Queue(q.takeAllSQL, []string{warmPolicy, warmPolicy}, [][]byte{key, key2}, []int64{1, 1},
		[]int64{l.Capacity, l.Capacity}, []int64{l.Rate.Tokens, l.Rate.Tokens}, []int64{period, period}, []int64{units, units}, []int64{scale, scale},
		conv, false, nil)
	// A take of a new key that tries the insert first (create.go), at the
	// last µs there is, so that its floor check, which fails when the
	// sweep floor is above the stamp, cannot fail: a failed batch would
	// make pgx forget the statements it prepared.
	key3 := fmt.Appendf(nil, "backend %d (3)", pid)
	b.Queue(q.createSQL, warmPolicy, key3, int64(1), l.Capacity, l.Rate.Tokens, period, int64(time.Hour/time.Microsecond), int64(math.MaxInt64))
	b.Queue(q.floorSQL)
	return b, nil
}
