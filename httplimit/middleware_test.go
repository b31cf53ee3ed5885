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
	"sync/atomic"
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

func (s failing) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
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
			opts: httplimit.Options{Policy: "p", Limit: sluice.Limit{Capacity: 3, Rate: sluice.Per(1, 1500*time.Millisecond)}},
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
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(10 * time.Millisecond)}},
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", `"api";q=1;w=1`, "RateLimit", `"api";r=0;t=1`)},
				{code: 429, fields: fields("Retry-After", "1", "RateLimit", `"api";r=0;t=1`)},
			},
		},
		{
			name: "never refills: no w, no t, no Retry-After",
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(0)}},
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", `"api";q=2`, "RateLimit", `"api";r=1`)},
				{code: 200, fields: fields("RateLimit", `"api";r=0`)},
				{code: 429, body: "waiting will not help", fields: fields("RateLimit", `"api";r=0`, "Retry-After", absent)},
			},
		},
		{
			name: "cost",
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}, Cost: costFromHeader},
			steps: []step{
				{header: hdr("X-Cost", "3"), code: 200, fields: fields("RateLimit", `"api";r=2;t=1`)},
				{header: hdr("X-Cost", "3"), code: 429, body: "the request costs 3 and 2 of 5 remain", fields: fields("Retry-After", "1")},
				// A cost above the capacity is a bug, not a denial, and takes nothing.
				{header: hdr("X-Cost", "6"), code: 500, fields: fields("RateLimit", absent, "Retry-After", absent)},
				{header: hdr("X-Cost", "x"), code: 500},
				{header: hdr("X-Cost", "2"), code: 200, fields: fields("RateLimit", `"api";r=0;t=1`)},
			},
		},
		{
			name: "tiers",
			opts: httplimit.Options{
				Policy: "api",
				Key:    httplimit.HeaderKey("X-User"),
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
				{header: hdr("X-User", "a"), code: 200, fields: fields("RateLimit-Policy", `"api";q=1;w=60`, "RateLimit", `"api";r=0;t=60`)},
				{header: hdr("X-User", "a"), code: 429, fields: fields("Retry-After", "60")},
				{header: hdr("X-User", "b", "X-Plan", "pro"), code: 200, fields: fields("RateLimit-Policy", `"api";q=100;w=10`, "RateLimit", `"api";r=99;t=1`)},
				{header: hdr("X-User", "b", "X-Plan", "broken"), code: 500},
				{header: hdr("X-User", "b", "X-Plan", "gold"), code: 500},
			},
		},
		{
			// The key is the store key as it is: all of sluice.MaxKeyLen
			// is the caller's.
			name: "keys: the whole length bound is the key function's",
			opts: httplimit.Options{
				Policy: "api",
				Key:    func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
				Limit:  sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)},
			},
			steps: []step{
				{header: hdr("X-User", strings.Repeat("u", sluice.MaxKeyLen)), code: 200},
				{header: hdr("X-User", strings.Repeat("u", sluice.MaxKeyLen+1)), code: 400, body: "invalid key"},
			},
		},
		{
			name: "keys: missing and too long",
			opts: httplimit.Options{Policy: "api", Key: httplimit.HeaderKey("X-User"), Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}},
			steps: []step{
				{code: 400, body: "header X-User is missing or empty"},
				{header: hdr("X-User", strings.Repeat("u", sluice.MaxKeyLen)), code: 400, body: "invalid key"},
				{header: hdr("X-User", "u"), code: 200},
			},
		},
		{
			name: "request IDs",
			opts: httplimit.Options{
				Policy:          "api",
				Limit:           sluice.Limit{Capacity: 1, Rate: sluice.Per(1, 10*time.Second)},
				RequestIDHeader: "Idempotency-Key",
				Cost:            costFromHeader,
			},
			steps: []step{
				{header: hdr("Idempotency-Key", "a"), code: 200, fields: fields("RateLimit", `"api";r=0;t=10`)},
				{header: hdr("Idempotency-Key", "a"), code: 200}, // a retry: not charged
				{header: hdr("Idempotency-Key", "b"), code: 429}, // a new request
				// A denial is not remembered: its retry is decided afresh,
				// and the allowed decision is remembered from then on.
				{advance: 10 * time.Second, header: hdr("Idempotency-Key", "b"), code: 200, fields: fields("RateLimit", `"api";r=0;t=10`)},
				{header: hdr("Idempotency-Key", "b"), code: 200, fields: fields("RateLimit", `"api";r=0;t=10`)},
				{header: hdr("Idempotency-Key", "a", "X-Cost", "1"), code: 200},
				{header: hdr("Idempotency-Key", strings.Repeat("i", sluice.MaxRequestIDLen+1)), code: 400},
			},
		},
		{
			name: "request ID conflict",
			opts: httplimit.Options{
				Policy:          "api",
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
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}},
			wrap: func(sluice.Store) sluice.Store { return failing{errDown} },
			steps: []step{
				{code: 503, fields: fields("RateLimit", absent, "Retry-After", absent), body: `"detail":"the rate limiter could not decide this request"`},
			},
		},
		{
			name:    "store full is 503",
			opts:    httplimit.Options{Policy: "api", Key: httplimit.HeaderKey("X-User"), Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(0)}},
			memOpts: memstore.Options{MaxKeys: 1, Shards: 1},
			steps: []step{
				{header: hdr("X-User", "a"), code: 200},
				{header: hdr("X-User", "b"), code: 503},
			},
		},
		{
			name: "degraded allow passes, degraded deny is 503",
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store { return degraded{Store: s} },
			steps: []step{
				{code: 200, fields: fields("RateLimit-Policy", absent, "RateLimit", absent)},
				{code: 503, body: "temporary-reduced-capacity", fields: fields(
					"RateLimit-Policy", absent, "RateLimit", absent, "Retry-After", "60")},
			},
		},
		{
			name: "degraded deny without a limit or a wait",
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store {
				return degraded{Store: s, decision: &sluice.Decision{RetryAfter: sluice.Never, Degraded: true}}
			},
			steps: []step{
				{code: 503, body: "temporary-reduced-capacity", fields: fields("RateLimit-Policy", absent, "RateLimit", absent, "Retry-After", absent)},
			},
		},
		{
			name: "degraded deny under a reduced limit shows it",
			opts: httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}},
			wrap: func(s sluice.Store) sluice.Store {
				return degraded{Store: s, decision: &sluice.Decision{
					RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second, Degraded: true,
					Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)},
				}}
			},
			steps: []step{
				{code: 503, fields: fields("RateLimit-Policy", `"api";q=10;w=10`, "RateLimit", absent, "Retry-After", "2")},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := sluicetest.NewClock(start)
			mo := tt.memOpts
			mo.Now = clock.Now
			mo.SweepInterval = -1
			mem := newMem(t, mo)
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
		Policy: "api",
		Limit:  sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)},
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

