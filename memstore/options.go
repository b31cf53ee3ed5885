package memstore

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// Overflow names what a Store does with a new key when it already holds
// MaxKeys buckets and the insert found none it could reclaim without loss.
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
	DefaultShards        = 256
	// MaxShards is the largest Options.Shards.
	MaxShards = 1 << 16
)

// Options configure a Store. The zero value of every field means its
// documented default; New refuses values outside the documented ranges
// with an error wrapping sluice.ErrInvalidOption.
type Options struct {
	// Now is the clock. Default: time.Now, whose monotonic reading makes the
	// store immune to wall-clock steps. A clock that steps back refills
	// nothing and never moves a bucket's stamp back.
	Now func() time.Time
	// MaxKeys bounds the number of buckets held at once, across all
	// policies: never more are held. Zero means DefaultMaxKeys
	// (1,048,576); at about 100 bytes each that is about 100 MiB with
	// short keys. Negative is an error.
	MaxKeys int
	// Overflow decides what happens to a new key when MaxKeys buckets are
	// held and the insert found no full one to reclaim (full buckets are
	// reclaimed first, at no loss). RefuseNew (the default) or EvictLRU;
	// another value is an error.
	Overflow Overflow
	// OnLimitChange converts a bucket's level when a request of its policy
	// arrives with a limit other than the one it was last decided under
	// (Stats.Conversions counts these). sluice.KeepTokens (the default),
	// sluice.ScaleTokens or sluice.ResetTokens; another value is an error.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first allowed decision of a request ID
	// is remembered. Zero means DefaultRequestIDTTL (5 minutes); negative
	// is an error.
	RequestIDTTL time.Duration
	// MaxRequestIDs bounds the number of remembered request IDs, split
	// evenly over the shards, so it must be at least the number of shards.
	// Zero means DefaultMaxRequestIDs (262,144); negative is an error.
	//
	// Only allowed decisions are remembered (a denial consumed nothing, so
	// its retry decides afresh), and a full share never refuses a request:
	// the shard forgets its oldest ID early, counted in
	// Stats.EvictedRequestIDs, and remembers the new one. Refusing instead
	// would let any client whose requests are allowed, for example over
	// many keys, fail every other client's idempotent requests; forgetting
	// costs only idempotency, and only for a retry that comes late: it is
	// decided afresh, and charged again if allowed. If EvictedRequestIDs
	// grows, raise MaxRequestIDs (about 200 bytes per ID, plus its policy,
	// key and ID bytes) or lower RequestIDTTL, so that the IDs of one TTL
	// fit.
	MaxRequestIDs int
	// SweepInterval is how often a background goroutine drops full
	// buckets and expired request IDs (SweepNow). Zero means
	// DefaultSweepInterval (10s); negative disables it (inserts at MaxKeys
	// still reclaim full buckets). Close stops it.
	SweepInterval time.Duration
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. Zero means DefaultShards (256); negative or more than
	// MaxShards is an error.
	Shards int
}

// config is Options checked, with the defaults filled in.
type config struct {
	maxKeys, maxIDs, shards int
	idTTL, sweepInterval    time.Duration
}

// check returns o's configuration, or an error wrapping
// sluice.ErrInvalidOption that names the first option out of range.
func (o Options) check() (config, error) {
	c := config{
		maxKeys:       o.MaxKeys,
		maxIDs:        o.MaxRequestIDs,
		idTTL:         o.RequestIDTTL,
		sweepInterval: o.SweepInterval,
	}
	switch {
	case o.MaxKeys < 0:
		return c, fmt.Errorf("%w: MaxKeys %d is negative; use 0 for the default (%d) or a positive bound", sluice.ErrInvalidOption, o.MaxKeys, DefaultMaxKeys)
	case o.Overflow > EvictLRU:
		return c, fmt.Errorf("%w: Overflow %d is unknown; use RefuseNew or EvictLRU", sluice.ErrInvalidOption, uint8(o.Overflow))
	case o.OnLimitChange.Validate() != nil:
		return c, fmt.Errorf("%w: OnLimitChange %d is unknown; use sluice.KeepTokens, sluice.ScaleTokens or sluice.ResetTokens", sluice.ErrInvalidOption, uint8(o.OnLimitChange))
	case o.RequestIDTTL < 0:
		return c, fmt.Errorf("%w: RequestIDTTL %v is negative; use 0 for the default (%v) or a positive duration", sluice.ErrInvalidOption, o.RequestIDTTL, DefaultRequestIDTTL)
	case o.MaxRequestIDs < 0:
		return c, fmt.Errorf("%w: MaxRequestIDs %d is negative; use 0 for the default (%d) or a positive bound", sluice.ErrInvalidOption, o.MaxRequestIDs, DefaultMaxRequestIDs)
	case o.Shards < 0 || o.Shards > MaxShards:
		return c, fmt.Errorf("%w: Shards %d is outside [0, %d]; use 0 for the default (%d)", sluice.ErrInvalidOption, o.Shards, MaxShards, DefaultShards)
	}
	if c.maxKeys == 0 {
		c.maxKeys = DefaultMaxKeys
	}
	if c.maxIDs == 0 {
		c.maxIDs = DefaultMaxRequestIDs
	}
	if c.idTTL == 0 {
		c.idTTL = DefaultRequestIDTTL
	}
	if c.sweepInterval == 0 {
		c.sweepInterval = DefaultSweepInterval
	}
	c.shards = DefaultShards
	if o.Shards > 0 {
		c.shards = 1
		for c.shards < o.Shards {
			c.shards <<= 1
		}
	}
	if c.maxIDs < c.shards {
		return c, fmt.Errorf("%w: MaxRequestIDs %d is below the number of shards (%d): each shard needs room for one; use at least %d, or fewer Shards", sluice.ErrInvalidOption, c.maxIDs, c.shards, c.shards)
	}
	return c, nil
}
