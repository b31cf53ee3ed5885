package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// server is a "sluice serve" running in the test process.
type server struct {
	api, admin string // base URLs
	grpc       string // host:port of the gRPC listener
	done       chan error
	stop       context.CancelFunc
	stderr     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var listening = regexp.MustCompile(`serving the HTTP API on http://(\S+), gRPC \(sluice.v1, Envoy rate limit\) on (\S+), and metrics on http://(\S+)/metrics`)

// startServe runs serve with args and waits until it listens.
func startServe(t *testing.T, args ...string) *server {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	s := &server{done: make(chan error, 1), stop: stop, stderr: &syncBuffer{}}
	go func() {
		err := run(ctx, append([]string{"serve"}, args...), strings.NewReader(""), pw, s.stderr)
		pw.Close()
		s.done <- err
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		stop()
		t.Fatalf("serve printed nothing; error %v; stderr:\n%s", <-s.done, s.stderr)
	}
	m := listening.FindStringSubmatch(sc.Text())
	if m == nil {
		t.Fatalf("serve's first line %q does not say where it listens", sc.Text())
	}
	s.api, s.admin = "http://"+strings.Replace(m[1], "[::]", "127.0.0.1", 1), "http://"+m[3]
	s.grpc = strings.Replace(m[2], "[::]", "127.0.0.1", 1)
	go io.Copy(io.Discard, pr) //nolint:errcheck // the rest of the banner
	t.Cleanup(func() {
		stop()
		<-s.done
	})
	return s
}

func post(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out) //nolint:errcheck // a non-JSON answer leaves out nil
	return resp.StatusCode, out
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func writeConfig(t *testing.T, path, policies string) {
	t.Helper()
	text := "listen:\n  http: \"127.0.0.1:0\"\n  grpc: \"127.0.0.1:0\"\n  admin: \"127.0.0.1:0\"\npolicies:\n" + policies
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestServeDefault(t *testing.T) {
	// The default config listens on :8080; this test needs free ports, so
	// it runs the default policy from a file with port 0.
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  default:\n    limit: \"2 1/h\"\n")
	s := startServe(t, "-config", path)
	for i, want := range []bool{true, true, false} {
		status, body := post(t, s.api+"/v1/take", `{"policy":"default","key":"me"}`)
		if status != 200 || body["allowed"] != want {
			t.Fatalf("take %d = %d %v, want 200 allowed=%v", i, status, body, want)
		}
	}
	if status, body := post(t, s.api+"/v1/take", `{"policy":"nope","key":"me"}`); status != 404 {
		t.Fatalf("unknown policy = %d %v, want 404", status, body)
	}
	if status, text := get(t, s.admin+"/metrics"); status != 200 || !strings.Contains(text, `sluice_decisions_total{op="take",policy="default",result="denied"} 1`) ||
		!strings.Contains(text, "sluice_config_info{version=") || !strings.Contains(text, "\nsluice_memstore_buckets 1\n") {
		t.Fatalf("GET /metrics = %d, want decisions by policy, the config version and the store's own gauges:\n%s", status, text)
	}
	if status, _ := get(t, s.api+"/readyz"); status != 200 {
		t.Fatalf("GET /readyz = %d, want 200", status)
	}
}

func TestServeReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"1 1/h\"\n")
	s := startServe(t, "-config", path)
	status := func() map[string]any {
		t.Helper()
		code, text := get(t, s.api+"/v1/status")
		var out map[string]any
		if err := json.Unmarshal([]byte(text), &out); code != 200 || err != nil {
			t.Fatalf("GET /v1/status = %d %q", code, text)
		}
		return out
	}
	first := status()["version"]
	post(t, s.api+"/v1/take", `{"policy":"api","key":"k"}`)

	// A good new config: the limit grows, the bucket converts lazily.
	writeConfig(t, path, "  api:\n    limit: \"3 1/h\"\n  login:\n    limit: \"5 5/m\"\n")
	reload(t)
	waitFor(t, func() bool { return status()["version"] != first })
	second := status()["version"]
	if code, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"k"}`); code != 200 || body["allowed"] != false || body["limit"] != "3 1/h" {
		// KeepTokens: the empty bucket stays empty under the new capacity.
		t.Fatalf("take after the reload = %d %v, want denied under 3 1/h (the level carried over)", code, body)
	}
	if code, _ := post(t, s.api+"/v1/take", `{"policy":"login","key":"k"}`); code != 200 {
		t.Fatalf("the new policy answers %d, want 200", code)
	}

	// A bad config is refused and logged; the last good one keeps serving.
	if err := os.WriteFile(path, []byte("policies:\n  api:\n    limit: \"3 1/fortnight\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reload(t)
	waitFor(t, func() bool { return strings.Contains(s.stderr.String(), "config refused") })
	if v := status()["version"]; v != second {
		t.Fatalf("after a bad reload the version is %v, want %v (the last good config)", v, second)
	}
	if code, _ := post(t, s.api+"/v1/take", `{"policy":"login","key":"k"}`); code != 200 {
		t.Fatalf("after a bad reload the policy login answers %d, want 200", code)
	}
}

// reload sends SIGHUP to this process, which serve handles.
func reload(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServeShutdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"1000 0/s\"\n")
	s := startServe(t, "-config", path)
	// Requests in flight when the shutdown begins all get an answer.
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed, failed := 0, 0
	start := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			<-start
			for range 20 {
				resp, err := http.Post(s.api+"/v1/take", "application/json", strings.NewReader(`{"policy":"api","key":"k"}`))
				mu.Lock()
				if err != nil {
					failed++
				} else if resp.StatusCode == 200 {
					allowed++
				}
				mu.Unlock()
				if err != nil {
					return
				}
				resp.Body.Close()
			}
		})
	}
	close(start)
	time.Sleep(20 * time.Millisecond)
	s.stop()
	if err := <-s.done; err != nil {
		t.Fatalf("serve returned %v after its context ended, want nil", err)
	}
	s.done <- nil // for the cleanup
	wg.Wait()
	if allowed == 0 {
		t.Fatalf("no request was answered before the shutdown (%d failed)", failed)
	}
	// Every request either got its answer or could not connect: none was
	// cut in the middle with a decision made and lost.
	t.Logf("%d answered, %d refused after the listener closed", allowed, failed)
}

func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	writeConfig(t, good, "  api:\n    limit: \"100 10/s\"\n")
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"config", "check", good}, nil, &out, &errOut); err != nil {
		t.Fatalf("config check of a good file: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "api") || !strings.Contains(out.String(), "100 10/s") {
		t.Errorf("config check printed %q; want the policy and its limit", out.String())
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("policies:\n  api:\n    limit: \"100 10/s\"\n    limt: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if err := run(t.Context(), []string{"config", "check", bad}, nil, &out, &errOut); err == nil {
		t.Fatal("config check of a file with an unknown key succeeded")
	}
	if !strings.Contains(errOut.String(), "limt") || !strings.Contains(errOut.String(), ":4") {
		t.Errorf("config check error %q does not name the key and its line", errOut.String())
	}

	// A limit the Redis store cannot decide exactly is refused for a Redis
	// config, at check time.
	redis := filepath.Join(dir, "redis.yaml")
	text := "store:\n  type: redis\n  redis:\n    url: \"redis://127.0.0.1:6379/0\"\npolicies:\n  api:\n    limit: \"143 1/366d\"\n"
	if err := os.WriteFile(redis, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if err := run(t.Context(), []string{"config", "check", redis}, nil, &out, &errOut); err == nil || !strings.Contains(errOut.String(), "143 1/366d") && !strings.Contains(errOut.String(), "capacity") {
		t.Fatalf("config check of a limit Redis cannot decide = %v, stderr %q; want it refused", err, errOut.String())
	}
	fmt.Fprint(io.Discard, out.String())
}
