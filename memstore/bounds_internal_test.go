package memstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// examined returns how many buckets the store's inserts have examined
// looking for one to reclaim.
func (s *Store) examined() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.examined
		sh.mu.Unlock()
	}
	return n
}

// A new key refused at MaxKeys does bounded work however many buckets the
// store holds: it examines at most reclaimBudget of them looking for a full
// one, even when every shard's bound on its next full bucket has passed (as
// it does while the buckets keep being taken).
func TestRefusedInsertWorkBounded(t *testing.T) {
	for _, n := range []int{1 << 10, 1 << 14} {
		t.Run(fmt.Sprint(n, " buckets"), func(t *testing.T) {
			base := time.Unix(1_700_000_000, 0)
			s, err := New(Options{Now: func() time.Time { return base }, MaxKeys: n, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			l := sluice.Limit{Capacity: 100, Rate: sluice.Per(1, time.Hour)}
			for i := range n {
				if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: fmt.Sprint("k", i), Cost: 1, Limit: l}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range s.shards {
				s.shards[i].minFull.Store(math.MinInt64)
			}
			before := s.examined()
			for i := range 3 {
				r := sluice.Request{Policy: "test", Key: fmt.Sprint("new", i), Cost: 1, Limit: l}
				if _, err := s.Take(ctx, r); !errors.Is(err, sluice.ErrTooManyKeys) {
					t.Fatalf("Take(%q) at MaxKeys error %v, want ErrTooManyKeys", r.Key, err)
				}
				if got := s.examined() - before; got > reclaimBudget {
					t.Fatalf("refused insert %d examined %d buckets, want at most %d", i, got, reclaimBudget)
				}
				before = s.examined()
			}
		})
	}
}

// BenchmarkTakeRefusedAtMaxKeys measures a new key refused at MaxKeys in
// the worst case for an insert's work: a million buckets, none full, and
// every shard's bound on its next full bucket passed (as it is while the
// buckets keep being taken), so that the insert may look for a bucket to
// reclaim in any shard. Each op also marks the 256 bounds passed again.
func BenchmarkTakeRefusedAtMaxKeys(b *testing.B) {
	const n = 1 << 20
	var tick int64
	s, err := New(Options{Now: func() time.Time { return time.Unix(0, tick) }, MaxKeys: n, SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := sluice.Limit{Capacity: 100, Rate: sluice.Per(1, time.Hour)}
	var k [16]byte
	copy(k[:], "user:")
	for i := range n {
		binary.BigEndian.PutUint64(k[8:], uint64(i)*0x9E3779B97F4A7C15)
		if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: string(k[:]), Cost: 1, Limit: l}); err != nil {
			b.Fatal(err)
		}
	}
	tick = int64(time.Minute)
	r := sluice.Request{Policy: "test", Key: "a-new-key", Cost: 1, Limit: l}
	b.ReportAllocs()
	for b.Loop() {
		for i := range s.shards {
			s.shards[i].minFull.Store(math.MinInt64)
		}
		if _, err := s.Take(ctx, r); !errors.Is(err, sluice.ErrTooManyKeys) {
			b.Fatalf("Take(new key) error %v, want ErrTooManyKeys", err)
		}
	}
}
