package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sluicehq/sluice"
)

// dbError classifies err, the failure of a store statement, for the
// caller. A database that answered that the store's schema, tables or
// functions are missing (SQLSTATE 3F000, 42P01, 42883, 42703), that the
// role lacks a privilege on them (42501), or that the session is not at
// READ COMMITTED (the take function's own check) is not set up for the
// store, and so is a pool whose sessions cannot carry the timeouts that
// SessionTimeouts put in its startup parameters (a connection pooler
// refusing them, SQLSTATE 08P01, or a new session found without them by
// AfterConnect's check): that is a deployment mistake, which a retry does
// not cure, and the error wraps sluice.ErrMisconfigured and says what to
// do. Anything else
// (no connection, a broken one, a statement or lock timeout, an
// administrator's shutdown, a read-only server, the context ending) is the
// database not deciding for the moment: the error wraps
// sluice.ErrUnavailable. Both wrap err too.
func (s *Store) dbError(op string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "3F000" || pe.Code == "42P01" || pe.Code == "42883" || pe.Code == "42703":
			s.ready.Store(false)
			return fmt.Errorf("%w: %s: the schema of %s is missing or older than version %d (run Migrate): %w",
				sluice.ErrMisconfigured, op, s.names.Buckets, SchemaVersion, err)
		case pe.Code == "42501":
			return fmt.Errorf("%w: %s: the database role lacks a privilege on the store's schema, tables or functions (grant it USAGE on the schema, EXECUTE on the functions and SELECT, INSERT, UPDATE, DELETE on the tables of %s): %w",
				sluice.ErrMisconfigured, op, s.names.Buckets, err)
		case pe.Code == "25000" && strings.HasPrefix(pe.Message, "sluice pgstore:"):
			return fmt.Errorf("%w: %s: %w", sluice.ErrMisconfigured, op, err)
		case pe.Code == "08P01" && strings.Contains(pe.Message, "startup parameter") &&
			(strings.Contains(pe.Message, "statement_timeout") || strings.Contains(pe.Message, "lock_timeout")):
			// A connection pooler (PgBouncer) refusing the timeouts that
			// SessionTimeouts put in the startup parameters.
			return fmt.Errorf("%w: %s: %s (%s): %w", sluice.ErrMisconfigured, op, pe.Message, sessionHint, err)
		}
	}
	if errors.Is(err, sluice.ErrMisconfigured) { // AfterConnect's check of a new session
		return fmt.Errorf("%s: %w", op, err)
	}
	return fmt.Errorf("%w: %s: %w", sluice.ErrUnavailable, op, err)
}

// sessionHint says what to do when the sessions cannot carry the timeouts.
const sessionHint = "a connection pooler such as PgBouncer does not pass timeouts set as startup parameters on to PostgreSQL; " +
	"set them in each decision's transaction instead: store.postgres.per_transaction_timeouts: true for sluice serve, -pg-per-transaction-timeouts for sluice loadgen, or no pgstore.SessionTimeouts on the pool's config"

// checkSchema returns nil once the store's schema has been found to be of
// SchemaVersion or later: the first call of each store reads the version
// recorded on the bucket table (one round trip), later ones only a flag.
// A missing table or an older version is an error wrapping
// sluice.ErrMisconfigured that says to run Migrate. A newer version is
// accepted: a newer package's Migrate keeps or replaces this version's
// functions, and a call of a function it dropped is a misconfiguration too.
func (s *Store) checkSchema(ctx context.Context, op string) error {
	if s.ready.Load() {
		return nil
	}
	v, exists, err := s.schemaVersion(ctx)
	if err != nil {
		return s.dbError(op, err)
	}
	switch {
	case !exists:
		return fmt.Errorf("%w: %s: there is no table %s (run Migrate to create the schema, version %d)", sluice.ErrMisconfigured, op, s.names.Buckets, SchemaVersion)
	case v < SchemaVersion:
		return fmt.Errorf("%w: %s: the schema of %s is version %d, older than this package's %d (run Migrate)", sluice.ErrMisconfigured, op, s.names.Buckets, v, SchemaVersion)
	}
	if err := s.checkSession(ctx, op); err != nil {
		return err
	}
	// The insert-first statements write the bucket table's columns
	// themselves, which only this version's schema is known to take.
	s.current.Store(v == SchemaVersion)
	s.ready.Store(true)
	return nil
}

// checkSession reads back, on one session of the pool, the timeouts that
// the store leaves to its sessions (SessionTimeouts), and returns an error
// wrapping sluice.ErrMisconfigured if one differs: a connection pooler may
// have dropped the startup parameters, and the decisions would run with no
// timeout at all.
func (s *Store) checkSession(ctx context.Context, op string) error {
	if len(s.session) == 0 {
		return nil
	}
	var statement, lock string
	if err := s.pool.QueryRow(ctx, sessionTimeoutsSQL).Scan(&statement, &lock); err != nil {
		return s.dbError(op, err)
	}
	if err := checkSessionTimeouts(s.session, statement, lock); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// sessionTimeoutsSQL reads the session's statement_timeout and
// lock_timeout, as PostgreSQL shows them ("0", "200ms", "1min").
const sessionTimeoutsSQL = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"

// checkSessionTimeouts returns an error wrapping sluice.ErrMisconfigured if
// a session whose statement_timeout and lock_timeout show as statement and
// lock lacks one of want.
func checkSessionTimeouts(want []sessionTimeout, statement, lock string) error {
	for _, t := range want {
		got := statement
		if t.name == "lock_timeout" {
			got = lock
		}
		if ms, ok := parseMillis(got); !ok || ms != t.ms {
			return fmt.Errorf("%w: the pool's startup parameters set %s to %s but its session has %s (%s)",
				sluice.ErrMisconfigured, t.name, t.value(), got, sessionHint)
		}
	}
	return nil
}

// parseMillis reads a time setting in milliseconds as PostgreSQL shows it:
// a whole number with the largest unit that keeps it whole (ms, s, min, h
// or d), or "0".
func parseMillis(v string) (int64, bool) {
	i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if i == 0 {
		return 0, false
	}
	unit := int64(1)
	if i > 0 {
		switch v[i:] {
		case "ms":
		case "s":
			unit = 1000
		case "min":
			unit = 60 * 1000
		case "h":
			unit = 60 * 60 * 1000
		case "d":
			unit = 24 * 60 * 60 * 1000
		default:
			return 0, false
		}
		v = v[:i]
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n > math.MaxInt64/unit {
		return 0, false
	}
	return n * unit, true
}

// schemaVersion reads the schema version recorded in the comment on the
// bucket table; 0 if it has none. exists is false if there is no table.
func (s *Store) schemaVersion(ctx context.Context) (version int, exists bool, err error) {
	var comment *string
	err = s.queryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, obj_description(to_regclass($1), 'pg_class')",
		[]any{&exists, &comment}, s.names.Buckets)
	if err != nil || !exists || comment == nil {
		return 0, exists, err
	}
	return parseVersion(*comment), true, nil
}

// parseVersion returns the N of a comment ending in "schema version N", or 0.
func parseVersion(comment string) int {
	const marker = "schema version "
	i := strings.LastIndex(comment, marker)
	if i < 0 {
		return 0
	}
	v, err := strconv.Atoi(comment[i+len(marker):])
	if err != nil || v < 0 {
		return 0
	}
	return v
}
