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
// the in-memory store and limits every request passes: one limit, and two
// decided together (a burst and a daily quota, one TakeAll).
func BenchmarkHandler(b *testing.B) {
	mem := newMem(b, memstore.Options{SweepInterval: -1})
	loose := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 30)}
	one, err := httplimit.New(mem, httplimit.Options{
		Policy: "api",
		Key:    httplimit.HeaderKey("X-Api-Key"),
		Limit:  loose,
	})
	if err != nil {
		b.Fatal(err)
	}
	two, err := httplimit.New(mem, httplimit.Options{
		Key:    httplimit.HeaderKey("X-Api-Key"),
		Limits: []httplimit.Limit{{Policy: "burst", Limit: loose}, {Policy: "daily", Limit: loose}},
	})
	if err != nil {
		b.Fatal(err)
	}
	newRequest := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Api-Key", key)
		return r
	}
	for _, bm := range []struct {
		name string
		m    *httplimit.Middleware
	}{{"", one}, {"two-limits/", two}} {
		h := bm.m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		b.Run(bm.name+"serial", func(b *testing.B) {
			r, w := newRequest("k"), httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.Header())
				h.ServeHTTP(w, r)
			}
		})
		b.Run(bm.name+"parallel", func(b *testing.B) {
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
}
