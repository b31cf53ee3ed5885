// Package redistest gives tests real Redis servers, never a fake: the
// standalone server SLUICE_REDIS_URL names (default DefaultURL, a database
// the tests may write to and flush), or, if none answers there, a private
// redis-server it starts on a free loopback port; and a private Redis
// Cluster of three masters. Servers it starts keep nothing on disk and are
// stopped when the package's tests end, which requires the package to call
// Main from TestMain.
//
// When no Redis can be had (none answers and redis-server cannot be
// started), a test is skipped, unless the environment variable CI is "true":
// then it fails, so that CI never passes without having tested against Redis.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is the server the tests use when SLUICE_REDIS_URL is not set.
const DefaultURL = "redis://127.0.0.1:6379/15"

// EnvURL is the environment variable naming the Redis server for tests.
const EnvURL = "SLUICE_REDIS_URL"

// startTimeout bounds how long a private server or cluster may take to
// come up.
const startTimeout = 15 * time.Second

var (
	mu      sync.Mutex
	started []*server // private servers, stopped by Main

	standaloneOnce sync.Once
	standaloneOpts *redis.Options
	standaloneErr  error

	clusterOnce  sync.Once
	clusterAddrs []string
	clusterErr   error
)

// Main runs the tests of a package, stops the private servers they started,
// and exits with the tests' status. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops every private server started so far and removes its files.
// Main calls it; a later Standalone or Cluster call does not start them
// again.
func Stop() {
	mu.Lock()
	defer mu.Unlock()
	for _, s := range started {
		s.stop()
	}
	started = nil
}

// Options returns client options for the standalone test server: the one
// SLUICE_REDIS_URL (or DefaultURL) names if it answers a PING within a
// second, else a private redis-server. ContextTimeoutEnabled is set, so the
// client keeps each caller's deadline (redisstore.New refuses a client
// without it). It skips t (fails it with CI=true) if neither can be had.
// Each call returns a fresh copy.
func Options(t testing.TB) *redis.Options {
	t.Helper()
	o, err := Find()
	if err != nil {
		unavailable(t, err)
	}
	return o
}

// Find is Options for code that has no testing.TB (runnable examples): it
// returns the error instead of skipping or failing.
func Find() (*redis.Options, error) {
	standaloneOnce.Do(func() { standaloneOpts, standaloneErr = findStandalone() })
	if standaloneErr != nil {
		return nil, standaloneErr
	}
	o := *standaloneOpts
	return &o, nil
}

// Client returns a client of the standalone test server (see Options),
// closed when t ends.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(Options(t))
	t.Cleanup(func() { c.Close() })
	return c
}

// ClusterOptions returns client options for a private Redis Cluster of
// three masters on loopback, started on first use and shared by the tests
// of the package, with ContextTimeoutEnabled set as in Options. It skips t
// (fails it with CI=true) if redis-server or redis-cli is missing or the
// cluster does not come up.
func ClusterOptions(t testing.TB) *redis.ClusterOptions {
	t.Helper()
	clusterOnce.Do(func() { clusterAddrs, clusterErr = startCluster() })
	if clusterErr != nil {
		unavailable(t, clusterErr)
	}
	return &redis.ClusterOptions{Addrs: append([]string(nil), clusterAddrs...), ContextTimeoutEnabled: true}
}

// ClusterClient returns a client of the private cluster (see
// ClusterOptions), closed when t ends.
func ClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(ClusterOptions(t))
	t.Cleanup(func() { c.Close() })
	return c
}

// Server is a private redis-server of one test, which the test may
// restart; Private starts one.
type Server struct{ s *server }

// Private starts a redis-server of t's own on a free loopback port, with
// no persistence, and stops it when t ends. It skips t (fails it with
// CI=true) if redis-server is missing or does not start.
func Private(t testing.TB) *Server {
	t.Helper()
	s, err := startServer()
	if err != nil {
		unavailable(t, err)
	}
	p := &Server{s: s}
	t.Cleanup(func() { p.s.stop() })
	return p
}

// Addr returns the server's address, the same across restarts.
func (p *Server) Addr() string { return p.s.addr }

