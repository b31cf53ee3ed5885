package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var (
	burstLimit = sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	dailyLimit = sluice.Limit{Capacity: 3, Rate: sluice.Per(3, 24*time.Hour)} // a token every 8 hours
)

// A burst limit and a daily quota on one route. Stacked as two
// middlewares, the outer (burst) one charged every request the inner
// (daily) one then denied, and once its bucket was empty it answered
// Retry-After: 1 while the daily quota stayed exhausted for 8 hours; each
// answer reported one policy. Decided together (Options.Limits), a denied
// request is charged to no bucket, Retry-After is the daily quota's wait,
// and both policies are reported, one list item each.
func TestSeveralLimits(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
	m, err := httplimit.New(store, httplimit.Options{
		Key: httplimit.HeaderKey("X-User"),
		Limits: []httplimit.Limit{
			{Policy: "burst", Limit: burstLimit},
			{Policy: "daily", Limit: dailyLimit},
		},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	user := hdr("X-User", "u")
	policy := `"burst";q=5;w=5, "daily";q=3;w=86400`
	steps := []step{
		{code: 200, fields: fields("RateLimit-Policy", policy, "RateLimit", `"burst";r=4;t=1, "daily";r=2;t=28800`, "Retry-After", absent)},
		{code: 200, fields: fields("RateLimit", `"burst";r=3;t=1, "daily";r=1;t=28800`)},
		{code: 200, fields: fields("RateLimit", `"burst";r=2;t=1, "daily";r=0;t=28800`)},
		// The daily quota is exhausted for 8 hours: every denial says so,
		// and the burst bucket, charged nothing, refills.
		{code: 429, body: `"violated-policies":["daily"]`, fields: fields(
			"RateLimit-Policy", policy, "RateLimit", `"burst";r=2;t=1, "daily";r=0;t=28800`, "Retry-After", "28800")},
		{advance: time.Second, code: 429, fields: fields("RateLimit", `"burst";r=3;t=1, "daily";r=0;t=28799`, "Retry-After", "28799")},
		{advance: time.Second, code: 429, fields: fields("RateLimit", `"burst";r=4;t=1, "daily";r=0;t=28798`, "Retry-After", "28798")},
		{advance: time.Second, code: 429, fields: fields("RateLimit", `"burst";r=5;t=1, "daily";r=0;t=28797`, "Retry-After", "28797")},
		{advance: time.Second, code: 429, fields: fields("RateLimit", `"burst";r=5;t=1, "daily";r=0;t=28796`, "Retry-After", "28796")},
		{advance: 8*time.Hour - 4*time.Second, code: 200, fields: fields("RateLimit", `"burst";r=4;t=1, "daily";r=0;t=28800`)},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		rec := serve(h, "/", user)
		checkStep(t, i, s, rec.Code, rec.Header(), rec.Body.String())
	}
	ctx := context.Background()
	p, err := store.Peek(ctx, sluice.Request{Policy: "burst", Key: "X-User:u", Cost: 1, Limit: burstLimit})
	if err != nil {
		t.Fatal(err)
	}
	if p.Remaining != 4 {
		t.Errorf("burst bucket: %d remaining, want 4 (charged by the four allowed requests only)", p.Remaining)
	}
}

// checkStep compares one answer with step s.
func checkStep(t *testing.T, i int, s step, code int, h http.Header, body string) {
	t.Helper()
	if code != s.code {
		t.Fatalf("step %d: status = %d, want %d; body %s", i, code, s.code, body)
	}
	for k, want := range s.fields {
		got, ok := h[http.CanonicalHeaderKey(k)]
		switch {
		case want == absent && ok:
			t.Errorf("step %d: %s = %q, want none", i, k, got)
		case want != absent && (len(got) != 1 || got[0] != want):
			t.Errorf("step %d: %s = %q, want %q", i, k, got, want)
		}
	}
	if s.body != "" && !json.Valid([]byte(body)) {
		t.Errorf("step %d: body %s is not JSON", i, body)
	}
	if !strings.Contains(body, s.body) {
		t.Errorf("step %d: body = %s, want it to contain %s", i, body, s.body)
	}
}

// The denied handler writes the application's own answer, with the fields
// already set and the decision given to it and in the request's context.
func TestDeniedHandler(t *testing.T) {
	clock := sluicetest.NewClock(start)
	var got httplimit.Decision
	var inContext bool
	m, err := httplimit.New(newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1}), httplimit.Options{
		Key:    httplimit.HeaderKey("X-User"),
		Limits: []httplimit.Limit{{Policy: "burst", Limit: burstLimit}, {Policy: "daily", Limit: dailyLimit}},
		DeniedHandler: func(w http.ResponseWriter, r *http.Request, d httplimit.Decision) {
			got = d
			_, inContext = httplimit.FromContext(r.Context())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, `{"error":"slow down","policy":%q}`, d.Requests[d.Denied].Policy)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.NotFoundHandler())
	for range 3 {
		serve(h, "/", hdr("X-User", "u"))
	}
	rec := serve(h, "/", hdr("X-User", "u"))
	if rec.Code != http.StatusTooManyRequests || rec.Body.String() != `{"error":"slow down","policy":"daily"}` {
		t.Errorf("denied: %d %s, want the handler's own 429", rec.Code, rec.Body)
	}
	if got := rec.Header().Get("Retry-After"); got != "28800" {
		t.Errorf("Retry-After = %q, want 28800, set before the handler", got)
	}
	if got.Allowed || got.Denied != 1 || got.RetryAfter != 8*time.Hour || len(got.Parts) != 2 || !got.Parts[0].Allowed || got.Parts[1].Allowed || !inContext {
		t.Errorf("handler got %+v (in context: %v), want daily's denial of both parts", got, inContext)
	}
}

// Skipped requests are not decided: nothing charged, no fields, no
// decision in the context.
func TestSkip(t *testing.T) {
	store := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	l := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}
	m, err := httplimit.New(store, httplimit.Options{
		Policy: "api",
		Limit:  l,
		Skip:   func(r *http.Request) bool { return r.URL.Path == "/healthz" },
	})
	if err != nil {
		t.Fatal(err)
	}
	var decided []bool
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := httplimit.FromContext(r.Context())
		decided = append(decided, ok)
	}))
	for range 3 {
		if rec := serve(h, "/healthz", nil); rec.Code != 200 || rec.Header().Get("RateLimit") != "" {
			t.Errorf("/healthz: %d, RateLimit %q; want 200 without fields", rec.Code, rec.Header().Get("RateLimit"))
		}
	}
	if rec := serve(h, "/api", nil); rec.Code != 200 || rec.Header().Get("RateLimit") != `"api";r=0` {
		t.Errorf("/api: %d, RateLimit %q; want 200 with the whole bucket left to it", rec.Code, rec.Header().Get("RateLimit"))
	}
	if want := []bool{false, false, false, true}; fmt.Sprint(decided) != fmt.Sprint(want) {
		t.Errorf("decision in the context: %v, want %v", decided, want)
	}
}

