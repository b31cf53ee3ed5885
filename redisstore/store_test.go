package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestConcurrentOneKeyRedisTime: 64 goroutines × 1,000 takes on one key of
// capacity 1,000 refilling 1 token an hour, on Redis TIME: exactly 1,000
// are allowed (the refill during the test is far below one token), each
// seeing a distinct Remaining.
func TestConcurrentOneKeyRedisTime(t *testing.T) {
	const workers, takes = 64, 1000
	l := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1, time.Hour)}
	for name, c := range topologies(t) {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				s := newStore(t, c, Options{Batch: batch})
				ctx := t.Context()
				var (
					wg      sync.WaitGroup
					allowed atomic.Int64
					failed  atomic.Int64
					seen    [1000]atomic.Int32
					firstMu sync.Mutex
					first   error
				)
				for range workers {
					wg.Go(func() {
						for range takes {
							d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "hot", Cost: 1, Limit: l})
							if err != nil {
								failed.Add(1)
								firstMu.Lock()
								first = cmp.Or(first, err)
								firstMu.Unlock()
								continue
							}
							if d.Allowed {
								allowed.Add(1)
								seen[d.Remaining].Add(1)
							}
						}
					})
				}
				wg.Wait()
				if n := failed.Load(); n > 0 {
					t.Fatalf("%d of %d takes failed, first: %v", n, workers*takes, first)
				}
				if got := allowed.Load(); got != l.Capacity {
					t.Fatalf("%d×%d concurrent Take(1) of capacity %d allowed %d, want %d", workers, takes, l.Capacity, got, l.Capacity)
				}
				for rem := range seen {
					if n := seen[rem].Load(); n != 1 {
						t.Fatalf("Remaining %d was seen by %d allowed takes, want 1", rem, n)
					}
				}
				// Batching shares round trips: 64 callers should fill
				// pipelines far beyond one decision each.
				if p := s.Stats().Pipelines; batch > 1 && (p == 0 || p > workers*takes/4) {
					t.Errorf("%d decisions went in %d pipelines; want between 1 and a quarter of them", workers*takes, p)
				}
				// One hot key: most takes share a script call.
				if sh := s.Stats().SharedTakes; batch > 1 && sh < workers*takes/2 {
					t.Errorf("%d of %d takes of one key shared a script call; want at least half", sh, workers*takes)
				}
			})
		}
	}
}

// TestRefillRedisTime: on Redis TIME, C = 100 refilling 1,000 a second,
// 8 goroutines taking for about a second admit the capacity plus what the
// server's clock says refilled: between C + floor(r·T_inner) − 1 and
// C + ceil(r·T_outer), with T_inner between the end of the first take and
// the end of the workers, the bucket drained at both ends, and T_outer
// from before the first take to after the last, both read from TIME.
func TestRefillRedisTime(t *testing.T) {
	const workers, runFor = 8, time.Second
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	l := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1000)}
	serverTime := func() time.Time {
		t.Helper()
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	take := func(cost int64) bool {
		d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: cost, Limit: l})
		if err != nil {
			t.Error(err)
		}
		return d.Allowed
	}
	// Drain the new bucket, so that it stays far below its capacity (and no
	// refill is lost to the cap) while the workers take.
	outerStart := serverTime()
	if !take(l.Capacity) {
		t.Fatal("the first take of the whole capacity was denied")
	}
	admitted := l.Capacity
	innerStart := serverTime()
	var (
		wg sync.WaitGroup
		n  atomic.Int64
	)
	deadline := time.Now().Add(runFor)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if take(1) {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	innerEnd := serverTime()
	for take(1) { // whatever refilled until now, less than a token left
		admitted++
	}
	outerEnd := serverTime()
	admitted += n.Load()
	rate := float64(l.Rate.Tokens) / l.Rate.Period.Seconds()
	lo := l.Capacity + int64(rate*innerEnd.Sub(innerStart).Seconds()) - 1
	hi := l.Capacity + int64(math.Ceil(rate*outerEnd.Sub(outerStart).Seconds()))
	if admitted < lo || admitted > hi {
		t.Fatalf("admitted %d, want between %d and %d (C + refill over %v inside, %v outside)", admitted, lo, hi, innerEnd.Sub(innerStart), outerEnd.Sub(outerStart))
	}
	t.Logf("admitted %d, within [%d, %d]", admitted, lo, hi)
}

