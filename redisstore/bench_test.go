package redisstore

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkTake measures decisions against the standalone test server, one
// round trip each: one hot key, and keys spread over 100,000.
//
//	go test -run '^$' -bench 'Take$' -benchtime 3s ./redisstore/
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

// BenchmarkTakeAllCluster measures a multi-take of two buckets against the
// private three-master cluster, next to a single take: the two buckets of
// one key under two policies (one slot, one script), and of two keys in
// different slots (decided slot by slot, one script and one round trip
// each); one caller, and 64. Every decision of these is allowed (the limit
// is far above the load), the common path. two-slots-denied is the same
// pair with the second slot's bucket empty, never refilling: every
// decision takes from the first slot, is denied by the second and gives
// back to the first, three scripts.
//
//	go test -run '^$' -bench TakeAllCluster -benchtime 20000x ./redisstore/
func BenchmarkTakeAllCluster(b *testing.B) {
	c := redistest.ClusterClient(b)
	l := sluice.Limit{Capacity: 1_000_000, Rate: sluice.PerSecond(1_000_000)}
	empty := sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}
	keys := keysOfSlots(2)
	cases := []struct {
		name string
		rs   []sluice.Request
	}{
		{"take", []sluice.Request{{Policy: "burst", Key: keys[0], Cost: 1, Limit: l}}},
		{"one-slot", []sluice.Request{{Policy: "burst", Key: keys[0], Cost: 1, Limit: l}, {Policy: "daily", Key: keys[0], Cost: 1, Limit: l}}},
		{"two-slots", []sluice.Request{{Policy: "burst", Key: keys[0], Cost: 1, Limit: l}, {Policy: "daily", Key: keys[1], Cost: 1, Limit: l}}},
		{"two-slots-denied", []sluice.Request{{Policy: "burst", Key: keys[0], Cost: 1, Limit: l}, {Policy: "daily", Key: keys[1], Cost: 1, Limit: empty}}},
	}
	for _, callers := range []int{1, 64} {
		for _, tc := range cases {
			b.Run(fmt.Sprintf("%s/callers=%d", tc.name, callers), func(b *testing.B) {
				s := newStore(b, c, Options{})
				ctx := b.Context()
				denied := tc.name == "two-slots-denied"
				decide := func() error {
					if len(tc.rs) == 1 {
						_, err := s.Take(ctx, tc.rs[0])
						return err
					}
					md, err := s.TakeAll(ctx, tc.rs)
					if err == nil && md.Allowed == denied {
						err = fmt.Errorf("TakeAll = %+v", md)
					}
					return err
				}
				if denied { // empty the second slot's bucket
					if _, err := s.Take(ctx, tc.rs[1]); err != nil {
						b.Fatal(err)
					}
				}
				if err := decide(); err != nil { // load the script on each node
					b.Fatal(err)
				}
				b.ReportAllocs()
				var next atomic.Int64
				var wg sync.WaitGroup
				var firstErr atomic.Pointer[error]
				b.ResetTimer()
				start := time.Now()
				for range callers {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							if err := decide(); err != nil {
								firstErr.CompareAndSwap(nil, &err)
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				if p := firstErr.Load(); p != nil {
					b.Fatal(*p)
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
				if st := s.Stats(); (st.CrossSlotTakes > 0) != strings.HasPrefix(tc.name, "two-slots") || st.LostRefunds != 0 {
					b.Fatalf("Stats() = %+v for %s", st, tc.name)
				}
			})
		}
	}
}
