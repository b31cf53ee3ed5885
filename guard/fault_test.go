package guard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/internal/faultproxy"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
)

// The fault tests run the guard in front of redisstore on a real Redis
// server (see internal/redistest: SLUICE_REDIS_URL or
// redis://127.0.0.1:6379/15, else a private redis-server; with CI=true no
// Redis is a failure), reached through a faultproxy.Proxy that the test
// breaks on purpose. Each drives 200 decisions a second from 8 goroutines
// for a few seconds.
func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests fail thousands on
	// purpose.
	redis.SetLogger(quiet{})
	redistest.Main(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// Load and bounds of the fault tests: 200 decisions a second, and the
// latencies docs/failure.md promises.
const (
	workers      = 8
	tick         = 40 * time.Millisecond // per worker: 8 × 25/s = 200/s
	poolSize     = 32
	maxOutageP99 = 60 * time.Millisecond // during the outage, breaker or not
	maxOpenP99   = 2 * time.Millisecond  // once the breaker is open
	recovery     = time.Second           // to the first store-backed decision
	maxOneCall   = 100 * time.Millisecond
)

// rig is a redisstore behind a fault proxy, and a guard in front of it.
type rig struct {
	proxy  *faultproxy.Proxy
	client *redis.Client // through the proxy
	direct *redisstore.Store
	guard  *guard.Store
	// control is a decision without I/O that each worker times after each
	// of its decisions: the machine's own scheduling noise (go test runs
	// other packages at the same time), which the latency bounds allow
	// for on top of the bounds.
	control *memstore.Store

	base   time.Time
	mu     sync.Mutex
	events []event // breaker changes
}

type event struct {
	at time.Duration // since base
	to guard.BreakerState
}

// callKey marks a call's context with a *callInfo the StoreCall hook fills.
type callKey struct{}

type callInfo struct{ store, probe bool }

// newRig builds a rig with the client settings docs/redis.md and
// docs/failure.md advise for the decision path: no retries, the context's
// deadline, short timeouts, one dial attempt.
func newRig(t *testing.T, o guard.Options) *rig {
	t.Helper()
	if testing.Short() {
		t.Skip("fault tests take seconds each; skipped with -short")
	}
	opts := redistest.Options(t)
	direct := redis.NewClient(opts)
	t.Cleanup(func() { direct.Close() })
	// The handshake also ends the goroutines go-redis starts for
	// maintenance notifications, which Redis 7.0 does not send.
	if err := direct.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(opts.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	via := *opts
	via.Addr = p.Addr()
	via.MaxRetries = -1
	via.ContextTimeoutEnabled = true
	via.DialTimeout = 200 * time.Millisecond
	via.ReadTimeout = 50 * time.Millisecond
	via.WriteTimeout = 50 * time.Millisecond
	via.PoolTimeout = 50 * time.Millisecond
	via.PoolSize = poolSize
	// One dial attempt per call: go-redis's default of 5 with 100ms
	// between them turns a refused connection into a wait for the whole
	// deadline.
	via.DialerRetries = 1
	client := redis.NewClient(&via)
	t.Cleanup(func() { client.Close() })

	var b [6]byte
	rand.Read(b[:])
	prefix := "sluicefault:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := direct.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			direct.Unlink(ctx, iter.Val())
		}
	})
	store, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	check, err := redisstore.New(direct, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}

	// Load the script and open the connections the load needs before the
	// guard's deadline applies: a cold start on a busy machine can take
	// longer (the client's 50ms ReadTimeout still bounds each try), and
	// the tests are about faults injected later.
	var (
		warm   sync.WaitGroup
		warmed atomic.Int64
	)
	for i := range workers {
		warm.Go(func() {
			for range 20 {
				if _, err := store.Take(t.Context(), sluice.Request{Policy: "test", Key: fmt.Sprint("warm", i), Cost: 1, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}}); err == nil {
					warmed.Add(1)
					return
				}
			}
		})
	}
	warm.Wait()
	if warmed.Load() == 0 {
		t.Fatalf("no decision through the proxy to %s in %d tries", opts.Addr, 20*workers)
	}

	control := newMemstore(t, memstore.Options{})
	r := &rig{proxy: p, client: client, direct: check, control: control, base: time.Now()}
	o.Hooks = guard.Hooks{
		StoreCall: func(ctx context.Context, c guard.Call) {
			if ci, ok := ctx.Value(callKey{}).(*callInfo); ok {
				ci.store, ci.probe = true, c.Probe
			}
		},
		BreakerChange: func(_, to guard.BreakerState) {
			r.mu.Lock()
			r.events = append(r.events, event{at: time.Since(r.base), to: to})
			r.mu.Unlock()
		},
	}
	r.guard = mustNew(t, store, o)
	return r
}

