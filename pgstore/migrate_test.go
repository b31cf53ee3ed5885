package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// catalog lists the objects in schema whose names start with prefix, with
// their kind and, for functions, their definition; the columns of its
// tables (type, collation, NOT NULL), the definitions of their indexes and
// constraints, and their comments.
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
		SELECT 'column ' || a.attrelid::regclass::text || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
			coalesce(' collate ' || co.collname, '') || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
			LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
		WHERE n.nspname = $1 AND c.relname LIKE $2 AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname LIKE $2
		UNION ALL
		SELECT 'constraint ' || co.conrelid::regclass::text || ' ' || co.conname || ' ' || pg_get_constraintdef(co.oid)
		FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace
		WHERE n.nspname = $1 AND co.conname LIKE $2
		UNION ALL
		SELECT 'comment ' || c.relname || ' ' || obj_description(c.oid, 'pg_class')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname LIKE $2 AND obj_description(c.oid, 'pg_class') IS NOT NULL
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
		"r Buckets fillfactor=75", "r Buckets_request_ids ", "r Buckets_floor ", "i Buckets_pkey ", "i Buckets_sweep_idx ",
		"i Buckets_request_ids_pkey ", "i Buckets_request_ids_exp_idx ", "i Buckets_floor_pkey ",
		"comment Buckets sluice pgstore token buckets, schema version " + strconv.Itoa(pgstore.SchemaVersion),
		"column " + schema + `."Buckets_request_ids" refunded boolean not null`,
	} {
		if !contains(first, want) {
			t.Errorf("after Migrate, no %q in the catalog:\n%s", want, strings.Join(first, "\n"))
		}
	}
	for _, want := range []string{
		`index CREATE UNIQUE INDEX "Buckets_pkey" ON ` + schema + `."Buckets" USING btree (policy, key)`,
		`index CREATE UNIQUE INDEX "Buckets_request_ids_pkey" ON ` + schema + `."Buckets_request_ids" USING btree (policy, key, request_id)`,
	} {
		if !slices.Contains(first, want) {
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

// applyOldSchema creates schema and in it the tables and functions of
// table as schema version v of this package made them
// (testdata/schema_v<v>.sql).
func applyOldSchema(t *testing.T, v int, schema, table string) {
	t.Helper()
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	text, err := os.ReadFile(fmt.Sprintf("testdata/schema_v%d.sql", v))
	if err != nil {
		t.Fatal(err)
	}
	var script strings.Builder
	err = template.Must(template.New("old").Parse(string(text))).Execute(&script, map[string]any{
		"Version": v, "Schema": pgx.Identifier{schema}.Sanitize(), "Buckets": q(""), "RequestIDs": q("_request_ids"),
		"FullAtIndex": pgx.Identifier{table + "_full_at_idx"}.Sanitize(), "ExpiresIndex": pgx.Identifier{table + "_request_ids_exp_idx"}.Sanitize(),
		"Clock": q("_clock"), "Wait": q("_wait"), "Advance": q("_advance"), "Take": q("_take"), "Peek": q("_peek"), "Sweep": q("_sweep"),
		"Floor": q("_floor"), "FullAt": q("_full_at"), "TakeAll": q("_take_all"), "Refund": q("_refund"), "Reset": q("_reset"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testPool.Exec(context.Background(), "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()+";"+script.String()); err != nil {
		t.Fatalf("applying schema version %d: %v", v, err)
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

// TestOptions: New refuses an option out of its range with an error
// wrapping sluice.ErrInvalidOption that names the option, and repairs
// none; zero values are the defaults, and the negative values that are
// documented (no timeout, no sweeper, no pause) are accepted.
func TestOptions(t *testing.T) {
	tests := []struct {
		name string
		o    pgstore.Options
		says string // "": valid
	}{
		{"defaults", pgstore.Options{}, ""},
		{"mixed case", pgstore.Options{Schema: "Rate_Limits", Table: "Buckets2"}, ""},
		{"longest table", pgstore.Options{Table: strings.Repeat("t", pgstore.MaxTableLen)}, ""},
		{"longest schema", pgstore.Options{Schema: strings.Repeat("s", pgstore.MaxSchemaLen)}, ""},
		{"table too long", pgstore.Options{Table: strings.Repeat("t", pgstore.MaxTableLen+1)}, "Table"},
		{"schema too long", pgstore.Options{Schema: strings.Repeat("s", pgstore.MaxSchemaLen+1)}, "Schema"},
		{"quote", pgstore.Options{Table: `a"b`}, "Table"},
		{"dot", pgstore.Options{Schema: "a.b"}, "Schema"},
		{"space", pgstore.Options{Table: "a b"}, "Table"},
		{"leading digit", pgstore.Options{Table: "1a"}, "Table"},
		{"non-ASCII", pgstore.Options{Table: "tabellé"}, "Table"},
		{"semicolon", pgstore.Options{Table: "t;DROP"}, "Table"},
		{"unknown conversion", pgstore.Options{OnLimitChange: 7}, "OnLimitChange"},
		{"negative request ID TTL", pgstore.Options{RequestIDTTL: -time.Second}, "RequestIDTTL"},
		{"no timeouts", pgstore.Options{StatementTimeout: -1, LockTimeout: -1}, ""},
		{"longest timeouts", pgstore.Options{StatementTimeout: pgstore.MaxTimeout, LockTimeout: pgstore.MaxTimeout}, ""},
		{"statement timeout too long", pgstore.Options{StatementTimeout: pgstore.MaxTimeout + 1}, "StatementTimeout"},
		{"lock timeout too long", pgstore.Options{LockTimeout: pgstore.MaxTimeout + time.Millisecond}, "LockTimeout"},
		{"no sweeper", pgstore.Options{SweepInterval: -1}, ""},
		{"negative sweep batch", pgstore.Options{SweepBatch: -1}, "SweepBatch"},
		{"largest sweep batch", pgstore.Options{SweepBatch: pgstore.MaxSweepBatch}, ""},
		{"sweep batch too large", pgstore.Options{SweepBatch: pgstore.MaxSweepBatch + 1}, "SweepBatch"},
		{"no sweep pause", pgstore.Options{SweepPauseRatio: -1}, ""},
		{"no sweep pause, -Inf", pgstore.Options{SweepPauseRatio: math.Inf(-1)}, ""},
		{"sweep pause NaN", pgstore.Options{SweepPauseRatio: math.NaN()}, "SweepPauseRatio"},
		{"sweep pause +Inf", pgstore.Options{SweepPauseRatio: math.Inf(1)}, "SweepPauseRatio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			if o.SweepInterval == 0 {
				o.SweepInterval = -1
			}
			s, err := pgstore.New(context.Background(), testPool, o)
			if tt.says == "" {
				if err != nil {
					t.Fatalf("New(%+v) = %v; want no error", tt.o, err)
				}
				s.Close()
				return
			}
			if !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("New(%+v) = %v; want an error wrapping %v that names %s", tt.o, err, sluice.ErrInvalidOption, tt.says)
			}
		})
	}
	if _, err := pgstore.New(context.Background(), nil, pgstore.Options{}); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Fatalf("New with a nil pool = %v; want error %v", err, sluice.ErrInvalidOption)
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
	for _, want := range []string{"r " + table + " ", "r " + table + "_request_ids ", "i " + table + "_sweep_idx ", "i " + table + "_request_ids_exp_idx ", "function " + table + "_take "} {
		if !contains(objs, want) {
			t.Errorf("no %q in the catalog:\n%s", want, strings.Join(objs, "\n"))
		}
	}
}

// TestMigrateFrom: Migrate upgrades a schema made by version 1 or 2
// (testdata/schema_v1.sql, schema_v2.sql), which key buckets by key alone.
// Before it, a store of this version says to run Migrate. After it, the
// schema is the one Migrate makes from nothing; the old rows are kept under
// the policy ”, where statements prepared by a process of the old version
// still decide (replaying its request IDs), apart from the buckets of
// every named policy; and the take and peek functions, old and new, have
// the privileges granted on the old ones, and the floor table those on the
// bucket table, so that a role allowed only to decide and sweep still can.
func TestMigrateFrom(t *testing.T) {
	for _, v := range []int{1, 2} {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) { testMigrateFrom(t, v) })
	}
}

func testMigrateFrom(t *testing.T, v int) {
	ctx := context.Background()
	schema, table := ownSchema(t), "Buckets"
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	exec := func(sql string) {
		t.Helper()
		if _, err := testPool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The schema Migrate makes from nothing, for comparison.
	fresh, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from nothing: %v", err)
	}
	want := catalog(t, schema, table)
	exec("DROP SCHEMA " + pgx.Identifier{schema}.Sanitize() + " CASCADE")

	role := "sluice_test_decider_" + randomHex(4)
	exec("CREATE ROLE " + pgx.Identifier{role}.Sanitize())
	t.Cleanup(func() {
		testPool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize()+"; DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
	})
	applyOldSchema(t, v, schema, table)
	oldTake := q("_take") + "(bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)"
	oldPeek := q("_peek") + "(bytea, bigint, bigint, bigint, bigint, bigint, integer, bigint)"
	newTake := q("_take") + "(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)"
	newPeek := q("_peek") + "(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bigint)"
	r := pgx.Identifier{role}.Sanitize()
	exec("REVOKE EXECUTE ON FUNCTION " + oldTake + ", " + oldPeek + " FROM PUBLIC; GRANT EXECUTE ON FUNCTION " + oldTake + ", " + oldPeek + " TO " + r +
		"; GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + r +
		"; GRANT SELECT, INSERT, UPDATE, DELETE ON " + q("") + ", " + q("_request_ids") + " TO " + r)
	privileges := func(fn string) []string { t.Helper(); return functionPrivileges(t, fn) }
	before := privileges(oldTake)
	if want := []string{role + " EXECUTE false"}; !cmp.Equal(before, want) || !cmp.Equal(privileges(oldPeek), want) {
		t.Fatalf("the old take and peek functions' privileges are %q and %q; want %q", before, privileges(oldPeek), want)
	}

	// A process of the old version decides with prepared statements.
	conn, err := testPool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	columns := "o_status, o_allowed, o_remaining, o_retry_us, o_reset_us, o_cost, o_capacity, o_rate_tokens, o_period_us"
	if v >= 2 {
		columns += ", o_lock_wait_us"
	}
	oldDecide := func(cost int64, id string) (status int32, allowed bool, remaining int64) {
		t.Helper()
		var retry, reset, c, capacity, tokens, period, wait int64
		dst := []any{&status, &allowed, &remaining, &retry, &reset, &c, &capacity, &tokens, &period}
		if v >= 2 {
			dst = append(dst, &wait)
		}
		var idArg any
		if id != "" {
			idArg = []byte(id)
		}
		if err := conn.QueryRow(ctx, "SELECT "+columns+" FROM "+q("_take")+"($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
			[]byte("k"), cost, int64(10), int64(1), int64(1e6), int64(1), int64(1e6), int32(0), idArg, int64(300e6), nil).Scan(dst...); err != nil {
			t.Fatalf("a version %d take: %v", v, err)
		}
		return status, allowed, remaining
	}
	oldPeekRemaining := func() int64 {
		t.Helper()
		var allowed bool
		var remaining, retry, reset int64
		if err := conn.QueryRow(ctx, "SELECT o_allowed, o_remaining, o_retry_us, o_reset_us FROM "+q("_peek")+"($1, $2, $3, $4, $5, $6, $7, $8)",
			[]byte("k"), int64(10), int64(1), int64(1e6), int64(1), int64(1e6), int32(0), nil).Scan(&allowed, &remaining, &retry, &reset); err != nil {
			t.Fatalf("a version %d peek: %v", v, err)
		}
		return remaining
	}
	if status, allowed, remaining := oldDecide(4, "r"); status != 0 || !allowed || remaining != 6 {
		t.Fatalf("a version %d take of 4 from a new bucket of 10 = status %d, %v, %d remaining; want 0, allowed, 6", v, status, allowed, remaining)
	}

	s, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	req := sluice.Request{Policy: testPolicy, Key: "k", Cost: 4, Limit: l, RequestID: "r"}
	if _, err := s.Take(ctx, req); !errors.Is(err, sluice.ErrMisconfigured) || !strings.Contains(err.Error(), "run Migrate") {
		t.Fatalf("Take on a version %d schema = %v; want %v saying to run Migrate", v, err, sluice.ErrMisconfigured)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from version %d: %v", v, err)
	}
	got := catalog(t, schema, table)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the schema migrated from version %d is not the one made from nothing (-fresh +migrated):\n%s", v, diff)
	}
	for _, fn := range append([]string{oldTake, oldPeek, newTake, newPeek}, opFunctions(schema, table)...) {
		if after := privileges(fn); !cmp.Equal(before, after) {
			t.Errorf("after Migrate, %s has the privileges %q; want those of the old take function, %q", fn, after, before)
		}
	}

	// The old process decides on its bucket, under the policy '': its
	// request ID is replayed, a new take refills from its stamp.
	if status, allowed, remaining := oldDecide(4, "r"); status != 1 || !allowed || remaining != 6 {
		t.Fatalf("a version %d retry of its request ID after Migrate = status %d, %v, %d remaining; want the replay (1, allowed, 6)", v, status, allowed, remaining)
	}
	if status, allowed, remaining := oldDecide(1, ""); status != 0 || !allowed || remaining < 5 || remaining > 6 {
		t.Fatalf("a version %d take of 1 after Migrate = status %d, %v, %d remaining; want allowed, 5 or 6 (a refill)", v, status, allowed, remaining)
	}
	if remaining := oldPeekRemaining(); remaining < 5 || remaining > 6 {
		t.Fatalf("a version %d peek after Migrate = %d remaining; want 5 or 6", v, remaining)
	}
	// A named policy's bucket of the same key is its own, and so is its
	// request ID.
	if d, err := s.Take(ctx, req); err != nil || d.Replayed || d.Remaining != 6 {
		t.Fatalf("Take(%+v) after Migrate = %+v, %v; want a new decision from a full bucket (6 remaining)", req, d, err)
	}
	var legacy int
	if err := testPool.QueryRow(ctx, "SELECT count(*) FROM "+q("")+" WHERE policy = ''").Scan(&legacy); err != nil || legacy != 1 {
		t.Fatalf("%d rows under the policy '' after Migrate, %v; want the old process's one", legacy, err)
	}

	// The role that could decide with the old functions decides and sweeps
	// with the new ones.
	cfg := testPool.Config()
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["role"] = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Generous timeouts: a first call of each function in a session
	// compiles it, which a busy machine may make slower than the default
	// statement timeout.
	decider, err := pgstore.New(ctx, pool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer decider.Close()
	if d, err := decider.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k2", Cost: 1, Limit: l}); err != nil || !d.Allowed {
		t.Fatalf("Take as %s after Migrate = %+v, %v; want allowed", role, d, err)
	}
	if d, err := decider.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k2", Cost: 1, Limit: l}); err != nil || !d.Allowed {
		t.Fatalf("Peek as %s after Migrate = %+v, %v; want allowed", role, d, err)
	}
	if _, err := decider.Sweep(ctx); err != nil {
		t.Fatalf("Sweep as %s after Migrate: %v", role, err)
	}
	useOperations(t, decider, role)

	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if diff := cmp.Diff(got, catalog(t, schema, table)); diff != "" {
		t.Errorf("Migrate again changed the catalog (-first +again):\n%s", diff)
	}
	for _, fn := range append([]string{oldTake, oldPeek, newTake, newPeek}, opFunctions(schema, table)...) {
		if after := privileges(fn); !cmp.Equal(before, after) {
			t.Errorf("after Migrate again, %s has the privileges %q; want %q", fn, after, before)
		}
	}
}

