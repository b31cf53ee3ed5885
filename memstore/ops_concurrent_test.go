package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// keyInShard returns a key of policy, made from key0, whose bucket is
// (same) or is not in the shard of (policy0, key0).
func keyInShard(t *testing.T, s *memstore.Store, policy0, key0, policy string, same bool) string {
	t.Helper()
	want := memstore.ShardOf(s, policy0, key0)
	for i := range 1 << 20 {
		k := fmt.Sprint(key0, "-", i)
		if (memstore.ShardOf(s, policy, k) == want) == same {
			return k
		}
	}
	t.Fatalf("no key of policy %q found (same shard as %q/%q: %v)", policy, policy0, key0, same)
	return ""
}

// sweepWhile runs SweepNow in a loop until the returned stop is called,
// which waits for it.
func sweepWhile(s *memstore.Store) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
				s.SweepNow()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// waitOrFail waits for wg, failing t if that takes longer than any
// deadlock-free run would.
func waitOrFail(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not finish in 2 minutes: deadlocked?", what)
	}
}

// 64 goroutines flood a multi-take of two buckets (1000 and 300 tokens)
// with the clock frozen, half of them naming the buckets in the other
// order, while sweeps run and single takes hit the same shards: exactly
// 300 are allowed, each sees its own remaining tokens, and afterwards the
// buckets hold 700 and 0. Whether the two buckets share a shard or not, no
// multi-take is half done and none deadlocks.
func TestTakeAllConcurrentExact(t *testing.T) {
	big := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1000, time.Hour)}
	small := sluice.Limit{Capacity: 300, Rate: sluice.Per(300, time.Hour)}
	for _, layout := range []struct {
		name   string
		shards int
		same   bool
	}{{"one shard", 1, true}, {"two buckets in one of 256 shards", 256, true}, {"two shards", 256, false}} {
		t.Run(layout.name, func(t *testing.T) {
			s := newStore(t, memstore.Options{Now: newClock().Now, Shards: layout.shards, SweepInterval: -1})
			ctx := context.Background()
			user := keyInShard(t, s, "tenant", "acme", "user", layout.same)
			noise := keyInShard(t, s, "user", user, "noise", true)
			forward := []sluice.Request{rq("tenant", "acme", 1, big), rq("user", user, 1, small)}
			backward := []sluice.Request{forward[1], forward[0]}
			stop := sweepWhile(s)
			var (
				mu       sync.Mutex
				bigLeft  []int64
				userLeft []int64
				errs     []error
				wg       sync.WaitGroup
			)
			for w := range 64 {
				wg.Go(func() {
					rs, iBig := forward, 0
					if w%2 == 1 {
						rs, iBig = backward, 1
					}
					for i := range 20 {
						md, err := s.TakeAll(ctx, rs)
						if err == nil && i%4 == 0 {
							_, err = s.Take(ctx, rq("noise", noise, 1, big))
						}
						mu.Lock()
						if err != nil {
							errs = append(errs, err)
						} else if md.Allowed {
							bigLeft = append(bigLeft, md.Parts[iBig].Remaining)
							userLeft = append(userLeft, md.Parts[1-iBig].Remaining)
						}
						mu.Unlock()
					}
				})
			}
			waitOrFail(t, &wg, "64 goroutines of multi-takes")
			stop()
			if len(errs) > 0 {
				t.Fatalf("TakeAll failed %d times, first: %v", len(errs), errs[0])
			}
			if len(userLeft) != 300 {
				t.Fatalf("64×20 concurrent multi-takes of (1000, 300) allowed %d, want exactly 300", len(userLeft))
			}
			slices.Sort(bigLeft)
			slices.Sort(userLeft)
			for i := range 300 {
				if bigLeft[i] != int64(700+i) || userLeft[i] != int64(i) {
					t.Fatalf("allowed multi-takes saw a Remaining twice or not at all: sorted %d-th is (%d, %d), want (%d, %d)", i, bigLeft[i], userLeft[i], 700+i, i)
				}
			}
			for i, want := range []int64{700, 0} {
				q := forward[i]
				if d, err := s.Peek(ctx, q); err != nil || d.Remaining != want {
					t.Fatalf("after the flood, Peek(%s/%s) = %+v, %v; want Remaining %d", q.Policy, q.Key, d, err, want)
				}
			}
		})
	}
}