// TestFloodExpires: after 100,000 distinct keys every bucket key has a TTL
// no longer than its refill time plus a millisecond, and once that time
// has passed no key is left.
func TestFloodExpires(t *testing.T) {
	const keys, workers = 100_000, 32
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	// Cost 3 of 10 at 10 a second: full again after 300ms.
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(10)}
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs atomic.Int64
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= keys {
					return
				}
				d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("user-", i), Cost: 3, Limit: l})
				if err != nil || !d.Allowed || d.ResetAfter != 300*time.Millisecond {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if n := errs.Load(); n > 0 {
		t.Fatalf("%d of %d takes failed or were not allowed with a 300ms reset", n, keys)
	}
	t.Logf("%d distinct keys in %v (%.0f decisions/s)", keys, took, keys/took.Seconds())

	// Every key still there has a TTL of at most 301ms.
	live, err := scanKeys(ctx, c, s.prefix)
	if err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	ttls := make([]*redis.DurationCmd, len(live))
	for i, k := range live {
		ttls[i] = pipe.PTTL(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	for i, cmd := range ttls {
		// A key that expired between SCAN and PTTL reports -2.
		if d := cmd.Val(); d == -1 || d > 301*time.Millisecond {
			t.Fatalf("PTTL %q = %v, want between 0 and 301ms (-2 if it just expired)", live[i], d)
		}
	}
	t.Logf("%d of %d bucket keys live after the flood, all with a TTL of at most 301ms", len(live), keys)

	// 301ms after the last take every bucket is full, so none is left.
	time.Sleep(400 * time.Millisecond)
	if live, err := scanKeys(ctx, c, s.prefix); err != nil || len(live) != 0 {
		t.Fatalf("400ms after the flood %d keys are left (%v), want 0", len(live), err)
	}
}

// TestTTLs: a bucket key expires 1ms after its bucket is full again, rounded
// up to a millisecond; a request-ID record after its TTL; a bucket that never
// refills never expires.
func TestTTLs(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{RequestIDTTL: 90 * time.Second})
	tests := []struct {
		name string
		req  sluice.Request
		key  string
		want time.Duration // -1: no expiry
	}{
		{"3 of 10 at 3/s", sluice.Request{Policy: testPolicy, Key: "a", Cost: 3, Limit: sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(3)}}, s.bucketKey(testPolicy, "a"), 1001 * time.Millisecond},
		{"1 of 1 per 7µs", sluice.Request{Policy: testPolicy, Key: "b", Cost: 1, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(7 * time.Microsecond)}}, s.bucketKey(testPolicy, "b"), 2 * time.Millisecond},
		{"1 of 5 per hour", sluice.Request{Policy: testPolicy, Key: "c", Cost: 1, Limit: sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Hour)}}, s.bucketKey(testPolicy, "c"), time.Hour + time.Millisecond},
		{"no refill", sluice.Request{Policy: testPolicy, Key: "d", Cost: 1, Limit: sluice.Limit{Capacity: 5, Rate: sluice.Per(0, time.Second)}}, s.bucketKey(testPolicy, "d"), -1},
		{"request-ID record", sluice.Request{Policy: testPolicy, Key: "e", Cost: 1, Limit: sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}, RequestID: "r"}, s.recordKey(testPolicy, "e", "r"), 90*time.Second + time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			if _, err := s.Take(ctx, tt.req); err != nil {
				t.Fatal(err)
			}
			got, err := c.PTTL(ctx, tt.key).Result()
			if err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(start)
			if tt.want < 0 {
				if got != -1 {
					t.Errorf("PTTL = %v, want -1 (no expiry)", got)
				}
				return
			}
			// PTTL counts down in real time: allow the time measured around
			// the take and the PTTL (a loaded machine may take milliseconds),
			// plus Redis's rounding to whole milliseconds.
			if got == -2 && elapsed+time.Millisecond >= tt.want {
				return // already expired, as it should be by now
			}
			if got > tt.want || got < tt.want-elapsed-time.Millisecond {
				t.Errorf("PTTL = %v, want %v less at most %v (the time around the take)", got, tt.want, elapsed+time.Millisecond)
			}
		})
	}
}

// TestScriptFlushDuringLoad: SCRIPT FLUSH every 100ms while 16 goroutines
// decide fails no decision (EVALSHA falls back to EVAL on NOSCRIPT), and
// the decisions stay exact.
func TestScriptFlushDuringLoad(t *testing.T) {
	const workers, runFor = 16, 1500 * time.Millisecond
	for name, c := range topologies(t) {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				ctx := t.Context()
				s := newStore(t, c, Options{Batch: batch})
				l := sluice.Limit{Capacity: 1_000_000, Rate: sluice.Per(1, time.Hour)}
				stop := make(chan struct{})
				var flushes, failed, decided atomic.Int64
				var firstErr atomic.Value
				var flusher sync.WaitGroup
				flusher.Go(func() {
					tick := time.NewTicker(100 * time.Millisecond)
					defer tick.Stop()
					for {
						select {
						case <-stop:
							return
						case <-tick.C:
							err := forEachNode(ctx, c, func(ctx context.Context, n redis.Cmdable) error { return n.ScriptFlush(ctx).Err() })
							if err != nil {
								firstErr.CompareAndSwap(nil, fmt.Errorf("SCRIPT FLUSH: %w", err))
							}
							flushes.Add(1)
						}
					}
				})
				var wg sync.WaitGroup
				deadline := time.Now().Add(runFor)
				for w := range workers {
					wg.Go(func() {
						for i := 0; time.Now().Before(deadline); i++ {
							_, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("k", (w*7+i)%50), Cost: 1, Limit: l})
							if err != nil {
								failed.Add(1)
								firstErr.CompareAndSwap(nil, err)
							}
							decided.Add(1)
						}
					})
				}
				wg.Wait()
				close(stop)
				flusher.Wait()
				if n := failed.Load(); n > 0 {
					t.Fatalf("%d of %d decisions failed during %d SCRIPT FLUSHes, first: %v", n, decided.Load(), flushes.Load(), firstErr.Load())
				}
				if err, _ := firstErr.Load().(error); err != nil {
					t.Fatal(err)
				}
				if flushes.Load() < 10 {
					t.Fatalf("only %d SCRIPT FLUSHes ran", flushes.Load())
				}
				// Each flush made at most one EVAL per node necessary for
				// every caller that saw NOSCRIPT; at least one reload follows
				// the flushes that happened while decisions ran.
				if n := s.Stats().ScriptLoads; n == 0 || n > uint64(decided.Load()) {
					t.Errorf("Stats().ScriptLoads = %d after %d flushes and %d decisions; want between 1 and the decisions", n, flushes.Load(), decided.Load())
				}
				// Every decision was allowed and counted once: the 50 keys hold
				// capacity minus their share.
				var left int64
				for k := range 50 {
					d, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("k", k), Cost: 1, Limit: l})
					if err != nil {
						t.Fatal(err)
					}
					left += l.Capacity - d.Remaining
				}
				if left != decided.Load() {
					t.Fatalf("the buckets lost %d tokens in all, want %d (one per decision)", left, decided.Load())
				}
				t.Logf("%d decisions, %d SCRIPT FLUSHes, 0 failed", decided.Load(), flushes.Load())
			})
		}
	}
}