// functionPrivileges lists the privileges granted on the function fn (a
// signature) to roles other than its owner.
func functionPrivileges(t *testing.T, fn string) []string {
	t.Helper()
	rows, err := testPool.Query(context.Background(), `SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END || ' ' || a.privilege_type || ' ' || a.is_grantable
		FROM pg_proc AS p, aclexplode(p.proacl) AS a WHERE p.oid = to_regprocedure($1) AND a.grantee <> p.proowner ORDER BY 1`, fn)
	if err != nil {
		t.Fatal(err)
	}
	privs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return privs
}

// opFunctions returns the signatures of the functions of the operations
// beyond a take (schema version 4) of the store of table in schema.
func opFunctions(schema, table string) []string {
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	return []string{
		q("_take_all") + "(text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], bigint[], integer, boolean, bigint)",
		q("_refund") + "(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint)",
		q("_reset") + "(text, bytea, bigint)",
	}
}

// useOperations requires s, whose pool connects as role, to be able to
// make a multi-take, a drain, a refund (with and without a request ID) and
// a reset.
func useOperations(t *testing.T, s *pgstore.Store, role string) {
	t.Helper()
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	if md, err := s.TakeAll(ctx, []sluice.Request{req(testPolicy, "ops1", 2, l), req(testPolicy, "ops2", 1, l)}); err != nil || !md.Allowed {
		t.Fatalf("TakeAll as %s = %+v, %v; want allowed", role, md, err)
	}
	if d, err := s.Drain(ctx, req(testPolicy, "ops1", 3, l)); err != nil || d.Taken != 3 {
		t.Fatalf("Drain as %s = %+v, %v; want 3 taken", role, d, err)
	}
	if _, err := s.Refund(ctx, req(testPolicy, "ops1", 1, l)); err != nil {
		t.Fatalf("Refund as %s: %v", role, err)
	}
	if _, err := s.Take(ctx, reqID(testPolicy, "ops2", 1, l, "ops")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Refund(ctx, reqID(testPolicy, "ops2", 1, l, "ops")); err != nil {
		t.Fatalf("Refund of a request ID as %s: %v", role, err)
	}
	if err := s.Reset(ctx, testPolicy, "ops1"); err != nil {
		t.Fatalf("Reset as %s: %v", role, err)
	}
}

// TestMigrateFromVersion3: Migrate upgrades a schema of version 3
// (testdata/schema_v3.sql) in place: the request-ID table gains the
// refunded mark, false for every record, and the functions of the
// multi-take (and drain), refund and reset are created with the
// privileges of the take function; the schema is then the one Migrate
// makes from nothing. A process of version 3 goes on deciding with its
// prepared statements (the take function keeps its signature), its request
// IDs are replayed by this version and can be refunded once, and a role
// allowed only to decide with version 3 can use every operation.
func TestMigrateFromVersion3(t *testing.T) {
	ctx := context.Background()
	schema, table := ownSchema(t), "Buckets"
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	exec := func(sql string) {
		t.Helper()
		if _, err := testPool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	fresh, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from nothing: %v", err)
	}
	want := catalog(t, schema, table)
	exec("DROP SCHEMA " + pgx.Identifier{schema}.Sanitize() + " CASCADE")

	role := "sluice_test_decider_" + randomHex(4)
	r := pgx.Identifier{role}.Sanitize()
	exec("CREATE ROLE " + r)
	t.Cleanup(func() {
		testPool.Exec(context.Background(), "DROP OWNED BY "+r+"; DROP ROLE IF EXISTS "+r)
	})
	applyOldSchema(t, 3, schema, table)
	take := q("_take") + "(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)"
	peek := q("_peek") + "(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bigint)"
	exec("REVOKE EXECUTE ON FUNCTION " + take + ", " + peek + " FROM PUBLIC; GRANT EXECUTE ON FUNCTION " + take + ", " + peek + " TO " + r +
		"; GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + r +
		"; GRANT SELECT, INSERT, UPDATE, DELETE ON " + q("") + ", " + q("_request_ids") + " TO " + r +
		"; GRANT SELECT ON " + q("_floor") + " TO " + r)
	before := functionPrivileges(t, take)
	if want := []string{role + " EXECUTE false"}; !cmp.Equal(before, want) {
		t.Fatalf("the take function's privileges are %q; want %q", before, want)
	}

	// A process of version 3 decides with a prepared statement.
	conn, err := testPool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	oldDecide := func(cost int64, id string) (status int32, allowed bool, remaining int64) {
		t.Helper()
		var retry, reset, c, capacity, tokens, period, wait int64
		var converted bool
		var idArg any
		if id != "" {
			idArg = []byte(id)
		}
		if err := conn.QueryRow(ctx, "SELECT o_status, o_allowed, o_remaining, o_retry_us, o_reset_us, o_cost, o_capacity, o_rate_tokens, o_period_us, o_lock_wait_us, o_converted FROM "+
			q("_take")+"($1::text, $2::bytea, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
			testPolicy, []byte("k"), cost, int64(10), int64(1), int64(1e6), int64(1), int64(1e6), int32(0), idArg, int64(300e6), nil).
			Scan(&status, &allowed, &remaining, &retry, &reset, &c, &capacity, &tokens, &period, &wait, &converted); err != nil {
			t.Fatalf("a version 3 take: %v", err)
		}
		return status, allowed, remaining
	}
	if status, allowed, remaining := oldDecide(4, "r"); status != 0 || !allowed || remaining != 6 {
		t.Fatalf("a version 3 take of 4 from a new bucket of 10 = status %d, %v, %d remaining; want 0, allowed, 6", status, allowed, remaining)
	}

	s, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	if _, err := s.Take(ctx, reqID(testPolicy, "k", 4, l, "r")); !errors.Is(err, sluice.ErrMisconfigured) || !strings.Contains(err.Error(), "run Migrate") {
		t.Fatalf("Take on a version 3 schema = %v; want %v saying to run Migrate", err, sluice.ErrMisconfigured)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from version 3: %v", err)
	}
	got := catalog(t, schema, table)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the schema migrated from version 3 is not the one made from nothing (-fresh +migrated):\n%s", diff)
	}
	fns := append([]string{take, peek}, opFunctions(schema, table)...)
	for _, fn := range fns {
		if after := functionPrivileges(t, fn); !cmp.Equal(before, after) {
			t.Errorf("after Migrate, %s has the privileges %q; want those of the take function, %q", fn, after, before)
		}
	}

	// The version 3 process's request ID: replayed by it and by this
	// version, and refunded once.
	if status, allowed, remaining := oldDecide(4, "r"); status != 1 || !allowed || remaining != 6 {
		t.Fatalf("a version 3 retry of its request ID after Migrate = status %d, %v, %d remaining; want the replay (1, allowed, 6)", status, allowed, remaining)
	}
	if d, err := s.Take(ctx, reqID(testPolicy, "k", 4, l, "r")); err != nil || !d.Replayed || d.Remaining != 6 {
		t.Fatalf("retry of the version 3 request ID = %+v, %v; want its replay (6 remaining)", d, err)
	}
	if d, err := s.Refund(ctx, reqID(testPolicy, "k", 4, l, "r")); err != nil || d.Replayed || d.Taken != -4 {
		t.Fatalf("refund of the version 3 request ID = %+v, %v; want 4 given back", d, err)
	}
	if d, err := s.Refund(ctx, reqID(testPolicy, "k", 4, l, "r")); err != nil || !d.Replayed || d.Taken != 0 {
		t.Fatalf("second refund of the version 3 request ID = %+v, %v; want a replay giving nothing", d, err)
	}
	if status, allowed, _ := oldDecide(1, ""); status != 0 || !allowed {
		t.Fatalf("a version 3 take after Migrate = status %d, %v; want allowed", status, allowed)
	}

	cfg := testPool.Config()
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["role"] = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Generous timeouts: a first call of each function in a session
	// compiles it, which a busy machine may make slower than the default
	// statement timeout.
	decider, err := pgstore.New(ctx, pool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer decider.Close()
	useOperations(t, decider, role)

	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if diff := cmp.Diff(got, catalog(t, schema, table)); diff != "" {
		t.Errorf("Migrate again changed the catalog (-first +again):\n%s", diff)
	}
	for _, fn := range fns {
		if after := functionPrivileges(t, fn); !cmp.Equal(before, after) {
			t.Errorf("after Migrate again, %s has the privileges %q; want %q", fn, after, before)
		}
	}
}

// TestMigrateRefusesNewer: Migrate leaves a schema of a later version than
// SchemaVersion as it is, with an error wrapping sluice.ErrMisconfigured,
// rather than putting this version's functions back; decisions go on.
func TestMigrateRefusesNewer(t *testing.T) {
	ctx := context.Background()
	s, table := newStoreTable(t, pgstore.Options{})
	if _, err := testPool.Exec(ctx, "COMMENT ON TABLE "+qualified(table)+" IS 'sluice pgstore token buckets, schema version 99'; "+
		"CREATE OR REPLACE FUNCTION "+qualified(table+"_clock")+"() RETURNS bigint LANGUAGE sql AS 'SELECT 99::bigint'"); err != nil {
		t.Fatal(err)
	}
	before := catalog(t, testSchema, table)
	err := s.Migrate(ctx)
	if !errors.Is(err, sluice.ErrMisconfigured) || !strings.Contains(err.Error(), "version 99") {
		t.Fatalf("Migrate of a schema of version 99 = %v; want an error wrapping %v that names the version", err, sluice.ErrMisconfigured)
	}
	if diff := cmp.Diff(before, catalog(t, testSchema, table)); diff != "" {
		t.Errorf("a refused Migrate changed the catalog (-before +after):\n%s", diff)
	}
	if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}); err != nil || !d.Allowed {
		t.Fatalf("Take on a newer schema = %+v, %v; want allowed", d, err)
	}
	// A store that finds the newer schema on its first call leaves its
	// takes of new keys to the function: the plain insert writes this
	// version's columns, which a later version need not take.
	s2, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: testSchema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for i := range 3 {
		if d, err := s2.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprintf("new %d", i), Cost: 1, Limit: testLimit}); err != nil || !d.Allowed {
			t.Fatalf("Take of a new key on a newer schema = %+v, %v; want allowed", d, err)
		}
	}
	if st := s2.Stats(); st.InsertFirst != 0 {
		t.Errorf("takes of new keys on a schema of version 99: Stats() = %+v; want no insert-first try", st)
	}
}

