package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// absent marks a header that must not be in the response.
const absent = "<absent>"

// step is one request of a scenario: move the clock, send a request with
// these headers, expect this status, these response headers and a body
// containing body.
type step struct {
	advance time.Duration
	header  map[string]string
	code    int
	fields  map[string]string
	body    string
}

func fields(kv ...string) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func hdr(kv ...string) map[string]string { return fields(kv...) }

func costFromHeader(r *http.Request) (int64, error) {
	s := r.Header.Get("X-Cost")
	if s == "" {
		return 1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// degraded marks every decision of the store under it as made by a failure
// policy, and can replace the decision outright.
type degraded struct {
	sluice.Store
	decision *sluice.Decision
}

func (s degraded) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if s.decision != nil {
		return *s.decision, nil
	}
	d, err := s.Store.Take(ctx, r)
	d.Degraded = true
	return d, err
}

// failing is a store whose every call fails with err.
type failing struct{ err error }

func (s failing) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func (s failing) Peek(context.Context, string, sluice.Limit) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func TestMiddleware(t *testing.T) {
	errDown := errors.New("dial tcp 10.1.1.1:6379: connection refused")
	tests := []struct {
		name    string
		opts    httplimit.Options
		memOpts memstore.Options
		wrap    func(sluice.Store) sluice.Store
		steps   []step
	}{
		{
			name: "burst, deny, refill",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 3, Rate: sluice.Per(1, 1500*time.Millisecond)}, Policy: "p"},
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", `"p";q=3;w=5`, "RateLimit", `"p";r=2;t=2`, "Retry-After", absent)},
				{code: 200, fields: fields("RateLimit", `"p";r=1;t=2`)},
				{code: 200, fields: fields("RateLimit", `"p";r=0;t=2`)},
				{code: 429, body: "quota-exceeded", fields: fields(
					"RateLimit-Policy", `"p";q=3;w=5`, "RateLimit", `"p";r=0;t=2`, "Retry-After", "2",
					"Content-Type", "application/problem+json")},
				// 0.5s left: Retry-After and t round up to 1.
				{advance: time.Second, code: 429, fields: fields("RateLimit", `"p";r=0;t=1`, "Retry-After", "1")},
				{advance: 500 * time.Millisecond, code: 200, fields: fields("RateLimit", `"p";r=0;t=2`)},
			},
		},
		{
			name: "retry-after is at least one second",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(10 * time.Millisecond)}},
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", `"default";q=1;w=1`, "RateLimit", `"default";r=0;t=1`)},
				{code: 429, fields: fields("Retry-After", "1", "RateLimit", `"default";r=0;t=1`)},
			},
		},
		{
			name: "never refills: no w, no t, no Retry-After",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(0)}},
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", `"default";q=2`, "RateLimit", `"default";r=1`)},
				{code: 200, fields: fields("RateLimit", `"default";r=0`)},
				{code: 429, body: "waiting will not help", fields: fields("RateLimit", `"default";r=0`, "Retry-After", absent)},
			},
		},
		{
			name: "cost",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}, Cost: costFromHeader},
			steps: []step{
				{header: hdr("X-Cost", "3"), code: 200, fields: fields("RateLimit", `"default";r=2;t=1`)},
				{header: hdr("X-Cost", "3"), code: 429, body: "the request costs 3 and 2 of 5 remain", fields: fields("Retry-After", "1")},
				// A cost above the capacity is a bug, not a denial, and takes nothing.
				{header: hdr("X-Cost", "6"), code: 500, fields: fields("RateLimit", absent, "Retry-After", absent)},
				{header: hdr("X-Cost", "x"), code: 500},
				{header: hdr("X-Cost", "2"), code: 200, fields: fields("RateLimit", `"default";r=0;t=1`)},
			},
		},
		{
			name: "tiers",
			opts: httplimit.Options{
				Key: httplimit.HeaderKey("X-User"),
				LimitFunc: func(r *http.Request) (sluice.Limit, error) {
					switch r.Header.Get("X-Plan") {
					case "pro":
						return sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}, nil
					case "free", "":
						return sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}, nil
					case "broken":
						return sluice.Limit{}, nil
					}
					return sluice.Limit{}, errors.New("no such plan")
				},
			},
			steps: []step{
				{header: hdr("X-User", "a"), code: 200, fields: fields("RateLimit-Policy", `"default";q=1;w=60`, "RateLimit", `"default";r=0;t=60`)},
				{header: hdr("X-User", "a"), code: 429, fields: fields("Retry-After", "60")},
				{header: hdr("X-User", "b", "X-Plan", "pro"), code: 200, fields: fields("RateLimit-Policy", `"default";q=100;w=10`, "RateLimit", `"default";r=99;t=1`)},
				{header: hdr("X-User", "b", "X-Plan", "broken"), code: 500},
				{header: hdr("X-User", "b", "X-Plan", "gold"), code: 500},
			},
		},
		{
			name: "keys: missing and too long",
			opts: httplimit.Options{Key: httplimit.HeaderKey("X-User"), Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}},
			steps: []step{
				{code: 400, body: "header X-User is missing or empty"},
				{header: hdr("X-User", strings.Repeat("u", sluice.MaxKeyLen)), code: 400, body: "invalid key"},
				{header: hdr("X-User", "u"), code: 200},
			},
		},
		{
			name: "request IDs",
			opts: httplimit.Options{
				Limit:           sluice.Limit{Capacity: 1, Rate: sluice.Per(1, 10*time.Second)},
				RequestIDHeader: "Idempotency-Key",
				Cost:            costFromHeader,
			},
			steps: []step{
				{header: hdr("Idempotency-Key", "a"), code: 200, fields: fields("RateLimit", `"default";r=0;t=10`)},
				{header: hdr("Idempotency-Key", "a"), code: 200},                            // a retry: not charged
				{header: hdr("Idempotency-Key", "b"), code: 429},                            // a new request
				{advance: 10 * time.Second, header: hdr("Idempotency-Key", "b"), code: 200}, // a retried denial is taken again
				// That take was made without the ID (the store still
				// remembers the denial under it), so a further retry is
				// charged again: over-charging, never a double pass.
				{header: hdr("Idempotency-Key", "b"), code: 429},
				{header: hdr("Idempotency-Key", "a", "X-Cost", "1"), code: 200},
				{header: hdr("Idempotency-Key", strings.Repeat("i", sluice.MaxRequestIDLen+1)), code: 400},
			},
		},
		{
			name: "request ID conflict",
			opts: httplimit.Options{
				Limit:           sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)},
				RequestIDHeader: "Idempotency-Key",
				Cost:            costFromHeader,
			},
			steps: []step{
				{header: hdr("Idempotency-Key", "a", "X-Cost", "2"), code: 200},
				{header: hdr("Idempotency-Key", "a", "X-Cost", "3"), code: 422, body: "request ID reused"},
			},
		},
		{
			name: "store error is 503, never a pass",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}},
			wrap: func(sluice.Store) sluice.Store { return failing{errDown} },
			steps: []step{
				{code: 503, fields: fields("RateLimit", absent, "Retry-After", absent), body: `"detail":"the rate limiter could not decide this request"`},
			},
		},
		{
			name:    "store full is 503",
			opts:    httplimit.Options{Key: httplimit.HeaderKey("X-User"), Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(0)}},
			memOpts: memstore.Options{MaxKeys: 1, Shards: 1},
			steps: []step{
				{header: hdr("X-User", "a"), code: 200},
				{header: hdr("X-User", "b"), code: 503},
			},
		},
		{
			name: "degraded allow passes, degraded deny is 503",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store { return degraded{Store: s} },
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", absent, "RateLimit", absent)},
				{code: 503, body: "temporary-reduced-capacity", fields: fields(
					"RateLimit-Policy", absent, "RateLimit", absent, "Retry-After", "60")},
			},
		},
		{
			name: "degraded deny without a limit or a wait",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store {
				return degraded{Store: s, decision: &sluice.Decision{RetryAfter: sluice.Never, Degraded: true}}
			},
			steps: []step{
				{code: 503, body: "temporary-reduced-capacity", fields: fields("RateLimit-Policy", absent, "RateLimit", absent, "Retry-After", absent)},
			},
		},
		{
			name: "degraded deny under a reduced limit shows it",
			opts: httplimit.Options{Limit: sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}},
			wrap: func(s sluice.Store) sluice.Store {
				return degraded{Store: s, decision: &sluice.Decision{
					RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second, Degraded: true,
					Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)},
				}}
			},
			steps: []step{
				{code: 503, fields: fields("RateLimit-Policy", `"default";q=10;w=10`, "RateLimit", absent, "Retry-After", "2")},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := sluicetest.NewClock(start)
			mo := tt.memOpts
			mo.Now = clock.Now
			mo.SweepInterval = -1
			mem := memstore.New(mo)
			defer mem.Close()
			var store sluice.Store = mem
			if tt.wrap != nil {
				store = tt.wrap(mem)
			}
			m, err := httplimit.New(store, tt.opts)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			var served int
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served++
				w.WriteHeader(http.StatusOK)
			}))
			for i, s := range tt.steps {
				clock.Advance(s.advance)
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				for k, v := range s.header {
					req.Header.Set(k, v)
				}
				rec := httptest.NewRecorder()
				before := served
				h.ServeHTTP(rec, req)
				if rec.Code != s.code {
					t.Fatalf("step %d: status = %d, want %d; body %s", i, rec.Code, s.code, rec.Body)
				}
				if got, want := served-before, btoi(s.code == 200); got != want {
					t.Errorf("step %d: next handler called %d times, want %d", i, got, want)
				}
				for k, want := range s.fields {
					got, ok := rec.Header()[http.CanonicalHeaderKey(k)]
					switch {
					case want == absent && ok:
						t.Errorf("step %d: %s = %q, want none", i, k, got)
					case want != absent && (len(got) != 1 || got[0] != want):
						t.Errorf("step %d: %s = %q, want %q", i, k, got, want)
					}
				}
				if !strings.Contains(rec.Body.String(), s.body) {
					t.Errorf("step %d: body = %s, want it to contain %q", i, rec.Body, s.body)
				}
				if s.code != 200 {
					var p map[string]any
					if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
						t.Errorf("step %d: body %s is not JSON: %v", i, rec.Body, err)
					} else if p["status"] != float64(s.code) {
						t.Errorf("step %d: body status = %v, want %d", i, p["status"], s.code)
					}
				}
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestErrorHandler(t *testing.T) {
	errDown := errors.New("connection refused")
	var got error
	m, err := httplimit.New(failing{errDown}, httplimit.Options{
		Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusTeapot)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusTeapot {
		t.Errorf("status = %d, want %d", rec.Code, http.StatusTeapot)
	}
	if !errors.Is(got, httplimit.ErrStore) || !errors.Is(got, errDown) {
		t.Errorf("ErrorHandler got %v, want it to wrap %v and %v", got, httplimit.ErrStore, errDown)
	}
}

// Two middlewares with different policies share a store without sharing
// buckets: the policy prefixes the key.
func TestPoliciesShareStore(t *testing.T) {
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	defer mem.Close()
	newHandler := func(policy string, capacity int64) http.Handler {
		m, err := httplimit.New(mem, httplimit.Options{
			Policy: policy, Limit: sluice.Limit{Capacity: capacity, Rate: sluice.PerSecond(0)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return m.Handler(http.NotFoundHandler())
	}
	login, api := newHandler("login", 1), newHandler("api", 3)
	for i, tc := range []struct {
		h    http.Handler
		want string
	}{
		{login, `"login";r=0`}, {api, `"api";r=2`}, {api, `"api";r=1`}, {login, `"login";r=0`},
	} {
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if got := rec.Header().Get("RateLimit"); got != tc.want {
			t.Errorf("request %d: RateLimit = %q, want %q", i, got, tc.want)
		}
	}
	if _, err := mem.Peek(context.Background(), "login:ip:192.0.2.1", sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}); err != nil {
		t.Errorf("Peek: %v", err)
	}
}

func TestNewInvalid(t *testing.T) {
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	defer mem.Close()
	ok := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	limitFunc := func(*http.Request) (sluice.Limit, error) { return ok, nil }
	tests := []struct {
		name  string
		store sluice.Store
		opts  httplimit.Options
		want  error
	}{
		{name: "no limit", store: mem, opts: httplimit.Options{}, want: sluice.ErrInvalidLimit},
		{name: "bad limit", store: mem, opts: httplimit.Options{Limit: sluice.Limit{Capacity: 1}}, want: sluice.ErrInvalidLimit},
		{name: "both limits", store: mem, opts: httplimit.Options{Limit: ok, LimitFunc: limitFunc}, want: httplimit.ErrInvalidOption},
		{name: "nil store", opts: httplimit.Options{Limit: ok}, want: httplimit.ErrInvalidOption},
		{name: "policy too long", store: mem, opts: httplimit.Options{Limit: ok, Policy: strings.Repeat("p", httplimit.MaxPolicyLen+1)}, want: httplimit.ErrInvalidOption},
		{name: "policy not printable", store: mem, opts: httplimit.Options{Limit: ok, Policy: "a\nb"}, want: httplimit.ErrInvalidOption},
		{name: "policy not ascii", store: mem, opts: httplimit.Options{Limit: ok, Policy: "größe"}, want: httplimit.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httplimit.New(tt.store, tt.opts)
			if !errors.Is(err, tt.want) {
				t.Errorf("New(%+v) error = %v, want %v", tt.opts, err, tt.want)
			}
		})
	}
}

// A policy name is written as a Structured Field String, quotes and
// backslashes escaped.
func TestPolicyQuoting(t *testing.T) {
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	defer mem.Close()
	m, err := httplimit.New(mem, httplimit.Options{Policy: `a "b" \c`, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.Handler(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if got, want := rec.Header().Get("RateLimit-Policy"), `"a \"b\" \\c";q=1;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
}

// Under concurrent load on one key, exactly the capacity is allowed and
// every other request is a 429: no store error, no pass-through.
func TestConcurrent(t *testing.T) {
	mem := memstore.New(memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	defer mem.Close()
	m, err := httplimit.New(mem, httplimit.Options{Limit: sluice.Limit{Capacity: 50, Rate: sluice.PerSecond(0)}})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
				mu.Lock()
				codes[rec.Code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if want := map[int]int{200: 50, 429: 150}; fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("status counts = %v, want %v", codes, want)
	}
}
