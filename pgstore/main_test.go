package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice/pgstore"
)

// The tests run against a real PostgreSQL: the one at SLUICE_POSTGRES_URL
// (default defaultURL) or, if that does not answer, a private server they
// start with initdb and postgres on a free loopback port. Without either,
// the tests fail when CI=true and are skipped otherwise. Each run works in
// a fresh schema of random name, dropped at the end.
const defaultURL = "postgres://postgres@127.0.0.1:5432/test"

// exampleSchema is the schema of the examples.
const exampleSchema = "sluice_example"

var (
	// testPool is connected to the test database; testSchema is this
	// run's schema in it.
	testPool   *pgxpool.Pool
	testSchema string
	// tableSeq numbers the tables of the stores the tests make.
	tableSeq sync.Mutex
	tableN   int
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx := context.Background()
	url := os.Getenv("SLUICE_POSTGRES_URL")
	if url == "" {
		url = defaultURL
	}
	if err := ping(ctx, url, 3*time.Second); err != nil {
		srv, serr := startServer()
		if serr != nil {
			msg := fmt.Sprintf("pgstore: no PostgreSQL at %s (%v), and no private server could be started: %v", where(url), err, serr)
			if os.Getenv("CI") == "true" {
				fmt.Fprintln(os.Stderr, msg)
				return 1
			}
			fmt.Println(msg + "; skipping the PostgreSQL tests (set CI=true to fail instead)")
			return 0
		}
		defer srv.stop()
		url = srv.url
		fmt.Printf("pgstore: using a private PostgreSQL at %s\n", where(url))
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgstore: SLUICE_POSTGRES_URL:", err)
		return 1
	}
	cfg.MaxConns = 72 // 64 concurrent callers and a few more
	// The tests create and drop hundreds of stores, each with its own
	// functions. A session keeps the cached plans of every function it
	// ran, also after the function is dropped, and every later catalog
	// change makes it look through all of them: a session that lived
	// through the whole run would make each new store slower than the
	// last (tenfold after some hundred stores). Young sessions keep the
	// run's time linear.
	cfg.MaxConnLifetime = 10 * time.Second
	// The tests check decisions, not durability: do not wait for the WAL
	// to reach the disk at each commit (a crash would lose only the last
	// commits of a test run).
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	testPool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgstore:", err)
		return 1
	}
	defer testPool.Close()
	testSchema = "sluice_test_" + randomHex(6)
	// The examples connect to SLUICE_POSTGRES_URL and use the schema
	// exampleSchema, dropped before and after.
	os.Setenv("SLUICE_POSTGRES_URL", url)
	dropSchemas := func() {
		for _, schema := range []string{testSchema, exampleSchema} {
			if _, err := testPool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				fmt.Fprintf(os.Stderr, "pgstore: dropping the schema %s: %v\n", schema, err)
			}
		}
	}
	dropSchemas()
	defer dropSchemas()
	return m.Run()
}

// ping connects to url and runs one query within timeout.
func ping(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.Ping(ctx)
}

// where names the server of url without credentials.
func where(url string) string {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return "(unparsable URL)"
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))) + "/" + cfg.ConnConfig.Database
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newStore returns a store of fresh, migrated tables in the test schema,
// configured by o (Schema and Table are set here), closed when t ends. The
// sweeper is off unless o sets an interval.
func newStore(t testing.TB, o pgstore.Options) *pgstore.Store {
	t.Helper()
	s, _ := newStoreTable(t, o)
	return s
}

// newStoreTable is newStore that also returns the table name.
func newStoreTable(t testing.TB, o pgstore.Options) (*pgstore.Store, string) {
	t.Helper()
	return newStoreOn(t, testPool, o)
}

