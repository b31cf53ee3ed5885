package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
)

// Two requests per API key at once, one more every two seconds: two
// answers 200, then a 429 with Retry-After and the RateLimit fields, and a
// 200 again once a token has been refilled.
func Example() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a clock the example controls
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	m, err := httplimit.New(store, httplimit.Options{
		Policy: "per-key",
		Key:    httplimit.HeaderKey("X-Api-Key"),
		Limit:  sluice.Limit{Capacity: 2, Rate: sluice.Per(1, 2*time.Second)},
	})
	if err != nil {
		panic(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	get := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Api-Key", "k-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
		return rec
	}
	get()
	get()
	rec := get()
	fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
	fmt.Println("Retry-After:", rec.Header().Get("Retry-After"))
	fmt.Println("Content-Type:", rec.Header().Get("Content-Type"))
	fmt.Print(rec.Body)
	now = now.Add(2 * time.Second)
	get()
	// Output:
	// 200 "per-key";r=1;t=2
	// 200 "per-key";r=0;t=2
	// 429 "per-key";r=0;t=2
	// RateLimit-Policy: "per-key";q=2;w=4
	// Retry-After: 2
	// Content-Type: application/problem+json
	// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota exceeded","status":429,"detail":"the request costs 1 and 0 of 2 remain","violated-policies":["per-key"]}
	// 200 "per-key";r=0;t=2
}

// A per-second burst and a daily quota on one route, decided together: the
// fields list both policies, and once the daily quota is used up the 429
// comes from it, with its own wait, while the burst bucket (charged
// nothing for the denial) is full.
func Example_severalLimits() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a clock the example controls
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	defer store.Close()

	m, err := httplimit.New(store, httplimit.Options{
		Key: httplimit.HeaderKey("X-Api-Key"),
		Limits: []httplimit.Limit{
			{Policy: "burst", Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}},
			{Policy: "daily", Limit: sluice.Limit{Capacity: 20, Rate: sluice.Per(20, 24*time.Hour)}},
		},
	})
	if err != nil {
		panic(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	get := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-Api-Key", "k-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	rec := get()
	fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
	fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	for range 9 {
		get() // the burst is used up
	}
	now = now.Add(time.Second)
	for range 9 {
		get()
	}
	rec = get() // the 20th request of the day
	fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	now = now.Add(time.Second)
	rec = get()
	fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	fmt.Println("Retry-After:", rec.Header().Get("Retry-After"))
	fmt.Print(rec.Body)
	// Output:
	// RateLimit-Policy: "burst";q=10;w=1, "daily";q=20;w=86400
	// 200 "burst";r=9;t=1, "daily";r=19;t=4320
	// 200 "burst";r=0;t=1, "daily";r=0;t=4319
	// 429 "burst";r=10;t=1, "daily";r=0;t=4318
	// Retry-After: 4318
	// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota exceeded","status":429,"detail":"the request costs 1 and 0 of 20 remain in \"daily\"","violated-policies":["daily"]}
}

// outage stands in for a failure policy while the store is unreachable: it
// fails closed, denying every request with Degraded set.
type outage struct{}

func (outage) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{RetryAfter: 5 * time.Second, Degraded: true}, nil
}

func (outage) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{Degraded: true}, nil
}

// A denial made while the store is degraded is 503 with the problem type
// temporary-reduced-capacity, never 429: the client did not exceed its
// quota.
func Example_degraded() {
	m, err := httplimit.New(outage{}, httplimit.Options{
		Policy: "checkout",
		Limit:  sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)},
	})
	if err != nil {
		panic(err)
	}
	h := m.Handler(http.NotFoundHandler())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(rec.Code, "Retry-After:", rec.Header().Get("Retry-After"))
	fmt.Print(rec.Body)
	// Output:
	// 503 Retry-After: 5
	// {"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Temporarily reduced capacity","status":503,"detail":"the rate limiter is degraded and cannot admit this request now","violated-policies":["checkout"]}
}

// Behind a load balancer at 10.0.0.0/8, the client is the rightmost
// X-Forwarded-For address that is not a trusted proxy; whatever the client
// wrote further left is ignored. IPv6 clients share a bucket per /64.
func ExampleClientIP() {
	key, err := httplimit.ClientIP(httplimit.ClientIPOptions{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
	})
	if err != nil {
		panic(err)
	}
	for _, xff := range []string{
		"203.0.113.7",
		"1.1.1.1, 203.0.113.7, 10.0.0.2", // 1.1.1.1 was written by the client
		"2001:db8:1:2::1234",
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "10.0.0.1:41000" // the load balancer
		r.Header.Set("X-Forwarded-For", xff)
		k, err := key(r)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			continue
		}
		fmt.Println(k)
	}
	// Output:
	// ip:203.0.113.7
	// ip:203.0.113.7
	// ip:2001:db8:1:2::/64
}
