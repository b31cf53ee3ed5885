package sluicetest

import (
	"math/big"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// holdClock is a manual clock whose next reading can be held: the held call
// reads the time when it is made but returns only when released, as a
// store's goroutine that read the clock and then waited for a lock would.
type holdClock struct {
	mu      sync.Mutex
	now     time.Time
	armed   bool
	entered chan time.Time
	release chan struct{}
}

func newHoldClock(t time.Time) *holdClock {
	return &holdClock{now: t, entered: make(chan time.Time, 1), release: make(chan struct{})}
}

func (c *holdClock) Now() time.Time {
	c.mu.Lock()
	now, armed := c.now, c.armed
	c.armed = false
	c.mu.Unlock()
	if armed {
		c.entered <- now
		<-c.release
	}
	return now
}

func (c *holdClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// hold makes the next reading wait for release.
func (c *holdClock) hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = true
}

// testStaleReadingSweep: a take that read the clock, then waited while the
// clock moved on and a sweep dropped the bucket as full, must not recreate
// the bucket full at its earlier reading: that would grant a second burst
// within the refill time of one.
func (s Suite) testStaleReadingSweep(t *testing.T) {
	// Slow enough in real time that a store expiring keys by its own clock
	// (Redis) cannot drop the bucket while the test runs.
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(10, time.Hour)}
	s.skipRefused(t, l)
	c := newHoldClock(start)
	st := s.New(t, StoreOptions{Now: c.Now, OnLimitChange: sluice.KeepTokens, RequestIDTTL: time.Minute})
	ctx := t.Context()
	take := func(what string) sluice.Decision {
		t.Helper()
		d, err := st.Take(ctx, req("k", 10, l))
		if err != nil {
			t.Fatalf("%s: Take(%q, 10): %v", what, "k", err)
		}
		return d
	}
	if d := take("at 0"); !d.Allowed {
		t.Fatalf("at 0: Take(%q, 10) on a new bucket = %+v, want allowed", "k", d)
	}

	// A take reads tick 1 and is held; meanwhile the clock moves past the
	// time the bucket is full again and a sweep runs.
	c.set(start.Add(s.Tick))
	c.hold()
	held := make(chan sluice.Decision, 1)
	failed := make(chan error, 1)
	go func() {
		d, err := st.Take(ctx, req("k", 10, l))
		if err != nil {
			failed <- err
			return
		}
		held <- d
	}()
	select {
	case <-c.entered:
	case err := <-failed:
		t.Fatalf("held Take(%q, 10): %v", "k", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Take did not read StoreOptions.Now within 10s")
	}
	end := time.Hour + s.Tick
	c.set(start.Add(end))
	if s.Sweep != nil {
		// A store that reads the clock under the lock its sweep needs
		// cannot have a stale reading: the sweep then waits for the held
		// take, which is released after a while and runs first.
		swept := make(chan struct{})
		go func() {
			defer close(swept)
			s.Sweep(st)
		}()
		select {
		case <-swept:
			close(c.release)
		case <-time.After(time.Second):
			close(c.release)
			<-swept
		}
	} else {
		close(c.release)
	}
	var staleAllowed bool
	select {
	case d := <-held:
		staleAllowed = d.Allowed
	case err := <-failed:
		t.Fatalf("held Take(%q, 10): %v", "k", err)
	}
	fresh := take("at 1h+1 tick")

	allowed := int64(10)
	if staleAllowed {
		allowed += 10
	}
	if fresh.Allowed {
		allowed += 10
	}
	// Over [0, 1h+1 tick] at most the capacity plus the refill.
	if bound := l.Capacity + refilled(l, end); allowed > bound {
		t.Fatalf("over %v the store allowed %d tokens (stale take allowed: %v, fresh take allowed: %v), more than capacity %d plus refill %d",
			end, allowed, staleAllowed, fresh.Allowed, l.Capacity, bound-l.Capacity)
	}
}

// refilled returns the whole tokens l refills over d.
func refilled(l sluice.Limit, d time.Duration) int64 {
	x := new(big.Int).Mul(big.NewInt(int64(d)), big.NewInt(l.Rate.Tokens))
	return x.Quo(x, big.NewInt(int64(l.Rate.Period))).Int64()
}

// jitterClock is a clock that moves forwards in steps, each reading lagging
// the true time by a random amount: concurrent callers see readings out of
// order, as goroutines that read the clock and then wait do.
type jitterClock struct {
	tick     time.Duration
	base     atomic.Int64 // ticks since start
	maxLag   int64        // ticks
	min, max atomic.Int64 // the earliest and latest readings returned
}

func (c *jitterClock) Now() time.Time {
	at := c.base.Load()
	if c.maxLag > 0 {
		at = max(0, at-rand.Int64N(c.maxLag+1))
	}
	for m := c.min.Load(); at < m && !c.min.CompareAndSwap(m, at); m = c.min.Load() {
	}
	for m := c.max.Load(); at > m && !c.max.CompareAndSwap(m, at); m = c.max.Load() {
	}
	return start.Add(time.Duration(at) * c.tick)
}

// testConcurrentStaleSweeps: many goroutines take from two keys with clock
// readings that lag by up to three hours, the clock sometimes jumps past the
// time the buckets are full, and sweeps run all the while. No key may be
// allowed more than its capacity plus the refill between the earliest and
// the latest reading.
func (s Suite) testConcurrentStaleSweeps(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(10, time.Hour)}
	s.skipRefused(t, l)
	c := &jitterClock{tick: s.Tick, maxLag: int64(3 * time.Hour / s.Tick)}
	c.min.Store(1<<62 - 1)
	st := s.New(t, StoreOptions{Now: c.Now, OnLimitChange: sluice.KeepTokens, RequestIDTTL: time.Minute})
	ctx := t.Context()
	const keys = 2
	workers := min(s.Workers, 16)
	takes := max(200, s.TakesPerWorker/10)
	var (
		allowed [keys]atomic.Int64
		failed  atomic.Pointer[error]
		wg      sync.WaitGroup
		stop    = make(chan struct{})
		swept   sync.WaitGroup
	)
	if s.Sweep != nil {
		swept.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					s.Sweep(st)
				}
			}
		})
	}
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range takes {
				k := rng.IntN(keys)
				d, err := st.Take(ctx, req(string(rune('a'+k)), 1, l))
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
				switch rng.IntN(64) {
				case 0: // a little time: a tenth of a token
					c.base.Add(int64(6 * time.Minute / s.Tick / 10))
				case 1: // past the time to full
					c.base.Add(int64(90 * time.Minute / s.Tick))
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	swept.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("Take: %v", *err)
	}
	span := time.Duration(c.max.Load()-c.min.Load()) * s.Tick
	bound := l.Capacity + refilled(l, span)
	for k := range keys {
		if got := allowed[k].Load(); got > bound {
			t.Errorf("key %q: allowed %d over readings spanning %v, more than capacity %d plus refill %d",
				string(rune('a'+k)), got, span, l.Capacity, bound-l.Capacity)
		}
	}
}
