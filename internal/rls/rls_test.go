package rls

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/internal/envoyconf"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// rulesYAML is an envoyproxy/ratelimit config with a rule of every kind.
const rulesYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tier
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 3}
  - key: internal
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: bulk
    rate_limit: {name: bulk, unit: hour, requests_per_unit: 2}
  - key: q1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: bulk_vip
    rate_limit:
      unit: hour
      requests_per_unit: 50
      replaces: [{name: bulk}]
`

type fixture struct {
	client rlsv3.RateLimitServiceClient
	core   *service.Core
	store  *memstore.Store
	clock  *sluicetest.Clock

	mu       sync.Mutex
	outcomes []Outcome
	shadowed []string
}

// policiesOf are the core's policies for the rules, as the service makes
// them.
func policiesOf(rules *envoyconf.Config) []service.Policy {
	var ps []service.Policy
	for _, r := range rules.Rules() {
		if r.Unlimited || r.Deny {
			continue
		}
		ps = append(ps, service.Policy{Name: r.Policy, Limit: r.Limit, Shadow: r.Shadow})
	}
	return ps
}

// start serves the rules over loopback gRPC, deciding in store (a
// memstore on a fake clock when nil).
func start(t *testing.T, yaml string, store sluice.Store, o Options) *fixture {
	t.Helper()
	f := &fixture{}
	if store == nil {
		f.clock = sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		st, err := memstore.New(memstore.Options{Now: f.clock.Now, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		f.store, store = st, st
	}
	rules, err := envoyconf.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	tab, err := service.NewTable(store, "v1", policiesOf(rules))
	if err != nil {
		t.Fatal(err)
	}
	f.core, err = service.New(store, tab.WithEnvoy(rules), service.Hooks{ShadowDenied: func(p string) {
		f.mu.Lock()
		f.shadowed = append(f.shadowed, p)
		f.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	o.Outcome = func(domain string, known bool, out Outcome) {
		f.mu.Lock()
		f.outcomes = append(f.outcomes, out)
		f.mu.Unlock()
	}
	srv, err := New(f.core, o)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f.client = rlsv3.NewRateLimitServiceClient(conn)
	return f
}

// stores are the stores the decision tests run on: memstore on a fake
// clock (nil: start makes it), and Redis under a prefix of its own.
var stores = []struct {
	name string
	open func(t *testing.T) sluice.Store
}{
	{"memory", func(*testing.T) sluice.Store { return nil }},
	{"redis", func(t *testing.T) sluice.Store {
		client := redistest.Client(t)
		prefix := fmt.Sprintf("sluicetest:rls:%d:", time.Now().UnixNano())
		t.Cleanup(func() {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				client.Del(ctx, iter.Val())
			}
		})
		st, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}},
}

// onStores runs test on each store.
func onStores(t *testing.T, test func(t *testing.T, store sluice.Store)) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) { test(t, st.open(t)) })
	}
}

func TestMain(m *testing.M) { redistest.Main(m) }

// desc builds a descriptor of key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *fixture) ask(t *testing.T, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

func codesOf(resp *rlsv3.RateLimitResponse) string {
	var b []string
	for _, s := range resp.Statuses {
		b = append(b, s.Code.String())
	}
	return resp.OverallCode.String() + " [" + strings.Join(b, " ") + "]"
}

func TestRuleKinds(t *testing.T) { onStores(t, testRuleKinds) }

func testRuleKinds(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	// Exact value beats wildcard beats key only; each value of a
	// key-only or wildcard rule has its own bucket.
	for i := range 2 {
		r := f.ask(t, 0, desc("path", "/login"))
		want := "OK [OK]"
		if i == 1 {
			want = "OVER_LIMIT [OVER_LIMIT]"
		}
		if got := codesOf(r); got != want {
			t.Fatalf("/login take %d: %s, want %s", i, got, want)
		}
	}
	r := f.ask(t, 0, desc("path", "/api/users"))
	if st := r.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit.GetRequestsPerUnit() != 5 || st.LimitRemaining != 4 {
		t.Fatalf("/api/users: %v; want OK under the wildcard rule of 5, 4 remaining", st)
	}
	r = f.ask(t, 0, desc("path", "/api/orders"))
	if st := r.Statuses[0]; st.LimitRemaining != 4 {
		t.Fatalf("/api/orders: remaining %d; want 4 (a bucket per value, as for a key-only rule)", st.LimitRemaining)
	}
	r = f.ask(t, 0, desc("path", "/other"))
	if st := r.Statuses[0]; st.CurrentLimit.GetRequestsPerUnit() != 100 || st.LimitRemaining != 99 {
		t.Fatalf("/other: %v; want the key-only rule of 100, 99 remaining", st)
	}
	r = f.ask(t, 0, desc("path", "/else"))
	if st := r.Statuses[0]; st.LimitRemaining != 99 {
		t.Fatalf("/else: remaining %d; want 99 (a bucket per value)", st.LimitRemaining)
	}
	// Nested: the limit is at the descriptor's own depth only.
	if r := f.ask(t, 0, desc("tier", "free")); codesOf(r) != "OK [OK]" || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("tier=free alone: %v; want OK with no limit (the rule is one level down)", r)
	}
	for i := range 4 {
		r := f.ask(t, 0, desc("tier", "free", "user", "ann"))
		if want := i < 3; (r.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("tier=free,user=ann take %d: %s", i, codesOf(r))
		}
	}
	// Unlimited: OK, no bucket.
	var keys int64
	if f.store != nil {
		keys = f.store.Stats().Buckets
	}
	r = f.ask(t, 0, desc("internal", "x"))
	if st := r.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != math.MaxUint32 {
		t.Fatalf("unlimited: %v", st)
	}
	if f.store != nil && f.store.Stats().Buckets != keys {
		t.Fatal("an unlimited rule made a bucket")
	}
	// requests_per_unit 0 denies, with no wait that would help.
	r = f.ask(t, 0, desc("blocked", "x"))
	if st := r.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.DurationUntilReset != nil {
		t.Fatalf("blocked: %v; want OVER_LIMIT without a reset duration", st)
	}
	// No rule, or an unknown domain: OK.
	r = f.ask(t, 0, desc("nothing", "x"))
	if codesOf(r) != "OK [OK]" {
		t.Fatalf("no rule: %s", codesOf(r))
	}
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "elsewhere", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("path", "/login")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unknown domain: %v, %v", resp, err)
	}
}

// A request denied by one descriptor consumes nothing from the others.
func TestAllOrNothing(t *testing.T) { onStores(t, testAllOrNothing) }

func testAllOrNothing(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	login := desc("path", "/login")
	ip := desc("remote_address", "10.0.0.1")
	if r := f.ask(t, 0, ip, login); codesOf(r) != "OK [OK OK]" {
		t.Fatalf("first: %s", codesOf(r))
	}
	for i := range 3 {
		r := f.ask(t, 0, ip, login)
		if codesOf(r) != "OVER_LIMIT [OK OVER_LIMIT]" {
			t.Fatalf("denied %d: %s", i, codesOf(r))
		}
		if got := r.Statuses[0].LimitRemaining; got != 9 {
			t.Fatalf("denied %d: the address has %d left, want 9 (nothing taken)", i, got)
		}
		if d := r.Statuses[1].DurationUntilReset.AsDuration(); d <= 0 || d > time.Hour {
			t.Fatalf("denied %d: login duration_until_reset %v, want the wait for a token (up to 1h)", i, d)
		}
	}
	// A cost above a capacity: OVER_LIMIT with no duration, and the
	// other descriptor untouched.
	big := desc("path", "/api/x")
	big.HitsAddend = wrapperspb.UInt64(6)
	r := f.ask(t, 0, ip, big)
	if codesOf(r) != "OVER_LIMIT [OK OVER_LIMIT]" || r.Statuses[1].DurationUntilReset != nil {
		t.Fatalf("cost 6 of a capacity 5: %v", r)
	}
	if got := r.Statuses[0].LimitRemaining; got != 9 {
		t.Fatalf("after the oversized cost the address has %d left, want 9", got)
	}
}

func TestHitsAddend(t *testing.T) { onStores(t, testHitsAddend) }

func testHitsAddend(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	ip := desc("remote_address", "10.0.0.2")
	if r := f.ask(t, 4, ip); r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("request hits 4: remaining %d, want 6", r.Statuses[0].LimitRemaining)
	}
	own := desc("remote_address", "10.0.0.2")
	own.HitsAddend = wrapperspb.UInt64(2)
	if r := f.ask(t, 4, own); r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("descriptor hits 2 over request hits 4: remaining %d, want 4", r.Statuses[0].LimitRemaining)
	}
	check := desc("remote_address", "10.0.0.2")
	check.HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		if r := f.ask(t, 0, check); r.Statuses[0].LimitRemaining != 4 || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("hits 0 (check only): %v; want OK and 4 remaining, nothing taken", r.Statuses[0])
		}
	}
	if r := f.ask(t, 5, ip); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("hits 5 of 4 left: %v", r.Statuses[0])
	}
}

func TestShadowAndReplaces(t *testing.T) { onStores(t, testShadowAndReplaces) }

func testShadowAndReplaces(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	for range 3 {
		if r := f.ask(t, 0, desc("trial", "t")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow rule: %s, want OK", codesOf(r))
		}
	}
	if len(f.shadowed) != 2 {
		t.Fatalf("shadow denials %v, want 2", f.shadowed)
	}
	// bulk_vip replaces the rule named bulk when both match.
	for i := range 5 {
		r := f.ask(t, 0, desc("bulk", "b"), desc("bulk_vip", "b"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("take %d with bulk replaced: %v", i, r)
		}
	}
	for i := range 3 {
		r := f.ask(t, 0, desc("bulk", "b"))
		if want := i < 2; (r.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("bulk alone, take %d: %s (its bucket was not charged while replaced)", i, codesOf(r))
		}
	}
}

// Quota-mode descriptors fail a request only when all of them are over,
// and then nothing is taken.
func TestQuotaMode(t *testing.T) { onStores(t, testQuotaMode) }

func testQuotaMode(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	ip := desc("remote_address", "10.0.0.9")
	for i, c := range []struct{ want, ip string }{
		{"OK [OK OK OK]", "9"},
		{"OK [OK OK OK]", "8"}, // q1 over, q2 not: q1 answers OK
		{"OVER_LIMIT [OK OVER_LIMIT OVER_LIMIT]", "8"},
	} {
		r := f.ask(t, 0, ip, desc("q1", "a"), desc("q2", "a"))
		if got := codesOf(r); got != c.want {
			t.Fatalf("request %d: %s, want %s", i, got, c.want)
		}
		if got := fmt.Sprint(r.Statuses[0].LimitRemaining); got != c.ip {
			t.Fatalf("request %d: the address has %s left, want %s", i, got, c.ip)
		}
	}
	if f.outcomes[4] != OutcomeQuota {
		t.Fatalf("outcomes %v; want q1's second answer counted as quota", f.outcomes)
	}
}

// A descriptor's own limit decides it, whatever the rules say; each limit
// has its own bucket.
func TestDescriptorLimitOverride(t *testing.T) { onStores(t, testDescriptorLimitOverride) }

func testDescriptorLimitOverride(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	over := func(n uint32) *ratelimitv3.RateLimitDescriptor {
		d := desc("path", "/login")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: typev3.RateLimitUnit_HOUR}
		return d
	}
	for i, want := range []string{"OK [OK]", "OK [OK]", "OVER_LIMIT [OVER_LIMIT]"} {
		r := f.ask(t, 0, over(2))
		if got := codesOf(r); got != want || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Fatalf("override 2/h, request %d: %v; want %s under 2 per hour", i, r, want)
		}
	}
	for i := range 3 {
		if r := f.ask(t, 0, over(3)); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("override 3/h, request %d: %s; want its own bucket", i, codesOf(r))
		}
	}
	// The config's rule of 1/h has its own bucket still.
	if r := f.ask(t, 0, desc("path", "/login")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the rule after the overrides: %s", codesOf(r))
	}
	// A domain with no rules: OK, no store call.
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "elsewhere", Descriptors: []*ratelimitv3.RateLimitDescriptor{over(1), over(1)}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("an override in an unknown domain: %v, %v; want OK", resp, err)
	}
}

// Two descriptors of one bucket are one take of their summed cost, not
// an error that Envoy would let through.
func TestRepeatedDescriptor(t *testing.T) { onStores(t, testRepeatedDescriptor) }

func testRepeatedDescriptor(t *testing.T, store sluice.Store) {
	f := start(t, rulesYAML, store, Options{})
	ip := func() *ratelimitv3.RateLimitDescriptor { return desc("remote_address", "10.0.0.7") }
	for i := range 5 {
		r := f.ask(t, 0, ip(), ip())
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != uint32(8-2*i) {
			t.Fatalf("request %d: %v; want OK, %d left (two tokens a request)", i, r, 8-2*i)
		}
	}
	if r := f.ask(t, 0, ip(), ip()); codesOf(r) != "OVER_LIMIT [OVER_LIMIT OVER_LIMIT]" {
		t.Fatalf("sixth request: %s, want over the limit", codesOf(r))
	}
	// Costs that fit one by one but not together: over the limit, nothing
	// taken.
	a, b := desc("remote_address", "10.0.0.8"), desc("remote_address", "10.0.0.8")
	a.HitsAddend, b.HitsAddend = wrapperspb.UInt64(6), wrapperspb.UInt64(6)
	if r := f.ask(t, 0, a, b); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].DurationUntilReset != nil {
		t.Fatalf("6 + 6 of a capacity of 10: %v; want OVER_LIMIT without a reset duration", r)
	}
	if r := f.ask(t, 0, desc("remote_address", "10.0.0.8")); r.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("after the refused 6 + 6, %d left; want 9 (nothing was taken)", r.Statuses[0].LimitRemaining)
	}
}

func TestHeaders(t *testing.T) {
	f := start(t, rulesYAML, nil, Options{LegacyHeaders: true})
	r := f.ask(t, 0, desc("remote_address", "10.0.0.3"), desc("path", "/login"))
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	login := `"envoy/edge/path=%2Flogin"`
	for k, want := range map[string]string{
		"RateLimit-Policy":    `"envoy/edge/remote_address";q=10;w=3600, ` + login + `;q=1;w=3600`,
		"RateLimit":           `"envoy/edge/remote_address";r=9;t=360, ` + login + `;r=0;t=3600`,
		"RateLimit-Limit":     "1",
		"RateLimit-Remaining": "0",
		"RateLimit-Reset":     "3600",
	} {
		if got[k] != want {
			t.Errorf("%s: %q, want %q", k, got[k], want)
		}
	}
}

// failing is a store that cannot be reached.
type failing struct{ *memstore.Store }

func (failing) TakeAll(context.Context, []sluice.Request) (sluice.MultiDecision, error) {
	return sluice.MultiDecision{}, fmt.Errorf("%w: down", sluice.ErrUnavailable)
}

func (failing) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, fmt.Errorf("%w: down", sluice.ErrUnavailable)
}

func (failing) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, fmt.Errorf("%w: down", sluice.ErrUnavailable)
}

func TestDegraded(t *testing.T) {
	for _, mode := range []guard.FailureMode{guard.FailClosed, guard.FailOpen} {
		st, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		g, err := guard.New(failing{st}, guard.Options{FailureMode: mode, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		f := start(t, rulesYAML, g, Options{})
		resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("path", "/login")}})
		switch mode {
		case guard.FailClosed:
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("closed: %v, %v; want UNAVAILABLE", resp, err)
			}
		case guard.FailOpen:
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.RequestHeadersToAdd) != 1 || resp.RequestHeadersToAdd[0].Key != DegradedHeader {
				t.Fatalf("open: %v, %v; want OK with the %s request header", resp, err, DegradedHeader)
			}
		}
	}
}

// A denial that needs no store stands during an outage: only denials the
// failure mode made are UNAVAILABLE.
func TestDegradedBesideRealDenial(t *testing.T) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := guard.New(failing{st}, guard.Options{FailureMode: guard.FailOpen, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, rulesYAML, g, Options{})
	big := desc("path", "/login")
	big.HitsAddend = wrapperspb.UInt64(1000)
	for _, ds := range [][]*ratelimitv3.RateLimitDescriptor{
		{desc("blocked", "x"), desc("remote_address", "1.2.3.4")},
		{big, desc("remote_address", "1.2.3.4")},
	} {
		resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%v during an outage: %v, %v; want OVER_LIMIT", ds, resp, err)
		}
	}
}

func TestBadRequests(t *testing.T) {
	f := start(t, rulesYAML, nil, Options{})
	neg := desc("path", "/x")
	neg.IsNegativeHits = true
	for _, c := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("path", "/x")}}},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}},
		{"empty descriptor", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{neg}}},
	} {
		if _, err := f.client.ShouldRateLimit(context.Background(), c.req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v; want INVALID_ARGUMENT", c.name, err)
		}
	}
}
