// Package memstore is the in-process sluice.Store: buckets in memory, spread
// over mutex-guarded shards so distinct buckets rarely contend, with a
// bounded number of buckets and of remembered request IDs, and lossless
// reclaiming of full buckets.
//
// A bucket belongs to a (policy, key) pair: two policies never share a
// bucket or a request ID, whatever their keys.
//
// Time comes from the monotonic clock (time.Now) unless Options.Now injects
// another; it counts whole nanoseconds, so every decision is exact to the
// nanosecond. Within a shard time never runs backwards: a bucket is never
// stamped before its previous stamp, nor created at a reading older than
// the latest moment something was dropped from the shard (see SweepNow).
package memstore

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Store is an in-memory sluice.Store, and a sluice.Operator: it also
// decides several buckets at once (TakeAll), drains, refunds and resets.
// It is safe for concurrent use. Create one with New and stop its sweeper
// with Close.
type Store struct {
	now        func() time.Time // nil: the monotonic clock
	epoch      time.Time
	seed       maphash.Seed // of keys longer than inlineKey
	keyKeys    [3]uint64    // of shorter keys
	policySeed maphash.Seed // of policy names longer than 8 bytes
	policyKeys [2]uint64    // of shorter policy names
	shards     []shard
	mask       uint64
	shardBits  uint
	conversion sluice.Conversion
	overflow   Overflow
	maxKeys    int64
	idTTL      int64 // nanoseconds

	keys atomic.Int64
	ids  atomic.Int64
	// cursor is the next shard an insert at MaxKeys looks at once its own
	// has nothing to reclaim.
	cursor atomic.Uint64

	reclaimed, evicted, refused, idsEvicted, conversions atomic.Uint64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ sluice.Operator = (*Store)(nil)

// New returns a Store configured by o and starts its sweeper (unless
// disabled). An option out of its range is an error wrapping
// sluice.ErrInvalidOption that names it; the zero value of each option is
// its default.
func New(o Options) (*Store, error) {
	c, err := o.check()
	if err != nil {
		return nil, err
	}
	s := &Store{
		now:        o.Now,
		seed:       maphash.MakeSeed(),
		keyKeys:    [3]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64()},
		policySeed: maphash.MakeSeed(),
		policyKeys: [2]uint64{rand.Uint64(), rand.Uint64()},
		conversion: o.OnLimitChange,
		overflow:   o.Overflow,
		maxKeys:    int64(c.maxKeys),
		idTTL:      int64(c.idTTL),
	}
	n := c.shards
	s.shards = make([]shard, n)
	s.mask = uint64(n - 1)
	s.shardBits = uint(bits.Len(uint(n - 1)))
	for i := range s.shards {
		sh := &s.shards[i]
		// Shares of MaxRequestIDs differ by at most one and add up to it.
		sh.ids.max = c.maxIDs / n
		if i < c.maxIDs%n {
			sh.ids.max++
		}
		sh.minFull.Store(math.MaxInt64)
		sh.floor = math.MinInt64
		sh.scanMin = math.MaxInt64
	}
	if s.now == nil {
		s.epoch = time.Now()
	} else {
		s.epoch = s.now()
	}
	if c.sweepInterval > 0 {
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.sweeper(c.sweepInterval)
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

// shard is one lock's worth of buckets and request IDs.
type shard struct {
	mu    sync.Mutex
	table table
	// minFull is a lower bound on the tick at which any bucket of the shard
	// becomes full: no bucket is reclaimable before it. Written under mu,
	// read without it.
	minFull atomic.Int64
	// floor is the latest clock reading at which the shard dropped
	// anything, or was swept: a bucket is created no earlier (see
	// SweepNow).
	floor int64
	// scanAt and scanMin are the position of the inserts' incremental
	// reclaim scan in table.entries and the least tick at which a bucket
	// seen (or decided) since the scan last started over is full.
	scanAt  int
	scanMin int64
	// examined counts the buckets reclaim scans looked at (for tests).
	examined uint64
	// plans holds the policies and limits of the shard's buckets, the
	// limits compiled.
	plans map[planKey]*planRef // nil until the first bucket
	// lastPlan is the record acquire returned last, if still in use: most
	// shards see one policy and limit, and a match spares the map lookup.
	lastPlan *planRef
	ids      idMemory

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
	if len(key) > sluice.MaxKeyLen || len(policy) > sluice.MaxPolicyLen {
		// Refuse before hashing a huge string.
		r := sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l, RequestID: id}
		return r.Validate()
	}
	// pn, h := s.identify(policy, key), with a key of 8 to 16 bytes and a
	// policy name of 4 to 8 bytes (the usual ones) written out: see
	// Store.hash. kw is the key packed as an entry holds it (see
	// makeKeyRef), for the probe below.
	var (
		pn policyName
		h  uint64
		kw [2]uint64
	)
	if n, m := len(key), len(policy); n >= 8 && n <= inlineKey && m >= 4 && m <= 8 {
		kw = [2]uint64{le64(key), le64(key[n-8:]) >> (8 * (16 - n))}
		pn = policyName{name: policy, word: le32(policy) | le32(policy[m-4:])<<(8*(m-4))}
		h = s.inlineKeyHash(kw, n) ^ s.shortPolicyHash(pn.word, m)
	} else {
		if n <= inlineKey {
			kw = packKey(key)
		}
		pn, h = s.identify(policy, key)
	}
	sh := &s.shards[h&s.mask]
	tg := tag(h, s.shardBits)
	now := s.clock()
	sh.mu.Lock()
	// The hot path: an existing bucket, the same limit, no request ID. The
	// bucket's policy, key and limit were validated when it was created,
	// so only the cost is left to check.
	if id == "" && cost >= 1 && cost <= l.Capacity {
		// idx, _ := sh.table.find(pn, key, tg), written out: find is too
		// large to be inlined, and this saves a call on every decision.
		t := &sh.table
		for mask, i := len(t.slots)-1, int(tg); mask >= 0; i++ {
			sv := t.slots[i&mask]
			if sv == 0 {
				break
			}
			if uint32(sv>>32) != tg {
				continue
			}
			e := &t.entries[uint32(sv)-1]
			// e.is(pn, &k) for k := makeKeyRef(key), written out with
			// kw for k.k.
			if e.key.k != kw || len(e.key.long) != len(key) || len(key) > inlineKey && e.key.long != key || !e.plan.policy.is(pn) {
				continue
			}
			if pl := &e.plan.plan; pl.Limit() == l {
				if err = ctx.Err(); err == nil {
					pl.Take(&e.state, now, cost, d)
					sh.noteFullAt(now, d.ResetAfter)
				}
				sh.mu.Unlock()
				return err
			}
			break
		}
	}
	err = s.take(ctx, sh, &sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l, RequestID: id}, pn, tg, now, d)
	sh.mu.Unlock()
	return err
}

