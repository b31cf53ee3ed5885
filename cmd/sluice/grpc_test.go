package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// edgeRules is an envoyproxy/ratelimit config file: its format, unchanged.
const edgeRules = `domain: edge
descriptors:
  - key: path
    value: /login
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: remote_address
    rate_limit:
      unit: year
      requests_per_unit: 300
`

func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func shouldRateLimit(ctx context.Context, c rlsv3.RateLimitServiceClient, kv ...string) (*rlsv3.RateLimitResponse, error) {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
}

// serveEnvoy starts n instances of sluice serve on store (a config
// section, "" for memory) with the rules of dir and a policy "api".
func serveEnvoy(t *testing.T, n int, store, dir, extra string) []*server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	text := "listen:\n  http: \"127.0.0.1:0\"\n  grpc: \"127.0.0.1:0\"\n  admin: \"127.0.0.1:0\"\n" + store + extra +
		"guard:\n  timeout: 5s\n  failure_mode: closed\nenvoy:\n  config: " + dir + "\npolicies:\n  api:\n    limit: \"3 1/h\"\n"
	if err := writeFile(path, text); err != nil {
		t.Fatal(err)
	}
	out := make([]*server, n)
	for i := range out {
		out[i] = startServe(t, "-config", path)
	}
	return out
}

func rulesDir(t *testing.T, text string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(dir, "edge.yaml"), text); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The gRPC listener serves sluice.v1, Envoy's rate-limit service, health
// and reflection, on the memory store and on Redis.
func TestServeGRPC(t *testing.T) {
	for _, st := range []struct {
		name    string
		section func(t *testing.T) string
	}{
		{"memory", func(*testing.T) string { return "" }},
		{"redis", redisSection},
	} {
		t.Run(st.name, func(t *testing.T) {
			s := serveEnvoy(t, 1, st.section(t), rulesDir(t, edgeRules), "")[0]
			conn := dialGRPC(t, s.grpc)
			ctx := t.Context()

			h := healthpb.NewHealthClient(conn)
			for _, name := range []string{"", "sluice.v1.RateLimiter", "envoy.service.ratelimit.v3.RateLimitService"} {
				r, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
				if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("health of %q = %v, %v; want SERVING", name, r, err)
				}
			}

			api := sluicev1.NewRateLimiterClient(conn)
			for i, want := range []bool{true, true, true, false} {
				d, err := api.Take(ctx, &sluicev1.TakeRequest{Policy: "api", Key: "me"})
				if err != nil || d.Allowed != want || d.Limit.GetText() != "3 1/h" {
					t.Fatalf("sluice.v1 take %d = %v, %v; want allowed %v under 3 1/h", i, d, err, want)
				}
			}

			envoy := rlsv3.NewRateLimitServiceClient(conn)
			for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
				r, err := shouldRateLimit(ctx, envoy, "path", "/login")
				if err != nil || r.OverallCode != want {
					t.Fatalf("ShouldRateLimit %d = %v, %v; want %v", i, r, err, want)
				}
			}
			rc, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			resp, err := rc.Recv()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, sv := range resp.GetListServicesResponse().GetService() {
				names = append(names, sv.Name)
			}
			if got := strings.Join(names, " "); !strings.Contains(got, "sluice.v1.RateLimiter") || !strings.Contains(got, "envoy.service.ratelimit.v3.RateLimitService") {
				t.Fatalf("reflection lists %q", got)
			}
			rc.CloseSend() //nolint:errcheck // done

			if code, text := get(t, s.admin+"/metrics"); code != 200 || !strings.Contains(text, `sluice_envoy_descriptors_total{domain="edge",outcome="over_limit"} 1`) {
				t.Fatalf("metrics = %d, want the Envoy descriptor outcomes:\n%s", code, text)
			}
		})
	}
}

