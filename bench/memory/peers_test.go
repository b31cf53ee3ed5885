package memory

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	"golang.org/x/time/rate"
)

// capacity is the burst every limiter is given, in tokens.
const capacity = 100

// maxKeys bounds the stores that take a bound on the number of keys; it is
// twice the largest key set of any workload, so nothing is evicted.
const maxKeys = 2_000_000

// shape is one limit, given to every peer in its own terms: a burst of
// capacity tokens refilled at perSecond tokens a second.
type shape struct {
	name      string // sub-benchmark name
	perSecond int64
}

// shapes are the limits every workload runs under. With rate=10 a hot key
// is denied almost always once its burst is gone; with rate=1e9 almost every
// decision is allowed.
var shapes = []shape{
	{name: "rate=10", perSecond: 10},
	{name: "rate=1e9", perSecond: 1e9},
}

// limiter is one peer set up for one shape.
type limiter interface {
	// take takes one token from the bucket of key and reports whether it
	// was allowed.
	take(key string) bool
	close()
}

// peer builds a limiter of one library.
type peer struct {
	name string
	new  func(tb testing.TB, s shape) limiter
}

// peers are the limiters compared, each configured as its documentation
// recommends.
var peers = []peer{
	{name: "peer=sluice", new: newSluice},
	{name: "peer=xrate", new: newXRate},
	{name: "peer=golimiter", new: newGoLimiter},
	{name: "peer=throttled", new: newThrottled},
	{name: "peer=baseline", new: newBaseline},
}

// sluiceLimiter is the sluice in-memory store.
type sluiceLimiter struct {
	store *memstore.Store
	limit sluice.Limit
	tb    testing.TB
}

func newSluice(tb testing.TB, s shape) limiter {
	store, err := memstore.New(memstore.Options{MaxKeys: maxKeys})
	if err != nil {
		tb.Fatalf("sluice: memstore.New: %v", err)
	}
	return &sluiceLimiter{
		store: store,
		limit: sluice.Limit{Capacity: capacity, Rate: sluice.PerSecond(s.perSecond)},
		tb:    tb,
	}
}

func (l *sluiceLimiter) take(key string) bool {
	d, err := l.store.Take(context.Background(), sluice.Request{Policy: "bench", Key: key, Cost: 1, Limit: l.limit})
	if err != nil {
		l.tb.Errorf("sluice: Take(%q) = %v", key, err)
	}
	return d.Allowed
}

func (l *sluiceLimiter) buckets() int64 { return l.store.Stats().Buckets }

func (l *sluiceLimiter) close() {
	if err := l.store.Close(); err != nil {
		l.tb.Errorf("sluice: Close: %v", err)
	}
}

// xrateLimiter keeps one golang.org/x/time/rate Limiter per key in a
// sync.Map. It loads first and allocates a new Limiter only for a key not
// yet seen, the usual way to use LoadOrStore.
type xrateLimiter struct {
	m     sync.Map // string -> *rate.Limiter
	limit rate.Limit
}

func newXRate(_ testing.TB, s shape) limiter {
	return &xrateLimiter{limit: rate.Limit(s.perSecond)}
}

func (l *xrateLimiter) take(key string) bool {
	v, ok := l.m.Load(key)
	if !ok {
		v, _ = l.m.LoadOrStore(key, rate.NewLimiter(l.limit, capacity))
	}
	return v.(*rate.Limiter).Allow()
}

func (l *xrateLimiter) close() {}

// goLimiter is the memorystore of github.com/sethvargo/go-limiter. It grants
// Tokens per Interval, so the shape is capacity tokens every
// capacity/perSecond: 100 every 10s, or 100 every 100ns.
type goLimiter struct {
	store golimiter.Store
	tb    testing.TB
}

