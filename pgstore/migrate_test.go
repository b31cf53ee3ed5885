package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

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
	d, err := s.Take(ctx, sluice.Request{Key: "k", Cost: 4, Limit: testLimit, RequestID: "r"})
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
	got, err := s.Take(ctx, sluice.Request{Key: "k", Cost: 4, Limit: testLimit, RequestID: "r"})
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
	if d, err := s.Take(ctx, sluice.Request{Key: "k", Cost: 1, Limit: testLimit}); err != nil || !d.Allowed {
		t.Fatalf("Take = %+v, %v", d, err)
	}
	objs := catalog(t, schema, table)
	for _, want := range []string{"r " + table + " ", "r " + table + "_request_ids ", "i " + table + "_full_at_idx ", "i " + table + "_request_ids_exp_idx ", "function " + table + "_take "} {
		if !contains(objs, want) {
			t.Errorf("no %q in the catalog:\n%s", want, strings.Join(objs, "\n"))
		}
	}
}
