package httpapi

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var (
	burst = sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(5)}
	daily = sluice.Limit{Capacity: 3, Rate: sluice.Per(3, 24*time.Hour)}
	llm   = sluice.Limit{Capacity: 100, Rate: sluice.Per(100, time.Hour)}
)

// newOpsAPI serves "login" (a burst and a daily quota decided together)
// and "llm" (100 an hour) over a memstore on a frozen clock.
func newOpsAPI(t *testing.T) *httptest.Server {
	t.Helper()
	clock := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	table, err := service.NewTable(st, "v1", []service.Policy{
		{Name: "login", Limits: []sluice.Limit{burst, daily}},
		{Name: "llm", Limit: llm},
	})
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(st, table, service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(core, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// A policy of several limits answers one list item per limit, and its
// denial waits for the limit that denied: the daily quota, 8 hours.
func TestSeveralLimitsAnswer(t *testing.T) {
	srv := newOpsAPI(t)
	for i := range 3 {
		a := call(t, srv, "POST", "/v1/take", `{"policy":"login","key":"alice"}`)
		if a.status != 200 || a.body["allowed"] != true {
			t.Fatalf("take %d = %d %v", i, a.status, a.body)
		}
	}
	a := call(t, srv, "POST", "/v1/take", `{"policy":"login","key":"alice"}`)
	if a.status != 200 || a.body["allowed"] != false || a.body["retry_after_ms"] != 28800000.0 || a.body["limit"] != "3 3/d" {
		t.Fatalf("4th take = %d %v; want denied by the daily quota, 8h", a.status, a.body)
	}
	if got, want := a.header.Get("RateLimit-Policy"), `"login";q=5;w=1, "login/1";q=3;w=86400`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got, want := a.header.Get("RateLimit"), `"login";r=2;t=1, "login/1";r=0;t=28800`; got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	if got := a.header.Get("Retry-After"); got != "28800" {
		t.Errorf("Retry-After = %q, want 28800", got)
	}
	limits, _ := a.body["limits"].([]any)
	if len(limits) != 2 {
		t.Fatalf("limits = %v, want two", a.body["limits"])
	}
	first, second := limits[0].(map[string]any), limits[1].(map[string]any)
	if first["bucket"] != "login" || first["allowed"] != true || first["remaining"] != 2.0 ||
		second["bucket"] != "login/1" || second["allowed"] != false || second["retry_after_ms"] != 28800000.0 {
		t.Errorf("limits = %v; want the burst allowing with 2 left (not charged) and the daily quota denying", limits)
	}
	if a := call(t, srv, "POST", "/v1/take", `{"policy":"login","key":"alice","request_id":"r1"}`); a.status != 400 || a.body["field"] != "request_id" {
		t.Errorf("a request ID on several limits = %d %v, want 400 naming request_id", a.status, a.body)
	}
	// Reset fills both.
	if a := call(t, srv, "POST", "/v1/reset", `{"policy":"login","key":"alice"}`); a.status != 204 {
		t.Fatalf("reset = %d %v", a.status, a.body)
	}
	if a := call(t, srv, "POST", "/v1/take", `{"policy":"login","key":"alice","cost":3}`); a.status != 200 || a.body["allowed"] != true {
		t.Fatalf("take of 3 after reset = %d %v", a.status, a.body)
	}
}

func TestDrainRefundReset(t *testing.T) {
	srv := newOpsAPI(t)
	a := call(t, srv, "POST", "/v1/drain", `{"policy":"llm","key":"k","cost":130}`)
	if a.status != 200 || a.body["allowed"] != false || a.body["taken"] != 100.0 || a.body["remaining"] != 0.0 || a.body["never"] != true {
		t.Fatalf("drain of 130 = %d %v; want 100 taken, not allowed, never", a.status, a.body)
	}
	a = call(t, srv, "POST", "/v1/refund", `{"policy":"llm","key":"k","cost":30}`)
	if a.status != 200 || a.body["taken"] != -30.0 || a.body["remaining"] != 30.0 {
		t.Fatalf("refund of 30 = %d %v", a.status, a.body)
	}
	// A take by request ID, refunded once.
	if a := call(t, srv, "POST", "/v1/take", `{"policy":"llm","key":"k","cost":10,"request_id":"job-1"}`); a.status != 200 || a.body["remaining"] != 20.0 {
		t.Fatalf("take of 10 = %d %v", a.status, a.body)
	}
	for i, want := range []float64{-10, 0} {
		a := call(t, srv, "POST", "/v1/refund", `{"policy":"llm","key":"k","cost":10,"request_id":"job-1"}`)
		if a.status != 200 || a.body["taken"] != want || a.body["replayed"] != (i == 1) || a.body["remaining"] != 30.0 {
			t.Fatalf("refund %d of job-1 = %d %v; want taken %v", i, a.status, a.body, want)
		}
	}
	for _, c := range []struct {
		path, body string
		status     int
		field      string
	}{
		{"/v1/refund", `{"policy":"llm","key":"k","cost":1,"request_id":"never-taken"}`, 409, "request_id"},
		{"/v1/refund", `{"policy":"llm","key":"k","cost":101}`, 400, "cost"},
		{"/v1/drain", `{"policy":"llm","key":"k","cost":0}`, 400, "cost"},
		{"/v1/drain", `{"policy":"llm","key":"k","cost":1,"request_id":"x"}`, 400, "request_id"},
		{"/v1/drain", `{"policy":"nope","key":"k"}`, 404, "policy"},
		{"/v1/reset", `{"policy":"llm"}`, 400, "key"},
		{"/v1/reset", `{"policy":"nope","key":"k"}`, 404, "policy"},
		{"/v1/reset", `{"policy":"llm","key":"k","cost":1}`, 400, ""},
	} {
		a := call(t, srv, "POST", c.path, c.body)
		if a.status != c.status || (c.field != "" && a.body["field"] != c.field) {
			t.Errorf("POST %s %s = %d %v; want %d naming %q", c.path, c.body, a.status, a.body, c.status, c.field)
		}
	}
	if a := call(t, srv, "GET", "/v1/reset", ""); a.status != 405 {
		t.Errorf("GET /v1/reset = %d, want 405", a.status)
	}
	// Nothing above changed the bucket: 30 left.
	if a := call(t, srv, "POST", "/v1/peek", `{"policy":"llm","key":"k","cost":30}`); a.body["allowed"] != true || a.body["remaining"] != 30.0 {
		t.Fatalf("peek = %d %v; want 30 left", a.status, a.body)
	}
	if a := call(t, srv, "POST", "/v1/reset", `{"policy":"llm","key":"k"}`); a.status != 204 {
		t.Fatalf("reset = %d", a.status)
	}
	if a := call(t, srv, "POST", "/v1/peek", `{"policy":"llm","key":"k","cost":100}`); a.body["allowed"] != true {
		t.Fatalf("peek after reset = %d %v; want full", a.status, a.body)
	}
}