// Multi-takes that name two buckets of different shards in opposite orders
// never deadlock: each locks the shards in the order of their index.
func TestTakeAllLockOrder(t *testing.T) {
	s := newStore(t, memstore.Options{Now: newClock().Now, SweepInterval: -1})
	ctx := context.Background()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	b := keyInShard(t, s, "api", "a", "api", false)
	c := keyInShard(t, s, "api", b, "api", false)
	orders := [][]sluice.Request{
		{rq("api", "a", 1, l), rq("api", b, 1, l), rq("api", c, 1, l)},
		{rq("api", c, 1, l), rq("api", b, 1, l), rq("api", "a", 1, l)},
		{rq("api", b, 1, l), rq("api", "a", 1, l)},
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for range 20000 {
				if _, err := s.TakeAll(ctx, orders[w%len(orders)]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	waitOrFail(t, &wg, "multi-takes naming their buckets in opposite orders")
}

// tally counts, for one bucket, what concurrent calls took and gave back.
type tally struct{ taken, given atomic.Int64 }

// Every operation at once, on buckets sharing shards and not, with the
// clock moving (each call moves it on a little), buckets refilling to
// full and sweeps dropping them: two
// buckets decided only together, by multi-takes naming them in either
// order, always report the same level; and no bucket gives out more than
// its capacity, plus its refill, plus what was refunded to it.
func TestOpsConcurrentWithSweeps(t *testing.T) {
	var ticks atomic.Int64
	base := time.Unix(1_700_000_000, 0)
	now := func() time.Time { return base.Add(time.Duration(ticks.Load())) }
	for _, shards := range []int{1, 16} {
		t.Run(fmt.Sprint(shards, " shards"), func(t *testing.T) {
			ticks.Store(0)
			s := newStore(t, memstore.Options{Now: now, Shards: shards, SweepInterval: -1, RequestIDTTL: time.Hour})
			ctx := context.Background()
			pair := sluice.Limit{Capacity: 20, Rate: sluice.Per(20, 100*time.Millisecond)}
			lim := sluice.Limit{Capacity: 50, Rate: sluice.Per(50, 200*time.Millisecond)}
			// Pairs in one shard and (with 16 shards) in two.
			pairs := [][2]sluice.Request{
				{rq("pair", "x1", 1, pair), rq("pair", keyInShard(t, s, "pair", "x1", "pair", true), 1, pair)},
				{rq("pair", "x2", 1, pair), rq("pair", keyInShard(t, s, "pair", "x2", "pair", shards == 1), 1, pair)},
			}
			keys := []string{"z1", "z2", keyInShard(t, s, "lim", "z1", "lim", true), "z4"}
			tallies := make([]tally, len(keys))
			start := ticks.Load()
			stop := sweepWhile(s)
			var (
				mu   sync.Mutex
				errs []error
				wg   sync.WaitGroup
			)
			fail := func(err error) {
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
			}
			for w := range 16 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for i := range 1500 {
						ticks.Add(rng.Int64N(int64(100 * time.Microsecond)))
						k := rng.IntN(len(keys))
						q := rq("lim", keys[k], 1+rng.Int64N(lim.Capacity), lim)
						switch rng.IntN(7) {
						case 0:
							p := pairs[rng.IntN(len(pairs))]
							rs := []sluice.Request{p[0], p[1]}
							if rng.IntN(2) == 0 {
								rs[0], rs[1] = rs[1], rs[0]
							}
							md, err := s.TakeAll(ctx, rs)
							if err != nil {
								fail(err)
							} else if a, b := md.Parts[0], md.Parts[1]; a.Allowed != b.Allowed || a.Remaining != b.Remaining {
								fail(fmt.Errorf("multi-take of a pair decided its buckets apart: %+v", md))
							}
						case 1:
							j := rng.IntN(len(keys))
							if j == k {
								j = (j + 1) % len(keys)
							}
							q2 := rq("lim", keys[j], 1+rng.Int64N(lim.Capacity), lim)
							md, err := s.TakeAll(ctx, []sluice.Request{q, q2, rq("reset", "w", 1, lim)})
							if err != nil {
								fail(err)
							} else if md.Allowed {
								tallies[k].taken.Add(q.Cost)
								tallies[j].taken.Add(q2.Cost)
							}
						case 2:
							if d, err := s.Take(ctx, q); err != nil {
								fail(err)
							} else if d.Allowed {
								tallies[k].taken.Add(q.Cost)
							}
						case 3:
							q.Cost += rng.Int64N(lim.Capacity)
							if d, err := s.Drain(ctx, q); err != nil {
								fail(err)
							} else {
								tallies[k].taken.Add(d.Taken)
							}
						case 4:
							if d, err := s.Refund(ctx, q); err != nil {
								fail(err)
							} else {
								tallies[k].given.Add(-d.Taken)
							}
						case 5:
							// Undo a take by its ID, sometimes twice.
							q.RequestID = fmt.Sprint(w, "/", i)
							d, err := s.Take(ctx, q)
							if err != nil || !d.Allowed {
								if err != nil {
									fail(err)
								}
								break
							}
							tallies[k].taken.Add(q.Cost)
							q.Cost = 1 + rng.Int64N(q.Cost)
							for range 1 + rng.IntN(2) {
								if d, err := s.Refund(ctx, q); err != nil {
									fail(err)
								} else {
									tallies[k].given.Add(-d.Taken)
								}
							}
						case 6:
							if err := s.Reset(ctx, "reset", "w"); err != nil {
								fail(err)
							}
						}
					}
				})
			}
			waitOrFail(t, &wg, "16 goroutines of mixed operations")
			stop()
			if len(errs) > 0 {
				t.Fatalf("%d calls failed, first: %v", len(errs), errs[0])
			}
			elapsed := ticks.Load() - start
			for k, key := range keys {
				// capacity + elapsed*n/P + given, rounded down.
				refill := new(big.Int).Mul(big.NewInt(elapsed), big.NewInt(lim.Rate.Tokens))
				refill.Quo(refill, big.NewInt(int64(lim.Rate.Period)))
				bound := lim.Capacity + refill.Int64() + tallies[k].given.Load()
				if got := tallies[k].taken.Load(); got > bound {
					t.Errorf("bucket %q gave out %d tokens over %v, more than capacity %d + refill %d + refunded %d", key, got, time.Duration(elapsed), lim.Capacity, refill.Int64(), tallies[k].given.Load())
				}
				d, err := s.Peek(ctx, rq("lim", key, 1, lim))
				if err != nil || d.Remaining < 0 || d.Remaining > lim.Capacity {
					t.Errorf("Peek(%q) = %+v, %v; want a level within [0, %d]", key, d, err, lim.Capacity)
				}
			}
			st := s.Stats()
			if got := memstore.CountBuckets(s); got != st.Buckets {
				t.Errorf("the tables hold %d buckets, Stats says %d", got, st.Buckets)
			}
			if st.Reclaimed == 0 {
				t.Errorf("Stats() = %+v: sweeps dropped no bucket in %v; the test exercises none", st, time.Duration(elapsed))
			}
			t.Logf("%v on the clock, %+v", time.Duration(elapsed), st)
		})
	}
}

