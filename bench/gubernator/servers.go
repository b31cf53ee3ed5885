package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The two servers compared.
const (
	sluiceServer     = "sluice"
	gubernatorServer = "gubernator"
)

// startTimeout bounds a server's start, up to its answering its readiness
// check; stopTimeout its graceful stop, after which it is killed.
const (
	startTimeout = 20 * time.Second
	stopTimeout  = 10 * time.Second
)

// server is one running server process.
type server struct {
	name     string
	cmd      *exec.Cmd
	httpURL  string // http://host:port of its HTTP API
	grpcAddr string // host:port of its gRPC listener
	stderr   *tailBuffer
	exited   chan struct{} // closed when the process has exited
	waitErr  error         // set before exited is closed
}

// launcher starts the servers: sluice from its binary with a config of the
// policy "bench", gubernator by running exe (this program, or the test
// binary) with daemonEnv set.
type launcher struct {
	sluiceBin string
	exe       string
	dir       string // holds the sluice config
	limit     string // the sluice policy's limit, as text
}

// sluiceConfig is the config of `sluice serve`: the memory store, the one
// policy "bench", and every listener on a free loopback port.
const sluiceConfig = `listen:
  http: "127.0.0.1:0"
  grpc: "127.0.0.1:0"
  admin: "127.0.0.1:0"
store:
  type: memory
policies:
  bench:
    limit: %q
`

// sluiceBanner is the line `sluice serve` writes when it is listening
// (cmd/sluice/serve.go).
var sluiceBanner = regexp.MustCompile(`^sluice: serving the HTTP API on (http://[^ ,]+), gRPC \([^)]*\) on ([^ ,]+),`)

// gubernatorBanner is the line the daemon mode writes (daemon.go).
var gubernatorBanner = regexp.MustCompile(`^gubernator: serving HTTP on (http://[^ ,]+) and gRPC on ([^ ,]+)$`)

func (l *launcher) start(ctx context.Context, name string) (*server, error) {
	var cmd *exec.Cmd
	var banner *regexp.Regexp
	var ready string
	switch name {
	case sluiceServer:
		cfg := filepath.Join(l.dir, "sluice.yaml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, sluiceConfig, l.limit), 0o600); err != nil {
			return nil, err
		}
		cmd = exec.Command(l.sluiceBin, "serve", "-config", cfg, "-watch=false")
		banner, ready = sluiceBanner, "/readyz"
	case gubernatorServer:
		cmd = exec.Command(l.exe)
		cmd.Env = append(cmd.Env, daemonEnv+"=1")
		banner, ready = gubernatorBanner, "/v1/HealthCheck"
	default:
		return nil, fmt.Errorf("server %q: want %s or %s", name, sluiceServer, gubernatorServer)
	}
	// The servers get the machine's GOMAXPROCS, whatever the generator's.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") && !strings.HasPrefix(kv, daemonEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	s := &server{name: name, cmd: cmd, stderr: &tailBuffer{max: 16 << 10}, exited: make(chan struct{})}
	cmd.Stderr = s.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	lines := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		found := false
		for sc.Scan() {
			if m := banner.FindStringSubmatch(sc.Text()); !found && m != nil {
				found = true
				lines <- m
			}
		}
		_, _ = io.Copy(io.Discard, out)
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	select {
	case m := <-lines:
		s.httpURL, s.grpcAddr = m[1], m[2]
	case <-s.exited:
		return nil, fmt.Errorf("%s exited before listening (%v): %s", name, s.waitErr, s.stderr)
	case <-ctx.Done():
		s.stop()
		return nil, fmt.Errorf("%s did not listen within %v: %s", name, startTimeout, s.stderr)
	}
	if err := waitReady(ctx, s.httpURL+ready); err != nil {
		s.stop()
		return nil, fmt.Errorf("%s is not ready: %w: %s", name, err, s.stderr)
	}
	return s, nil
}

// waitReady polls url until it answers 200.
func waitReady(ctx context.Context, url string) error {
	client := &http.Client{Timeout: time.Second}
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: status %d: %.200s", url, resp.StatusCode, body)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// pid is the server's process id.
func (s *server) pid() int { return s.cmd.Process.Pid }

// stop stops the server with SIGTERM, and kills it if it has not exited
// within stopTimeout.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}

// userHZ is the unit of the CPU times in /proc/PID/stat and /proc/stat:
// the kernel's USER_HZ, 100 on Linux's common architectures.
const userHZ = 100

// procCPU returns the user and system CPU time process pid has used, all
// its threads, from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces;
	// utime and stime are fields 14 and 15, the 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat: CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// machineCPU returns the busy and the total CPU time of all CPUs since
// boot, from /proc/stat (busy: user, nice, system, irq, softirq, steal;
// total adds idle and iowait).
func machineCPU() (busy, total time.Duration, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %.80q is not the cpu line", line)
	}
	var v [8]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q: %w", f[i+1], err)
		}
	}
	b0 := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	t := b0 + v[3] + v[4]
	return time.Duration(b0) * time.Second / userHZ, time.Duration(t) * time.Second / userHZ, nil
}

// loadAverage returns the 1, 5 and 15 minute load averages of
// /proc/loadavg, as they are written there.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// idleOver returns the share of the CPUs' time that was idle over the
// next d, in percent.
func idleOver(ctx context.Context, d time.Duration) (float64, error) {
	b0, t0, err := machineCPU()
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	b1, t1, err := machineCPU()
	if err != nil {
		return 0, err
	}
	if t1 == t0 {
		return 100, nil
	}
	return 100 * (1 - float64(b1-b0)/float64(t1-t0)), nil
}