// serve sends one GET request with these headers (and RemoteAddr
// 192.0.2.1, httptest's default) to h and returns the answer.
func serve(h http.Handler, path string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// A loose limit on /api (100/s) and a strict one on /login (5/h), on one
// store, for the same client keyed by its address. Only a policy of its own
// keeps the login quota apart: left at a shared default name, both
// middlewares would charge one bucket per client, and every API request
// would convert it back to the API's limit and refill it, so that no login
// attempt was ever denied. The policy name is therefore required.
func TestLoginAndAPIPolicies(t *testing.T) {
	apiLimit := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(100)}
	loginLimit := sluice.Limit{Capacity: 5, Rate: sluice.Per(5, time.Hour)}
	tests := []struct {
		name       string
		api, login string
		wantErr    error
	}{
		{name: "left at the zero policy", wantErr: sluice.ErrInvalidPolicy},
		{name: "a policy each", api: "api", login: "login"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := sluicetest.NewClock(start)
			mem := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
			apiMW, errAPI := httplimit.New(mem, httplimit.Options{Policy: tt.api, Limit: apiLimit})
			loginMW, errLogin := httplimit.New(mem, httplimit.Options{Policy: tt.login, Limit: loginLimit})
			for _, err := range []error{errAPI, errLogin} {
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("New error = %v, want %v", err, tt.wantErr)
				}
				if tt.wantErr == nil && err != nil {
					t.Fatalf("New: %v", err)
				}
			}
			if errAPI != nil || errLogin != nil {
				return
			}
			// Whatever New accepted must keep the login quota.
			mux := http.NewServeMux()
			ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
			mux.Handle("/api", apiMW.Handler(ok))
			mux.Handle("/login", loginMW.Handler(ok))
			apis, logins := map[int]int{}, map[int]int{}
			for range 60 {
				for range 10 {
					apis[serve(mux, "/api", nil).Code]++
				}
				logins[serve(mux, "/login", nil).Code]++
				clock.Advance(time.Second)
			}
			if want := map[int]int{200: 5, 429: 55}; fmt.Sprint(logins) != fmt.Sprint(want) {
				t.Errorf("60 login attempts in 60 s: status counts = %v, want %v", logins, want)
			}
			if want := map[int]int{200: 600}; fmt.Sprint(apis) != fmt.Sprint(want) {
				t.Errorf("600 API requests in 60 s: status counts = %v, want %v", apis, want)
			}
		})
	}
}