// Restart kills the server (no shutdown: what it held is lost, as in a
// crash without persistence) and starts it again on the same port, then
// waits until it answers.
func (p *Server) Restart(t testing.TB) {
	t.Helper()
	p.s.kill()
	old := p.s
	s := &server{addr: old.addr, dir: old.dir, cmd: exec.Command(old.cmd.Path, old.cmd.Args[1:]...), done: make(chan struct{})}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("restarting redis-server on %s: %v", s.addr, err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	mu.Lock()
	started = append(started, s)
	mu.Unlock()
	p.s = s
	if err := s.waitReady(); err != nil {
		t.Fatalf("restarting redis-server: %v", err)
	}
}

// Replica starts a private redis-server of t's own that replicates p, and
// waits until its first synchronization is done. It stops when t ends.
func (p *Server) Replica(t testing.TB) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(p.s.addr)
	if err != nil {
		t.Fatal(err)
	}
	// Send the first synchronization at once, not after the default 5 s
	// wait for more replicas.
	m := redis.NewClient(&redis.Options{Addr: p.s.addr})
	err = m.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err()
	m.Close()
	if err != nil {
		t.Fatalf("CONFIG SET repl-diskless-sync-delay on %s: %v", p.s.addr, err)
	}
	s, err := startServer("--replicaof", host, port)
	if err != nil {
		unavailable(t, err)
	}
	r := &Server{s: s}
	t.Cleanup(func() { r.s.stop() })
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s of %s not in sync after %v: %v, %q", s.addr, p.s.addr, startTimeout, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the server, as a crash would; it is not started again.
func (p *Server) Kill() { p.s.kill() }

func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("no Redis for this test (CI=true makes that a failure): %v", err)
	}
	t.Skipf("no Redis for this test: %v", err)
}

func findStandalone() (*redis.Options, error) {
	url := os.Getenv(EnvURL)
	if url == "" {
		url = DefaultURL
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", EnvURL, url, err)
	}
	o.ContextTimeoutEnabled = true
	if err := ping(o.Addr, o); err == nil {
		return o, nil
	}
	s, err := startServer()
	if err != nil {
		return nil, fmt.Errorf("nothing answers at %s and no private server: %w", url, err)
	}
	return &redis.Options{Addr: s.addr, ContextTimeoutEnabled: true}, nil
}

// ping checks that a server answers at addr, with o's credentials if any.
func ping(addr string, o *redis.Options) error {
	opts := &redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1}
	if o != nil {
		opts.Username, opts.Password, opts.DB = o.Username, o.Password, o.DB
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// server is a private redis-server process.
type server struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// startServer starts a private redis-server on a free loopback port, with
// no persistence, and waits until it answers. Extra arguments are passed on
// (cluster mode).
func startServer(extra ...string) (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 { // another process may take the port between probe and start
		port, err := freePort(len(extra) > 0)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		args := append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--daemonize", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
		}, extra...)
		s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: exec.Command(bin, args...), done: make(chan struct{})}
		if err := s.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		go func() { s.cmd.Wait(); close(s.done) }()
		if lastErr = s.waitReady(); lastErr == nil {
			mu.Lock()
			started = append(started, s)
			mu.Unlock()
			return s, nil
		}
		s.kill()
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// waitReady waits until s answers a PING or exits.
func (s *server) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server on %s exited: %s", s.addr, s.logTail())
		default:
		}
		err := ping(s.addr, nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer within %v: %v; %s", s.addr, startTimeout, err, s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return "log: " + string(b)
}

// kill ends the process this package started, by its id, and waits for it.
func (s *server) kill() {
	s.cmd.Process.Kill()
	<-s.done
}

func (s *server) stop() {
	s.kill()
	os.RemoveAll(s.dir)
}

// freePort returns a loopback port nobody listens on; with bus set, port +
// 10000 (Redis Cluster's bus port) must be free too.
func freePort(bus bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !bus {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		b, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		b.Close()
		return port, nil
	}
	return 0, errors.New("no free pair of loopback ports for a cluster node")
}

// startCluster starts three cluster-enabled servers, joins them into a
// cluster of three masters with redis-cli, and waits until every node
// reports the cluster ok.
func startCluster() ([]string, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, err
	}
	var addrs []string
	for range 3 {
		s, err := startServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, s.addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	deadline := time.Now().Add(startTimeout)
	for _, addr := range addrs {
		for {
			state, err := clusterState(addr)
			if err == nil && state == "ok" {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("cluster node %s: state %q, %v after %v", addr, state, err, startTimeout)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return addrs, nil
}

// clusterState returns the cluster_state a node reports.
func clusterState(addr string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_state:"); ok {
			return v, nil
		}
	}
	return "", errors.New("no cluster_state in CLUSTER INFO")
}