// TestTakeIsHeapOnlyUpdate: a take of an existing bucket changes no
// indexed column, so PostgreSQL updates it in place (a heap-only tuple):
// no index entry is written, and a hot key's row stays one entry in each
// index. Ten takes of one bucket in one transaction, each a millisecond
// apart, are one insert and nine updates, all of them heap-only. (With the
// index on full_at of schema version 4, none was.)
func TestTakeIsHeapOnlyUpdate(t *testing.T) {
	ctx := t.Context()
	_, table := newStoreTable(t, pgstore.Options{})
	q := func(suffix string) string { return pgx.Identifier{testSchema, table + suffix}.Sanitize() }
	tx, err := testPool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	const takes = 10
	// A second into one of sweep_at's units (2^23 µs), so that the takes'
	// full_at stays in it.
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()>>23<<23 + 1e6
	for i := range takes {
		// A bucket of 100 refilled at 100 a second: each take of 2, a
		// millisecond after the last, moves full_at by 19 ms.
		if _, err := tx.Exec(ctx, "SELECT * FROM "+q("_take")+"($1::text, $2::bytea, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
			testPolicy, []byte("hot"), int64(2), int64(100), int64(100), int64(1e6), int64(1), int64(1e4), int32(0), nil, int64(300e6), start+int64(i)*1e3); err != nil {
			t.Fatal(err)
		}
	}
	var inserted, updated, hot int64
	if err := tx.QueryRow(ctx, "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = $1::regclass", q("")).Scan(&inserted, &updated, &hot); err != nil {
		t.Fatal(err)
	}
	if inserted != 1 || updated != takes-1 || hot != takes-1 {
		t.Fatalf("%d takes of one bucket: %d inserts, %d updates, %d heap-only; want 1, %d, %d", takes, inserted, updated, hot, takes-1, takes-1)
	}
}

