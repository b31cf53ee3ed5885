// Package memstore is the in-process sluice.Store: buckets in memory, spread
// over mutex-guarded shards so distinct keys rarely contend, with a bounded
// number of keys and lossless reclaiming of full buckets.
//
// Time comes from the monotonic clock (time.Now) unless Options.Now injects
// another; it counts whole nanoseconds, so every decision is exact to the
// nanosecond.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Overflow names what a Store does with a new key (or request ID) when it
// already holds its maximum and nothing can be reclaimed without loss.
type Overflow uint8

const (
	// RefuseNew fails the request with an error wrapping
	// sluice.ErrTooManyKeys and counts it (Stats.Refused): existing buckets
	// keep their state, new keys are not limited but refused. The default.
	RefuseNew Overflow = iota
	// EvictLRU drops the least recently used of a small random sample of
	// buckets (the approximation Redis uses) and counts it
	// (Stats.Evicted). An evicted bucket that was not full comes back full
	// the next time its key is seen: each eviction can grant that key at
	// most one extra burst of its capacity.
	EvictLRU
)

// String returns "refuse" or "evict-lru".
func (o Overflow) String() string {
	switch o {
	case RefuseNew:
		return "refuse"
	case EvictLRU:
		return "evict-lru"
	}
	return fmt.Sprintf("Overflow(%d)", uint8(o))
}

// Defaults for the zero Options.
const (
	DefaultMaxKeys       = 1 << 20
	DefaultMaxRequestIDs = 1 << 18
	DefaultRequestIDTTL  = 5 * time.Minute
	DefaultSweepInterval = 10 * time.Second
)

// Options configure a Store. The zero value of every field means its
// documented default.
type Options struct {
	// Now is the clock. Default: time.Now, whose monotonic reading makes the
	// store immune to wall-clock steps. A clock that steps back refills
	// nothing and never moves a bucket's stamp back.
	Now func() time.Time
	// MaxKeys bounds the number of buckets held at once. Default
	// DefaultMaxKeys (1,048,576); at about 100 bytes each that is about
	// 100 MiB with short keys.
	MaxKeys int
	// Overflow decides what happens to a new key when MaxKeys buckets are
	// held and none is full (full buckets are always reclaimed first, at no
	// loss). Default RefuseNew.
	Overflow Overflow
	// OnLimitChange converts a bucket's level when a request arrives with a
	// limit other than the one it was last decided under. Default
	// sluice.KeepTokens.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first decision of a request ID is
	// remembered. Default DefaultRequestIDTTL (5 minutes).
	RequestIDTTL time.Duration
	// MaxRequestIDs bounds the number of remembered request IDs. When a
	// shard's share (MaxRequestIDs/shards) is full and none has expired,
	// Overflow decides: RefuseNew fails a request carrying a new ID with
	// sluice.ErrTooManyKeys, EvictLRU forgets the oldest ID early. Default
	// DefaultMaxRequestIDs (262,144).
	MaxRequestIDs int
	// SweepInterval is how often a background goroutine drops full
	// buckets and expired request IDs. Default DefaultSweepInterval (10s);
	// negative disables it (full buckets are still reclaimed when the store
	// is at MaxKeys). Close stops it.
	SweepInterval time.Duration
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. Default 256.
	Shards int
}

// Store is an in-memory sluice.Store. It is safe for concurrent use. Create
// one with New and stop its sweeper with Close.
type Store struct {
	now       func() time.Time // nil: the monotonic clock
	epoch     time.Time
	seed      maphash.Seed
	shards    []shard
	mask      uint64
	shardBits uint
	policy    sluice.Conversion
	overflow  Overflow
	maxKeys   int64
	idTTL     int64 // nanoseconds
	idsPer    int   // request IDs per shard

	keys atomic.Int64
	ids  atomic.Int64

	reclaimed, evicted, refused, idsEvicted atomic.Uint64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ sluice.Store = (*Store)(nil)

// New returns a Store configured by o and starts its sweeper (unless
// disabled). Invalid option values (negative sizes) are replaced by defaults.
func New(o Options) (*Store, error) {
	s := &Store{
		now:      o.Now,
		seed:     maphash.MakeSeed(),
		policy:   o.OnLimitChange,
		overflow: o.Overflow,
		maxKeys:  int64(o.MaxKeys),
		idTTL:    int64(o.RequestIDTTL),
	}
	if s.maxKeys <= 0 {
		s.maxKeys = DefaultMaxKeys
	}
	if s.idTTL <= 0 {
		s.idTTL = int64(DefaultRequestIDTTL)
	}
	n := 256
	if o.Shards > 0 {
		n = 1
		for n < o.Shards && n < 1<<16 {
			n <<= 1
		}
	}
	maxIDs := o.MaxRequestIDs
	if maxIDs <= 0 {
		maxIDs = DefaultMaxRequestIDs
	}
	s.idsPer = max(1, (maxIDs+n-1)/n)
	s.shards = make([]shard, n)
	s.mask = uint64(n - 1)
	s.shardBits = uint(bits.Len(uint(n - 1)))
	for i := range s.shards {
		s.shards[i].ids = make(map[idKey]*idRecord)
		s.shards[i].plans = make(map[sluice.Limit]*planRef)
		s.shards[i].minFull.Store(math.MaxInt64)
	}
	if s.now == nil {
		s.epoch = time.Now()
	} else {
		s.epoch = s.now()
	}
	interval := o.SweepInterval
	if interval == 0 {
		interval = DefaultSweepInterval
	}
	if interval > 0 {
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.sweeper(interval)
	}
	return s, nil
}

// Close stops the background sweeper and waits for it to exit. The store
// stays usable afterwards. Close is idempotent and always returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
	})
	return nil
}

