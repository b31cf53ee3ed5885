package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/envoyconf"
	"github.com/sluicehq/sluice/internal/grpcapi"
	"github.com/sluicehq/sluice/internal/rls"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// capacity is the limit of the test policy "p" and of the Envoy rule of
// descriptor "user": 3 tokens that do not refill during a test (the rule's
// refill 3 a year), so that the tokens a run took are in the store when it
// ends.
const capacity = 3

// rulesYAML is the test service's Envoy rules.
const rulesYAML = `domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: year
      requests_per_unit: 3
`

// testService is the gRPC APIs of a service over a memstore.
type testService struct {
	addr  string
	store *memstore.Store
	rules *envoyconf.Config
	seen  atomic.Int64 // calls that reached the server
}

// newService serves sluice.v1 and Envoy's rate-limit service, with the
// policy "p" and the rules of rulesYAML, on a loopback port. fail, if not
// nil, answers a call instead of the APIs when it returns an error.
func newService(t *testing.T, fail func(method string) error) *testService {
	t.Helper()
	st, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rules, err := envoyconf.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	policies := []service.Policy{{Name: "p", Limit: sluice.Limit{Capacity: capacity, Rate: sluice.Per(0, time.Second)}}}
	for _, r := range rules.Rules() {
		policies = append(policies, service.Policy{Name: r.Policy, Limit: r.Limit})
	}
	table, err := service.NewTable(st, "v", policies)
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(st, table.WithEnvoy(rules), service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	api, err := grpcapi.New(core, grpcapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	envoy, err := rls.New(core, rls.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := &testService{store: st, rules: rules}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.seen.Add(1)
		if fail != nil {
			if err := fail(info.FullMethod); err != nil {
				return nil, err
			}
		}
		return h(ctx, req)
	}))
	api.Register(srv)
	rlsv3.RegisterRateLimitServiceServer(srv, envoy)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	s.addr = ln.Addr().String()
	return s
}