// TestMigrateFromVersion4: Migrate upgrades a schema of version 4
// (testdata/schema_v4.sql), whose sweeper index on full_at made every
// update of a bucket write index entries: the buckets gain sweep_at, the
// index on full_at is replaced by one on sweep_at, and the schema is then
// the one Migrate makes from nothing. A process of version 4 goes on
// deciding with its prepared statements (no function changed its
// signature), its request IDs are replayed by this version, and the
// sweeper finds the buckets it left.
func TestMigrateFromVersion4(t *testing.T) {
	ctx := context.Background()
	schema, table := ownSchema(t), "Buckets"
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	fresh, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := fresh.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from nothing: %v", err)
	}
	want := catalog(t, schema, table)
	if _, err := testPool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	applyOldSchema(t, 4, schema, table)
	if objs := catalog(t, schema, table); !contains(objs, "i "+table+"_full_at_idx ") || contains(objs, "i "+table+"_sweep_idx ") {
		t.Fatalf("the version 4 schema has no index on full_at, or one on sweep_at:\n%s", strings.Join(objs, "\n"))
	}

	conn, err := testPool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A version 4 take, at an explicit time: a bucket of 10 refilled at 1
	// a second.
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	oldDecide := func(key string, cost int64, id string, now time.Time) (status int32, allowed bool, remaining int64) {
		t.Helper()
		var retry, reset, c, capacity, tokens, period, wait int64
		var converted bool
		var idArg any
		if id != "" {
			idArg = []byte(id)
		}
		if err := conn.QueryRow(ctx, "SELECT o_status, o_allowed, o_remaining, o_retry_us, o_reset_us, o_cost, o_capacity, o_rate_tokens, o_period_us, o_lock_wait_us, o_converted FROM "+
			q("_take")+"($1::text, $2::bytea, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
			testPolicy, []byte(key), cost, int64(10), int64(1), int64(1e6), int64(1), int64(1e6), int32(0), idArg, int64(3600e6), now.UnixMicro()).
			Scan(&status, &allowed, &remaining, &retry, &reset, &c, &capacity, &tokens, &period, &wait, &converted); err != nil {
			t.Fatalf("a version 4 take: %v", err)
		}
		return status, allowed, remaining
	}
	if status, allowed, remaining := oldDecide("k", 4, "r", at); status != 0 || !allowed || remaining != 6 {
		t.Fatalf("a version 4 take of 4 from a new bucket of 10 = status %d, %v, %d remaining; want 0, allowed, 6", status, allowed, remaining)
	}

	s, err := pgstore.New(ctx, testPool, pgstore.Options{Schema: schema, Table: table, SweepInterval: -1, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	if _, err := s.Take(ctx, reqID(testPolicy, "k", 4, l, "r")); !errors.Is(err, sluice.ErrMisconfigured) || !strings.Contains(err.Error(), "run Migrate") {
		t.Fatalf("Take on a version 4 schema = %v; want %v saying to run Migrate", err, sluice.ErrMisconfigured)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate from version 4: %v", err)
	}
	if diff := cmp.Diff(want, catalog(t, schema, table)); diff != "" {
		t.Errorf("the schema migrated from version 4 is not the one made from nothing (-fresh +migrated):\n%s", diff)
	}
	var sweepAt, fullAt int64
	if err := testPool.QueryRow(ctx, "SELECT sweep_at, full_at FROM "+q("")+" WHERE policy = $1 AND key = $2", testPolicy, []byte("k")).Scan(&sweepAt, &fullAt); err != nil {
		t.Fatal(err)
	}
	if want := fullAt >> 23; sweepAt != want {
		t.Fatalf("the version 4 bucket's sweep_at = %d; want full_at >> 23 = %d", sweepAt, want)
	}

	// The version 4 process's request ID, replayed by it and by this one.
	if status, allowed, remaining := oldDecide("k", 4, "r", at); status != 1 || !allowed || remaining != 6 {
		t.Fatalf("a version 4 retry of its request ID after Migrate = status %d, %v, %d remaining; want the replay (1, allowed, 6)", status, allowed, remaining)
	}
	if d, err := s.Take(ctx, reqID(testPolicy, "k", 4, l, "r")); err != nil || !d.Replayed || d.Remaining != 6 {
		t.Fatalf("retry of the version 4 request ID = %+v, %v; want its replay (6 remaining)", d, err)
	}
	if status, allowed, remaining := oldDecide("k2", 1, "", at); status != 0 || !allowed || remaining != 9 {
		t.Fatalf("a version 4 take after Migrate = status %d, %v, %d remaining; want 0, allowed, 9", status, allowed, remaining)
	}
	// 4 s after at, "k" (6 of 10) is full again, and k2 (9 of 10) too: the
	// sweeper finds both through the new index.
	at = at.Add(4 * time.Second)
	n, err := s.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Buckets != 2 {
		t.Fatalf("Sweep 4 s later = %+v; want the 2 full buckets deleted", n)
	}
}
