package httpapi

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// benchKeys is the number of keys the benchmarks spread their takes over.
const benchKeys = 10000

// discardWriter is the least a ResponseWriter can be: the handler's own
// cost is what remains.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(s int)   { w.status = s }
func (w *discardWriter) Write(b []byte) (int, error) {
	w.n += len(b)
	return len(b), nil
}

// newBenchHandler returns the API over a memstore with the policy "bench",
// 100 10/s, as bench/http/run.sh configures the service.
func newBenchHandler(b *testing.B) *Handler {
	b.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	table, err := service.NewTable(st, "v", []service.Policy{{Name: "bench", Limit: sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}}})
	if err != nil {
		b.Fatal(err)
	}
	core, err := service.New(st, table, service.Hooks{})
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(core, Options{})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// serveBodies posts bodies in turn to path, one per iteration, as a server
// would: a new Header map each time. Besides ns/op it reports cpu-ns/op,
// the CPU time of the process (garbage collection included) per op, which
// other processes on a shared machine change less than the elapsed time
// (where the system reports it: cpuTime).
func serveBodies(b *testing.B, h *Handler, path string, bodies [][]byte) {
	b.ReportAllocs()
	if cpu0, ok := loadgen.CPUTime(); ok {
		defer func() {
			cpu1, _ := loadgen.CPUTime()
			b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
		}()
	}
	b.RunParallel(func(pb *testing.PB) {
		req, err := http.NewRequest("POST", path, nil)
		if err != nil {
			b.Error(err)
			return
		}
		var rd bytes.Reader
		w := &discardWriter{}
		for i := 0; pb.Next(); i++ {
			rd.Reset(bodies[i%len(bodies)])
			req.Body = io.NopCloser(&rd)
			w.h, w.status = make(http.Header), 0
			h.ServeHTTP(w, req)
			if w.status != http.StatusOK {
				b.Errorf("POST %s = %d", path, w.status)
				return
			}
		}
	})
}

func BenchmarkTake(b *testing.B) {
	h := newBenchHandler(b)
	bodies := make([][]byte, benchKeys)
	for i := range bodies {
		bodies[i] = []byte(`{"policy":"bench","key":"k` + strconv.Itoa(i*7919%benchKeys) + `"}`)
	}
	serveBodies(b, h, "/v1/take", bodies)
}

// BenchmarkBatch: one op is a batch of 100 takes.
func BenchmarkBatch(b *testing.B) {
	h := newBenchHandler(b)
	bodies := make([][]byte, benchKeys/100)
	for i := range bodies {
		var items []string
		for j := range 100 {
			items = append(items, `{"policy":"bench","key":"k`+strconv.Itoa((i*100+j)*7919%benchKeys)+`"}`)
		}
		bodies[i] = []byte(`{"requests":[` + strings.Join(items, ",") + `]}`)
	}
	serveBodies(b, h, "/v1/take:batch", bodies)
}

// BenchmarkDenied: every take of one key is a denial, which also sets
// Retry-After.
func BenchmarkDenied(b *testing.B) {
	h := newBenchHandler(b)
	serveBodies(b, h, "/v1/take", [][]byte{[]byte(`{"policy":"bench","key":"hot","cost":100}`)})
}