// taken returns the tokens taken from the buckets of the keys k0 to
// k(keys-1): of the policy "p" for the sluice.v1 modes, of the rule of
// "user" for envoy.
func (s *testService) taken(t *testing.T, mode string, keys int) int64 {
	t.Helper()
	var sum int64
	for i := range keys {
		r := sluice.Request{Policy: "p", Key: keyName(i), Cost: 1, Limit: sluice.Limit{Capacity: capacity, Rate: sluice.Per(0, time.Second)}}
		if mode == "envoy" {
			entries := []envoyconf.Entry{{Key: "user", Value: keyName(i)}}
			rule, ok := s.rules.Match("bench", entries)
			if !ok {
				t.Fatal("no rule for user")
			}
			r = sluice.Request{Policy: rule.Policy, Key: rule.Key(entries), Cost: 1, Limit: rule.Limit}
		}
		d, err := s.store.Peek(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		sum += capacity - d.Remaining
	}
	return sum
}

func testConfig(s *testService, client, mode string) config {
	return config{addr: s.addr, policy: "p", domain: "bench", descriptor: "user", mode: mode, batch: 10,
		inFlight: 8, conns: 3, keys: 50, calls: 200, seed: 1, client: client, timeout: 5 * time.Second}
}

var (
	modes   = []string{"take", "batch", "envoy"}
	clients = []string{"raw", "proto"}
)

// TestCounts: every decision asked for is counted once, as the service
// made it: allowed + denied is what was asked for, and the allowed ones
// are the tokens the store lost.
func TestCounts(t *testing.T) {
	for _, client := range clients {
		for _, mode := range modes {
			t.Run(client+"/"+mode, func(t *testing.T) {
				s := newService(t, nil)
				c := testConfig(s, client, mode)
				g, err := newGenerator(t.Context(), c)
				if err != nil {
					t.Fatal(err)
				}
				defer g.close()
				r, err := g.run(t.Context(), 0, c.calls)
				if err != nil {
					t.Fatal(err)
				}
				want := c.calls * int64(c.perCall())
				if r.calls != c.calls || s.seen.Load() != c.calls || r.decisions != want {
					t.Fatalf("calls %d (the service saw %d), decisions %d; want %d calls, %d decisions",
						r.calls, s.seen.Load(), r.decisions, c.calls, want)
				}
				if r.allowed+r.denied != want || r.errors != 0 || r.failed != 0 {
					t.Fatalf("allowed %d + denied %d = %d, errors %d, failed %d (%s); want %d decided, no errors",
						r.allowed, r.denied, r.allowed+r.denied, r.errors, r.failed, r.firstErr, want)
				}
				if got := s.taken(t, mode, c.keys); r.allowed != got {
					t.Errorf("allowed %d, but the store lost %d tokens", r.allowed, got)
				}
				if r.denied == 0 || r.allowed == 0 {
					t.Errorf("allowed %d, denied %d: want both, %d keys of %d tokens for %d decisions", r.allowed, r.denied, c.keys, capacity, want)
				}
				if len(r.latencies) != int(r.calls) {
					t.Errorf("%d latencies for %d calls", len(r.latencies), r.calls)
				}
			})
		}
	}
}

// TestErrors: calls that fail, batch items that are errors and envoy
// answers that no rule matched are counted as errors, never as decisions.
func TestErrors(t *testing.T) {
	var n atomic.Int64
	// Every 5th call fails UNAVAILABLE; the rest go to the APIs.
	fail := func(string) error {
		if n.Add(1)%5 == 0 {
			return status.Error(codes.Unavailable, "test: every 5th call fails")
		}
		return nil
	}
	for _, client := range clients {
		for _, mode := range modes {
			t.Run(client+"/"+mode, func(t *testing.T) {
				n.Store(0)
				s := newService(t, fail)
				c := testConfig(s, client, mode)
				c.inFlight, c.conns = 1, 1 // the pattern of answers is then that of the calls
				g, err := newGenerator(t.Context(), c)
				if err != nil {
					t.Fatal(err)
				}
				defer g.close()
				r, err := g.run(t.Context(), 0, c.calls)
				if err != nil {
					t.Fatal(err)
				}
				per := int64(c.perCall())
				if r.allowed+r.denied+r.errors != r.decisions || r.decisions != c.calls*per {
					t.Fatalf("allowed %d + denied %d + errors %d != %d decisions of %d calls", r.allowed, r.denied, r.errors, r.decisions, c.calls)
				}
				if r.failed != c.calls/5 || r.codes[codes.Unavailable] != c.calls/5 || r.errors != r.failed*per {
					t.Errorf("failed %d, codes %v, errors %d: want the %d UNAVAILABLE calls counted as %d errors", r.failed, r.codes, r.errors, c.calls/5, c.calls/5*per)
				}
				if got := s.taken(t, mode, c.keys); r.allowed != got {
					t.Errorf("allowed %d, but the store lost %d tokens", r.allowed, got)
				}
			})
		}
	}
}

// TestNoDecision: a run that gets no decision at all is an error, and
// what it got instead is counted: NOT_FOUND items of a batch of an unknown
// policy, envoy answers of a descriptor no rule matches.
func TestNoDecision(t *testing.T) {
	for _, client := range clients {
		for _, mode := range []string{"batch", "envoy"} {
			t.Run(client+"/"+mode, func(t *testing.T) {
				s := newService(t, nil)
				c := testConfig(s, client, mode)
				c.policy, c.descriptor = "nope", "nope"
				g, err := newGenerator(t.Context(), c)
				if err != nil {
					t.Fatal(err)
				}
				defer g.close()
				r, err := g.run(t.Context(), 0, 10)
				if err == nil || !strings.Contains(err.Error(), "no decision") {
					t.Fatalf("run with an unknown policy or descriptor: error %v, want no decision", err)
				}
				per := int64(c.perCall())
				if r.errors != 10*per || r.failed != 0 {
					t.Errorf("errors %d, failed %d: want %d errors, no failed call", r.errors, r.failed, 10*per)
				}
				if mode == "batch" && r.codes[codes.NotFound] != 10*per {
					t.Errorf("codes %v: want every item NOT_FOUND", r.codes)
				}
				if mode == "envoy" && r.unmatched != 10 {
					t.Errorf("unmatched %d: want every answer counted as no rule matched", r.unmatched)
				}
			})
		}
	}
}

// TestRun: the command runs for a duration after a warm-up and prints its
// report.
func TestRun(t *testing.T) {
	s := newService(t, nil)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-addr", s.addr, "-mode", "envoy", "-keys", "50", "-in-flight", "4", "-conns", "2",
		"-duration", "100ms", "-warmup", "50ms"}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v (%s)", err, errOut.String())
	}
	for _, want := range []string{"decisions ", "latency    p50 ", "result mode=envoy decisions/s="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report %q lacks %q", out.String(), want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, tt := range []struct{ args, want string }{
		{"-mode both", `-mode "both": want take, batch or envoy`},
		{"-in-flight 0", "-in-flight 0: want 1 to 10000"},
		{"-conns 0", "-conns 0: want 1 to 64"},
		{"-in-flight 2 -conns 3", "-conns 3: want 1 to 2"},
		{"-keys 0", "-keys 0: want 1 to 16777216"},
		{"-batch 0", "-batch 0: want 1 to 100000"},
		{"-calls -1", "-calls -1: want 0"},
		{"-duration 0", "-duration 0s: want a positive duration"},
		{"-addr localhost", `-addr "localhost": want host:port`},
		{"-policy=", "-policy is empty"},
		{"-mode envoy -domain=", "-domain is empty"},
		{"-client json", `-client "json": want raw or proto`},
		{"-timeout 0", "-timeout 0s: want a positive duration"},
		{"extra", `loadgen takes no arguments, got ["extra"]`},
	} {
		err := run(context.Background(), strings.Fields(tt.args), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("loadgen %s: error %v, want %q", tt.args, err, tt.want)
		}
	}
}
