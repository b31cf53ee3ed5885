package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memstore"
)

// BenchmarkHandler measures the middleware around an empty handler, with
// the in-memory store and a limit every request passes.
func BenchmarkHandler(b *testing.B) {
	mem := newMem(b, memstore.Options{SweepInterval: -1})
	m, err := httplimit.New(mem, httplimit.Options{
		Policy: "api",
		Key:    httplimit.HeaderKey("X-Api-Key"),
		Limit:  sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 30)},
	})
	if err != nil {
		b.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	newRequest := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Api-Key", key)
		return r
	}
	b.Run("serial", func(b *testing.B) {
		r, w := newRequest("k"), httptest.NewRecorder()
		b.ReportAllocs()
		for b.Loop() {
			clear(w.Header())
			h.ServeHTTP(w, r)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var n atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r, w := newRequest("k"+strconv.FormatInt(n.Add(1), 10)), httptest.NewRecorder()
			for pb.Next() {
				clear(w.Header())
				h.ServeHTTP(w, r)
			}
		})
	})
}
