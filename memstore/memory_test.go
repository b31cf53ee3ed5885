//go:build !race

package memstore_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// heapPerBucket returns the live heap bytes per bucket of a store holding n
// buckets of 16-byte keys.
func heapPerBucket(tb testing.TB, n int) float64 {
	keys := benchKeys(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := newStore(tb, memstore.Options{MaxKeys: n, SweepInterval: -1})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}
	for _, k := range keys {
		if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: k, Cost: 1, Limit: l}); err != nil {
			tb.Fatal(err)
		}
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	runtime.KeepAlive(keys)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestHeapPerBucket holds the in-memory store to at most 100 bytes of live
// heap per bucket at 1M keys of 16 bytes (key bytes included, the caller's
// copies of the keys excluded as they are allocated before the baseline).
func TestHeapPerBucket(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 1M buckets")
	}
	got := heapPerBucket(t, 1_000_000)
	t.Logf("%.1f bytes of live heap per bucket at 1M keys", got)
	if got > 100 {
		t.Errorf("heap per bucket = %.1f B, want <= 100", got)
	}
}

func BenchmarkHeapPerBucket(b *testing.B) {
	var got float64
	for b.Loop() {
		got = heapPerBucket(b, 1_000_000)
	}
	b.ReportMetric(got, "B/bucket")
}
