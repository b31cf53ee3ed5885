package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var (
	perMinute = sluice.Limit{Capacity: 2, Rate: sluice.Per(2, time.Minute)}
	once      = sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}
)

// newAPI returns a test server for the API over a memstore on a frozen
// clock, with policies "api" (2 per minute), "once" (never refills) and
// "trial" (shadow, 2 per minute).
func newAPI(t *testing.T, o Options) *httptest.Server {
	t.Helper()
	clock := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newAPIOn(t, st, o)
}

func newAPIOn(t *testing.T, st sluice.Store, o Options) *httptest.Server {
	t.Helper()
	table, err := service.NewTable(st, "v1", []service.Policy{
		{Name: "api", Limit: perMinute},
		{Name: "once", Limit: once},
		{Name: "trial", Limit: perMinute, Shadow: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(st, table, service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(core, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
}

func call(t *testing.T, srv *httptest.Server, method, path, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header}
	if ct := resp.Header.Get("Content-Type"); strings.Contains(ct, "json") {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", method, path, raw, err)
		}
	}
	return a
}

func TestTake(t *testing.T) {
	srv := newAPI(t, Options{})
	take := func(body string) answer { return call(t, srv, "POST", "/v1/take", body) }

	a := take(`{"policy":"api","key":"u1"}`)
	want := map[string]any{
		"allowed": true, "remaining": 1.0, "retry_after_ms": 0.0, "reset_after_ms": 30000.0, "never": false,
		"policy": "api", "limit": "2 2/m", "replayed": false, "degraded": false,
	}
	if a.status != http.StatusOK || !cmp.Equal(a.body, want) {
		t.Fatalf("first take = %d %v, want 200 %v", a.status, a.body, want)
	}
	if got := a.header.Get("RateLimit-Policy"); got != `"api";q=2;w=60` {
		t.Errorf("RateLimit-Policy = %q, want %q", got, `"api";q=2;w=60`)
	}
	// A denial is a 200 too: the decision is the answer.
	a = take(`{"policy":"api","key":"u1","cost":2}`)
	if a.status != http.StatusOK || a.body["allowed"] != false || a.body["retry_after_ms"] != 30000.0 {
		t.Fatalf("take of 2 with 1 left = %d %v, want 200, denied, retry_after_ms 30000", a.status, a.body)
	}
	if got := a.header.Get("Retry-After"); got != "30" {
		t.Errorf("Retry-After = %q, want 30", got)
	}
	// Never: null wait and never true.
	take(`{"policy":"once","key":"u1"}`)
	a = take(`{"policy":"once","key":"u1"}`)
	if a.body["never"] != true || a.body["retry_after_ms"] != nil || a.body["reset_after_ms"] != nil {
		t.Fatalf("a denial that no wait cures = %v, want never true and null waits", a.body)
	}
	// Request IDs: an allowed take is replayed, nothing charged again.
	a = take(`{"policy":"api","key":"u2","request_id":"r1"}`)
	b := take(`{"policy":"api","key":"u2","request_id":"r1"}`)
	if b.body["replayed"] != true || b.body["remaining"] != a.body["remaining"] {
		t.Fatalf("retry with the same request ID = %v, want the first decision %v replayed", b.body, a.body)
	}
	if c := take(`{"policy":"api","key":"u2","request_id":"r1","cost":2}`); c.status != http.StatusConflict || c.body["field"] != "request_id" {
		t.Fatalf("same request ID with another cost = %d %v, want 409 naming request_id", c.status, c.body)
	}
}

func TestShadow(t *testing.T) {
	srv := newAPI(t, Options{})
	for i := range 3 {
		a := call(t, srv, "POST", "/v1/take", `{"policy":"trial","key":"k"}`)
		if a.status != http.StatusOK || a.body["allowed"] != true {
			t.Fatalf("shadow take %d = %d %v, want 200 allowed", i, a.status, a.body)
		}
		if shadowDenied := a.body["shadow_denied"] == true; shadowDenied != (i == 2) {
			t.Fatalf("shadow take %d: shadow_denied = %v, want %v", i, shadowDenied, i == 2)
		}
	}
}

func TestErrors(t *testing.T) {
	srv := newAPI(t, Options{})
	tests := []struct {
		name, path, body string
		status           int
		field            string
	}{
		{"not JSON", "/v1/take", `{"policy":`, 400, ""},
		{"unknown field", "/v1/take", `{"policy":"api","key":"k","costs":1}`, 400, ""},
		{"trailing data", "/v1/take", `{"policy":"api","key":"k"} {}`, 400, ""},
		{"cost of the wrong type", "/v1/take", `{"policy":"api","key":"k","cost":"1"}`, 400, "cost"},
		{"no policy", "/v1/take", `{"key":"k"}`, 400, "policy"},
		{"no key", "/v1/take", `{"policy":"api"}`, 400, "key"},
		{"cost 0", "/v1/take", `{"policy":"api","key":"k","cost":0}`, 400, "cost"},
		{"cost above capacity", "/v1/take", `{"policy":"api","key":"k","cost":3}`, 400, "cost"},
		{"key too long", "/v1/take", fmt.Sprintf(`{"policy":"api","key":%q}`, strings.Repeat("k", 513)), 400, "key"},
		{"unknown policy", "/v1/take", `{"policy":"nope","key":"k"}`, 404, "policy"},
		{"peek with a request ID", "/v1/peek", `{"policy":"api","key":"k","request_id":"r"}`, 400, "request_id"},
		{"body too large", "/v1/take", `{"policy":"api","key":"` + strings.Repeat("k", DefaultMaxBodyBytes) + `"}`, 413, ""},
		{"empty batch", "/v1/take:batch", `{"requests":[]}`, 400, "requests"},
		{"no such endpoint", "/v1/nope", `{}`, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := call(t, srv, "POST", tt.path, tt.body)
			if a.status != tt.status {
				t.Fatalf("POST %s %.60s = %d %v, want %d", tt.path, tt.body, a.status, a.body, tt.status)
			}
			if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q, want application/problem+json", ct)
			}
			if tt.field != "" && a.body["field"] != tt.field {
				t.Errorf("problem %v does not name the field %q", a.body, tt.field)
			}
		})
	}
	if a := call(t, srv, "GET", "/v1/take", ""); a.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/take = %d, want 405", a.status)
	}
}

