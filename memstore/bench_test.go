package memstore_test

import (
	"context"
	"encoding/binary"
	"math/rand"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

var benchLimit = sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1_000_000_000)}

// benchKeys returns n distinct 16-byte keys.
func benchKeys(n int) []string {
	keys := make([]string, n)
	var b [16]byte
	copy(b[:], "user:")
	for i := range keys {
		binary.BigEndian.PutUint64(b[8:], uint64(i)*0x9E3779B97F4A7C15)
		keys[i] = string(b[:])
	}
	return keys
}

func BenchmarkTakeHotKey(b *testing.B) {
	s := newStore(b, memstore.Options{})
	ctx := context.Background()
	r := sluice.Request{Policy: "test", Key: "hot-key-16-bytes", Cost: 1, Limit: benchLimit}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Take(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTakeHotKeyParallel(b *testing.B) {
	s := newStore(b, memstore.Options{})
	ctx := context.Background()
	r := sluice.Request{Policy: "test", Key: "hot-key-16-bytes", Cost: 1, Limit: benchLimit}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Take(ctx, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchSpread takes from keys[next()] in parallel over 1M existing keys.
func benchSpread(b *testing.B, zipf bool) {
	const n = 1 << 20
	keys := benchKeys(n)
	s := newStore(b, memstore.Options{MaxKeys: n})
	ctx := context.Background()
	for _, k := range keys {
		if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: k, Cost: 1, Limit: benchLimit}); err != nil {
			b.Fatal(err)
		}
	}
	// Pre-drawn index sequences keep the random generator out of the loop.
	seq := make([]uint32, 1<<22)
	rng := rand.New(rand.NewSource(1))
	z := rand.NewZipf(rng, 1.1, 1, n-1)
	for i := range seq {
		if zipf {
			seq[i] = uint32(z.Uint64())
		} else {
			seq[i] = uint32(rng.Intn(n))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var worker atomic.Uint32
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)*7919) & (len(seq) - 1)
		for pb.Next() {
			if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: keys[seq[i]], Cost: 1, Limit: benchLimit}); err != nil {
				b.Error(err)
				return
			}
			i = (i + 1) & (len(seq) - 1)
		}
	})
}

func BenchmarkTakeUniform1M(b *testing.B) { benchSpread(b, false) }
func BenchmarkTakeZipf1M(b *testing.B)    { benchSpread(b, true) }

// BenchmarkTakeAllTwo decides two buckets in one multi-take: the same two
// keys every time (HotKeys, and in parallel), or two neighbouring keys of
// 1M existing ones drawn at random, in parallel (Uniform1M, the multi-take
// counterpart of BenchmarkTakeUniform1M).
func BenchmarkTakeAllTwo(b *testing.B) {
	ctx := context.Background()
	hot := []sluice.Request{
		{Policy: "test", Key: "hot-key-16-bytes", Cost: 1, Limit: benchLimit},
		{Policy: "user", Key: "hot-key-16-bytes", Cost: 1, Limit: benchLimit},
	}
	b.Run("HotKeys", func(b *testing.B) {
		s := newStore(b, memstore.Options{})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.TakeAll(ctx, hot); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("HotKeysParallel", func(b *testing.B) {
		s := newStore(b, memstore.Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.TakeAll(ctx, hot); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Uniform1M", func(b *testing.B) {
		const n = 1 << 20
		keys := benchKeys(n)
		s := newStore(b, memstore.Options{MaxKeys: n})
		for _, k := range keys {
			if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: k, Cost: 1, Limit: benchLimit}); err != nil {
				b.Fatal(err)
			}
		}
		seq := make([]uint32, 1<<22)
		rng := rand.New(rand.NewSource(1))
		for i := range seq {
			seq[i] = uint32(rng.Intn(n))
		}
		b.ReportAllocs()
		b.ResetTimer()
		var worker atomic.Uint32
		b.RunParallel(func(pb *testing.PB) {
			i := int(worker.Add(1)*7919) & (len(seq) - 1)
			rs := make([]sluice.Request, 2)
			for pb.Next() {
				k := seq[i]
				rs[0] = sluice.Request{Policy: "test", Key: keys[k], Cost: 1, Limit: benchLimit}
				rs[1] = sluice.Request{Policy: "test", Key: keys[k^1], Cost: 1, Limit: benchLimit}
				if _, err := s.TakeAll(ctx, rs); err != nil {
					b.Error(err)
					return
				}
				i = (i + 1) & (len(seq) - 1)
			}
		})
	})
}