// Multi-takes of new keys flood a store at MaxKeys, with single takes and
// sweeps: the store never holds more than MaxKeys, every error is
// ErrTooManyKeys, nothing deadlocks, and the count of buckets stays true
// (a refused multi-take gives back the room it reserved).
func TestTakeAllConcurrentAtMaxKeys(t *testing.T) {
	for _, overflow := range []memstore.Overflow{memstore.RefuseNew, memstore.EvictLRU} {
		t.Run(overflow.String(), func(t *testing.T) {
			var ticks atomic.Int64
			now := func() time.Time { return time.Unix(1_700_000_000, ticks.Add(int64(time.Millisecond))) }
			s := newStore(t, memstore.Options{Now: now, MaxKeys: 64, Overflow: overflow, Shards: 4, SweepInterval: -1})
			ctx := context.Background()
			l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
			stop := sweepWhile(s)
			var (
				mu        sync.Mutex
				errs      []error
				refused   atomic.Int64
				allowedMT atomic.Int64
				wg        sync.WaitGroup
			)
			for w := range 8 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 2))
					for range 2000 {
						var err error
						if rng.IntN(3) == 0 {
							_, err = s.Take(ctx, rq("api", fmt.Sprint(rng.IntN(500)), 1, l))
						} else {
							rs := make([]sluice.Request, 1+rng.IntN(4))
							for i := range rs {
								rs[i] = rq("api", fmt.Sprint(rng.IntN(500)), 1+rng.Int64N(10), l)
							}
							var md sluice.MultiDecision
							md, err = s.TakeAll(ctx, rs)
							if errors.Is(err, sluice.ErrInvalidMulti) {
								continue // a key drawn twice
							}
							if err == nil && md.Allowed {
								allowedMT.Add(1)
							}
						}
						if n := s.Stats().Buckets; n > 64 {
							err = fmt.Errorf("Stats().Buckets = %d, more than MaxKeys 64", n)
						}
						switch {
						case errors.Is(err, sluice.ErrTooManyKeys):
							refused.Add(1)
						case err != nil:
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
					}
				})
			}
			waitOrFail(t, &wg, "8 goroutines flooding new keys")
			stop()
			if len(errs) > 0 {
				t.Fatalf("%d calls failed, first: %v", len(errs), errs[0])
			}
			st := s.Stats()
			if got := memstore.CountBuckets(s); got != st.Buckets || got > 64 {
				t.Fatalf("the tables hold %d buckets, Stats says %d; want equal, at most 64", got, st.Buckets)
			}
			if allowedMT.Load() == 0 {
				t.Fatalf("no multi-take was allowed (%d refused); the test exercises nothing", refused.Load())
			}
			t.Logf("%d multi-takes allowed, %d calls refused, %+v", allowedMT.Load(), refused.Load(), st)
		})
	}
}
