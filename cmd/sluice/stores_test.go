package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/redisstore"
)

// The tests of this file run sluice serve on real Redis and PostgreSQL
// servers over loopback sockets. Redis is the one internal/redistest finds
// or starts (SLUICE_REDIS_URL, default redis://127.0.0.1:6379/15);
// PostgreSQL is the one at SLUICE_POSTGRES_URL (default postgresURL).
// Each test works under a key prefix or in a schema of random name and
// removes it at the end. Without a server a test is skipped, and fails
// under CI=true.

const postgresURL = "postgres://postgres@127.0.0.1:5432/test"

func TestMain(m *testing.M) { redistest.Main(m) }

func randomName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// redisSection returns a store section of a config for the test Redis,
// under a prefix of its own whose keys are deleted when t ends.
func redisSection(t *testing.T) string {
	t.Helper()
	o := redistest.Options(t)
	if o.Password != "" || o.Network == "unix" {
		t.Skip("the test Redis needs a password or a socket; these tests write only a host and a database into the URL")
	}
	prefix := "sluicetest:" + randomName(t) + ":"
	client := redistest.Client(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	return fmt.Sprintf("store:\n  type: redis\n  redis:\n    url: \"redis://%s/%d\"\n    prefix: %q\n", o.Addr, o.DB, prefix)
}

// postgresSection returns a store section of a config for the test
// PostgreSQL, in a schema of its own that is dropped when t ends, and
// whether the schema is migrated (by running "sluice migrate").
func postgresSection(t *testing.T, migrate bool) string {
	t.Helper()
	url := os.Getenv("SLUICE_POSTGRES_URL")
	if url == "" {
		url = postgresURL
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		err = conn.Ping(ctx)
		conn.Close(context.Background())
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no PostgreSQL at SLUICE_POSTGRES_URL or %s: %v", postgresURL, err)
		}
		t.Skipf("no PostgreSQL at SLUICE_POSTGRES_URL or %s (%v); set CI=true to fail instead", postgresURL, err)
	}
	schema := "sluice_cmd_" + randomName(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	// The store's timeouts match serveOn's guard deadline: a hot key's
	// queue on a busy machine waits, as the guard would, rather than
	// failing at the default 100ms lock timeout.
	section := fmt.Sprintf("store:\n  type: postgres\n  postgres:\n    url: %q\n    schema: %s\n    statement_timeout: 5s\n    lock_timeout: 5s\n", url, schema)
	if migrate {
		path := filepath.Join(t.TempDir(), "migrate.yaml")
		if err := writeFile(path, section+"policies:\n  api:\n    limit: \"1 1/s\"\n"); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		if err := run(t.Context(), []string{"migrate", "-config", path}, nil, &stdout, &stderr); err != nil {
			t.Fatalf("sluice migrate: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stdout.String(), schema) {
			t.Errorf("sluice migrate printed %q, want it to name the schema %s", stdout.String(), schema)
		}
	}
	return section
}

// serveOn writes a config of store and policies and starts n instances
// of sluice serve on it.
func serveOn(t *testing.T, n int, store, policies string) []*server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	// A generous deadline and no failure mode: every answer below is the
	// store's, never a degraded decision.
	text := "listen:\n  http: \"127.0.0.1:0\"\n  grpc: \"127.0.0.1:0\"\n  admin: \"127.0.0.1:0\"\n" + store +
		"guard:\n  timeout: 5s\n  failure_mode: closed\npolicies:\n" + policies
	if err := writeFile(path, text); err != nil {
		t.Fatal(err)
	}
	out := make([]*server, n)
	for i := range out {
		out[i] = startServe(t, "-config", path, "-watch=false")
	}
	return out
}

var sharedStores = []struct {
	name    string
	section func(t *testing.T) string
	// metric is one of the store's own counters, which /metrics exports.
	metric string
}{
	{"redis", redisSection, "sluice_redisstore_script_loads_total"},
	{"postgres", func(t *testing.T) string { return postgresSection(t, true) }, "sluice_pgstore_insert_first_total"},
}

// TestServeSharedStore: the API's decisions, replays and peeks on each
// shared store, and readiness.
func TestServeSharedStore(t *testing.T) {
	for _, st := range sharedStores {
		t.Run(st.name, func(t *testing.T) {
			s := serveOn(t, 1, st.section(t), "  api:\n    limit: \"3 1/h\"\n")[0]
			if code, text := get(t, s.api+"/readyz"); code != 200 {
				t.Fatalf("GET /readyz = %d %q, want 200", code, text)
			}
			steps := []struct {
				path, body string
				allowed    bool
				remaining  float64
				replayed   bool
			}{
				{"/v1/take", `{"policy":"api","key":"k","request_id":"a"}`, true, 2, false},
				{"/v1/take", `{"policy":"api","key":"k","request_id":"a"}`, true, 2, true},
				{"/v1/peek", `{"policy":"api","key":"k","cost":2}`, true, 2, false},
				{"/v1/take", `{"policy":"api","key":"k","cost":2}`, true, 0, false},
				{"/v1/take", `{"policy":"api","key":"k"}`, false, 0, false},
				{"/v1/take", `{"policy":"api","key":"other"}`, true, 2, false},
			}
			for i, step := range steps {
				code, body := post(t, s.api+step.path, step.body)
				if code != 200 || body["allowed"] != step.allowed || body["remaining"] != step.remaining || body["replayed"] != step.replayed || body["degraded"] != false {
					t.Fatalf("step %d: POST %s %s = %d %v, want allowed=%v remaining=%v replayed=%v, not degraded",
						i, step.path, step.body, code, body, step.allowed, step.remaining, step.replayed)
				}
			}
			if code, text := get(t, s.admin+"/metrics"); code != 200 || !strings.Contains(text, "\n"+st.metric+" ") {
				t.Errorf("GET /metrics = %d, want the store's counter %s:\n%s", code, st.metric, text)
			}
		})
	}
}

// TestServePostgresNotMigrated: serve does not migrate; a schema never
// migrated answers 500 naming the remedy, and "sluice migrate" fixes it
// while the service runs.
func TestServePostgresNotMigrated(t *testing.T) {
	section := postgresSection(t, false)
	s := serveOn(t, 1, section, "  api:\n    limit: \"3 1/h\"\n")[0]
	// Not ready: a load balancer sends it nothing until the schema is there.
	if code, text := get(t, s.api+"/readyz"); code != 503 || !strings.Contains(text, "run Migrate") {
		t.Fatalf("GET /readyz on a schema never migrated = %d %q, want 503 saying to run Migrate", code, text)
	}
	code, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"k"}`)
	if code != 500 || !strings.Contains(fmt.Sprint(body["detail"]), "run Migrate") {
		t.Fatalf("take on a schema never migrated = %d %v, want 500 saying to run Migrate", code, body)
	}
	path := filepath.Join(t.TempDir(), "migrate.yaml")
	if err := writeFile(path, section+"policies:\n  api:\n    limit: \"3 1/h\"\n"); err != nil {
		t.Fatal(err)
	}
	for range 2 { // Migrate is idempotent
		if err := run(t.Context(), []string{"migrate", "-config", path}, nil, new(bytes.Buffer), new(bytes.Buffer)); err != nil {
			t.Fatalf("sluice migrate: %v", err)
		}
	}
	if code, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"k"}`); code != 200 || body["allowed"] != true {
		t.Fatalf("take after sluice migrate = %d %v, want 200 allowed", code, body)
	}
	if code, text := get(t, s.api+"/readyz"); code != 200 {
		t.Fatalf("GET /readyz after sluice migrate = %d %q, want 200", code, text)
	}
}