// take is the general path of Take, with sh locked: it validates r, answers
// request-ID replays, creates buckets, converts limits and remembers
// allowed decisions of request IDs.
func (s *Store) take(ctx context.Context, sh *shard, r *sluice.Request, pn policyName, tg uint32, now int64, d *sluice.Decision) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.RequestID != "" {
		if ok, err := s.replay(sh, r, now, d); ok || err != nil {
			return err
		}
	}

	b, err := s.bucket(sh, r, pn, tg, now)
	if err != nil {
		return err
	}
	b.plan.plan.Take(&b.state, now, r.Cost, d)
	sh.noteFullAt(now, d.ResetAfter)
	if r.RequestID != "" && d.Allowed {
		s.remember(sh, r, now, d)
	}
	return nil
}

// bucket returns the bucket of r in sh (locked by the caller) brought to
// r.Limit: created full if it is missing and the store has room for it
// (reserveKey), converted if it was last decided under another limit.
func (s *Store) bucket(sh *shard, r *sluice.Request, pn policyName, tg uint32, now int64) (*entry, error) {
	idx, _ := sh.table.find(pn, r.Key, tg)
	if idx < 0 {
		pr, err := sh.acquire(pn, r.Limit)
		if err != nil {
			return nil, err
		}
		if err := s.reserveKey(sh, now, nil); err != nil {
			sh.release(pr)
			return nil, err
		}
		return s.insert(sh, pr, r.Key, tg, now), nil
	}
	b := &sh.table.entries[idx]
	if b.plan.plan.Limit() != r.Limit {
		pr, err := sh.acquire(pn, r.Limit)
		if err != nil {
			return nil, err
		}
		s.convert(sh, b, pr, now)
	}
	return b, nil
}