// Two middlewares with different policies on one store never share a
// bucket, whatever their keys: not for the same client address, and not
// when the policy and the key, joined with a colon, spell the same string.
func TestPoliciesNeverShare(t *testing.T) {
	fixed := func(key string) httplimit.KeyFunc {
		return func(*http.Request) (string, error) { return key, nil }
	}
	tests := []struct {
		name          string
		policyA, keyA string
		policyB, keyB string
		byAddress     bool
	}{
		{name: "same client address", policyA: "login", policyB: "api", byAddress: true},
		{name: "same key", policyA: "login", keyA: "user:7", policyB: "api", keyB: "user:7"},
		{name: "policy and key join to the same string", policyA: "a", keyA: "b:c", policyB: "a:b", keyB: "c"},
	}
	never := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := newMem(t, memstore.Options{SweepInterval: -1})
			newHandler := func(policy, key string) http.Handler {
				o := httplimit.Options{Policy: policy, Limit: never}
				if !tt.byAddress {
					o.Key = fixed(key)
				}
				m, err := httplimit.New(mem, o)
				if err != nil {
					t.Fatal(err)
				}
				return m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			}
			a, b := newHandler(tt.policyA, tt.keyA), newHandler(tt.policyB, tt.keyB)
			for i, h := range []http.Handler{a, b} {
				if rec := serve(h, "/", nil); rec.Code != http.StatusOK {
					t.Errorf("first request to middleware %d: status %d, want 200 (a bucket of its own); RateLimit %q",
						i, rec.Code, rec.Header().Get("RateLimit"))
				}
			}
			for i, h := range []http.Handler{a, b} {
				if rec := serve(h, "/", nil); rec.Code != http.StatusTooManyRequests {
					t.Errorf("second request to middleware %d: status %d, want 429", i, rec.Code)
				}
			}
		})
	}
}

// The store key is the key function's key as it is, under the policy: no
// prefix is added to it.
func TestStoreKeyIsTheKey(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	l := sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(0)}
	m, err := httplimit.New(mem, httplimit.Options{Policy: "login", Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	serve(m.Handler(http.NotFoundHandler()), "/", nil)
	d, err := mem.Peek(context.Background(), sluice.Request{Policy: "login", Key: "ip:192.0.2.1", Cost: 1, Limit: l})
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	if d.Remaining != 2 {
		t.Errorf("Peek(login, ip:192.0.2.1) = %+v, want 2 remaining (one request taken)", d)
	}
}

// counting passes every call to the store under it and counts the tokens
// that store charged: the cost of every allowed decision that is not a
// replay.
type counting struct {
	sluice.Store
	charged atomic.Int64
}

func (s *counting) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	d, err := s.Store.Take(ctx, r)
	if err == nil && d.Allowed && !d.Replayed {
		s.charged.Add(r.Cost)
	}
	return d, err
}