// since returns the time since the rig's base.
func (r *rig) since() time.Duration { return time.Since(r.base) }

// firstOpen returns when the breaker first opened at or after from.
func (r *rig) firstOpen(from time.Duration) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.at >= from && e.to == guard.BreakerOpen {
			return e.at, true
		}
	}
	return 0, false
}

// sample is one decision of the load.
type sample struct {
	start, end time.Duration // since the rig's base
	key        int
	d          sluice.Decision
	err        error
	callInfo
	control time.Duration // the control decision made right after
}

func (s sample) took() time.Duration { return s.end - s.start }

// load drives 200 decisions a second at the rig's guard from 8 goroutines,
// spread over keys, until stopped.
type load struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	panics atomic.Int64

	mu      sync.Mutex
	samples []sample
}

func (r *rig) startLoad(keys int, l sluice.Limit) *load {
	ld := &load{stop: make(chan struct{})}
	for w := range workers {
		ld.wg.Go(func() {
			defer func() {
				if recover() != nil {
					ld.panics.Add(1)
				}
			}()
			t := time.NewTicker(tick)
			defer t.Stop()
			var mine []sample
			defer func() {
				ld.mu.Lock()
				ld.samples = append(ld.samples, mine...)
				ld.mu.Unlock()
			}()
			for i := w; ; i += workers {
				select {
				case <-ld.stop:
					return
				case <-t.C:
				}
				ci := &callInfo{}
				ctx := context.WithValue(context.Background(), callKey{}, ci)
				k := i % keys
				s := sample{start: r.since(), key: k}
				req := sluice.Request{Policy: "test", Key: fmt.Sprint("key", k), Cost: 1, Limit: l}
				s.d, s.err = r.guard.Take(ctx, req)
				s.end = r.since()
				s.callInfo = *ci
				r.control.Take(ctx, req)
				s.control = r.since() - s.end
				mine = append(mine, s)
			}
		})
	}
	return ld
}

// finish stops the load and returns its samples in start order.
func (ld *load) finish(t *testing.T) []sample {
	t.Helper()
	close(ld.stop)
	ld.wg.Wait()
	if n := ld.panics.Load(); n > 0 {
		t.Errorf("%d workers panicked", n)
	}
	slices.SortFunc(ld.samples, func(a, b sample) int { return int(a.start - b.start) })
	for _, s := range ld.samples {
		if s.err != nil {
			t.Errorf("Take at %v failed: %v (the guard should decide every valid request)", s.start, s.err)
			break
		}
	}
	return ld.samples
}

// within returns the samples that started at or after from and ended
// before to.
func within(samples []sample, from, to time.Duration) []sample {
	var out []sample
	for _, s := range samples {
		if s.start >= from && s.end < to {
			out = append(out, s)
		}
	}
	return out
}

// p99 returns the 99th percentile of the samples' durations and the
// longest, and the 99th percentile of their control decisions.
func p99(samples []sample) (p, longest, noise time.Duration) {
	if len(samples) == 0 {
		return 0, 0, 0
	}
	d := make([]time.Duration, len(samples))
	c := make([]time.Duration, len(samples))
	for i, s := range samples {
		d[i], c[i] = s.took(), s.control
	}
	slices.Sort(d)
	slices.Sort(c)
	i := int(math.Ceil(0.99*float64(len(d)))) - 1
	return d[i], d[len(d)-1], c[i]
}

