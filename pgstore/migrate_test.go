package pgstore_test

import (
	"context"
	"errors"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// catalog lists the objects in schema whose names start with prefix, with
// their kind and, for functions, their definition; and the columns and
// options of its tables.
func catalog(t *testing.T, schema, prefix string) []string {
	t.Helper()
	rows, err := testPool.Query(context.Background(), `
		SELECT c.relkind::text || ' ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname LIKE $2
		UNION ALL
		SELECT 'function ' || p.proname || ' ' || md5(pg_get_functiondef(p.oid))
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname LIKE $2
		UNION ALL
		SELECT 'column ' || a.attrelid::regclass::text || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname LIKE $2 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY 1`, schema, prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestMigrateIdempotent: Migrate creates the schema, tables, indexes and
// functions; running it again, also from several goroutines at once,
// changes none of them and keeps every bucket and request ID.
func TestMigrateIdempotent(t *testing.T) {
	ctx := context.Background()
	schema := testSchema + "_m"
	t.Cleanup(func() {
		testPool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	o := pgstore.Options{Schema: schema, Table: "Buckets", SweepInterval: -1}
	s, err := pgstore.New(ctx, testPool, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("first Migrate: %v", err)
	}
	first := catalog(t, schema, "Buckets")
	for _, want := range []string{
		"r Buckets fillfactor=75", "r Buckets_request_ids ", "i Buckets_pkey ", "i Buckets_full_at_idx ",
		"i Buckets_request_ids_pkey ", "i Buckets_request_ids_exp_idx ",
	} {
		if !contains(first, want) {
			t.Errorf("after Migrate, no %q in the catalog:\n%s", want, strings.Join(first, "\n"))
		}
	}
	d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 4, Limit: testLimit, RequestID: "r"})
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := pgstore.New(ctx, testPool, o)
			if err == nil {
				err = s.Migrate(ctx)
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent Migrate again: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if diff := cmp.Diff(first, catalog(t, schema, "Buckets")); diff != "" {
		t.Errorf("Migrate again changed the catalog (-first +again):\n%s", diff)
	}
	got, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 4, Limit: testLimit, RequestID: "r"})
	if want := replayed(d); err != nil || got != want {
		t.Fatalf("retry after Migrate = %+v, %v; want %+v", got, err, want)
	}
}

func replayed(d sluice.Decision) sluice.Decision {
	d.Replayed = true
	return d
}

func contains(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// TestOptions: names that are not plain identifiers, or too long for the
// names made from them, are refused by New.
func TestOptions(t *testing.T) {
	tests := []struct {
		name string
		o    pgstore.Options
		ok   bool
	}{
		{"defaults", pgstore.Options{}, true},
		{"mixed case", pgstore.Options{Schema: "Rate_Limits", Table: "Buckets2"}, true},
		{"longest table", pgstore.Options{Table: strings.Repeat("t", pgstore.MaxTableLen)}, true},
		{"longest schema", pgstore.Options{Schema: strings.Repeat("s", pgstore.MaxSchemaLen)}, true},
		{"table too long", pgstore.Options{Table: strings.Repeat("t", pgstore.MaxTableLen+1)}, false},
		{"schema too long", pgstore.Options{Schema: strings.Repeat("s", pgstore.MaxSchemaLen+1)}, false},
		{"quote", pgstore.Options{Table: `a"b`}, false},
		{"dot", pgstore.Options{Schema: "a.b"}, false},
		{"space", pgstore.Options{Table: "a b"}, false},
		{"leading digit", pgstore.Options{Table: "1a"}, false},
		{"non-ASCII", pgstore.Options{Table: "tabellé"}, false},
		{"semicolon", pgstore.Options{Table: "t;DROP"}, false},
		{"unknown policy", pgstore.Options{OnLimitChange: 7}, false},
		{"no sweep pause", pgstore.Options{SweepPauseRatio: -1}, true},
		{"no sweep pause, -Inf", pgstore.Options{SweepPauseRatio: math.Inf(-1)}, true},
		{"sweep pause NaN", pgstore.Options{SweepPauseRatio: math.NaN()}, false},
		{"sweep pause +Inf", pgstore.Options{SweepPauseRatio: math.Inf(1)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.SweepInterval = -1
			s, err := pgstore.New(context.Background(), testPool, o)
			if tt.ok {
				if err != nil {
					t.Fatalf("New(%+v) = %v; want no error", tt.o, err)
				}
				s.Close()
				return
			}
			if !errors.Is(err, pgstore.ErrInvalidOptions) {
				t.Fatalf("New(%+v) = %v; want error %v", tt.o, err, pgstore.ErrInvalidOptions)
			}
		})
	}
	if _, err := pgstore.New(context.Background(), nil, pgstore.Options{}); !errors.Is(err, pgstore.ErrInvalidOptions) {
		t.Fatalf("New with a nil pool = %v; want error %v", err, pgstore.ErrInvalidOptions)
	}
}

// TestLongestNames: a store with the longest schema and table names
// migrates, and every name made from them fits PostgreSQL's 63 bytes (a
// longer one would be truncated and collide).
func TestLongestNames(t *testing.T) {
	ctx := context.Background()
	schema := testSchema + "_" + strings.Repeat("s", pgstore.MaxSchemaLen-len(testSchema)-1)
	table := strings.Repeat("t", pgstore.MaxTableLen)
	t.Cleanup(func() {
		testPool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	s, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}); err != nil || !d.Allowed {
		t.Fatalf("Take = %+v, %v", d, err)
	}
	objs := catalog(t, schema, table)
	for _, want := range []string{"r " + table + " ", "r " + table + "_request_ids ", "i " + table + "_full_at_idx ", "i " + table + "_request_ids_exp_idx ", "function " + table + "_take "} {
		if !contains(objs, want) {
			t.Errorf("no %q in the catalog:\n%s", want, strings.Join(objs, "\n"))
		}
	}
}

// TestMigrateFromVersion1: Migrate upgrades a schema made by version 1
// (testdata/schema_v1.sql), whose take function returns no o_lock_wait_us:
// before it, a store of this version says to run Migrate; after it, the
// buckets and request IDs are kept, the take function's privileges are
// those granted on the old one, and a statement prepared by a process of
// version 1 still runs.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := context.Background()
	schema, table := testSchema+"_v1", "Buckets"
	role := "sluice_test_decider_" + randomHex(4)
	if _, err := testPool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testPool.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize()) })
	t.Cleanup(func() {
		testPool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	v1, err := os.ReadFile("testdata/schema_v1.sql")
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	err = template.Must(template.New("v1").Parse(string(v1))).Execute(&script, map[string]any{
		"Version": 1, "Buckets": q(""), "RequestIDs": q("_request_ids"),
		"FullAtIndex": pgx.Identifier{table + "_full_at_idx"}.Sanitize(), "ExpiresIndex": pgx.Identifier{table + "_request_ids_exp_idx"}.Sanitize(),
		"Clock": q("_clock"), "Wait": q("_wait"), "Advance": q("_advance"), "Take": q("_take"), "Peek": q("_peek"), "Sweep": q("_sweep"),
	})
	if err != nil {
		t.Fatal(err)
	}
	take := q("_take") + "(bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)"
	if _, err := testPool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+";"+script.String()+
		"; REVOKE EXECUTE ON FUNCTION "+take+" FROM PUBLIC; GRANT EXECUTE ON FUNCTION "+take+" TO "+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatalf("applying schema version 1: %v", err)
	}
	privileges := func() []string {
		t.Helper()
		rows, err := testPool.Query(ctx, `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END || ' ' || a.privilege_type || ' ' || a.is_grantable
			FROM pg_proc AS p, aclexplode(p.proacl) AS a WHERE p.oid = to_regprocedure($1) ORDER BY 1`, take)
		if err != nil {
			t.Fatal(err)
		}
		privs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return privs
	}
	before := privileges()
	if !contains(before, role+" EXECUTE") || contains(before, "PUBLIC") {
		t.Fatalf("the version 1 take function's privileges are %q; want EXECUTE for %s and none for PUBLIC", before, role)
	}

	// A process of version 1 decides with a prepared statement.
	conn, err := testPool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	v1Take := "SELECT o_status, o_allowed, o_remaining, o_retry_us, o_reset_us, o_cost, o_capacity, o_rate_tokens, o_period_us FROM " +
		q("_take") + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
	v1Decide := func(cost int64, id string) (allowed bool, remaining int64) {
		t.Helper()
		var status int32
		var retry, reset, c, capacity, tokens, period int64
		if err := conn.QueryRow(ctx, v1Take, []byte("k"), cost, int64(10), int64(1), int64(1e6), int64(1), int64(1e6), int32(0), []byte(id), int64(300e6), nil).
			Scan(&status, &allowed, &remaining, &retry, &reset, &c, &capacity, &tokens, &period); err != nil {
			t.Fatalf("a version 1 take: %v", err)
		}
		return allowed, remaining
	}
	if allowed, remaining := v1Decide(4, "r"); !allowed || remaining != 6 {
		t.Fatalf("a version 1 take of 4 from a new bucket of 10 = %v, %d remaining; want allowed, 6", allowed, remaining)
	}

	s, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 4, Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}, RequestID: "r"}
	if _, err := s.Take(ctx, r); !errors.Is(err, pgstore.ErrUnavailable) || !strings.Contains(err.Error(), "run Migrate") {
		t.Fatalf("Take on a version 1 schema = %v; want %v saying to run Migrate", err, pgstore.ErrUnavailable)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from version 1: %v", err)
	}
	if after := privileges(); !cmp.Equal(before, after) {
		t.Errorf("Migrate changed the take function's privileges from %q to %q", before, after)
	}
	// The request ID remembered by version 1 is replayed by this one.
	if d, err := s.Take(ctx, r); err != nil || !d.Replayed || d.Remaining != 6 {
		t.Fatalf("Take(%+v) after Migrate = %+v, %v; want the replay of version 1's decision (6 remaining)", r, d, err)
	}
	// The version 1 process still decides, on the same bucket.
	if allowed, remaining := v1Decide(1, ""); !allowed || remaining < 5 || remaining > 6 {
		t.Fatalf("a version 1 take of 1 after Migrate = %v, %d remaining; want allowed, 5 or 6 (a refill)", allowed, remaining)
	}
	first := catalog(t, schema, table)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if diff := cmp.Diff(first, catalog(t, schema, table)); diff != "" {
		t.Errorf("Migrate again changed the catalog (-first +again):\n%s", diff)
	}
	if after := privileges(); !cmp.Equal(before, after) {
		t.Errorf("Migrate again changed the take function's privileges from %q to %q", before, after)
	}
}
