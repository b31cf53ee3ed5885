package memory

import (
	"fmt"
	"math/rand"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// numKeys is the size of the key set of the Uniform and Zipf workloads.
const numKeys = 1_000_000

// seqLen is the length of each pre-drawn sequence of key indexes; a power of
// two so a goroutine can walk it with a mask.
const seqLen = 1 << 22

// keys returns numKeys distinct 16-byte keys, built once.
var keys = sync.OnceValue(func() []string {
	ks := make([]string, numKeys)
	for i := range ks {
		ks[i] = keyOf(i)
	}
	return ks
})

// keyOf returns the 16-byte key number i: 16 hex digits of a bijective
// scramble of i, so neighbouring keys share no prefix.
func keyOf(i int) string {
	return fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15)
}

// uniformSeq and zipfSeq are key indexes drawn before any timer starts, so the
// random generator costs nothing inside a measured loop and every peer sees
// the same sequence.
var (
	uniformSeq = sync.OnceValue(func() []int32 {
		r := rand.New(rand.NewSource(1))
		seq := make([]int32, seqLen)
		for i := range seq {
			seq[i] = int32(r.Intn(numKeys))
		}
		return seq
	})
	zipfSeq = sync.OnceValue(func() []int32 {
		z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, numKeys-1)
		seq := make([]int32, seqLen)
		for i := range seq {
			seq[i] = int32(z.Uint64())
		}
		return seq
	})
)

// hotKey is the one key of the HotKey workloads.
const hotKey = "hot-key-00000001"

// BenchmarkHotKey takes from one key in one goroutine: the cost of a single
// decision on an existing bucket.
func BenchmarkHotKey(b *testing.B) {
	forEach(b, shapes, takeHotKey, func(b *testing.B, l limiter) {
		allowed := 0
		b.ReportAllocs()
		for b.Loop() {
			if l.take(hotKey) {
				allowed++
			}
		}
		b.ReportMetric(float64(allowed)/float64(b.N), "allowed/op")
	})
}

// BenchmarkHotKeyParallel takes from one key in GOMAXPROCS goroutines: every
// decision contends for the same bucket.
func BenchmarkHotKeyParallel(b *testing.B) {
	forEach(b, shapes, takeHotKey, func(b *testing.B, l limiter) {
		var allowed atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			n := int64(0)
			for pb.Next() {
				if l.take(hotKey) {
					n++
				}
			}
			allowed.Add(n)
		})
		b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
	})
}

func takeHotKey(l limiter) { l.take(hotKey) }

// BenchmarkUniform takes from keys drawn uniformly from 1M existing keys in
// GOMAXPROCS goroutines. It runs under rate=10 only: a run visits each key a
// few times, so its burst never runs out and every decision is allowed under
// either shape.
func BenchmarkUniform(b *testing.B) {
	benchKeys(b, shapes[:1], uniformSeq())
}

// BenchmarkZipf takes from keys drawn from 1M existing keys with a Zipf
// distribution (s=1.1, v=1), in GOMAXPROCS goroutines: a few hot keys and a
// long tail, as real traffic.
func BenchmarkZipf(b *testing.B) {
	benchKeys(b, shapes, zipfSeq())
}

// benchKeys runs each limiter over the key indexes seq in GOMAXPROCS
// goroutines. Every key is taken from once before the timer starts, so the
// measured decisions are on existing buckets. Each goroutine starts at its
// own place in seq.
//
// The keys taken before the timer are copies: as in a server, where every
// request brings its own copy of the key, a limiter that keeps the string it
// was first given cannot find it again by comparing pointers.
func benchKeys(b *testing.B, shapes []shape, seq []int32) {
	ks := keys()
	takeAll := func(l limiter) {
		// Spread over GOMAXPROCS goroutines: inserting 1M keys is most of
		// the time of a short run.
		var wg sync.WaitGroup
		n := runtime.GOMAXPROCS(0)
		for g := range n {
			wg.Go(func() {
				for i := g; i < len(ks); i += n {
					l.take(strings.Clone(ks[i]))
				}
			})
		}
		wg.Wait()
	}
	forEach(b, shapes, takeAll, func(b *testing.B, l limiter) {
		var (
			allowed    atomic.Int64
			goroutines atomic.Uint32
		)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := goroutines.Add(1) * 0x9e3779b9
			n := int64(0)
			for pb.Next() {
				if l.take(ks[seq[i%seqLen]]) {
					n++
				}
				i++
			}
			allowed.Add(n)
		})
		b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
	})
}

// errorCounter is a limiter that counts the calls it failed to decide (and
// answered as denied).
type errorCounter interface{ errors() int64 }

// forEach runs bench as a sub-benchmark for each of shapes and every peer.
// The limiter is built and set up once per sub-benchmark and shared by the
// calls the testing package makes while it sizes b.N (and by the
// repetitions of -count), so a set-up that inserts 1M keys runs once. The
// limiter is closed, and its memory collected, before the next peer runs. A
// limiter that counts failed calls also reports errors/op.
func forEach(b *testing.B, shapes []shape, setup func(limiter), bench func(*testing.B, limiter)) {
	for _, s := range shapes {
		for _, p := range peers {
			var l limiter
			b.Run(s.name+"/"+p.name, func(b *testing.B) {
				if l == nil {
					l = p.new(b, s)
					setup(l)
				}
				ec, counts := l.(errorCounter)
				var errs int64
				if counts {
					errs = ec.errors()
				}
				bench(b, l)
				if counts {
					b.ReportMetric(float64(ec.errors()-errs)/float64(b.N), "errors/op")
				}
			})
			if l != nil {
				l.close()
				l = nil
			}
			runtime.GC()
		}
	}
}
