package redisstore

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/exact"
)

// Bounds of Lua's exact integers.
const (
	maxExact  = 1<<53 - 1 // the largest integer every double below it is exact
	limitBits = 52        // C*p' and n' must be below 2^limitBits
)

// plan is a limit prepared for the script: the rate n per P microseconds
// reduced by their gcd to n1 per p1, as bucket.NewPlan does at a 1µs tick.
type plan struct {
	c, n, p, n1, p1 int64
}

// CheckLimit implements sluice.LimitChecker: it reports whether the store
// decides l exactly. l must be valid, its period a whole number of
// microseconds, and, with the rate n per P reduced by gcd(n, P µs) to n'
// per p', capacity × p' below 2^52 (so every intermediate of the script
// stays below 2^53, where Lua's doubles stop being exact). For example,
// 1000 tokens a minute (p' = 60,000µs) allows a capacity up to 75 billion;
// one token every 366 days, a capacity up to 142; a capacity of 2^40 needs
// p' below 4096µs. The error wraps sluice.ErrInvalidLimit and names the
// bound. The answer does not depend on the store's options, and
// sluice.NewLimiter and the middleware constructors ask it, so that a limit
// the store cannot decide fails when it is bound rather than on every
// request.
func (s *Store) CheckLimit(l sluice.Limit) error {
	_, err := compile(l)
	return err
}

// compile checks l as CheckLimit does and prepares it for the script.
func compile(l sluice.Limit) (plan, error) {
	if err := l.Validate(); err != nil {
		return plan{}, err
	}
	if l.Rate.Period%time.Microsecond != 0 {
		return plan{}, fmt.Errorf("%w: period %v is not a whole number of microseconds, the Redis store's time unit", sluice.ErrInvalidLimit, l.Rate.Period)
	}
	pl := plan{c: l.Capacity, n: l.Rate.Tokens, p: int64(l.Rate.Period / time.Microsecond), n1: 0, p1: 1}
	if pl.n > 0 {
		g := int64(exact.GCD(uint64(pl.n), uint64(pl.p)))
		pl.n1, pl.p1 = pl.n/g, pl.p/g
	}
	if hi, lo := bits.Mul64(uint64(pl.c), uint64(pl.p1)); hi != 0 || lo >= 1<<limitBits {
		return plan{}, fmt.Errorf("%w: Redis cannot decide limit %q exactly: capacity %d × reduced period %dµs (the period over gcd(tokens, period)) must be below 2^52, the range of Lua's exact integers; lower the capacity or use a period with more tokens in common",
			sluice.ErrInvalidLimit, l, pl.c, pl.p1)
	}
	if pl.n1 >= 1<<limitBits {
		return plan{}, fmt.Errorf("%w: Redis cannot decide limit %q exactly: reduced rate tokens %d must be below 2^52", sluice.ErrInvalidLimit, l, pl.n1)
	}
	return pl, nil
}

// specLen is the length of a spec argument.
const specLen = 38

// spec returns the script's spec argument for limit pl under the store's
// settings (see bucket.lua).
func (s *Store) spec(pl plan) string {
	return specArg(pl, int64(s.conv), s.minTTL)
}

// specArg encodes a spec as the script reads it,
// struct.unpack('<I6I6I6I6I6BI7'): C, n, P, n', p' as little-endian
// unsigned integers of 6 bytes, the limit-change conversion as 1 and the
// least TTL in milliseconds as 7. A bucket's value starts with the spec it
// was written under.
func specArg(pl plan, conv, leastTTL int64) string {
	var b [specLen]byte
	i := 0
	put := func(v int64, size int) {
		for range size {
			b[i] = byte(v)
			v >>= 8
			i++
		}
	}
	for _, v := range [...]int64{pl.c, pl.n, pl.p, pl.n1, pl.p1} {
		put(v, 6)
	}
	put(conv, 1)
	put(leastTTL, 7)
	return string(b[:])
}