// store.postgres.lock_timeout reaches the store, whether the pool's
// sessions carry it (the default) or each decision sets it
// (per_transaction_timeouts): a take that finds its bucket's row locked for
// 600ms waits for it under a lock timeout of 2s, and one that finds it
// locked for 1.2s fails at a lock timeout of 300ms.
func TestServePostgresTimeouts(t *testing.T) {
	for _, mode := range []struct{ name, line string }{{"session", ""}, {"per-transaction", "    per_transaction_timeouts: true\n"}} {
		for _, tt := range []struct {
			lockTimeout string
			hold        time.Duration
			fails       bool
		}{{"2s", 600 * time.Millisecond, false}, {"300ms", 1200 * time.Millisecond, true}} {
			t.Run(mode.name+"/lock_timeout="+tt.lockTimeout, func(t *testing.T) {
				section := postgresSection(t, true)
				section = strings.Replace(section, "lock_timeout: 5s\n", "lock_timeout: "+tt.lockTimeout+"\n"+mode.line, 1)
				s := serveOn(t, 1, section, "  api:\n    limit: \"3 1/h\"\n")[0]
				if code, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"held"}`); code != 200 || body["allowed"] != true {
					t.Fatalf("first take = %d %v, want 200 allowed", code, body)
				}
				url := regexp.MustCompile(`url: "([^"]+)"`).FindStringSubmatch(section)[1]
				schema := regexp.MustCompile(`schema: (\S+)`).FindStringSubmatch(section)[1]
				conn, err := pgx.Connect(t.Context(), url)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(context.Background())
				tx, err := conn.Begin(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(context.Background())
				var n int
				if err := tx.QueryRow(t.Context(), "SELECT count(*) FROM (SELECT FROM "+pgx.Identifier{schema, "sluice_buckets"}.Sanitize()+
					" WHERE policy = 'api' AND key = 'held'::bytea FOR UPDATE) AS locked").Scan(&n); err != nil || n != 1 {
					t.Fatalf("locking the bucket's row: %d rows, %v", n, err)
				}
				released := make(chan error, 1)
				time.AfterFunc(tt.hold, func() { released <- tx.Commit(context.Background()) })
				start := time.Now()
				code, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"held"}`)
				elapsed := time.Since(start)
				if err := <-released; err != nil {
					t.Fatalf("releasing the row lock: %v", err)
				}
				if tt.fails {
					if code == 200 && body["allowed"] == true || elapsed < 250*time.Millisecond || elapsed > tt.hold-200*time.Millisecond {
						t.Fatalf("take of a row locked for %v = %d %v after %v; want a store failure at the lock timeout of %s", tt.hold, code, body, elapsed, tt.lockTimeout)
					}
					return
				}
				if code != 200 || body["allowed"] != true || body["remaining"] != 1.0 || elapsed < tt.hold {
					t.Fatalf("take of a row locked for %v = %d %v after %v; want 200 allowed with 1 remaining, after the lock was released", tt.hold, code, body, elapsed)
				}
			})
		}
	}
}

// sluice serve opens its pool's connections at start, warms them and
// leaves none in a transaction; the server sees them under the URL's
// application_name, or "sluice".
func TestServePostgresPool(t *testing.T) {
	section := postgresSection(t, true)
	url := regexp.MustCompile(`url: "([^"]+)"`).FindStringSubmatch(section)[1]
	name := "sluice_test_" + randomName(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	section = strings.Replace(section, url, url+sep+"application_name="+name, 1)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, 1, section, "  api:\n    limit: \"3 1/h\"\n")
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var open, idle int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := conn.QueryRow(t.Context(), "SELECT count(*), count(*) FILTER (WHERE state = 'idle') FROM pg_stat_activity WHERE application_name = $1", name).Scan(&open, &idle); err != nil {
			t.Fatal(err)
		}
		if open == int(pc.MaxConns) && idle == open || time.Now().After(deadline) {
			break
		}
	}
	if open != int(pc.MaxConns) || idle != open {
		t.Fatalf("%d connections named %s, %d of them idle, with no request made; want the pool's %d, all idle", open, name, idle, pc.MaxConns)
	}

	section = strings.Replace(section, sep+"application_name="+name, "", 1)
	serveOn(t, 1, section, "  api:\n    limit: \"3 1/h\"\n")
	var named int
	for deadline := time.Now().Add(10 * time.Second); named == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'").Scan(&named); err != nil {
			t.Fatal(err)
		}
	}
	if named == 0 {
		t.Error(`no connection named "sluice" from a service whose URL names none`)
	}
}