type idKey struct{ key, id string }

type idRecord struct {
	cost     int64
	decision sluice.Decision
	expires  int64
}

type idQueued struct {
	k       idKey
	expires int64
}

// shard is one lock's worth of buckets and request IDs.
type shard struct {
	mu    sync.Mutex
	table table
	// minFull is a lower bound on the tick at which any bucket of the shard
	// becomes full: no bucket is reclaimable before it. Written under mu,
	// read without it.
	minFull atomic.Int64
	// plans holds the limits in use by the shard's buckets, compiled.
	plans map[sluice.Limit]*planRef

	ids   map[idKey]*idRecord
	queue []idQueued // request IDs in insertion order, for expiry
	head  int

	_ [64]byte // keep neighbouring shards' locks off one cache line
}

// Take implements sluice.Store. A request that passes validation returns
// ctx.Err() if ctx is already done; otherwise Take never blocks on anything
// but the shard lock.
func (s *Store) Take(ctx context.Context, r sluice.Request) (d sluice.Decision, err error) {
	// Small enough to be inlined: a caller holding a *Store passes the
	// request's fields in registers and receives the decision in place,
	// rather than copying both structs through memory.
	err = s.takeFields(ctx, r.Policy, r.Key, r.Cost, r.Limit, r.RequestID, &d)
	return d, err
}

// takeFields is Take with the request passed field by field and the
// decision by pointer.
func (s *Store) takeFields(ctx context.Context, policy, key string, cost int64, l sluice.Limit, id string, d *sluice.Decision) (err error) {
	if len(key) > sluice.MaxKeyLen {
		return sluice.ValidateKey(key) // refuse before hashing a huge key
	}
	h := maphash.String(s.seed, key)
	sh := &s.shards[h&s.mask]
	tg := tag(h, s.shardBits)
	now := s.clock()
	sh.mu.Lock()
	// The hot path: an existing bucket, the same limit, no request ID. The
	// bucket's key and limit were validated when it was created, so only
	// the cost is left to check.
	if id == "" && cost >= 1 && cost <= l.Capacity {
		if idx, _ := sh.table.find(key, tg); idx >= 0 {
			e := &sh.table.entries[idx]
			if pl := &e.plan.plan; pl.Limit() == l {
				if err = ctx.Err(); err == nil {
					pl.Take(&e.state, now, cost, d)
					sh.noteFullAt(e.state.Stamp, d.ResetAfter)
				}
				sh.mu.Unlock()
				return err
			}
		}
	}
	err = s.take(ctx, sh, &sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l, RequestID: id}, tg, now, d)
	sh.mu.Unlock()
	return err
}