// TestNoRetryAfterLostReply: when the connection drops after the script
// ran but before its reply arrived, the decision fails once and the bucket
// is charged once, even on a client left at go-redis's default of 3
// retries. The same command sent without the store's no-retry mark runs 4
// times through the same proxy, which shows what the mark prevents.
func TestNoRetryAfterLostReply(t *testing.T) {
	ctx := t.Context()
	direct := redistest.Client(t)
	p := newDropProxy(t, redistest.Options(t).Addr)
	o := redistest.Options(t)
	o.Addr = p.addr() // MaxRetries left at its default (3)
	viaProxy := redis.NewClient(o)
	t.Cleanup(func() { viaProxy.Close() })

	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	var s *Store
	for _, batch := range batchModes {
		prefix := newPrefix(t, direct)
		var err error
		s, err = New(viaProxy, Options{Prefix: prefix, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		// Load the script while replies still get through.
		p.dropScriptReplies.Store(false)
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "warm", Cost: 1, Limit: l}); err != nil {
			t.Fatal(err)
		}

		p.dropScriptReplies.Store(true)
		p.scripts.Store(0)
		d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
		if err == nil {
			t.Fatalf("batch %d: Take through a proxy that drops the reply = %+v, nil; want an error", batch, d)
		}
		if n := p.scripts.Load(); n != 1 {
			t.Errorf("batch %d: the store sent the script %d times, want 1", batch, n)
		}
		s2, err := New(direct, Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := s2.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l}); err != nil || d.Remaining != 9 {
			t.Errorf("batch %d: Peek after the lost reply = %+v, %v; want 9 remaining (charged once)", batch, d, err)
		}
	}

	// The control: an ordinary command is retried by go-redis.
	p.scripts.Store(0)
	args := []any{"evalsha", scriptSHA, 1, s.bucketKey(testPolicy, "k"), "take", "redis", 10, 1, 3600000000, 1, 3600000000, 1, 0, 0, 0}
	if err := viaProxy.Do(ctx, args...).Err(); err == nil {
		t.Fatal("an ordinary EVALSHA through the proxy succeeded; the proxy drops nothing")
	}
	if n := p.scripts.Load(); n != 4 {
		t.Errorf("an ordinary EVALSHA was sent %d times, want 4 (1 + go-redis's 3 retries)", n)
	}
}

// dropProxy forwards TCP connections to a Redis server; while
// dropScriptReplies is set, it closes a connection instead of forwarding the
// reply to an EVAL or EVALSHA, which the server has run.
type dropProxy struct {
	ln                net.Listener
	target            string
	dropScriptReplies atomic.Bool
	scripts           atomic.Int64 // EVAL and EVALSHA commands forwarded
	wg                sync.WaitGroup
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target}
	var mu sync.Mutex
	var conns []net.Conn
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			p.wg.Go(func() { p.serve(in, out) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *dropProxy) addr() string { return p.ln.Addr().String() }

// serve copies one connection both ways. Commands are small and go-redis
// sends one at a time here, so one read holds one command.
func (p *dropProxy) serve(in, out net.Conn) {
	defer in.Close()
	defer out.Close()
	var script atomic.Bool // the command in flight is a script
	p.wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := in.Read(buf)
			if err != nil {
				out.Close()
				return
			}
			lower := strings.ToLower(string(buf[:n]))
			if strings.Contains(lower, "\r\nevalsha\r\n") || strings.Contains(lower, "\r\neval\r\n") {
				p.scripts.Add(1)
				script.Store(true)
			}
			if _, err := out.Write(buf[:n]); err != nil {
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for {
		n, err := out.Read(buf)
		if err != nil {
			return
		}
		if script.Swap(false) && p.dropScriptReplies.Load() {
			return // the script ran; its reply is lost
		}
		if _, err := in.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestNewOptions: a bad option is an error wrapping sluice.ErrInvalidOption
// that names it, never repaired; New does no I/O.
func TestNewOptions(t *testing.T) {
	c := offline(t)
	tests := []struct {
		name string
		o    Options
		want string // the option named in the error; "" for accepted
	}{
		{"zero", Options{}, ""},
		{"prefix with {", Options{Prefix: "a{"}, "Prefix"},
		{"prefix with }", Options{Prefix: "}"}, "Prefix"},
		{"unknown conversion", Options{OnLimitChange: 7}, "OnLimitChange"},
		{"negative request-ID TTL", Options{RequestIDTTL: -1}, "RequestIDTTL"},
		{"request-ID TTL beyond 2^53 µs", Options{RequestIDTTL: 286 * 365 * 24 * time.Hour}, "RequestIDTTL"},
		{"request-ID TTL of 2^53 - 1 µs", Options{RequestIDTTL: (1<<53 - 1) * time.Microsecond}, ""},
		{"negative minimum TTL", Options{MinTTL: -time.Second}, "MinTTL"},
		{"negative batch", Options{Batch: -1}, "Batch"},
		{"negative pipelines", Options{Pipelines: -1}, "Pipelines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(c, tt.o)
			if tt.want == "" {
				if err != nil || s == nil {
					t.Fatalf("New(%+v) = %v, %v; want a store", tt.o, s, err)
				}
				return
			}
			if !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New(%+v) = %v, %v; want an error wrapping %v that names %s", tt.o, s, err, sluice.ErrInvalidOption, tt.want)
			}
		})
	}
	if s, err := New(c, Options{}); err != nil || s.prefix != DefaultPrefix || s.idTTL != int64(DefaultRequestIDTTL/time.Microsecond) {
		t.Errorf("New(zero Options) = %+v, %v; want the default prefix and request-ID TTL", s, err)
	}
	// Batching needs pipelines: a client with only Process cannot batch.
	if s, err := New(processOnly{c}, Options{Batch: 2}); !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), "Batch") {
		t.Errorf("New(a client without Pipeline, Batch 2) = %v, %v; want an error wrapping %v that names Batch", s, err, sluice.ErrInvalidOption)
	}
	if _, err := New(processOnly{c}, Options{Batch: 1}); err != nil {
		t.Errorf("New(a client without Pipeline, Batch 1) = %v; want a store (1 is no batching)", err)
	}
	// The default batches when the client can, and otherwise does not.
	for _, tt := range []struct {
		name    string
		client  Client
		o       Options
		batched int
	}{
		{"default with pipelines", c, Options{}, DefaultBatch},
		{"default without pipelines", processOnly{c}, Options{}, 0},
		{"batch 1", c, Options{Batch: 1}, 0},
		{"batch 2", c, Options{Batch: 2}, 2},
	} {
		s, err := New(tt.client, tt.o)
		if err != nil {
			t.Errorf("%s: New = %v", tt.name, err)
			continue
		}
		got := 0
		if s.batch != nil {
			got = s.batch.max
		}
		if got != tt.batched {
			t.Errorf("%s: batches of %d; want %d (0: none)", tt.name, got, tt.batched)
		}
	}
	if s, err := New(nil, Options{}); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("New(nil, ...) = %v, %v; want an error wrapping %v", s, err, sluice.ErrInvalidOption)
	}
}

