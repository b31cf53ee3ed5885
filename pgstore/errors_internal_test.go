package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

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
