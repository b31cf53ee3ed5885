package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// FuzzBody: no body makes the API panic or answer anything but a decision
// or a problem with a client-error status.
func FuzzBody(f *testing.F) {
	for _, s := range []string{
		`{"policy":"api","key":"k"}`, `{"policy":"api","key":"k","cost":2,"request_id":"r"}`,
		`{"requests":[{"policy":"api","key":"k"},{"policy":"x"}]}`, `{"policy":"api","key":"k","cost":-9223372036854775808}`,
		`{"policy":"api","key":"\u0000"}`, `[]`, `null`, `{"policy":null}`, `{"cost":1e400}`, "\xff",
	} {
		f.Add("/v1/take", s)
		f.Add("/v1/take:batch", s)
		f.Add("/v1/peek", s)
	}
	clock := sluicetest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	table, err := service.NewTable(st, "v", []service.Policy{{Name: "api", Limit: perMinute}})
	if err != nil {
		f.Fatal(err)
	}
	core, err := service.New(st, table, service.Hooks{})
	if err != nil {
		f.Fatal(err)
	}
	h, err := New(core, Options{MaxBatch: 10})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path, body string) {
		switch path {
		case "/v1/take", "/v1/peek", "/v1/take:batch":
		default:
			path = "/v1/take"
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
		switch rec.Code {
		case http.StatusOK:
			if !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
				t.Fatalf("200 with Content-Type %q", rec.Header().Get("Content-Type"))
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge:
			if rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("%d with Content-Type %q", rec.Code, rec.Header().Get("Content-Type"))
			}
		default:
			t.Fatalf("POST %s %q = %d %s", path, body, rec.Code, rec.Body)
		}
	})
}