func TestPeek(t *testing.T) {
	srv := newAPI(t, Options{})
	call(t, srv, "POST", "/v1/take", `{"policy":"api","key":"k"}`)
	for range 2 {
		a := call(t, srv, "POST", "/v1/peek", `{"policy":"api","key":"k","cost":2}`)
		if a.status != 200 || a.body["allowed"] != false || a.body["remaining"] != 1.0 || a.body["retry_after_ms"] != 30000.0 {
			t.Fatalf("peek of 2 with 1 left = %d %v, want denied, 1 remaining, 30000 ms", a.status, a.body)
		}
	}
}

func TestBatch(t *testing.T) {
	srv := newAPI(t, Options{})
	a := call(t, srv, "POST", "/v1/take:batch", `{"requests":[
		{"policy":"api","key":"b"},
		{"policy":"nope","key":"b"},
		{"policy":"api","key":"b","cost":2},
		{"policy":"api","key":"b"},
		{"policy":"api"}
	]}`)
	if a.status != 200 {
		t.Fatalf("batch = %d %v, want 200", a.status, a.body)
	}
	results, _ := a.body["results"].([]any)
	if len(results) != 5 {
		t.Fatalf("batch results = %v, want 5", a.body)
	}
	get := func(i int) map[string]any { return results[i].(map[string]any) }
	if get(0)["allowed"] != true || get(2)["allowed"] != false || get(3)["allowed"] != true {
		t.Errorf("batch decisions in order = %v, want allowed, -, denied, allowed", results)
	}
	for i, status := range map[int]float64{1: 404, 4: 400} {
		p, _ := get(i)["error"].(map[string]any)
		if p == nil || p["status"] != status || p["type"] != "about:blank" {
			t.Errorf("batch item %d = %v, want an error with status %v and type about:blank", i, get(i), status)
		}
	}
	if p := get(4)["error"].(map[string]any); p["field"] != "requests[4].key" {
		t.Errorf("batch item 4 names field %v, want requests[4].key", p["field"])
	}
	big := `{"requests":[` + strings.Repeat(`{"policy":"api","key":"b"},`, DefaultMaxBatch) + `{"policy":"api","key":"b"}]}`
	if a := call(t, srv, "POST", "/v1/take:batch", big); a.status != 400 {
		t.Errorf("batch of %d = %d, want 400", DefaultMaxBatch+1, a.status)
	}
}