// TestExplicitTimeRange: an explicit time outside the store's range fails
// the call before anything is sent.
func TestExplicitTimeRange(t *testing.T) {
	l := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	for _, at := range []time.Time{time.Date(2019, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(2306, 1, 1, 0, 0, 0, 0, time.UTC)} {
		s, err := New(offline(t), Options{Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := s.Take(context.Background(), sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l}); err == nil || !strings.Contains(err.Error(), "outside the store's range") {
			t.Errorf("Take at %v = %+v, %v; want a range error", at, d, err)
		}
	}
}

// TestStatsScriptLoads: after SCRIPT FLUSH the first decision sends the
// script in full, once; the next one runs it by digest.
func TestStatsScriptLoads(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint64{1, 1} {
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l}); err != nil {
			t.Fatal(err)
		}
		if got := s.Stats().ScriptLoads; got != want {
			t.Fatalf("after take %d: Stats().ScriptLoads = %d, want %d", i+1, got, want)
		}
	}
}

// TestBatchWithdrawsQueued: with batching, a decision still queued behind a
// pipeline in flight when its context ends is withdrawn unsent (its bucket
// is never charged), and the decisions in flight complete.
func TestBatchWithdrawsQueued(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{Batch: 64})
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	var wg sync.WaitGroup
	wg.Go(func() { keepBusy(t, c) })
	time.Sleep(50 * time.Millisecond)
	var first sluice.Decision
	var firstErr error
	wg.Go(func() { first, firstErr = s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "a", Cost: 1, Limit: l}) })
	time.Sleep(100 * time.Millisecond) // "a" is in flight, waiting for Redis
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := s.Take(short, sluice.Request{Policy: testPolicy, Key: "b", Cost: 1, Limit: l}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Take past its deadline = %+v, %v; want context.DeadlineExceeded", d, err)
	}
	wg.Wait()
	if firstErr != nil || !first.Allowed || first.Remaining != 9 {
		t.Fatalf("the Take in flight = %+v, %v; want allowed with 9 remaining", first, firstErr)
	}
	if n, err := c.Exists(ctx, s.bucketKey(testPolicy, "b")).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS of the withdrawn take's bucket = %d, %v; want 0 (never sent)", n, err)
	}
	// "a" went alone, as the first caller's command does; a pipeline would
	// have carried "b".
	if p := s.Stats().Pipelines; p != 0 {
		t.Fatalf("Stats().Pipelines = %d, want 0 (the withdrawn take was never sent)", p)
	}
}

// processOnly is a Client that is not a Pipeliner.
type processOnly struct{ c *redis.Client }

func (p processOnly) Process(ctx context.Context, cmd redis.Cmder) error {
	return p.c.Process(ctx, cmd)
}

// TestBatchSharesAcrossKeys: with batching, takes of distinct keys share
// script calls on a standalone server (one call may touch any keys) and
// never on a cluster (a call's keys must share a slot), and each decision
// is its own: every key of capacity 2 is charged by its single take.
func TestBatchSharesAcrossKeys(t *testing.T) {
	const workers, takes = 64, 50
	l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
	for name, c := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := newStore(t, c, Options{Batch: 64})
			var wg sync.WaitGroup
			var bad atomic.Int64
			var firstErr atomic.Pointer[error]
			for w := range workers {
				wg.Go(func() {
					for i := range takes {
						d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprintf("w%d-%d", w, i), Cost: 1, Limit: l})
						if err != nil {
							firstErr.CompareAndSwap(nil, &err)
							return
						}
						if !d.Allowed || d.Remaining != 1 {
							bad.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if p := firstErr.Load(); p != nil {
				t.Fatal(*p)
			}
			if n := bad.Load(); n != 0 {
				t.Fatalf("%d first takes of fresh keys were not allowed with 1 remaining", n)
			}
			shared := s.Stats().SharedTakes
			if name == "cluster" && shared != 0 {
				t.Fatalf("on a cluster %d takes of distinct keys shared a script call; want 0", shared)
			}
			if name != "cluster" && shared == 0 {
				t.Fatalf("on a standalone server no take of %d shared a script call", workers*takes)
			}
			t.Logf("%d takes, %d shared a call, %d pipelines", workers*takes, shared, s.Stats().Pipelines)
		})
	}
}