// take is the general path of Take, with sh locked: it validates r, answers
// request-ID replays, creates buckets and converts limits.
func (s *Store) take(ctx context.Context, sh *shard, r *sluice.Request, tg uint32, now int64, d *sluice.Decision) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var ik idKey
	if r.RequestID != "" {
		ik = idKey{r.Key, r.RequestID}
		if rec := sh.ids[ik]; rec != nil && now >= rec.expires {
			delete(sh.ids, ik)
			s.ids.Add(-1)
		} else if rec != nil {
			if rec.cost != r.Cost || rec.decision.Limit != r.Limit {
				return fmt.Errorf("%w: request ID %q for this key was first used with cost %d and limit %v, now cost %d and limit %v",
					sluice.ErrRequestIDConflict, r.RequestID, rec.cost, rec.decision.Limit, r.Cost, r.Limit)
			}
			*d = rec.decision
			d.Replayed = true
			return nil
		}
		if err := s.reserveID(sh, now); err != nil {
			return err
		}
	}

	idx, _ := sh.table.find(r.Key, tg)
	var b *entry
	switch {
	case idx < 0:
		pr, err := sh.acquire(r.Limit)
		if err == nil {
			if err = s.reserveKey(sh, now); err != nil {
				sh.release(pr)
			}
		}
		if err != nil {
			if r.RequestID != "" {
				s.ids.Add(-1)
			}
			return err
		}
		key := strings.Clone(r.Key)
		idx = sh.table.insert(key, tg, entry{key: key, state: pr.plan.Full(now), plan: pr}, s.shardBits, s.hash)
		b = &sh.table.entries[idx]
	case sh.table.entries[idx].plan.plan.Limit() != r.Limit:
		b = &sh.table.entries[idx]
		pr, err := sh.acquire(r.Limit)
		if err != nil {
			if r.RequestID != "" {
				s.ids.Add(-1)
			}
			return err
		}
		old := b.plan
		b.state = pr.plan.Convert(old.plan.Refill(b.state, now), &old.plan, s.policy)
		b.plan = pr
		sh.release(old)
	default:
		b = &sh.table.entries[idx]
	}

	b.plan.plan.Take(&b.state, now, r.Cost, d)
	sh.noteFullAt(b.state.Stamp, d.ResetAfter)
	if r.RequestID != "" {
		ik.key = strings.Clone(ik.key)
		ik.id = strings.Clone(ik.id)
		exp := satAdd(now, s.idTTL)
		sh.ids[ik] = &idRecord{cost: r.Cost, decision: *d, expires: exp}
		sh.queue = append(sh.queue, idQueued{k: ik, expires: exp})
	}
	return nil
}

// Peek implements sluice.Store. It creates no state and changes none.
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	key, l := r.Key, r.Limit
	pl, err := bucket.NewPlan(l, time.Nanosecond)
	if err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	h := maphash.String(s.seed, key)
	sh := &s.shards[h&s.mask]
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx, _ := sh.table.find(key, tag(h, s.shardBits))
	if idx < 0 {
		return pl.Peek(pl.Full(now), now, r.Cost), nil
	}
	b := &sh.table.entries[idx]
	if b.plan.plan.Limit() == l {
		return pl.Peek(b.state, now, r.Cost), nil
	}
	old := &b.plan.plan
	return pl.Peek(pl.Convert(old.Refill(b.state, now), old, s.policy), now, r.Cost), nil
}

// planRef is a compiled limit shared by the buckets of one shard that use it.
type planRef struct {
	plan bucket.Plan
	refs int
}

// acquire returns the shard's plan for l, compiling it if no bucket of the
// shard uses l yet, and counts one more user.
func (sh *shard) acquire(l sluice.Limit) (*planRef, error) {
	if pr := sh.plans[l]; pr != nil {
		pr.refs++
		return pr, nil
	}
	p, err := bucket.NewPlan(l, time.Nanosecond)
	if err != nil {
		return nil, err
	}
	pr := &planRef{plan: p, refs: 1}
	sh.plans[l] = pr
	return pr, nil
}

// release counts one user fewer of pr and forgets it when none is left.
func (sh *shard) release(pr *planRef) {
	if pr.refs--; pr.refs == 0 {
		delete(sh.plans, pr.plan.Limit())
	}
}

// clock returns the current time in nanoseconds since the store's epoch.
func (s *Store) clock() int64 {
	if s.now == nil {
		return int64(time.Since(s.epoch)) // one read of the monotonic clock
	}
	return int64(s.now().Sub(s.epoch))
}

// hash is the store's hash of a key: its low bits pick the shard, the rest
// index the shard's table.
func (s *Store) hash(key string) uint64 { return maphash.String(s.seed, key) }

// noteFullAt lowers the shard's bound on the next full bucket to the tick
// a bucket with this stamp and ResetAfter is full.
func (sh *shard) noteFullAt(stamp int64, resetAfter time.Duration) {
	if full := fullAt(stamp, resetAfter); full < sh.minFull.Load() {
		sh.minFull.Store(full)
	}
}

// fullAt returns stamp+wait saturated at math.MaxInt64 (Never stays never).
func fullAt(stamp int64, wait time.Duration) int64 {
	if wait == sluice.Never {
		return math.MaxInt64
	}
	return satAdd(stamp, int64(wait))
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