// A request denied and retried under one request ID is charged once, when
// it is allowed: its denials took nothing, and the retries after the
// allowed one replay it. (The middleware used to take a replayed denial
// again without the ID, so every later retry was charged anew.)
func TestDeniedRetriesChargedOnce(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := &counting{Store: newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})}
	m, err := httplimit.New(store, httplimit.Options{
		Policy:          "orders",
		Key:             httplimit.HeaderKey("X-User"),
		Limit:           sluice.Limit{Capacity: 3, Rate: sluice.Every(10 * time.Second)},
		RequestIDHeader: "Idempotency-Key",
	})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	user := hdr("X-User", "u")
	for range 3 {
		serve(h, "/", user) // empty the bucket
	}
	store.charged.Store(0)
	retry := hdr("X-User", "u", "Idempotency-Key", "order-1")
	steps := []step{
		{code: 429},                           // the request
		{code: 429}, {code: 429}, {code: 429}, // three retries while empty
		{advance: 30 * time.Second, code: 200, fields: fields("RateLimit", `"orders";r=2;t=10`)},
		{code: 200, fields: fields("RateLimit", `"orders";r=2;t=10`)}, // replays
		{code: 200, fields: fields("RateLimit", `"orders";r=2;t=10`)},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		rec := serve(h, "/", retry)
		if rec.Code != s.code {
			t.Errorf("attempt %d: status %d, want %d", i, rec.Code, s.code)
		}
		for k, want := range s.fields {
			if got := rec.Header().Get(k); got != want {
				t.Errorf("attempt %d: %s = %q, want %q", i, k, got, want)
			}
		}
	}
	if got := store.charged.Load(); got != 1 {
		t.Errorf("tokens charged for one request and its retries = %d, want 1", got)
	}
}

// bounded decides only limits whose period is at most maxPeriod, standing
// in for a store whose arithmetic is exact only in a range (the Redis
// store's): it refuses other limits at CheckLimit and on every request.
type bounded struct {
	sluice.Store
	maxPeriod time.Duration
}

func (s bounded) CheckLimit(l sluice.Limit) error {
	if l.Rate.Period > s.maxPeriod {
		return fmt.Errorf("%w: period %v is longer than %v, the longest this store decides exactly", sluice.ErrInvalidLimit, l.Rate.Period, s.maxPeriod)
	}
	return nil
}

func (s bounded) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.CheckLimit(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	return s.Store.Take(ctx, r)
}

// A fixed limit the store cannot decide fails New, rather than every
// request with a 500; a limit from LimitFunc is the store's to refuse, per
// request.
func TestNewChecksLimitWithStore(t *testing.T) {
	day := 24 * time.Hour
	store := bounded{Store: newMem(t, memstore.Options{SweepInterval: -1}), maxPeriod: 365 * day}
	tooLong := sluice.Limit{Capacity: 143, Rate: sluice.Every(366 * day)}
	fits := sluice.Limit{Capacity: 143, Rate: sluice.Every(365 * day)}

	if _, err := httplimit.New(store, httplimit.Options{Policy: "yearly", Limit: tooLong}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("New(Limit %v) error = %v, want %v", tooLong, err, sluice.ErrInvalidLimit)
	}
	m, err := httplimit.New(store, httplimit.Options{Policy: "yearly", Limit: fits})
	if err != nil {
		t.Fatalf("New(Limit %v): %v", fits, err)
	}
	if rec := serve(m.Handler(http.NotFoundHandler()), "/", nil); rec.Code != http.StatusNotFound {
		t.Errorf("Limit %v: status %d, want 404 from the handler", fits, rec.Code)
	}

	var got error
	m, err = httplimit.New(store, httplimit.Options{
		Policy:    "yearly",
		LimitFunc: func(*http.Request) (sluice.Limit, error) { return tooLong, nil },
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			httplimit.DefaultErrorHandler(w, r, err)
		},
	})
	if err != nil {
		t.Fatalf("New(LimitFunc): %v", err)
	}
	if rec := serve(m.Handler(http.NotFoundHandler()), "/", nil); rec.Code != http.StatusInternalServerError || !errors.Is(got, sluice.ErrInvalidLimit) {
		t.Errorf("LimitFunc %v: status %d, error %v; want 500 and %v", tooLong, rec.Code, got, sluice.ErrInvalidLimit)
	}
}

