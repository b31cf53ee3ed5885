package guard_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
)

// nonBlocking is a store that reports itself guard.NonBlocking.
type nonBlocking struct{ sluice.Store }

func (nonBlocking) NonBlocking() bool { return true }

// mayBlock is a store that does not implement guard.NonBlocking, whatever
// the store it wraps does.
type mayBlock struct{ sluice.Store }

// BenchmarkTake measures what the guard adds to a store's Take: the store
// here is memstore, so the numbers are the guard's own cost. "guard" wraps
// memstore as it is; "guard-goroutine" runs each call on a goroutine of its
// own with the guard's deadline, as for a store that may block;
// "guard-nonblocking" calls the store on the caller's goroutine, as for a
// store that implements guard.NonBlocking.
func BenchmarkTake(b *testing.B) {
	l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 40)}
	ms := newMemstore(b, memstore.Options{})
	for _, bc := range []struct {
		name  string
		store sluice.Store
	}{
		{"memstore", ms},
		{"guard", mustNew(b, ms, guard.Options{})},
		{"guard-goroutine", mustNew(b, mayBlock{ms}, guard.Options{})},
		{"guard-nonblocking", mustNew(b, nonBlocking{ms}, guard.Options{})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l}
			b.ReportAllocs()
			for b.Loop() {
				bc.store.Take(ctx, r)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: l}
				for pb.Next() {
					bc.store.Take(ctx, r)
				}
			})
		})
	}
}

// BenchmarkTakeAll measures what the guard adds to a multi-take of two
// buckets, as BenchmarkTake does for a take.
func BenchmarkTakeAll(b *testing.B) {
	l := sluice.Limit{Capacity: 1 << 40, Rate: sluice.PerSecond(1 << 40)}
	ms := newMemstore(b, memstore.Options{})
	for _, bc := range []struct {
		name  string
		store sluice.Operator
	}{
		{"memstore", ms},
		{"guard", mustNew(b, ms, guard.Options{})},
		{"guard-goroutine", mustNew(b, mayBlockOps{ms}, guard.Options{})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rs := []sluice.Request{{Policy: "a", Key: "k", Cost: 1, Limit: l}, {Policy: "b", Key: "k", Cost: 1, Limit: l}}
			b.ReportAllocs()
			for b.Loop() {
				bc.store.TakeAll(ctx, rs)
			}
		})
	}
}

// mayBlockOps is an Operator that does not implement guard.NonBlocking,
// whatever the store it wraps does.
type mayBlockOps struct{ sluice.Operator }