func newGoLimiter(tb testing.TB, s shape) limiter {
	store, err := memorystore.New(&memorystore.Config{
		Tokens:   capacity,
		Interval: time.Duration(capacity * int64(time.Second) / s.perSecond),
	})
	if err != nil {
		tb.Fatalf("go-limiter: memorystore.New: %v", err)
	}
	return &goLimiter{store: store, tb: tb}
}

func (l *goLimiter) take(key string) bool {
	_, _, _, ok, err := l.store.Take(context.Background(), key)
	if err != nil {
		l.tb.Errorf("go-limiter: Take(%q) = %v", key, err)
	}
	return ok
}

func (l *goLimiter) close() {
	if err := l.store.Close(context.Background()); err != nil {
		l.tb.Errorf("go-limiter: Close: %v", err)
	}
}

// throttledLimiter is the GCRA limiter of github.com/throttled/throttled/v2
// over its memstore, bounded to maxKeys keys with its LRU as the README
// shows. MaxBurst counts requests beyond the first, so a burst of capacity
// is MaxBurst capacity-1.
//
// Under contention RateLimitCtx can fail after its default of 10
// compare-and-swap attempts; such a call counts as denied and is reported
// as errors/op rather than failing the benchmark.
type throttledLimiter struct {
	lim  *throttled.GCRARateLimiterCtx
	errs atomic.Int64
}

func newThrottled(tb testing.TB, s shape) limiter {
	store, err := throttledmem.NewCtx(maxKeys)
	if err != nil {
		tb.Fatalf("throttled: memstore.NewCtx: %v", err)
	}
	lim, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{
		MaxRate:  throttled.PerSec(int(s.perSecond)),
		MaxBurst: capacity - 1,
	})
	if err != nil {
		tb.Fatalf("throttled: NewGCRARateLimiterCtx: %v", err)
	}
	return &throttledLimiter{lim: lim}
}

func (l *throttledLimiter) take(key string) bool {
	limited, _, err := l.lim.RateLimitCtx(context.Background(), key, 1)
	if err != nil {
		l.errs.Add(1)
		return false
	}
	return !limited
}

func (l *throttledLimiter) errors() int64 { return l.errs.Load() }

func (l *throttledLimiter) close() {}

// baseline does the least any per-key token bucket must do: find the
// bucket of the key under a lock (256 shards chosen by maphash), read the
// monotonic clock once, refill as a float and take one token. It has no
// eviction, no validation and no exact arithmetic; it is the yardstick for
// the cost of one decision, not a limiter to use.
type baseline struct {
	seed     maphash.Seed
	start    time.Time
	capacity float64
	perNano  float64 // tokens added per nanosecond
	shards   [256]baselineShard
}

type baselineShard struct {
	mu      sync.Mutex
	buckets map[string]*baselineBucket
	_       [64 - 16]byte // one shard per cache line
}

type baselineBucket struct {
	tokens float64
	last   int64 // nanoseconds since start
}

func newBaseline(_ testing.TB, s shape) limiter {
	b := &baseline{
		seed:     maphash.MakeSeed(),
		start:    time.Now(),
		capacity: capacity,
		perNano:  float64(s.perSecond) / 1e9,
	}
	for i := range b.shards {
		b.shards[i].buckets = make(map[string]*baselineBucket)
	}
	return b
}

func (b *baseline) take(key string) bool {
	sh := &b.shards[maphash.String(b.seed, key)%uint64(len(b.shards))]
	now := int64(time.Since(b.start))
	sh.mu.Lock()
	bk := sh.buckets[key]
	if bk == nil {
		bk = &baselineBucket{tokens: b.capacity, last: now}
		sh.buckets[key] = bk
	}
	if now > bk.last { // another goroutine may have read the clock later
		bk.tokens = min(b.capacity, bk.tokens+float64(now-bk.last)*b.perNano)
		bk.last = now
	}
	ok := bk.tokens >= 1
	if ok {
		bk.tokens--
	}
	sh.mu.Unlock()
	return ok
}

func (b *baseline) close() {}