// The next handler finds the decision in its request's context.
func TestFromContext(t *testing.T) {
	if _, ok := httplimit.FromContext(context.Background()); ok {
		t.Error("FromContext(Background) found a decision")
	}
	store := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	m, err := httplimit.New(store, httplimit.Options{
		Key: httplimit.HeaderKey("X-User"),
		Limits: []httplimit.Limit{
			{Policy: "per-user", Limit: burstLimit},
			{Policy: "per-tenant", Limit: dailyLimit, Key: httplimit.HeaderKey("X-Tenant")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got httplimit.Decision
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = httplimit.FromContext(r.Context())
	}))
	serve(h, "/", hdr("X-User", "u", "X-Tenant", "t"))
	want := []sluice.Request{
		{Policy: "per-user", Key: "X-User:u", Cost: 1, Limit: burstLimit},
		{Policy: "per-tenant", Key: "X-Tenant:t", Cost: 1, Limit: dailyLimit},
	}
	if diff := cmp.Diff(want, got.Requests); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
	if !got.Allowed || got.Denied != -1 || len(got.Parts) != 2 || got.Parts[0].Remaining != 4 || got.Parts[1].Remaining != 2 {
		t.Errorf("decision %+v, want both parts allowed, 4 and 2 remaining", got.MultiDecision)
	}
	// A tenant key missing: no decision, 400, nothing charged.
	if rec := serve(h, "/", hdr("X-User", "u")); rec.Code != http.StatusBadRequest {
		t.Errorf("without X-Tenant: %d, want 400", rec.Code)
	}
	if rec := serve(h, "/", hdr("X-User", "u", "X-Tenant", "t")); rec.Header().Get("RateLimit") != `"per-user";r=3;t=1, "per-tenant";r=1;t=28800` {
		t.Errorf("RateLimit = %q after a request without a tenant key, want it charged nothing", rec.Header().Get("RateLimit"))
	}
}

func TestLegacyHeaders(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
	m, err := httplimit.New(store, httplimit.Options{
		Key:           httplimit.HeaderKey("X-User"),
		Limits:        []httplimit.Limit{{Policy: "burst", Limit: burstLimit}, {Policy: "daily", Limit: dailyLimit}},
		LegacyHeaders: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	legacy := func(limit, remaining, reset string) map[string]string {
		return fields("X-RateLimit-Limit", limit, "X-RateLimit-Remaining", remaining, "X-RateLimit-Reset", reset)
	}
	// The limit with the fewest tokens left is reported: daily (2 of 3,
	// full in 8 hours) before burst (4 of 5).
	steps := []step{
		{code: 200, fields: legacy("3", "2", "28800")},
		{code: 200, fields: legacy("3", "1", "57600")},
		{code: 200, fields: legacy("3", "0", "86400")},
		{code: 429, fields: legacy("3", "0", "86400")},
	}
	for i, s := range steps {
		rec := serve(h, "/", hdr("X-User", "u"))
		checkStep(t, i, s, rec.Code, rec.Header(), rec.Body.String())
	}
	if got := serve(h, "/", hdr("X-User", "u")).Header().Get("RateLimit"); got == "" {
		t.Error("with LegacyHeaders, RateLimit is missing: the legacy fields come beside the draft's")
	}

	// One limit that never refills: no reset.
	m, err = httplimit.New(store, httplimit.Options{Policy: "once", Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(0)}, LegacyHeaders: true})
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(m.Handler(http.NotFoundHandler()), "/", nil)
	checkStep(t, 0, step{code: 404, fields: legacy("2", "1", absent)}, rec.Code, rec.Header(), "")

	// Degraded: no legacy fields, as no RateLimit.
	m, err = httplimit.New(degraded{Store: store}, httplimit.Options{Policy: "api", Limit: burstLimit, LegacyHeaders: true})
	if err != nil {
		t.Fatal(err)
	}
	rec = serve(m.Handler(http.NotFoundHandler()), "/", nil)
	checkStep(t, 0, step{code: 404, fields: legacy(absent, absent, absent)}, rec.Code, rec.Header(), "")
}

// degradedAll answers every multi-take as a failure policy failing closed
// does: every part denied and degraded.
type degradedAll struct{ *memstore.Store }

func (s degradedAll) TakeAll(_ context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	md := sluice.MultiDecision{Degraded: true, Parts: make([]sluice.Decision, len(rs))}
	for i := range md.Parts {
		md.Parts[i] = sluice.Decision{RetryAfter: 5 * time.Second, Degraded: true}
	}
	md.Combine()
	return md, nil
}

func TestSeveralLimitsDegraded(t *testing.T) {
	store := degradedAll{newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})}
	m, err := httplimit.New(store, httplimit.Options{
		Limits: []httplimit.Limit{{Policy: "burst", Limit: burstLimit}, {Policy: "daily", Limit: dailyLimit}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(m.Handler(http.NotFoundHandler()), "/", nil)
	checkStep(t, 0, step{
		code: http.StatusServiceUnavailable,
		body: `"violated-policies":["burst","daily"]`,
		fields: fields("Retry-After", "5", "RateLimit", absent, "RateLimit-Policy", absent,
			"Content-Type", "application/problem+json"),
	}, rec.Code, rec.Header(), rec.Body.String())
	if !strings.Contains(rec.Body.String(), "temporary-reduced-capacity") {
		t.Errorf("body %s, want the temporary-reduced-capacity type", rec.Body)
	}
}

func TestNewInvalidLimits(t *testing.T) {
	store := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	two := []httplimit.Limit{{Policy: "a", Limit: burstLimit}, {Policy: "b", Limit: dailyLimit}}
	many := make([]httplimit.Limit, sluice.MaxParts+1)
	for i := range many {
		many[i] = httplimit.Limit{Policy: fmt.Sprintf("p%d", i), Limit: burstLimit}
	}
	tests := []struct {
		name  string
		store sluice.Store
		opts  httplimit.Options
		want  error
		msg   string
	}{
		{name: "Policy and Limits", store: store, opts: httplimit.Options{Policy: "a", Limits: two}, want: sluice.ErrInvalidOption},
		{name: "Limit and Limits", store: store, opts: httplimit.Options{Limit: burstLimit, Limits: two}, want: sluice.ErrInvalidOption},
		{name: "a store that is not a sluice.Operator", store: plain{store}, opts: httplimit.Options{Limits: two}, want: sluice.ErrInvalidOption, msg: "sluice.Operator"},
		{name: "a request ID header", store: store, opts: httplimit.Options{Limits: two, RequestIDHeader: "Idempotency-Key"}, want: sluice.ErrInvalidOption, msg: "Options.RequestIDHeader"},
		{name: "too many", store: store, opts: httplimit.Options{Limits: many}, want: sluice.ErrInvalidOption, msg: "more than 16"},
		{name: "one policy twice", store: store, opts: httplimit.Options{Limits: []httplimit.Limit{{Policy: "a", Limit: burstLimit}, {Policy: "a", Limit: dailyLimit}}}, want: sluice.ErrInvalidOption},
		{name: "no policy", store: store, opts: httplimit.Options{Limits: []httplimit.Limit{{Policy: "a", Limit: burstLimit}, {Limit: dailyLimit}}}, want: sluice.ErrInvalidPolicy, msg: "Options.Limits[1].Policy"},
		{name: "no limit", store: store, opts: httplimit.Options{Limits: []httplimit.Limit{{Policy: "a"}}}, want: sluice.ErrInvalidLimit, msg: "Options.Limits[0].Limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httplimit.New(tt.store, tt.opts)
			if !errors.Is(err, tt.want) || !strings.Contains(fmt.Sprint(err), tt.msg) {
				t.Errorf("New error = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
		})
	}
	// One limit in Limits works on any store, with a request ID.
	if _, err := httplimit.New(plain{store}, httplimit.Options{Limits: two[:1], RequestIDHeader: "Idempotency-Key"}); err != nil {
		t.Errorf("New(one limit in Limits): %v", err)
	}
}

// plain is a sluice.Store that is not a sluice.Operator.
type plain struct{ sluice.Store }

// Under concurrent load on two buckets, exactly the smaller one's capacity
// is allowed: a request the per-tenant limit denies is not charged to the
// per-user one, or the per-user allowance would be used up too.
func TestSeveralLimitsConcurrent(t *testing.T) {
	store := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	never := func(c int64) sluice.Limit { return sluice.Limit{Capacity: c, Rate: sluice.PerSecond(0)} }
	m, err := httplimit.New(store, httplimit.Options{
		Limits: []httplimit.Limit{{Policy: "user", Limit: never(1000)}, {Policy: "tenant", Limit: never(300)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				rec := serve(h, "/", nil)
				mu.Lock()
				codes[rec.Code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if want := map[int]int{200: 300, 429: 100}; fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("status counts = %v, want %v", codes, want)
	}
	p, err := store.Peek(context.Background(), sluice.Request{Policy: "user", Key: "ip:192.0.2.1", Cost: 1, Limit: never(1000)})
	if err != nil {
		t.Fatal(err)
	}
	if p.Remaining != 700 {
		t.Errorf("per-user bucket: %d remaining, want 700 (charged only for the 300 allowed)", p.Remaining)
	}
}