// TestRestartDuringLoad: Redis restarts (a crash without persistence: the
// script cache and the buckets are lost) in the middle of load from 8
// callers. Decisions may fail while it is down; none fails for want of the
// script afterwards (the callers that meet NOSCRIPT share one SCRIPT
// LOAD, and only one happens), the first decision
// after the server answers again succeeds within 1.5 s, and every decision
// started later than that succeeds. (After as many failed dials as its
// pool size, go-redis stops dialing and tries again once a second, so the
// pool itself may take up to a second to notice the server is back.)
func TestRestartDuringLoad(t *testing.T) {
	const workers, recovery = 8, 1500 * time.Millisecond
	l := sluice.Limit{Capacity: 1_000_000, Rate: sluice.Per(1, time.Hour)}
	for _, batch := range batchModes {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			srv := redistest.Private(t)
			c := redis.NewClient(&redis.Options{
				Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, PoolSize: workers,
				DialTimeout: 100 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			})
			t.Cleanup(func() { c.Close() })
			s, err := New(c, Options{Batch: batch})
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				start, end time.Time
				err        error
			}
			var (
				mu      sync.Mutex
				results []result
				stop    atomic.Bool
				wg      sync.WaitGroup
			)
			for w := range workers {
				wg.Go(func() {
					for i := 0; !stop.Load(); i++ {
						start := time.Now()
						_, err := s.Take(t.Context(), sluice.Request{Policy: testPolicy, Key: fmt.Sprint("k", (w*7+i)%20), Cost: 1, Limit: l})
						mu.Lock()
						results = append(results, result{start, time.Now(), err})
						mu.Unlock()
						if err != nil {
							time.Sleep(time.Millisecond) // no busy loop while Redis is down
						}
					}
				})
			}
			time.Sleep(300 * time.Millisecond)
			loadsBefore := s.Stats().ScriptLoads
			srv.Restart(t)
			up := time.Now()
			time.Sleep(2500 * time.Millisecond)
			stop.Store(true)
			wg.Wait()

			var failed, after, lateFailed int
			var firstOK time.Time
			for _, r := range results {
				if r.err != nil {
					failed++
					if strings.Contains(r.err.Error(), "NOSCRIPT") {
						t.Errorf("a decision failed for want of the script: %v", r.err)
					}
				}
				if r.start.After(up) && r.err == nil && (firstOK.IsZero() || r.end.Before(firstOK)) {
					firstOK = r.end
				}
				if r.start.After(up.Add(recovery)) {
					after++
					if r.err != nil {
						lateFailed++
						t.Errorf("a decision started %v after the restart failed: %v", r.start.Sub(up), r.err)
					}
				}
			}
			if firstOK.IsZero() || firstOK.Sub(up) > recovery {
				t.Fatalf("no decision succeeded within %v of the restart (first at %v)", recovery, firstOK.Sub(up))
			}
			if after == 0 {
				t.Fatalf("no decision started more than %v after the restart", recovery)
			}
			// The restarted server lost the script: the callers that met
			// NOSCRIPT there share one load.
			if loads := s.Stats().ScriptLoads - loadsBefore; loads != 1 {
				t.Errorf("%d script loads across the restart; want 1 (the restarted server lost the script, and its callers share one load)", loads)
			}
			t.Logf("%d decisions, %d failed (while down or on connections it broke); first success %v after the restart; %d started %v later, %d failed",
				len(results), failed, firstOK.Sub(up), after, recovery, lateFailed)
		})
	}
}

// TestResendWhenRefusedUnrun: while another script runs past
// busy-reply-threshold, Redis answers BUSY without running the decision;
// the store sends it again until Redis is free, and charges once. With
// batching too.
func TestResendWhenRefusedUnrun(t *testing.T) {
	for _, batch := range batchModes {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			srv := redistest.Private(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
			t.Cleanup(func() { c.Close() })
			ctx := t.Context()
			if err := c.ConfigSet(ctx, "busy-reply-threshold", "100").Err(); err != nil {
				t.Fatal(err)
			}
			s, err := New(c, Options{Batch: batch})
			if err != nil {
				t.Fatal(err)
			}
			l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "warm", Cost: 1, Limit: l}); err != nil {
				t.Fatal(err) // loads the script
			}
			// Another connection runs a script for 500ms.
			busyClient := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ReadTimeout: 2 * time.Second})
			t.Cleanup(func() { busyClient.Close() })
			var wg sync.WaitGroup
			wg.Go(func() { keepBusy(t, busyClient) })
			time.Sleep(200 * time.Millisecond)
			// Redis answers BUSY now.
			if err := c.Ping(ctx).Err(); err == nil || !strings.HasPrefix(err.Error(), "BUSY") {
				t.Fatalf("PING during the busy script = %v; want BUSY", err)
			}
			start := time.Now()
			d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
			took := time.Since(start)
			wg.Wait()
			if err != nil || !d.Allowed || d.Remaining != 9 {
				t.Fatalf("Take while Redis is BUSY = %+v, %v; want allowed, 9 remaining", d, err)
			}
			if p, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l}); err != nil || p.Remaining != 9 {
				t.Fatalf("Peek after = %+v, %v; want 9 remaining (charged once)", p, err)
			}
			if took < 100*time.Millisecond {
				t.Fatalf("Take took %v; it cannot have waited for the busy script", took)
			}
			t.Logf("Take waited %v for the busy script", took)
		})
	}
}