// recovered returns how long after at the first store-backed decision that
// started after at ended.
func recovered(samples []sample, at time.Duration) (time.Duration, bool) {
	for _, s := range samples {
		if s.start >= at && !s.d.Degraded {
			return s.end - at, true
		}
	}
	return 0, false
}

// fault is when a fault was injected and lifted, since the rig's base.
type fault struct {
	begin    time.Duration // before it was injected
	from     time.Duration // once it was in place
	to       time.Duration // before it was lifted
	restored time.Duration // once it was lifted
}

// inject runs begin, which puts a fault in place, and returns its times;
// lift fills in the end.
func (r *rig) inject(begin func()) *fault {
	f := &fault{begin: r.since()}
	begin()
	f.from = r.since()
	return f
}

// lift ends the fault f.
func (r *rig) lift(t *testing.T, f *fault, end func() error) {
	t.Helper()
	f.to = r.since()
	if err := end(); err != nil {
		t.Fatal(err)
	}
	f.restored = r.since()
}

// checkOutage checks what every failure mode must do during a fault: every
// decision made while it was in place degraded and quick, the breaker open
// within a second and quicker still once open, and a store-backed decision
// within maxRecovery after it was lifted. It returns the decisions made
// while it was in place.
func checkOutage(t *testing.T, r *rig, samples []sample, f *fault, maxRecovery time.Duration) []sample {
	t.Helper()
	from, to, restored := f.from, f.to, f.restored
	before := within(samples, 0, from)
	stored := 0
	for _, s := range before {
		if !s.d.Degraded {
			stored++
		}
	}
	if stored == 0 {
		t.Errorf("no store-backed decision before the fault: the rig does not reach Redis")
	}
	out := within(samples, from, to)
	// The load is 200/s unless the machine is starved (go test runs other
	// packages meanwhile); the checks need enough decisions to mean
	// something.
	if len(out) < 100 {
		t.Errorf("%d decisions during the %v fault, want at least 100", len(out), to-from)
	}
	for _, s := range out {
		if !s.d.Degraded {
			t.Errorf("decision at %v during the fault = %+v, want degraded", s.start, s.d)
			break
		}
	}
	p, longest, noise := p99(out)
	t.Logf("fault %v: %d decisions (%d before it, %d of them store-backed), p99 %v, longest %v; control p99 %v", to-from, len(out), len(before), stored, p, longest, noise)
	if p > maxOutageP99+noise {
		t.Errorf("p99 latency during the fault = %v, want at most %v + %v (the control's p99)", p, maxOutageP99, noise)
	}
	if longest > maxOneCall {
		t.Errorf("longest decision during the fault took %v, want at most %v: the deadline did not hold", longest, maxOneCall)
	}
	opened, ok := r.firstOpen(f.begin)
	if !ok {
		t.Fatalf("the breaker did not open during the fault")
	}
	if opened-f.begin > time.Second {
		t.Errorf("the breaker opened %v after the fault began, want within 1s", opened-f.begin)
	}
	var open []sample // the probes excluded: they wait for the store by design
	for _, s := range within(samples, max(opened, from), to) {
		if !s.probe {
			open = append(open, s)
		}
	}
	p, longest, noise = p99(open)
	t.Logf("breaker open after %v: %d decisions without the store, p99 %v, longest %v; control p99 %v", opened-f.begin, len(open), p, longest, noise)
	if p > maxOpenP99+noise {
		t.Errorf("p99 latency with the breaker open = %v, want at most %v + %v (the control's p99)", p, maxOpenP99, noise)
	}
	back, ok := recovered(samples, restored)
	if !ok || back > maxRecovery {
		t.Errorf("first store-backed decision %v (found %v) after the fault ended, want within %v", back, ok, maxRecovery)
	} else {
		t.Logf("first store-backed decision %v after the fault ended", back)
	}
	return out
}

