package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// capacity is the limit of the test policy "p": 3 tokens that never
// refill, so that the tokens a run took are in the store when it ends.
const capacity = 3

// newService returns the service's HTTP API over a memstore with the policy
// "p", behind a handler that counts the requests it was sent, and the
// store.
func newService(t *testing.T, wrap func(http.Handler) http.Handler) (*httptest.Server, *memstore.Store, *atomic.Int64) {
	t.Helper()
	st, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	table, err := service.NewTable(st, "v", []service.Policy{{Name: "p", Limit: sluice.Limit{Capacity: capacity, Rate: sluice.Per(0, time.Second)}}})
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(st, table, service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	api, err := httpapi.New(core, httpapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = api
	if wrap != nil {
		h = wrap(api)
	}
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, st, &seen
}

// taken returns the tokens taken from the keys k0 to k(keys-1) of "p".
func taken(t *testing.T, st *memstore.Store, keys int) int64 {
	t.Helper()
	var sum int64
	for i := range keys {
		d, err := st.Peek(t.Context(), sluice.Request{Policy: "p", Key: fmt.Sprintf("k%d", i), Cost: 1,
			Limit: sluice.Limit{Capacity: capacity, Rate: sluice.Per(0, time.Second)}})
		if err != nil {
			t.Fatal(err)
		}
		sum += capacity - d.Remaining
	}
	return sum
}

func testConfig(srv *httptest.Server, client, mode string) config {
	return config{url: srv.URL, policy: "p", mode: mode, batch: 10, inFlight: 8, keys: 50,
		requests: 200, seed: 1, client: client, timeout: 5 * time.Second}
}

// TestCounts: every decision asked for is counted once, as the service
// made it: allowed + denied is what was sent, and the allowed ones are the
// tokens the store lost.
func TestCounts(t *testing.T) {
	for _, client := range []string{"raw", "net/http"} {
		for _, mode := range []string{"single", "batch"} {
			t.Run(client+"/"+mode, func(t *testing.T) {
				srv, st, seen := newService(t, nil)
				c := testConfig(srv, client, mode)
				g, err := newGenerator(c)
				if err != nil {
					t.Fatal(err)
				}
				defer g.close()
				r, err := g.run(t.Context(), 0, c.requests)
				if err != nil {
					t.Fatal(err)
				}
				want := c.requests * int64(c.perRequest())
				if r.requests != c.requests || seen.Load() != c.requests || r.decisions != want {
					t.Fatalf("requests %d (the service saw %d), decisions %d; want %d requests, %d decisions",
						r.requests, seen.Load(), r.decisions, c.requests, want)
				}
				if r.allowed+r.denied != want || r.errors != 0 || r.failed != 0 {
					t.Fatalf("allowed %d + denied %d = %d, errors %d, failed %d (%s); want %d decided, no errors",
						r.allowed, r.denied, r.allowed+r.denied, r.errors, r.failed, r.firstErr, want)
				}
				if got := taken(t, st, c.keys); r.allowed != got {
					t.Errorf("allowed %d, but the store lost %d tokens", r.allowed, got)
				}
				if r.denied == 0 || r.allowed == 0 {
					t.Errorf("allowed %d, denied %d: want both, %d keys of %d tokens for %d decisions", r.allowed, r.denied, c.keys, capacity, want)
				}
				if len(r.latencies) != int(r.requests) {
					t.Errorf("%d latencies for %d requests", len(r.latencies), r.requests)
				}
			})
		}
	}
}

// TestErrors: answers that are not decisions are counted as errors, never
// as decisions, and the raw client recovers from a connection cut short
// and reads chunked and closing answers.
func TestErrors(t *testing.T) {
	var n atomic.Int64
	// Every 7th request is cut off without an answer, every 5th answered
	// 500, every 3rd chunked and then closed; the rest go to the API.
	wrap := func(api http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch i := n.Add(1); {
			case i%7 == 0:
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
			case i%5 == 0:
				http.Error(w, "boom", http.StatusInternalServerError)
			case i%3 == 0:
				rec := httptest.NewRecorder()
				api.ServeHTTP(rec, r)
				w.Header().Set("Connection", "close")
				w.WriteHeader(rec.Code)
				body := rec.Body.Bytes()
				w.Write(body[:len(body)/2])
				http.NewResponseController(w).Flush()
				w.Write(body[len(body)/2:])
			default:
				api.ServeHTTP(w, r)
			}
		})
	}
	for _, client := range []string{"raw", "net/http"} {
		for _, mode := range []string{"single", "batch"} {
			t.Run(client+"/"+mode, func(t *testing.T) {
				n.Store(0)
				srv, st, _ := newService(t, wrap)
				c := testConfig(srv, client, mode)
				c.inFlight = 1 // the pattern of answers is then that of the requests
				g, err := newGenerator(c)
				if err != nil {
					t.Fatal(err)
				}
				defer g.close()
				r, err := g.run(t.Context(), 0, c.requests)
				if err != nil {
					t.Fatal(err)
				}
				per := int64(c.perRequest())
				if r.allowed+r.denied+r.errors != r.decisions || r.decisions != c.requests*per {
					t.Fatalf("allowed %d + denied %d + errors %d != %d decisions of %d requests", r.allowed, r.denied, r.errors, r.decisions, c.requests)
				}
				// A cut connection is retried by net/http's client, so
				// only the 500s are sure to be seen by both clients.
				if r.statuses[500] == 0 || r.errors < r.statuses[500]*per {
					t.Errorf("statuses %v, errors %d: want the 500s counted as errors", r.statuses, r.errors)
				}
				if client == "raw" && r.failed == 0 {
					t.Errorf("no request failed, though every 7th connection was cut")
				}
				if got := taken(t, st, c.keys); r.allowed != got {
					t.Errorf("allowed %d, but the store lost %d tokens", r.allowed, got)
				}
			})
		}
	}
}