func TestMigrateOtherStores(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"3 1/h\"\n")
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"migrate", "-config", path}, nil, &stdout, new(bytes.Buffer)); err != nil || !strings.Contains(stdout.String(), "needs no migration") {
		t.Fatalf("migrate of a memory config = %v, printed %q; want success saying it needs none", err, stdout.String())
	}
	if err := run(t.Context(), []string{"migrate"}, nil, new(bytes.Buffer), new(bytes.Buffer)); err == nil {
		t.Fatal("migrate without -config succeeded")
	}
}

// TestServeManyInstancesOneQuota: two instances of sluice serve on one
// store, 64 concurrent clients spread over both, one key of capacity 1,000
// that never refills: exactly 1,000 takes are allowed across both.
func TestServeManyInstancesOneQuota(t *testing.T) {
	const (
		clients  = 64
		each     = 20 // 1,280 takes in all
		capacity = 1000
	)
	for _, st := range sharedStores {
		t.Run(st.name, func(t *testing.T) {
			servers := serveOn(t, 2, st.section(t), fmt.Sprintf("  api:\n    limit: \"%d 0/s\"\n", capacity))
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
			defer client.CloseIdleConnections()
			var mu sync.Mutex
			allowed, denied := 0, 0
			perServer := make([]int, len(servers))
			var failures []string
			var wg sync.WaitGroup
			start := time.Now()
			for c := range clients {
				wg.Go(func() {
					s := servers[c%len(servers)]
					for range each {
						code, ok, err := takeOnce(client, s.api)
						mu.Lock()
						switch {
						case err != nil || code != 200:
							failures = append(failures, fmt.Sprintf("%d %v", code, err))
						case ok:
							allowed++
							perServer[c%len(servers)]++
						default:
							denied++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			if len(failures) > 0 {
				t.Fatalf("%d takes failed, the first: %s", len(failures), failures[0])
			}
			if allowed != capacity || denied != clients*each-capacity {
				t.Fatalf("%d allowed and %d denied across both instances, want exactly %d and %d", allowed, denied, capacity, clients*each-capacity)
			}
			t.Logf("%d takes in %v (%.0f/s): %d allowed (%v by instance), %d denied",
				clients*each, elapsed.Round(time.Millisecond), float64(clients*each)/elapsed.Seconds(), allowed, perServer, denied)
		})
	}
}

func takeOnce(client *http.Client, api string) (code int, allowed bool, err error) {
	resp, err := client.Post(api+"/v1/take", "application/json", strings.NewReader(`{"policy":"api","key":"shared"}`))
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var d struct {
		Allowed  bool `json:"allowed"`
		Degraded bool `json:"degraded"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return resp.StatusCode, false, err
	}
	if d.Degraded {
		return resp.StatusCode, false, fmt.Errorf("a degraded decision")
	}
	return resp.StatusCode, d.Allowed, nil
}

// The config's PostgreSQL defaults are pgstore's, written again only so
// that package config needs no store.
func TestPostgresDefaults(t *testing.T) {
	if config.DefaultStatementTimeout != pgstore.DefaultStatementTimeout || config.DefaultLockTimeout != pgstore.DefaultLockTimeout ||
		config.DefaultSchema != pgstore.DefaultSchema || config.DefaultTable != pgstore.DefaultTable {
		t.Errorf("config defaults %v, %v, %s.%s; pgstore's %v, %v, %s.%s", config.DefaultStatementTimeout, config.DefaultLockTimeout, config.DefaultSchema, config.DefaultTable,
			pgstore.DefaultStatementTimeout, pgstore.DefaultLockTimeout, pgstore.DefaultSchema, pgstore.DefaultTable)
	}
	if config.DefaultPGBatch != pgstore.DefaultBatch || config.DefaultPGTransactions != pgstore.DefaultTransactions {
		t.Errorf("config defaults batch %d, transactions %d; pgstore's %d, %d", config.DefaultPGBatch, config.DefaultPGTransactions, pgstore.DefaultBatch, pgstore.DefaultTransactions)
	}
}

// The config's Redis batching defaults are redisstore's, and the store
// gets the config's batch and pipelines.
func TestRedisOptions(t *testing.T) {
	if config.DefaultRedisBatch != redisstore.DefaultBatch || config.DefaultRedisPipelines != redisstore.DefaultPipelines {
		t.Errorf("config defaults batch %d, pipelines %d; redisstore's %d, %d", config.DefaultRedisBatch, config.DefaultRedisPipelines, redisstore.DefaultBatch, redisstore.DefaultPipelines)
	}
	c, err := config.Parse([]byte("store: {type: redis, redis: {url: \"redis://r:6379\", batch: 1, pipelines: 3}}\npolicies: {default: {limit: \"100 10/s\"}}"))
	if err != nil {
		t.Fatal(err)
	}
	if o := redisOptions(c.Store); o.Batch != 1 || o.Pipelines != 3 {
		t.Errorf("redisOptions(batch: 1, pipelines: 3) = Batch %d, Pipelines %d", o.Batch, o.Pipelines)
	}
}

// The store gets the config's batch and transactions.
func TestPostgresOptions(t *testing.T) {
	c, err := config.Parse([]byte("store: {type: postgres, postgres: {url: \"postgres://db/s\", batch: 1, transactions: 3}}\npolicies: {default: {limit: \"100 10/s\"}}"))
	if err != nil {
		t.Fatal(err)
	}
	if o := postgresOptions(c.Store); o.Batch != 1 || o.Transactions != 3 {
		t.Errorf("postgresOptions(batch: 1, transactions: 3) = Batch %d, Transactions %d", o.Batch, o.Transactions)
	}
}

// The service's pool carries the store's timeouts in its sessions' startup
// parameters, and warms each connection; with per_transaction_timeouts it
// leaves the timeouts to each decision, and sluice migrate's pool does
// neither.
func TestPostgresPoolConfig(t *testing.T) {
	pg := config.PostgresStore{URL: config.NewURL("postgres://u@db.internal/x?application_name=mine"), Schema: "public", Table: "sluice_buckets",
		StatementTimeout: 250 * time.Millisecond, LockTimeout: 40 * time.Millisecond}
	o := pgstore.Options{StatementTimeout: pg.StatementTimeout, LockTimeout: pg.LockTimeout}
	for _, tt := range []struct {
		name           string
		perTx, serving bool
		want           map[string]string // the timeouts' startup parameters; nil: none
	}{
		{"serve", false, true, map[string]string{"statement_timeout": "250ms", "lock_timeout": "40ms"}},
		{"serve, per-transaction timeouts", true, true, nil},
		{"migrate", false, false, nil},
	} {
		pg.PerTransactionTimeouts = tt.perTx
		pc, err := postgresPoolConfig(pg, o, tt.serving)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got := map[string]string{}
		for _, k := range []string{"statement_timeout", "lock_timeout"} {
			if v, ok := pc.ConnConfig.RuntimeParams[k]; ok {
				got[k] = v
			}
		}
		if len(got) != len(tt.want) || got["statement_timeout"] != tt.want["statement_timeout"] || got["lock_timeout"] != tt.want["lock_timeout"] {
			t.Errorf("%s: startup parameters %v; want %v", tt.name, got, tt.want)
		}
		if (pc.AfterConnect != nil) != tt.serving || (pc.MinConns == pc.MaxConns) != tt.serving {
			t.Errorf("%s: warmed %v, MinConns %d of %d; want the warm-up and every connection kept open only when serving", tt.name, pc.AfterConnect != nil, pc.MinConns, pc.MaxConns)
		}
		if name := pc.ConnConfig.RuntimeParams["application_name"]; name != "mine" {
			t.Errorf("%s: application_name %q; want the URL's", tt.name, name)
		}
	}
	// Without a name in the URL, the server sees "sluice"; with
	// pool_min_conns, the pool keeps as many open as the URL says.
	pg.URL = config.NewURL("postgres://u@db.internal/x?pool_min_conns=1&pool_max_conns=4")
	pc, err := postgresPoolConfig(pg, o, true)
	if err != nil {
		t.Fatal(err)
	}
	if name := pc.ConnConfig.RuntimeParams["application_name"]; name != "sluice" || pc.MinConns != 1 || pc.MaxConns != 4 {
		t.Errorf("application_name %q, MinConns %d, MaxConns %d; want sluice, 1 and 4", name, pc.MinConns, pc.MaxConns)
	}
}