// TestOutage: Redis unreachable for 3s (the proxy cuts every connection
// and refuses new ones, as a killed server would), then back. Each mode
// holds exactly during the outage.
func TestOutage(t *testing.T) {
	big := sluice.Limit{Capacity: 1 << 20, Rate: sluice.PerSecond(1 << 20)}
	small := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(40)}
	const divisor = 4
	tests := []struct {
		mode  guard.FailureMode
		limit sluice.Limit
		check func(t *testing.T, all, outage []sample)
	}{
		{guard.FailOpen, big, func(t *testing.T, all, outage []sample) {
			for _, s := range outage {
				if !s.d.Allowed {
					t.Fatalf("decision at %v during the outage = %+v, want allowed", s.start, s.d)
				}
			}
		}},
		{guard.FailClosed, big, func(t *testing.T, all, outage []sample) {
			for _, s := range outage {
				if s.d.Allowed {
					t.Fatalf("decision at %v during the outage = %+v, want denied", s.start, s.d)
				}
			}
			for _, s := range all {
				if !s.d.Allowed && !s.d.Degraded {
					t.Fatalf("decision at %v = %+v: a quota denial, want none (the limit is far above the load)", s.start, s.d)
				}
			}
		}},
		{guard.FailLocal, small, func(t *testing.T, all, outage []sample) {
			local := guard.LocalLimit(small, divisor)
			type span struct {
				first, last     time.Duration
				allowed, denied int64
			}
			keys := map[int]*span{}
			for _, s := range all {
				if !s.d.Degraded {
					continue
				}
				if s.d.Limit != local {
					t.Fatalf("degraded decision at %v under %v, want the local limit %v", s.start, s.d.Limit, local)
				}
				k := keys[s.key]
				if k == nil {
					k = &span{first: s.start}
					keys[s.key] = k
				}
				k.last = s.end
				if s.d.Allowed {
					k.allowed++
				} else {
					k.denied++
				}
			}
			if len(keys) != 4 {
				t.Fatalf("degraded decisions for %d keys, want 4", len(keys))
			}
			for key, k := range keys {
				// The local bucket starts full at the key's first degraded
				// decision and refills until its last.
				elapsed := k.last - k.first
				budget := local.Capacity + int64(elapsed)*local.Rate.Tokens/int64(local.Rate.Period)
				t.Logf("key%d: %d allowed, %d denied locally over %v; budget %d", key, k.allowed, k.denied, elapsed, budget)
				if k.allowed > budget {
					t.Errorf("key%d: %d allowed locally over %v, more than the local budget %d (%v)", key, k.allowed, elapsed, budget, local)
				}
				if k.allowed < local.Capacity || k.denied == 0 {
					t.Errorf("key%d: %d allowed and %d denied locally, want the local bucket drained (the load is above its rate)", key, k.allowed, k.denied)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			r := newRig(t, guard.Options{FailureMode: tt.mode, LocalDivisor: divisor})
			ld := r.startLoad(4, tt.limit)
			time.Sleep(time.Second)
			f := r.inject(r.proxy.Refuse)
			time.Sleep(3 * time.Second)
			r.lift(t, f, r.proxy.Restore)
			time.Sleep(1500 * time.Millisecond)
			all := ld.finish(t)
			outage := checkOutage(t, r, all, f, recovery)
			tt.check(t, all, outage)
		})
	}
}

// TestLostReplies: for 2s every reply from Redis is lost after the script
// ran. Calls time out at the deadline, the failure mode answers, and Redis
// charged each lost call at most once: the guard never retries, and
// neither does the client.
func TestLostReplies(t *testing.T) {
	r := newRig(t, guard.Options{FailureMode: guard.FailClosed})
	l := sluice.Limit{Capacity: 1 << 20, Rate: sluice.Per(1, time.Hour)}
	ld := r.startLoad(4, l)
	time.Sleep(time.Second)
	f := r.inject(func() { r.proxy.DropReplies(true) })
	time.Sleep(2 * time.Second)
	r.lift(t, f, func() error { r.proxy.DropReplies(false); return nil })
	time.Sleep(1500 * time.Millisecond)
	all := ld.finish(t)
	checkOutage(t, r, all, f, recovery)

	var allowed, lost int64
	for _, s := range all {
		switch {
		case !s.d.Degraded && s.d.Allowed:
			allowed++
		case s.d.Degraded && s.store:
			lost++ // sent to the store, no decision came back
		}
	}
	var charged int64
	for k := range 4 {
		d, err := r.direct.Peek(t.Context(), sluice.Request{Policy: "test", Key: fmt.Sprint("key", k), Cost: 1, Limit: l})
		if err != nil {
			t.Fatal(err)
		}
		charged += l.Capacity - d.Remaining
	}
	t.Logf("%d allowed by Redis, %d calls without a reply, %d tokens charged", allowed, lost, charged)
	if charged < allowed || charged > allowed+lost {
		t.Errorf("Redis charged %d tokens for %d allowed decisions and %d calls whose reply was lost; want between %d and %d (each call at most once)",
			charged, allowed, lost, allowed, allowed+lost)
	}
}

// TestSlowStore: 200ms of latency on every reply for 2s. The deadline holds
// for every call, the pool never holds more connections than its size nor
// more afterwards than before (or one per worker), and once the client and
// the proxy are closed the goroutines are back to where they were.
func TestSlowStore(t *testing.T) {
	if testing.Short() {
		t.Skip("fault tests take seconds each; skipped with -short")
	}
	redistest.Options(t) // start a private server, if any, before counting
	baseline := runtime.NumGoroutine()

	r := newRig(t, guard.Options{FailureMode: guard.FailOpen})
	l := sluice.Limit{Capacity: 1 << 20, Rate: sluice.PerSecond(1 << 20)}
	var maxConns atomic.Int64
	stopWatch := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if n := int64(r.proxy.Conns()); n > maxConns.Load() {
				maxConns.Store(n)
			}
		}
	})
	ld := r.startLoad(4, l)
	time.Sleep(time.Second)
	connsBefore := r.proxy.Conns()
	f := r.inject(func() { r.proxy.SetLatency(200 * time.Millisecond) })
	time.Sleep(2 * time.Second)
	r.lift(t, f, func() error { r.proxy.SetLatency(0); return nil })
	time.Sleep(1500 * time.Millisecond)
	all := ld.finish(t)
	close(stopWatch)
	watch.Wait()
	outage := checkOutage(t, r, all, f, recovery)
	for _, s := range outage {
		if !s.d.Allowed {
			t.Fatalf("decision at %v = %+v, want allowed (FailOpen)", s.start, s.d)
		}
	}
	connsAfter := r.proxy.Conns()
	t.Logf("connections through the proxy: %d before the fault, at most %d during the test, %d at the end", connsBefore, maxConns.Load(), connsAfter)
	if n := maxConns.Load(); n > poolSize {
		t.Errorf("%d connections open at once, more than the pool size %d", n, poolSize)
	}
	if connsAfter > max(connsBefore, workers) {
		t.Errorf("%d connections open after the fault, %d before: the pool did not shrink back (at most one per worker is needed)", connsAfter, connsBefore)
	}

	r.client.Close()
	r.proxy.Close()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > baseline && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > baseline {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines 5s after closing the client and the proxy, %d before the test:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// TestChaos repeats long outages: SLUICE_CHAOS=N runs N rounds (0: skip)
// of a 10s outage and 5s back, under FailLocal, with the checks of
// TestOutage. Not run by CI. After a long outage go-redis itself waits:
// once PoolSize dials have failed it stops dialing and probes the server
// once a second in the background, so the first store-backed decision may
// come up to 1s + ProbeInterval after the server is back; the bound here is
// 2s.
func TestChaos(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("SLUICE_CHAOS"))
	if rounds <= 0 {
		t.Skip("set SLUICE_CHAOS=N to run N rounds of 10s outages (about 15s each)")
	}
	l := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(40)}
	r := newRig(t, guard.Options{FailureMode: guard.FailLocal, LocalDivisor: 4})
	ld := r.startLoad(4, l)
	var faults []*fault
	time.Sleep(time.Second)
	for range rounds {
		f := r.inject(r.proxy.Refuse)
		time.Sleep(10 * time.Second)
		r.lift(t, f, r.proxy.Restore)
		faults = append(faults, f)
		time.Sleep(5 * time.Second)
	}
	all := ld.finish(t)
	for i, f := range faults {
		t.Run(fmt.Sprint("round", i), func(t *testing.T) {
			checkOutage(t, r, all, f, 2*time.Second)
		})
	}
}