// TestNoDecision: a run that gets no decision at all is an error.
func TestNoDecision(t *testing.T) {
	srv, _, _ := newService(t, nil)
	c := testConfig(srv, "raw", "batch")
	c.policy = "nope"
	g, err := newGenerator(c)
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	r, err := g.run(t.Context(), 0, 10)
	if err == nil || !strings.Contains(err.Error(), "no decision") {
		t.Fatalf("run with an unknown policy: error %v, want no decision", err)
	}
	if r.errors != 10*int64(c.batch) || r.statuses[http.StatusNotFound] != 10*int64(c.batch) {
		t.Errorf("errors %d, statuses %v: want every item a 404", r.errors, r.statuses)
	}
}

// TestRun: the command runs for a duration after a warm-up and prints its
// report.
func TestRun(t *testing.T) {
	srv, _, _ := newService(t, nil)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-url", srv.URL, "-policy", "p", "-keys", "50", "-in-flight", "4",
		"-duration", "100ms", "-warmup", "50ms"}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v (%s)", err, errOut.String())
	}
	for _, want := range []string{"decisions ", "latency    p50 ", "result mode=single decisions/s="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report %q lacks %q", out.String(), want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, tt := range []struct{ args, want string }{
		{"-mode both", `-mode "both": want single or batch`},
		{"-in-flight 0", "-in-flight 0: want 1 to 10000"},
		{"-keys 0", "-keys 0: want 1 to 16777216"},
		{"-batch 0", "-batch 0: want 1 to 100000"},
		{"-requests -1", "-requests -1: want 0"},
		{"-duration 0", "-duration 0s: want a positive duration"},
		{"-url ftp://x", `-url "ftp://x": want http://host:port`},
		{"-client curl", `-client "curl": want raw or net/http`},
		{"-url https://127.0.0.1:1", "-client raw speaks http only"},
	} {
		err := run(context.Background(), strings.Fields(tt.args), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("loadgen %s: error %v, want %q", tt.args, err, tt.want)
		}
	}
}