// insert adds the bucket of key under pr to sh (locked by the caller; the
// key is missing, its room reserved, pr acquired for it), full, and
// returns it.
func (s *Store) insert(sh *shard, pr *planRef, key string, tg uint32, now int64) *entry {
	// A bucket the shard may have dropped at a later reading than now
	// comes back at that reading, never earlier.
	e := entry{key: ownKeyRef(key), state: pr.plan.Full(max(now, sh.floor)), plan: pr}
	return &sh.table.entries[sh.table.insert(tg, e, s.shardBits, s.rehash)]
}

// convert carries b (in sh, locked by the caller), refilled up to now
// under its limit, over to pr (acquired for it) under the store's
// conversion, and counts it.
func (s *Store) convert(sh *shard, b *entry, pr *planRef, now int64) {
	old := b.plan
	b.state = pr.plan.Convert(old.plan.Refill(b.state, now), &old.plan, s.conversion)
	b.plan = pr
	sh.release(old)
	s.conversions.Add(1)
}

// Peek implements sluice.Store. It answers as a Take of r.Cost would, and
// creates no state and changes none.
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	pn, h := s.identify(r.Policy, r.Key)
	sh := &s.shards[h&s.mask]
	now := s.clock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var b *entry
	if idx, _ := sh.table.find(pn, r.Key, tag(h, s.shardBits)); idx >= 0 {
		b = &sh.table.entries[idx]
		if pl := &b.plan.plan; pl.Limit() == r.Limit {
			return pl.Peek(b.state, now, r.Cost), nil
		}
	}
	pl, err := bucket.NewPlan(r.Limit, time.Nanosecond)
	if err != nil {
		return sluice.Decision{}, err
	}
	if b == nil {
		return pl.Peek(pl.Full(max(now, sh.floor)), now, r.Cost), nil
	}
	old := &b.plan.plan
	return pl.Peek(pl.Convert(old.Refill(b.state, now), old, s.conversion), now, r.Cost), nil
}

// planKey is what buckets share a planRef by.
type planKey struct {
	policy string
	limit  sluice.Limit
}

// planRef is the policy and compiled limit shared by the buckets of one
// shard that have them.
type planRef struct {
	plan   bucket.Plan
	policy policyName
	refs   int
}

// acquire returns the shard's planRef for policy p and limit l, making it
// if no bucket of the shard has them yet, and counts one more user.
func (sh *shard) acquire(p policyName, l sluice.Limit) (*planRef, error) {
	if pr := sh.lastPlan; pr != nil && pr.policy.is(p) && pr.plan.Limit() == l {
		pr.refs++
		return pr, nil
	}
	if pr := sh.plans[planKey{p.name, l}]; pr != nil {
		pr.refs++
		sh.lastPlan = pr
		return pr, nil
	}
	plan, err := bucket.NewPlan(l, time.Nanosecond)
	if err != nil {
		return nil, err
	}
	if sh.plans == nil {
		sh.plans = make(map[planKey]*planRef)
	}
	p.name = strings.Clone(p.name)
	pr := &planRef{plan: plan, policy: p, refs: 1}
	sh.plans[planKey{p.name, l}] = pr
	sh.lastPlan = pr
	return pr, nil
}

// release counts one user fewer of pr and forgets it when none is left.
func (sh *shard) release(pr *planRef) {
	if pr.refs--; pr.refs == 0 {
		delete(sh.plans, planKey{pr.policy.name, pr.plan.Limit()})
		if sh.lastPlan == pr {
			sh.lastPlan = nil
		}
	}
}

// clock returns the current time in nanoseconds since the store's epoch.
func (s *Store) clock() int64 {
	if s.now == nil {
		return int64(time.Since(s.epoch)) // one read of the monotonic clock
	}
	return int64(s.now().Sub(s.epoch))
}

// noteFullAt lowers the shard's bounds on the next full bucket to the tick
// at which a bucket just decided at now, with this ResetAfter, is full
// (waits count from now, even when the bucket's stamp is later).
func (sh *shard) noteFullAt(now int64, resetAfter time.Duration) {
	sh.noteFull(fullAt(now, resetAfter))
}

// noteFull lowers the shard's bounds on the next full bucket to full, the
// tick at which one of its buckets is full.
func (sh *shard) noteFull(full int64) {
	if full < sh.minFull.Load() {
		sh.minFull.Store(full)
	}
	if full < sh.scanMin {
		sh.scanMin = full
	}
}

// fullAt returns now+wait saturated at math.MaxInt64 (Never stays never).
func fullAt(now int64, wait time.Duration) int64 {
	if wait == sluice.Never {
		return math.MaxInt64
	}
	return satAdd(now, int64(wait))
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
