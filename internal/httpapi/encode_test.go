package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// The reference encoding: the structs the API's JSON was first written
// from, with encoding/json. appendDecision and the batch encoding must
// produce the same bytes.

// decisionBody is a decision as JSON.
type decisionBody struct {
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMS *int64 `json:"retry_after_ms"`
	ResetAfterMS *int64 `json:"reset_after_ms"`
	Never        bool   `json:"never"`
	Policy       string `json:"policy"`
	Limit        string `json:"limit"`
	Replayed     bool   `json:"replayed"`
	Degraded     bool   `json:"degraded"`
	ShadowDenied bool   `json:"shadow_denied,omitempty"`
}

// batchItem is one result of a batch: a decision or a problem.
type batchItem struct {
	*decisionBody
	Error *problem `json:"error,omitempty"`
}

// typed is p as every problem is written: with the type about:blank when
// it names none (RFC 9457 section 4.2.1).
func typed(p problem) *problem {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	return &p
}

func encodeDecision(res service.Result) decisionBody {
	b := decisionBody{
		Allowed:      res.Allowed,
		Remaining:    res.Remaining,
		Policy:       res.Policy.Name,
		Limit:        res.Decision.Limit.String(),
		Replayed:     res.Replayed,
		Degraded:     res.Degraded,
		ShadowDenied: res.ShadowDenied,
	}
	if res.RetryAfter == sluice.Never {
		b.Never = true
	} else {
		ms := ceilMillis(res.RetryAfter)
		b.RetryAfterMS = &ms
	}
	if res.ResetAfter != sluice.Never {
		ms := ceilMillis(res.ResetAfter)
		b.ResetAfterMS = &ms
	}
	return b
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// randomResult returns a result with every field drawn from values that
// matter to its encoding: zero, negative, Never and its neighbours, the
// ends of int64, sub-millisecond waits.
func randomResult(rng *rand.Rand) service.Result {
	durations := []time.Duration{0, 1, -1, time.Millisecond - 1, time.Millisecond, time.Millisecond + 1,
		30 * time.Second, sluice.Never, sluice.Never - 1, math.MinInt64, time.Duration(rng.Int64())}
	counts := []int64{0, 1, -1, 99, math.MaxInt64, math.MinInt64, rng.Int64N(1 << 40)}
	names := []string{"api", "a", `<b>&"\`, "x\u2028y", "login:v2", strings.Repeat("p", 64), "héllo", "\xff"}
	limits := []sluice.Limit{
		{Capacity: 2, Rate: sluice.Per(2, time.Minute)},
		{Capacity: 1, Rate: sluice.Per(0, time.Second)},
		{Capacity: 1 << 40, Rate: sluice.Per(1<<40, 366*24*time.Hour)},
		{Capacity: 10, Rate: sluice.Per(1, 1500*time.Millisecond)},
	}
	pick := func(n int) int { return rng.IntN(n) }
	return service.Result{
		Decision: sluice.Decision{
			Allowed:    rng.IntN(2) == 0,
			Remaining:  counts[pick(len(counts))],
			RetryAfter: durations[pick(len(durations))],
			ResetAfter: durations[pick(len(durations))],
			Limit:      limits[pick(len(limits))],
			Replayed:   rng.IntN(2) == 0,
			Degraded:   rng.IntN(2) == 0,
		},
		Policy:       service.Policy{Name: names[pick(len(names))], Limit: limits[pick(len(limits))]},
		ShadowDenied: rng.IntN(2) == 0,
	}
}

func TestAppendDecision(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var c nameCache
	for i := range 20000 {
		res := randomResult(rng)
		got := appendDecision(nil, res, c.names(res.Policy.Name, res.Decision.Limit))
		want := mustMarshal(t, encodeDecision(res))
		if !bytes.Equal(got, want) {
			t.Fatalf("decision %d %+v:\n got %s\nwant %s", i, res, got, want)
		}
		if !json.Valid(got) {
			t.Fatalf("decision %d: %s is not JSON", i, got)
		}
	}
}

func TestAppendProblemItem(t *testing.T) {
	for _, p := range []problem{
		{Title: "invalid request", Status: 400, Detail: `"key" is missing or empty`, Field: "requests[3].key"},
		{Type: problemReducedCapacity, Title: "t", Status: 503, Policy: "<a>"},
		{},
	} {
		want := mustMarshal(t, batchItem{Error: typed(p)})
		if got := appendProblemItem(nil, p); !bytes.Equal(got, want) {
			t.Errorf("problem item %+v:\n got %s\nwant %s", p, got, want)
		}
	}
}

// TestAnswerBytes: the bodies of a take and of a batch are byte for byte
// those of the reference encoding, for the same decisions (two stores on
// the same frozen clock make them).
func TestAnswerBytes(t *testing.T) {
	clock := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	policies := []service.Policy{
		{Name: "api", Limit: perMinute},
		{Name: "once", Limit: once},
		{Name: "trial", Limit: perMinute, Shadow: true},
		{Name: `<&>"`, Limit: perMinute},
	}
	newCore := func() *service.Core {
		st, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		table, err := service.NewTable(st, "v", policies)
		if err != nil {
			t.Fatal(err)
		}
		core, err := service.New(st, table, service.Hooks{})
		if err != nil {
			t.Fatal(err)
		}
		return core
	}
	h, err := New(newCore(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref := newCore()
	post := func(path, body string) []byte {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" ||
			rec.Header().Get("Content-Length") != fmt.Sprint(rec.Body.Len()) {
			t.Fatalf("POST %s %s = %d %v %s", path, body, rec.Code, rec.Header(), rec.Body)
		}
		return rec.Body.Bytes()
	}
	reqs := []service.Request{
		{Policy: "api", Key: "k", Cost: 1}, {Policy: "api", Key: "k", Cost: 2}, {Policy: "api", Key: "k", Cost: 1, RequestID: "r"},
		{Policy: "api", Key: "k", Cost: 1, RequestID: "r"}, {Policy: "once", Key: "k", Cost: 1}, {Policy: "once", Key: "k", Cost: 1},
		{Policy: "trial", Key: "k", Cost: 2}, {Policy: "trial", Key: "k", Cost: 2}, {Policy: `<&>"`, Key: "k", Cost: 1},
	}
	for _, r := range reqs {
		body := string(mustMarshal(t, map[string]any{"policy": r.Policy, "key": r.Key, "cost": r.Cost, "request_id": r.RequestID}))
		got := post("/v1/take", body)
		res, err := ref.Take(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		if want := append(mustMarshal(t, encodeDecision(res)), '\n'); !bytes.Equal(got, want) {
			t.Errorf("POST /v1/take %s:\n got %s\nwant %s", body, got, want)
		}
	}
	// A batch of decisions and problems: the reference is the batch
	// handler as it was written with encoding/json.
	items := []string{`{"policy":"api","key":"b"}`, `{"policy":"nope","key":"b"}`, `{"policy":"api","key":"b","cost":2}`,
		`{"policy":"api"}`, `{"policy":"once","key":"b"}`, `{"policy":"once","key":"b"}`, `{"policy":"trial","key":"b","cost":2}`,
		`{"policy":"trial","key":"b","cost":2}`, `{"policy":"api","key":"b","cost":0}`, `{"policy":"<&>\"","key":"b"}`}
	got := post("/v1/take:batch", `{"requests":[`+strings.Join(items, ",")+`]}`)
	var want struct {
		Results []batchItem `json:"results"`
	}
	for i, item := range items {
		var dr decisionRequest
		if err := json.Unmarshal([]byte(item), &dr); err != nil {
			t.Fatal(err)
		}
		sr, field, err := serviceRequest(dr, true)
		if err != nil {
			want.Results = append(want.Results, batchItem{Error: typed(problem{Title: "invalid request", Status: http.StatusBadRequest, Detail: err.Error(), Field: fmt.Sprintf("requests[%d].%s", i, field)})})
			continue
		}
		res, err := ref.Take(t.Context(), sr)
		if err != nil {
			status, p := h.errorProblem(httptest.NewRequest("POST", "/v1/take:batch", nil), err)
			p.Status = status
			want.Results = append(want.Results, batchItem{Error: typed(p)})
			continue
		}
		body := encodeDecision(res)
		want.Results = append(want.Results, batchItem{decisionBody: &body})
	}
	if want := append(mustMarshal(t, want), '\n'); !bytes.Equal(got, want) {
		t.Errorf("POST /v1/take:batch:\n got %s\nwant %s", got, want)
	}
}

func TestNameCache(t *testing.T) {
	var c nameCache
	l := sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range maxNames + 100 {
				name := fmt.Sprintf("p%d", (i+g*7)%(maxNames+100))
				got := c.names(name, l)
				if want := fmt.Sprintf(`"policy":%q,"limit":"5 1/s"`, name); string(got) != want {
					t.Errorf("names(%q) = %s, want %s", name, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := c.c.Len(); n != maxNames {
		t.Errorf("the cache holds %d names, want its bound %d", n, maxNames)
	}
}

// BenchmarkAppendDecision is the encoding alone, next to encoding/json's.
func BenchmarkAppendDecision(b *testing.B) {
	res := service.Result{
		Decision: sluice.Decision{Allowed: true, Remaining: 99, ResetAfter: 100 * time.Millisecond, Limit: sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}},
		Policy:   service.Policy{Name: "bench", Limit: sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}},
	}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var c nameCache
		var buf []byte
		for b.Loop() {
			buf = appendDecision(buf[:0], res, c.names(res.Policy.Name, res.Decision.Limit))
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(encodeDecision(res)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
