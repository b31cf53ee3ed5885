package memory

import (
	"encoding/binary"
	"encoding/hex"
	"math"
	"runtime"
	"testing"
	"time"
)

// BenchmarkNewKeys inserts numKeys new 16-byte keys into an empty limiter,
// one take each, and reports per new key: the time (ns/op), the bytes and
// allocations made (B/op, allocs/op), and the live heap the limiter keeps
// once everything else is collected (B/bucket). The key strings are built
// inside the measurement, as a server builds them from requests, so a
// limiter that keeps or copies a key is charged for it. The whole insertion
// is one measurement, whatever b.N is.
func BenchmarkNewKeys(b *testing.B) {
	s := shapes[0]
	for _, p := range peers {
		b.Run(p.name, func(b *testing.B) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()

			l := p.new(b, s)
			var raw [8]byte
			var text [16]byte
			for i := range numKeys {
				binary.BigEndian.PutUint64(raw[:], uint64(i)*0x9e3779b97f4a7c15)
				hex.Encode(text[:], raw[:])
				l.take(string(text[:]))
			}

			elapsed := time.Since(start)
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&after)
			if bc, ok := l.(bucketCounter); ok && bc.buckets() != numKeys {
				// A store that reclaimed full buckets would look smaller.
				b.Errorf("%s holds %d buckets after %d new keys, want all of them", p.name, bc.buckets(), numKeys)
			}
			runtime.KeepAlive(l)
			l.close()

			b.ReportMetric(float64(elapsed.Nanoseconds())/numKeys, "ns/op")
			// The testing package prints B/op and allocs/op as integers
			// (truncated): round them instead.
			b.ReportMetric(math.Round(float64(after.TotalAlloc-before.TotalAlloc)/numKeys), "B/op")
			b.ReportMetric(math.Round(float64(after.Mallocs-before.Mallocs)/numKeys), "allocs/op")
			b.ReportMetric((float64(after.HeapAlloc)-float64(before.HeapAlloc))/numKeys, "B/bucket")
		})
	}
}

// bucketCounter is a limiter that reports how many buckets it holds.
type bucketCounter interface{ buckets() int64 }
