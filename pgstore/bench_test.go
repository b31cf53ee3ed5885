package pgstore_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

// BenchmarkTake measures decisions with 16 concurrent callers on 16
// connections, on spread keys (1M) and on one hot key, with
// synchronous_commit on (every decision durable at commit) and off. It
// reports decisions/s. Run it with -benchtime=5s or more:
//
//	go test -run '^$' -bench 'BenchmarkTake$' -benchtime 5s ./pgstore/
func BenchmarkTake(b *testing.B) {
	for _, sync := range []string{"on", "off"} {
		cfg := testPool.Config()
		cfg.MaxConns = 16
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = sync
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		s, _ := newStoreOn(b, pool, pgstore.Options{StatementTimeout: 10 * time.Second, LockTimeout: 10 * time.Second})
		l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 30)}
		for _, keys := range []int{1 << 20, 1} {
			name := "spread"
			if keys == 1 {
				name = "hot"
			}
			b.Run(name+"/synchronous_commit="+sync, func(b *testing.B) {
				var n atomic.Int64
				b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						k := n.Add(1) % int64(keys)
						if _, err := s.Take(ctx, sluice.Request{Key: "key" + strconv.FormatInt(k, 10), Cost: 1, Limit: l}); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
		pool.Close()
	}
}