// Two instances on one Redis answering Envoy share each rule's quota
// exactly.
func TestServeEnvoyManyInstancesOneQuota(t *testing.T) {
	servers := serveEnvoy(t, 2, redisSection(t), rulesDir(t, edgeRules), "")
	clients := []rlsv3.RateLimitServiceClient{
		rlsv3.NewRateLimitServiceClient(dialGRPC(t, servers[0].grpc)),
		rlsv3.NewRateLimitServiceClient(dialGRPC(t, servers[1].grpc)),
	}
	var allowed, denied, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for range 20 {
				r, err := shouldRateLimit(t.Context(), clients[w%2], "remote_address", "10.1.1.1")
				switch {
				case err != nil:
					failed.Add(1)
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					allowed.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 300 || denied.Load() != 340 || failed.Load() != 0 {
		t.Fatalf("640 requests over two instances: %d allowed, %d denied, %d failed; want exactly 300 allowed (the rule's 300 a year)", allowed.Load(), denied.Load(), failed.Load())
	}
}

// A changed rules file is picked up; a bad one is refused, and the rules
// in use keep serving.
func TestServeEnvoyReload(t *testing.T) {
	dir := rulesDir(t, edgeRules)
	s := serveEnvoy(t, 1, "", dir, "")[0]
	envoy := rlsv3.NewRateLimitServiceClient(dialGRPC(t, s.grpc))
	limitOf := func() uint32 {
		r, err := shouldRateLimit(t.Context(), envoy, "path", "/login")
		if err != nil {
			t.Fatal(err)
		}
		return r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limitOf(); got != 2 {
		t.Fatalf("limit %d, want 2", got)
	}
	replace := func(text string) {
		tmp := filepath.Join(dir, ".edge.yaml.tmp")
		if err := writeFile(tmp, text); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "edge.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	replace(strings.Replace(edgeRules, "requests_per_unit: 2", "requests_per_unit: 5", 1))
	waitFor(t, func() bool { return limitOf() == 5 })
	replace(edgeRules + "  - key: path\n    value: /login\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")
	waitFor(t, func() bool { return strings.Contains(s.stderr.String(), "config refused") })
	if got := limitOf(); got != 5 {
		t.Fatalf("after a bad rules file the limit is %d, want 5 still", got)
	}
}

// The bearer tokens guard gRPC as they guard HTTP; health needs none.
func TestServeGRPCAuth(t *testing.T) {
	const token = "grpc-token-0123456789abcdef"
	t.Setenv("SLUICE_TEST_TOKENS", token)
	s := serveEnvoy(t, 1, "", rulesDir(t, edgeRules), "auth:\n  bearer_tokens_env: SLUICE_TEST_TOKENS\n")[0]
	conn := dialGRPC(t, s.grpc)
	envoy := rlsv3.NewRateLimitServiceClient(conn)
	if _, err := shouldRateLimit(t.Context(), envoy, "path", "/login"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v; want UNAUTHENTICATED", err)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
	if r, err := shouldRateLimit(ctx, envoy, "path", "/login"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("with the token: %v, %v", r, err)
	}
	if _, err := sluicev1.NewRateLimiterClient(conn).Take(t.Context(), &sluicev1.TakeRequest{Policy: "api", Key: "k"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("sluice.v1 without a token: %v; want UNAUTHENTICATED", err)
	}
	if r, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v, %v", r, err)
	}
}

// config check prints each rule's translation and the differences from
// envoyproxy/ratelimit, and refuses a bad rules file with its line.
func TestConfigCheckEnvoy(t *testing.T) {
	dir := rulesDir(t, edgeRules)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := writeFile(path, "guard:\n  timeout: 10ms\nenvoy:\n  config: "+dir+"\n"); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	if err := run(t.Context(), []string{"config", "check", path}, nil, &out, &errOut); err != nil {
		t.Fatalf("config check: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		"envoy rules: 2 in 1 domain",
		"edge: path=/login -> 2 per hour -> capacity 2, refill 2/h",
		"policy envoy/edge/path=%2Flogin",
		"edge: remote_address -> 300 per year -> capacity 300",
		"unlike envoyproxy/ratelimit:",
		"Denied requests",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("config check printed no %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "guard.timeout is") {
		t.Errorf("a 10ms guard timeout was warned about:\n%s", out.String())
	}

	if err := writeFile(filepath.Join(dir, "edge.yaml"), edgeRules+"  - key: path\n    value: /login\n"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if err := run(t.Context(), []string{"config", "check", path}, nil, &out, &errOut); err == nil {
		t.Fatalf("config check of a duplicate descriptor passed:\n%s", out.String())
	}
	if !strings.Contains(errOut.String(), "edge.yaml:12") {
		t.Errorf("config check error %q does not name the file and line", errOut.String())
	}
}

// A client watching the gRPC health sees NOT_SERVING at a shutdown, and
// its stream ends: it does not hold the shutdown for the drain time.
func TestServeShutdownEndsHealthWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"10 1/s\"\n")
	s := startServe(t, "-config", path, "-drain", "5s")
	w, err := healthpb.NewHealthClient(dialGRPC(t, s.grpc)).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch answer %v, %v; want SERVING", r, err)
	}
	start := time.Now()
	s.stop()
	err = <-s.done
	s.done <- nil // for the cleanup
	if err != nil {
		t.Fatalf("serve returned %v, want nil", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the shutdown took %v with a health watch open; want well under the 5s drain", took)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			break
		}
		if r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("watch answer %v after the shutdown began; want NOT_SERVING", r)
		}
	}
}