// keepBusy keeps the server of c busy for 500ms with a script that loops
// on TIME.
func keepBusy(t *testing.T, c redis.Scripter) {
	const busy = `local t0 = redis.call('TIME') local t = t0
while (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) < 500000 do t = redis.call('TIME') end
return 1`
	if err := c.Eval(context.Background(), busy, nil).Err(); err != nil {
		t.Errorf("busy script: %v", err)
	}
}

// TestDeadlineWhileSlow: when Redis answers late, every decision returns by
// its caller's deadline, with and without batching: the caller that sends
// alone does so under its own context, and the callers queued behind it
// stop waiting at theirs.
func TestDeadlineWhileSlow(t *testing.T) {
	ctx := t.Context()
	direct := redistest.Client(t)
	p, via := proxied(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	l := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}
	const deadline, slack = 50 * time.Millisecond, 40 * time.Millisecond
	for _, batch := range batchModes {
		s, err := New(via, Options{Prefix: newPrefix(t, direct), Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		p.SetLatency(0)
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "warm", Cost: 1, Limit: l}); err != nil {
			t.Fatal(err)
		}
		p.SetLatency(400 * time.Millisecond)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				short, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				start := time.Now()
				d, err := s.Take(short, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("k", i%2), Cost: 1, Limit: l})
				var ne net.Error
				timedOut := errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
				if took := time.Since(start); !timedOut || took > deadline+slack {
					t.Errorf("batch %d: Take with a %v deadline against a 400ms Redis = %+v, %v after %v; want a timeout within %v",
						batch, deadline, d, err, took, deadline+slack)
				}
			})
		}
		wg.Wait()
	}
	p.SetLatency(0)
}

// TestStatsConversions: Stats().Conversions counts the takes that found
// their bucket stored under another limit of its policy and converted it,
// alone, with a request ID, and in a shared call of a batch (once per
// bucket: the takes after the first find it converted); not peeks, not
// takes under the same limit written by a store with other settings.
func TestStatsConversions(t *testing.T) {
	ctx := t.Context()
	direct := redistest.Client(t)
	p, via := proxied(t, nil)
	prefix := newPrefix(t, direct)
	s, err := New(via, Options{Prefix: prefix, Batch: 64})
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(direct, Options{Prefix: prefix, OnLimitChange: sluice.ScaleTokens})
	if err != nil {
		t.Fatal(err)
	}
	limit := func(c int64) sluice.Limit { return sluice.Limit{Capacity: c, Rate: sluice.Per(1, time.Hour)} }
	steps := []struct {
		name  string
		do    func() error
		count uint64 // Stats().Conversions after the step
	}{
		{"a new bucket", func() error { return take(ctx, s, "k", limit(10), "") }, 0},
		{"the same limit", func() error { return take(ctx, s, "k", limit(10), "") }, 0},
		{"another limit", func() error { return take(ctx, s, "k", limit(20), "") }, 1},
		{"that limit again", func() error { return take(ctx, s, "k", limit(20), "") }, 1},
		{"a peek under the first limit", func() error {
			_, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: limit(10)})
			return err
		}, 1},
		{"another limit with a request ID", func() error { return take(ctx, s, "k", limit(30), "id") }, 2},
		{"the same limit, written with other settings", func() error {
			if err := take(ctx, other, "k", limit(30), ""); err != nil {
				return err
			}
			return take(ctx, s, "k", limit(30), "")
		}, 2},
		{"four takes in a shared call under another limit", func() error {
			// The first take goes alone and waits for its reply; the
			// others queue and go in the next pipeline, in one call.
			p.SetLatency(200 * time.Millisecond)
			defer p.SetLatency(0)
			errs := make(chan error, 5)
			go func() { errs <- take(ctx, s, "first", limit(10), "") }()
			time.Sleep(50 * time.Millisecond)
			for range 4 {
				go func() { errs <- take(ctx, s, "k", limit(40), "") }()
			}
			for range 5 {
				if err := <-errs; err != nil {
					return err
				}
			}
			if sh := s.Stats().SharedTakes; sh != 3 {
				return fmt.Errorf("Stats().SharedTakes = %d, want 3", sh)
			}
			return nil
		}, 3},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := s.Stats().Conversions; got != st.count {
			t.Errorf("after %s: Stats().Conversions = %d, want %d", st.name, got, st.count)
		}
	}
}

// take takes one token from the bucket of key under l, with request ID id.
func take(ctx context.Context, s *Store, key string, l sluice.Limit, id string) error {
	_, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l, RequestID: id})
	return err
}