// newStoreOn is newStoreTable with another pool to the test database.
func newStoreOn(t testing.TB, pool *pgxpool.Pool, o pgstore.Options) (*pgstore.Store, string) {
	t.Helper()
	tableSeq.Lock()
	tableN++
	table := fmt.Sprintf("b%d", tableN)
	tableSeq.Unlock()
	o.Schema, o.Table = testSchema, table
	if o.SweepInterval == 0 {
		o.SweepInterval = -1
	}
	s, err := pgstore.New(t.Context(), pool, o)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		dropTables(t, table)
	})
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s, table
}

// dropTables drops the tables and functions of the store of table.
func dropTables(t testing.TB, table string) {
	t.Helper()
	q := func(suffix string) string { return pgx.Identifier{testSchema, table + suffix}.Sanitize() }
	if _, err := testPool.Exec(context.Background(), "DROP TABLE IF EXISTS "+q("")+", "+q("_request_ids")+", "+q("_floor")); err != nil {
		t.Errorf("dropping %s: %v", table, err)
	}
	dropFunctions(t, testSchema, table)
}

// dropFunctions drops every function of the store of table in schema,
// whatever its arguments.
func dropFunctions(t testing.TB, schema, table string) {
	t.Helper()
	ctx := context.Background()
	var names []string
	for _, f := range []string{"_take", "_peek", "_take_all", "_refund", "_reset", "_sweep", "_advance", "_wait", "_full_at", "_refill_tokens", "_refill_frac", "_clock"} {
		names = append(names, table+f)
	}
	rows, err := testPool.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = ANY ($2)`, schema, names)
	if err != nil {
		t.Errorf("listing the functions of %s: %v", table, err)
		return
	}
	fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Errorf("listing the functions of %s: %v", table, err)
		return
	}
	for _, f := range fns {
		if _, err := testPool.Exec(ctx, "DROP FUNCTION IF EXISTS "+f); err != nil {
			t.Errorf("dropping %s: %v", f, err)
		}
	}
}

// qualified returns the quoted name of a table in the test schema.
func qualified(table string) string { return pgx.Identifier{testSchema, table}.Sanitize() }

// server is a private PostgreSQL: initdb'd in a temporary directory, on a
// free loopback port, run as the postgres user when the tests run as root
// (postgres refuses to run as root).
type server struct {
	bin  string // the directory of initdb and postgres
	dir  string
	data string
	port int
	url  string
	cred *syscall.Credential
	cmd  *exec.Cmd
	exit chan error
}

// postgresBin finds the directory of the PostgreSQL server binaries:
// SLUICE_POSTGRES_BIN, else the newest /usr/lib/postgresql/*/bin, else the
// directory of initdb on PATH.
func postgresBin() (string, error) {
	if d := os.Getenv("SLUICE_POSTGRES_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no initdb: install PostgreSQL (Debian: postgresql) or set SLUICE_POSTGRES_BIN")
}

// startServer initializes and starts a private server.
func startServer() (*server, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		return nil, err
	}
	s := &server{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root and no postgres user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	initdb := s.command("initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", s.port)
	if err := s.start(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// start runs postgres and waits until it accepts connections.
func (s *server) start() error {
	log, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return err
	}
	defer log.Close()
	s.cmd = s.command("postgres", "-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+s.dir,
		"-c", "max_connections=200", "-c", "fsync=off", "-c", "full_page_writes=off")
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exit = make(chan error, 1)
	go func(cmd *exec.Cmd, exit chan<- error) { exit <- cmd.Wait() }(s.cmd, s.exit)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ping(context.Background(), s.url, time.Second)
		if err == nil {
			return nil
		}
		select {
		case werr := <-s.exit:
			s.cmd = nil
			out, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
			return fmt.Errorf("postgres exited (%v): %s", werr, out)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shutdown stops postgres with a fast shutdown (SIGINT: abort transactions,
// close connections, checkpoint) and waits for it to exit.
func (s *server) shutdown() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exit:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.exit
	}
	s.cmd = nil
}

// stop shuts the server down and removes its directory.
func (s *server) stop() {
	s.shutdown()
	os.RemoveAll(s.dir)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
