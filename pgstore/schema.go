package pgstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
	"github.com/sluicehq/sluice"
)

// SchemaVersion is the version of the embedded schema that Migrate applies.
// It is recorded as a comment on the tables. Version 3 keys buckets and
// request IDs by (policy, key) and adds the sweep floor; version 4 adds the
// functions of the operations beyond a take (sluice.Operator) and the
// refunded mark of a request ID; version 5 indexes buckets for the sweeper
// by full_at in units of about 8 s (sweep_at), so that updating a bucket
// writes no index entry. Migrate upgrades versions 1 to 4 to it
// (docs/postgres.md).
const SchemaVersion = 5

// Bounds on the names in Options.
const (
	// MaxSchemaLen is the longest schema name, in bytes (PostgreSQL's
	// identifier limit).
	MaxSchemaLen = 63
	// MaxTableLen is the longest table name, in bytes: the names of the
	// request-ID and floor tables, the indexes and the functions add a
	// suffix of up to 20 bytes to it, within PostgreSQL's limit of 63.
	MaxTableLen = 43
)

//go:embed schema.sql
var schemaSQL string

var schemaTemplate = template.Must(template.New("schema.sql").Parse(schemaSQL))

// names are the quoted, schema-qualified names of one store's objects.
type names struct {
	Version      int
	Schema       string // quoted
	Buckets      string // qualified and quoted
	RequestIDs   string
	Floor        string
	FullAtIndex  string // quoted, not qualified (an index lives in its table's schema); versions 1 to 4
	SweepIndex   string
	ExpiresIndex string
	Clock        string
	Wait         string
	FullAt       string
	RefillTokens string
	RefillFrac   string
	Advance      string
	Take         string
	Peek         string
	TakeAll      string
	Refund       string
	Reset        string
	Sweep        string
}

func newNames(schema, table string) names {
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	return names{
		Version:      SchemaVersion,
		Schema:       pgx.Identifier{schema}.Sanitize(),
		Buckets:      q(""),
		RequestIDs:   q("_request_ids"),
		Floor:        q("_floor"),
		FullAtIndex:  pgx.Identifier{table + "_full_at_idx"}.Sanitize(),
		SweepIndex:   pgx.Identifier{table + "_sweep_idx"}.Sanitize(),
		ExpiresIndex: pgx.Identifier{table + "_request_ids_exp_idx"}.Sanitize(),
		Clock:        q("_clock"),
		Wait:         q("_wait"),
		FullAt:       q("_full_at"),
		RefillTokens: q("_refill_tokens"),
		RefillFrac:   q("_refill_frac"),
		Advance:      q("_advance"),
		Take:         q("_take"),
		Peek:         q("_peek"),
		TakeAll:      q("_take_all"),
		Refund:       q("_refund"),
		Reset:        q("_reset"),
		Sweep:        q("_sweep"),
	}
}

// checkName reports whether name is a plain identifier: an ASCII letter or
// underscore, then letters, digits or underscores, at most max bytes. Such a
// name needs no escaping; it is quoted anyway, so its case is kept.
func checkName(option, name string, max int) error {
	if name == "" || len(name) > max {
		return fmt.Errorf("%w: %s %q is not 1 to %d bytes", sluice.ErrInvalidOption, option, name, max)
	}
	for i, c := range []byte(name) {
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return fmt.Errorf("%w: %s %q is not a plain identifier (an ASCII letter or _, then letters, digits or _)", sluice.ErrInvalidOption, option, name)
		}
	}
	return nil
}

// migrationSQL returns the schema script with n's names filled in.
func migrationSQL(n names) string {
	var b strings.Builder
	if err := schemaTemplate.Execute(&b, n); err != nil {
		panic("pgstore: schema template: " + err.Error()) // the template is constant and tested
	}
	return b.String()
}

// Migrate creates the store's schema (if missing), tables, indexes and
// functions, and replaces the functions with this version's. It is
// idempotent and keeps every bucket and request ID; concurrent calls (from
// several processes) are serialized by a transaction-scoped advisory lock.
// It runs in one transaction: on error nothing is changed. It upgrades a
// schema of version 1, 2 or 3, keeping the rows of versions 1 and 2 under
// the policy ” for processes of those versions (docs/postgres.md), and
// the take and peek functions of version 3 for its processes, and refuses
// a schema of a later version than SchemaVersion with an error wrapping
// sluice.ErrMisconfigured, changing nothing. New never migrates; call
// Migrate once at deployment or start-up, with a role allowed to create
// objects in Options.Schema.
func (s *Store) Migrate(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// A migration may wait for the lock below and rewrite a table: it
		// runs with no timeout but ctx's, also on a pool whose sessions
		// carry the decisions' timeouts (SessionTimeouts).
		if s.lift != "" {
			if _, err := tx.Exec(ctx, s.lift); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "sluice.pgstore:"+s.names.Buckets); err != nil {
			return err
		}
		var comment *string
		if err := tx.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", s.names.Buckets).Scan(&comment); err != nil {
			return err
		}
		if comment != nil {
			if v := parseVersion(*comment); v > SchemaVersion {
				return fmt.Errorf("%w: the schema is version %d, newer than this package's %d; run Migrate of that package instead",
					sluice.ErrMisconfigured, v, SchemaVersion)
			}
		}
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", s.schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.names.Schema); err != nil {
				return err
			}
		}
		// No arguments: pgx sends the script with the simple protocol, which
		// runs all its statements.
		_, err := tx.Exec(ctx, s.migration)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", s.names.Buckets, err)
	}
	return nil
}
