package redisstore

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkTake measures decisions against the standalone test server, one
// round trip each: one hot key, and keys spread over 100,000.
//
//	go test -run '^$' -bench Take -benchtime 3s ./redisstore/
func BenchmarkTake(b *testing.B) {
	c := redistest.Client(b)
	l := sluice.Limit{Capacity: 1_000_000, Rate: sluice.PerSecond(1_000_000)}
	for _, keys := range []int{1, 100_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint("user-", i)
		}
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			s := newStore(b, c, Options{})
			ctx := b.Context()
			b.Run("serial", func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: names[i%keys], Cost: 1, Limit: l}); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
			b.Run("parallel", func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(32) // 32 × GOMAXPROCS callers
				var next atomic.Int64
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						i := next.Add(1)
						if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: names[int(i)%keys], Cost: 1, Limit: l}); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
			})
		})
	}
}
