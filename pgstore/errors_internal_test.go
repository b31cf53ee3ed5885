package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sluicehq/sluice"
)

// TestDBError: each failure a statement can meet is classified as a
// misconfiguration (the database answered that the store is not set up)
// or as the database being unavailable (anything else), and wraps its
// cause.
func TestDBError(t *testing.T) {
	s := &Store{names: newNames("public", "sluice_buckets")}
	pg := func(code, msg string) error { return &pgconn.PgError{Code: code, Message: msg} }
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"missing schema", pg("3F000", "schema does not exist"), sluice.ErrMisconfigured},
		{"missing table", pg("42P01", "relation does not exist"), sluice.ErrMisconfigured},
		{"missing function", pg("42883", "function does not exist"), sluice.ErrMisconfigured},
		{"missing column", pg("42703", "column does not exist"), sluice.ErrMisconfigured},
		{"no privilege", pg("42501", "permission denied"), sluice.ErrMisconfigured},
		{"isolation check", pg("25000", "sluice pgstore: a decision must run at READ COMMITTED, not serializable"), sluice.ErrMisconfigured},
		{"another invalid transaction state", pg("25000", "something else"), sluice.ErrUnavailable},
		{"read-only", pg("25006", "cannot execute INSERT in a read-only transaction"), sluice.ErrUnavailable},
		{"statement timeout", pg("57014", "canceling statement due to statement timeout"), sluice.ErrUnavailable},
		{"lock timeout", pg("55P03", "canceling statement due to lock timeout"), sluice.ErrUnavailable},
		{"admin shutdown", pg("57P01", "terminating connection due to administrator command"), sluice.ErrUnavailable},
		{"crash shutdown", pg("57P02", "terminating connection because of crash of another server process"), sluice.ErrUnavailable},
		{"cannot connect now", pg("57P03", "the database system is starting up"), sluice.ErrUnavailable},
		{"too many connections", pg("53300", "too many clients already"), sluice.ErrUnavailable},
		{"serialization failure", pg("40001", "could not serialize access"), sluice.ErrUnavailable},
		{"deadlock", pg("40P01", "deadlock detected"), sluice.ErrUnavailable},
		{"connection failure", pg("08006", "connection failure"), sluice.ErrUnavailable},
		{"pooler refusing the timeouts", pg("08P01", "unsupported startup parameter: statement_timeout"), sluice.ErrMisconfigured},
		{"pooler refusing another parameter", pg("08P01", "unsupported startup parameter: search_path"), sluice.ErrUnavailable},
		{"another protocol violation", pg("08P01", "invalid message format"), sluice.ErrUnavailable},
		{"a new session without the timeouts", fmt.Errorf("failed to connect: %w", fmt.Errorf("%w: statement_timeout", sluice.ErrMisconfigured)), sluice.ErrMisconfigured},
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, sluice.ErrUnavailable},
		{"context", fmt.Errorf("conn closed: %w", context.DeadlineExceeded), sluice.ErrUnavailable},
	}
	for _, tt := range tests {
		got := s.dbError("take", tt.err)
		other := sluice.ErrUnavailable
		if tt.want == sluice.ErrUnavailable {
			other = sluice.ErrMisconfigured
		}
		if !errors.Is(got, tt.want) || errors.Is(got, other) || !errors.Is(got, tt.err) {
			t.Errorf("%s: dbError(%v) = %v; want an error wrapping %v and the cause, not %v", tt.name, tt.err, got, tt.want, other)
		}
	}
}

// TestParseVersion reads the version from the tables' comments.
func TestParseVersion(t *testing.T) {
	for _, tt := range []struct {
		comment string
		want    int
	}{
		{"sluice pgstore token buckets, schema version 3", 3},
		{"sluice pgstore token buckets, schema version 12", 12},
		{"sluice pgstore token buckets, schema version x", 0},
		{"my buckets", 0},
		{"", 0},
	} {
		if got := parseVersion(tt.comment); got != tt.want {
			t.Errorf("parseVersion(%q) = %d, want %d", tt.comment, got, tt.want)
		}
	}
}

// TestPreludeAndLift: a decision sets, for its transaction, each enabled
// timeout that the sessions do not carry with the same value under an
// unambiguous name; sweeps, Migrate and the warm-up lift every timeout the
// startup parameters name, whatever its value.
func TestPreludeAndLift(t *testing.T) {
	const both = "SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true)"
	tests := []struct {
		name            string
		statement, lock time.Duration
		params          map[string]string
		prelude         string
		args            []any
		session         []sessionTimeout
		lift            string
	}{
		{"no parameters", 200 * time.Millisecond, 100 * time.Millisecond, nil,
			"SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)", []any{"200ms", "100ms"}, nil, ""},
		{"both carried", 200 * time.Millisecond, 100 * time.Millisecond, map[string]string{"statement_timeout": "200ms", "lock_timeout": "100ms"},
			"", nil, []sessionTimeout{{"statement_timeout", 200}, {"lock_timeout", 100}}, both},
		{"another value", 200 * time.Millisecond, 100 * time.Millisecond, map[string]string{"statement_timeout": "300ms", "lock_timeout": "100ms"},
			"SELECT set_config('statement_timeout', $1, true)", []any{"200ms"}, []sessionTimeout{{"lock_timeout", 100}}, both},
		{"another unit", 200 * time.Millisecond, 100 * time.Millisecond, map[string]string{"statement_timeout": "200"},
			"SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)", []any{"200ms", "100ms"}, nil,
			"SELECT set_config('statement_timeout', '0', true)"},
		{"two spellings", 200 * time.Millisecond, 100 * time.Millisecond, map[string]string{"statement_timeout": "200ms", "Statement_Timeout": "0", "lock_timeout": "100ms"},
			"SELECT set_config('statement_timeout', $1, true)", []any{"200ms"}, []sessionTimeout{{"lock_timeout", 100}}, both},
		{"disabled", -1, 1500 * time.Microsecond, map[string]string{"statement_timeout": "5s", "lock_timeout": "2ms"},
			"", nil, []sessionTimeout{{"lock_timeout", 2}}, both},
		{"none enabled", -1, -1, map[string]string{"application_name": "x"}, "", nil, nil, ""},
	}
	for _, tt := range tests {
		prelude, args, session := prelude(tt.statement, tt.lock, tt.params)
		if prelude != tt.prelude || !slices.Equal(args, tt.args) || !slices.Equal(session, tt.session) {
			t.Errorf("%s: prelude(%v, %v, %v) = %q, %v, %v; want %q, %v, %v", tt.name, tt.statement, tt.lock, tt.params, prelude, args, session, tt.prelude, tt.args, tt.session)
		}
		if got := lift(tt.params); got != tt.lift {
			t.Errorf("%s: lift(%v) = %q; want %q", tt.name, tt.params, got, tt.lift)
		}
	}
}

// TestParseMillis reads time settings as PostgreSQL shows them.
func TestParseMillis(t *testing.T) {
	for v, want := range map[string]int64{"0": 0, "5ms": 5, "200ms": 200, "1s": 1000, "90s": 90000, "1min": 60000, "2h": 7200000, "1d": 86400000, "2147483647ms": 2147483647} {
		if got, ok := parseMillis(v); !ok || got != want {
			t.Errorf("parseMillis(%q) = %d, %v; want %d", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "ms", "-1", "1.5s", "1 s", "1us", "9223372036854775807d", "99999999999999999999"} {
		if got, ok := parseMillis(v); ok {
			t.Errorf("parseMillis(%q) = %d; want it refused", v, got)
		}
	}
}