func TestAuth(t *testing.T) {
	srv := newAPI(t, Options{Tokens: []string{"s3cret", "other"}})
	body := `{"policy":"api","key":"k"}`
	for _, tt := range []struct {
		header string
		status int
	}{
		{"", 401},
		{"Bearer", 401},
		{"Bearer ", 401},
		{"Bearer s3cre", 401},
		{"Bearer s3cret!", 401},
		{"Basic s3cret", 401},
		{"Bearer s3cret", 200},
		{"Bearer other", 200},
	} {
		a := call(t, srv, "POST", "/v1/take", body, "Authorization", tt.header)
		if a.status != tt.status {
			t.Errorf("Authorization %q: %d, want %d", tt.header, a.status, tt.status)
		}
		if tt.status == 401 && a.header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: 401 without WWW-Authenticate", tt.header)
		}
	}
	// Health is open: a load balancer has no token.
	if a := call(t, srv, "GET", "/healthz", ""); a.status != 200 {
		t.Errorf("GET /healthz without a token = %d, want 200", a.status)
	}
}

// downStore fails every call as a shared store that cannot be reached.
type downStore struct{}

func (downStore) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, fmt.Errorf("test: %w", sluice.ErrUnavailable)
}

func (downStore) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, fmt.Errorf("test: %w", sluice.ErrUnavailable)
}

func TestDegraded(t *testing.T) {
	closed, err := guard.New(downStore{}, guard.Options{FailureMode: guard.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	srv := newAPIOn(t, closed, Options{})
	a := call(t, srv, "POST", "/v1/take", `{"policy":"api","key":"k"}`)
	if a.status != http.StatusServiceUnavailable || a.body["type"] != problemReducedCapacity {
		t.Fatalf("degraded denial = %d %v, want 503 %s (never 429)", a.status, a.body, problemReducedCapacity)
	}
	if a.header.Get("RateLimit") != "" {
		t.Errorf("degraded answer carries RateLimit %q; the store's level is unknown", a.header.Get("RateLimit"))
	}

	open, err := guard.New(downStore{}, guard.Options{FailureMode: guard.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	srv = newAPIOn(t, open, Options{})
	a = call(t, srv, "POST", "/v1/take", `{"policy":"api","key":"k"}`)
	if a.status != http.StatusOK || a.body["allowed"] != true || a.body["degraded"] != true {
		t.Fatalf("degraded allow = %d %v, want 200, allowed and degraded", a.status, a.body)
	}

	srv = newAPIOn(t, downStore{}, Options{})
	if a := call(t, srv, "POST", "/v1/take", `{"policy":"api","key":"k"}`); a.status != http.StatusServiceUnavailable {
		t.Fatalf("unguarded store error = %d %v, want 503", a.status, a.body)
	}
}

func TestStatusAndReady(t *testing.T) {
	notReady := fmt.Errorf("store not reachable")
	ready := error(nil)
	srv := newAPI(t, Options{Ready: func(context.Context) error { return ready }})
	a := call(t, srv, "GET", "/v1/status", "")
	want := map[string]any{"version": "v1", "policies": []any{
		map[string]any{"name": "api", "limit": "2 2/m", "shadow": false},
		map[string]any{"name": "once", "limit": "1 0/s", "shadow": false},
		map[string]any{"name": "trial", "limit": "2 2/m", "shadow": true},
	}}
	if a.status != 200 || !cmp.Equal(a.body, want) {
		t.Fatalf("GET /v1/status = %d %v, want %v", a.status, a.body, want)
	}
	if a := call(t, srv, "GET", "/readyz", ""); a.status != 200 {
		t.Errorf("GET /readyz = %d, want 200", a.status)
	}
	ready = notReady
	if a := call(t, srv, "GET", "/readyz", ""); a.status != 503 {
		t.Errorf("GET /readyz while not ready = %d, want 503", a.status)
	}
}

func TestNewInvalid(t *testing.T) {
	st, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	table, _ := service.NewTable(st, "v", nil)
	core, _ := service.New(st, table, service.Hooks{})
	for _, o := range []Options{{MaxBodyBytes: -1}, {MaxBatch: -1}, {Tokens: []string{""}}} {
		if _, err := New(core, o); err == nil {
			t.Errorf("New(%+v) = nil error, want one wrapping ErrInvalidOption", o)
		}
	}
}