// TestDeniedRequestIDDecidesAfresh: a denial is not remembered under its
// request ID (no record is written), so a retry with the ID decides again,
// and once allowed it is remembered and replayed.
func TestDeniedRequestIDDecidesAfresh(t *testing.T) {
	l := sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Minute)}
	for name, c := range topologies(t) {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				ctx := t.Context()
				at := micros(1_000_000)
				s := newStore(t, c, Options{Now: func() time.Time { return at }, MinTTL: time.Hour, Batch: batch})
				take := func(id string) sluice.Decision {
					t.Helper()
					d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l, RequestID: id})
					if err != nil {
						t.Fatalf("Take(ID %q) = %v", id, err)
					}
					return d
				}
				if d := take(""); !d.Allowed {
					t.Fatalf("first Take = %+v, want allowed", d)
				}
				for i := range 2 {
					if d := take("r"); d.Allowed || d.Replayed || d.RetryAfter != time.Minute {
						t.Fatalf("Take %d with ID %q of an empty bucket = %+v; want denied afresh (not replayed), retry after 1m", i+1, "r", d)
					}
				}
				if keys, err := scanKeys(ctx, c, s.prefix); err != nil || len(keys) != 1 {
					t.Errorf("keys after the denials %q, %v; want the bucket's alone (no record of a denial)", keys, err)
				}
				at = at.Add(time.Minute)
				if d := take("r"); !d.Allowed || d.Replayed {
					t.Fatalf("Take with ID %q a minute later = %+v; want allowed, not replayed", "r", d)
				}
				if d := take("r"); !d.Allowed || !d.Replayed {
					t.Fatalf("retry of the allowed Take with ID %q = %+v; want its replay", "r", d)
				}
				other := sluice.Limit{Capacity: 2, Rate: l.Rate}
				if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: other, RequestID: "r"}); !errors.Is(err, sluice.ErrRequestIDConflict) {
					t.Fatalf("Take with ID %q under another limit = %+v, %v; want %v", "r", d, err, sluice.ErrRequestIDConflict)
				}
			})
		}
	}
}

// TestOneScriptLoadPerFlush: after the servers lose the script (SCRIPT
// FLUSH, as a restart does), 16 callers meeting NOSCRIPT at once make one
// load per server between them, and every decision succeeds: three rounds,
// on a private standalone server and on the cluster, batched and not.
func TestOneScriptLoadPerFlush(t *testing.T) {
	const callers = 16
	srv := redistest.Private(t)
	standalone := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: callers})
	t.Cleanup(func() { standalone.Close() })
	clients := map[string]client{"standalone": standalone}
	if !testing.Short() {
		clients["cluster"] = redistest.ClusterClient(t)
	}
	l := sluice.Limit{Capacity: 1_000_000, Rate: sluice.Per(1, time.Hour)}
	for name, c := range clients {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				ctx := t.Context()
				s := newStore(t, c, Options{Batch: batch})
				keys := make([]string, callers)
				nodes := map[string]bool{}
				for i := range keys {
					keys[i] = fmt.Sprint("k", i)
					addr := ""
					if cc, ok := c.(*redis.ClusterClient); ok {
						n, err := cc.MasterForKey(ctx, s.bucketKey(testPolicy, keys[i]))
						if err != nil {
							t.Fatal(err)
						}
						addr = n.Options().Addr
					}
					nodes[addr] = true
				}
				for round := range 3 {
					if err := forEachNode(ctx, c, func(ctx context.Context, n redis.Cmdable) error { return n.ScriptFlush(ctx).Err() }); err != nil {
						t.Fatal(err)
					}
					before := s.Stats().ScriptLoads
					start := make(chan struct{})
					var wg sync.WaitGroup
					for _, k := range keys {
						wg.Go(func() {
							<-start
							if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: k, Cost: 1, Limit: l}); err != nil {
								t.Errorf("round %d: Take(%q) = %v", round, k, err)
							}
						})
					}
					close(start)
					wg.Wait()
					if got := s.Stats().ScriptLoads - before; got != uint64(len(nodes)) {
						t.Errorf("round %d: %d callers after SCRIPT FLUSH made %d script loads; want %d (one per server)", round, callers, got, len(nodes))
					}
				}
			})
		}
	}
}

// openTwo opens two connections of via's main pool and two of its pool for
// pipelines before a test delays replies, as a new one would wait for the
// delayed replies of its handshake: WAIT for a replica that does not exist
// holds a connection for 100 ms, so two at once hold two.
func openTwo(t *testing.T, via *redis.Client) {
	t.Helper()
	var warm sync.WaitGroup
	for range 2 {
		warm.Go(func() {
			if err := via.Do(t.Context(), "WAIT", 1, 100).Err(); err != nil {
				t.Error(err)
			}
		})
		warm.Go(func() {
			if _, err := via.Pipelined(t.Context(), func(p redis.Pipeliner) error { return p.Do(t.Context(), "WAIT", 1, 100).Err() }); err != nil {
				t.Error(err)
			}
		})
	}
	warm.Wait()
}

// TestBatchPipelinesInFlight: with batching, decisions queued behind a
// send in flight wait for it to come back, unless minPipeline or more of
// them are waiting and fewer than Options.Pipelines sends are in flight:
// then they go at once, in a pipeline of their own. Every reply is delayed
// by a proxy, so a queued decision that waits for the first send's reply
// takes about two delays, one sent at once about one.
func TestBatchPipelinesInFlight(t *testing.T) {
	const delay = 400 * time.Millisecond
	direct := redistest.Client(t)
	p, via := proxied(t, nil)
	openTwo(t, via)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	for _, tt := range []struct {
		pipelines, queued int
		atOnce            bool
	}{
		{pipelines: 0, queued: minPipeline, atOnce: true}, // the default, 2
		{pipelines: 2, queued: minPipeline - 1, atOnce: false},
		{pipelines: 1, queued: minPipeline, atOnce: false},
	} {
		t.Run(fmt.Sprintf("pipelines=%d/queued=%d", tt.pipelines, tt.queued), func(t *testing.T) {
			ctx := t.Context()
			s, err := New(via, Options{Prefix: newPrefix(t, direct), Batch: 64, Pipelines: tt.pipelines})
			if err != nil {
				t.Fatal(err)
			}
			// Load the script, so that no send meets NOSCRIPT.
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "warm", Cost: 1, Limit: l}); err != nil {
				t.Fatal(err)
			}
			p.SetLatency(delay)
			defer p.SetLatency(0)
			var wg sync.WaitGroup
			wg.Go(func() {
				if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "first", Cost: 1, Limit: l}); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(delay / 4) // "first" is in flight
			took := make([]time.Duration, tt.queued)
			for i := range tt.queued {
				wg.Go(func() {
					start := time.Now()
					d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("q", i), Cost: 1, Limit: l})
					took[i] = time.Since(start)
					if err != nil || !d.Allowed || d.Remaining != 9 {
						t.Errorf("queued take %d = %+v, %v; want allowed with 9 remaining", i, d, err)
					}
				})
			}
			wg.Wait()
			// Sent at once: about one delay. Behind "first": the rest of
			// its delay (3/4) and one of their own.
			limit := delay * 3 / 2
			for i, d := range took {
				if tt.atOnce && d >= limit {
					t.Errorf("queued take %d took %v; want under %v (sent at once, beside the first)", i, d, limit)
				}
				if !tt.atOnce && d < limit {
					t.Errorf("queued take %d took %v; want at least %v (sent after the first came back)", i, d, limit)
				}
			}
		})
	}
}