func TestNewInvalid(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	ok := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	limitFunc := func(*http.Request) (sluice.Limit, error) { return ok, nil }
	tests := []struct {
		name  string
		store sluice.Store
		opts  httplimit.Options
		want  error
	}{
		{name: "no limit", store: mem, opts: httplimit.Options{Policy: "p"}, want: sluice.ErrInvalidLimit},
		{name: "bad limit", store: mem, opts: httplimit.Options{Policy: "p", Limit: sluice.Limit{Capacity: 1}}, want: sluice.ErrInvalidLimit},
		{name: "both limits", store: mem, opts: httplimit.Options{Policy: "p", Limit: ok, LimitFunc: limitFunc}, want: sluice.ErrInvalidOption},
		{name: "nil store", opts: httplimit.Options{Policy: "p", Limit: ok}, want: sluice.ErrInvalidOption},
		{name: "no policy", store: mem, opts: httplimit.Options{Limit: ok}, want: sluice.ErrInvalidPolicy},
		{name: "no policy with LimitFunc", store: mem, opts: httplimit.Options{LimitFunc: limitFunc}, want: sluice.ErrInvalidPolicy},
		{name: "policy too long", store: mem, opts: httplimit.Options{Limit: ok, Policy: strings.Repeat("p", sluice.MaxPolicyLen+1)}, want: sluice.ErrInvalidPolicy},
		{name: "policy with a space", store: mem, opts: httplimit.Options{Limit: ok, Policy: "per key"}, want: sluice.ErrInvalidPolicy},
		{name: "policy not printable", store: mem, opts: httplimit.Options{Limit: ok, Policy: "a\nb"}, want: sluice.ErrInvalidPolicy},
		{name: "policy not ascii", store: mem, opts: httplimit.Options{Limit: ok, Policy: "größe"}, want: sluice.ErrInvalidPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httplimit.New(tt.store, tt.opts)
			if !errors.Is(err, tt.want) {
				t.Errorf("New(%+v) error = %v, want %v", tt.opts, err, tt.want)
			}
		})
	}
	for _, o := range []httplimit.Options{
		{Policy: strings.Repeat("p", sluice.MaxPolicyLen), Limit: ok},
		{Policy: "p", LimitFunc: limitFunc},
	} {
		if _, err := httplimit.New(mem, o); err != nil {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
}

// A policy name is written as a Structured Field String, quotes and
// backslashes escaped.
func TestPolicyQuoting(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	m, err := httplimit.New(mem, httplimit.Options{Policy: `a"b"\c`, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}})
	if err != nil {
		t.Fatal(err)
	}
	rec := serve(m.Handler(http.NotFoundHandler()), "/", nil)
	if got, want := rec.Header().Get("RateLimit-Policy"), `"a\"b\"\\c";q=1;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
	if got, want := rec.Header().Get("RateLimit"), `"a\"b\"\\c";r=0;t=1`; got != want {
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
}

// Under concurrent load on one key, exactly the capacity is allowed and
// every other request is a 429: no store error, no pass-through.
func TestConcurrent(t *testing.T) {
	mem := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	m, err := httplimit.New(mem, httplimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 50, Rate: sluice.PerSecond(0)}})
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
				rec := serve(h, "/", nil)
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