// While pipelines come back full, the queue waits for the next one to take
// it whole rather than splitting it: with a pipeline of 12 in flight, 11
// queued takes wait for it to come back, and 12 open a second pipeline at
// once.
func TestBatchWaitsForFullPipeline(t *testing.T) {
	const delay = 400 * time.Millisecond
	direct := redistest.Client(t)
	p, via := proxied(t, nil)
	openTwo(t, via)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	for _, tt := range []struct {
		queued int
		atOnce bool
	}{{11, false}, {12, true}} {
		t.Run(fmt.Sprintf("queued=%d", tt.queued), func(t *testing.T) {
			ctx := t.Context()
			s, err := New(via, Options{Prefix: newPrefix(t, direct), Batch: 64, Pipelines: 2})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "warm", Cost: 1, Limit: l}); err != nil {
				t.Fatal(err)
			}
			p.SetLatency(delay)
			defer p.SetLatency(0)
			var wg sync.WaitGroup
			takes := func(prefix string, n int) []time.Duration {
				took := make([]time.Duration, n)
				for i := range n {
					wg.Go(func() {
						start := time.Now()
						d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint(prefix, i), Cost: 1, Limit: l})
						took[i] = time.Since(start)
						if err != nil || !d.Allowed || d.Remaining != 9 {
							t.Errorf("take %s%d = %+v, %v; want allowed with 9 remaining", prefix, i, d, err)
						}
					})
				}
				return took
			}
			// At 0, "first" is sent alone; at 0.1 delay, 8 queued takes open
			// the second pipeline; at 0.2, 12 more queue behind both, and
			// "first" takes them as its next pipeline when it comes back at
			// 1. The pipeline of 8 is back at 1.1.
			takes("first", 1)
			time.Sleep(delay / 10)
			takes("a", minPipeline)
			time.Sleep(delay / 10)
			takes("b", 12)
			time.Sleep(delay * 11 / 10)
			// At 1.3, the 12 are in flight, alone, until 2.
			took := takes("c", tt.queued)
			wg.Wait()
			// Sent at once: back at about 2.3, one delay after they were
			// queued. Behind the 12: sent at 2, back at 3, 1.7 delays.
			limit := delay * 27 / 20
			for i, d := range took {
				if tt.atOnce && d >= limit {
					t.Errorf("take c%d took %v; want under %v (sent at once, beside the pipeline of 12)", i, d, limit)
				}
				if !tt.atOnce && d < limit {
					t.Errorf("take c%d took %v; want at least %v (sent when the pipeline of 12 came back)", i, d, limit)
				}
			}
		})
	}
}

// failEvals is a go-redis hook that fails the next n EVAL commands (not
// EVALSHA) as a broken connection would, after a delay, without sending
// them: loads of the script that no server answered.
type failEvals struct {
	n     atomic.Int64
	delay time.Duration
}

func (h *failEvals) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failEvals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "eval" && h.n.Add(-1) >= 0 {
			time.Sleep(h.delay)
			err := errors.New("injected: connection refused")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failEvals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFailedLoadsAreNoLosses: after the server lost the script, callers
// that meet NOSCRIPT wait for one caller's EVAL; when that EVAL fails
// unanswered (its connection broke, as after a restart), the next caller
// to meet NOSCRIPT leads a new one. A failed load says nothing about the
// server losing the script again, so it must not bring the waiters to
// send the script themselves (evalAfter): the server that lost the script
// is still sent it once, by the first EVAL it answers.
func TestFailedLoadsAreNoLosses(t *testing.T) {
	const callers, failures = 8, 4
	srv := redistest.Private(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: callers})
	t.Cleanup(func() { c.Close() })
	hook := &failEvals{delay: 50 * time.Millisecond}
	c.AddHook(hook)
	s, err := New(c, Options{Batch: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	l := sluice.Limit{Capacity: 100, Rate: sluice.Per(1, time.Hour)}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "first", Cost: 1, Limit: l}); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := s.Stats().ScriptLoads
	hook.n.Store(failures)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: fmt.Sprint("k", w), Cost: 1, Limit: l}); err != nil {
				if !strings.Contains(err.Error(), "injected") {
					t.Errorf("caller %d: %v", w, err)
				}
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if loads := s.Stats().ScriptLoads - before; loads != 1 {
		t.Errorf("%d script loads answered after the flush; want 1", loads)
	}
	if n := failed.Load(); n != failures {
		t.Errorf("%d decisions failed; want %d, the callers whose EVAL failed", n, failures)
	}
}
