package limitcore

import (
	"math"
	"math/bits"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// Fields are the RateLimit fields of one decision, as httplimit writes them
// in response headers and grpclimit in response metadata
// (draft-ietf-httpapi-ratelimit-headers-11).
type Fields struct {
	// Policy is the RateLimit-Policy value: a Structured Field List of one
	// item per limit; empty for none.
	Policy string
	// Limit is the RateLimit value: one item per limit; empty for none.
	Limit string
	// RetryAfter is the Retry-After value in whole seconds, rounded up
	// and at least 1, on a denial whose wait can end; 0 for none.
	RetryAfter int64
}

// Fields returns the fields of d, a decision of c. Degraded decisions (a
// failure policy decided) carry no RateLimit value: their numbers do not
// describe the shared buckets. Their RateLimit-Policy lists only the
// limits a failure policy decided under a reduced limit, as the draft
// allows for a temporarily lower quota. Every t is capped at Retry-After,
// so that no effective window ends after it.
func (c *Core[R]) Fields(d *Decision) Fields {
	var f Fields
	if !d.Allowed {
		f.RetryAfter, _ = RetryAfterSeconds(d.RetryAfter)
	}
	n := min(len(d.Parts), len(d.Requests), len(c.limits))
	var buf [128]byte
	if d.Degraded {
		b := buf[:0]
		for i := range n {
			if l := d.Parts[i].Limit; l.Validate() == nil && l != d.Requests[i].Limit {
				if len(b) > 0 {
					b = append(b, ", "...)
				}
				b = AppendPolicyItem(b, c.limits[i].quoted, l)
			}
		}
		f.Policy = string(b)
		return f
	}
	fixed := c.policyField != ""
	b := buf[:0]
	for i := range n {
		l := partLimit(d, i)
		fixed = fixed && l == c.limits[i].cfg.Limit
		if i > 0 {
			b = append(b, ", "...)
		}
		b = AppendLimitItem(b, c.limits[i].quoted, d.Parts[i], l, f.RetryAfter)
	}
	f.Limit = string(b)
	if fixed {
		f.Policy = c.policyField
		return f
	}
	b = buf[:0]
	for i := range n {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = AppendPolicyItem(b, c.limits[i].quoted, partLimit(d, i))
	}
	f.Policy = string(b)
	return f
}

// partLimit returns the limit part i of d was decided under: the one the
// store reports, or the request's if the store reported none.
func partLimit(d *Decision, i int) sluice.Limit {
	if l := d.Parts[i].Limit; l.Validate() == nil {
		return l
	}
	return d.Requests[i].Limit
}

// AppendPolicyItem appends the RateLimit-Policy item of limit l under the
// quoted policy name: q is the capacity (the largest burst), w the time to
// refill an empty bucket in whole seconds rounded up. w is left out when
// the bucket never refills or takes longer than sluice.Never (about 292
// years) to fill; every value written is far below the 15-digit bound of a
// Structured Field Integer.
func AppendPolicyItem(b []byte, quoted string, l sluice.Limit) []byte {
	b = append(b, quoted...)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, l.Capacity, 10)
	if w, ok := RefillSeconds(l); ok {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, w, 10)
	}
	return b
}

// AppendLimitItem appends the RateLimit item of decision d under limit l:
// r is the whole tokens remaining, t the seconds until r grows (see
// GrowSeconds), capped at retryAfter when that is positive so that t never
// ends after Retry-After. t is left out when r will not grow by waiting.
func AppendLimitItem(b []byte, quoted string, d sluice.Decision, l sluice.Limit, retryAfter int64) []byte {
	b = append(b, quoted...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
	if t, ok := GrowSeconds(d, l); ok {
		if retryAfter > 0 {
			t = min(t, retryAfter)
		}
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
	}
	return b
}

// QuoteString returns s as a Structured Field String (RFC 9651 section
// 3.3.3). s must be printable ASCII (sluice.ValidatePolicy allows
// nothing else in a policy name).
func QuoteString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}

// RetryAfterSeconds returns d rounded up to whole seconds and at least 1,
// and false for sluice.Never or a non-positive d: no Retry-After.
func RetryAfterSeconds(d time.Duration) (int64, bool) {
	if d <= 0 || d == sluice.Never {
		return 0, false
	}
	return CeilSeconds(d), true
}

// CeilSeconds returns d (> 0) in whole seconds, rounded up.
func CeilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// RefillSeconds returns the time an empty bucket of l takes to fill,
// Capacity × Period / Tokens, in whole seconds rounded up; false if it
// never fills or takes longer than sluice.Never.
func RefillSeconds(l sluice.Limit) (int64, bool) {
	if l.Rate.Tokens <= 0 || l.Capacity <= 0 || l.Rate.Period <= 0 {
		return 0, false
	}
	ns, ok := mulDiv(uint64(l.Capacity), uint64(l.Rate.Period), uint64(l.Rate.Tokens), true)
	if !ok {
		return 0, false
	}
	s := ns / uint64(time.Second)
	if ns%uint64(time.Second) != 0 {
		s++
	}
	return int64(s), true
}

// GrowSeconds returns the number of whole seconds, rounded up and at least
// 1, until the whole-token level d.Remaining of a bucket of l grows by one
// if nothing is taken meanwhile: the effective window of the draft, the
// time within which the client can use no more than r. A full bucket grows
// one token's refill time after the client starts taking.
//
// The exact level is not in a Decision, so the time is derived from
// ResetAfter (the time to refill up to the capacity, rounded up by the
// store) minus the refill time of the k = Capacity − Remaining − 1 tokens
// above the next one (rounded down), which never reports a time shorter
// than the exact one. It is false when the bucket does not refill or the
// wait is sluice.Never.
func GrowSeconds(d sluice.Decision, l sluice.Limit) (int64, bool) {
	if l.Rate.Tokens <= 0 || l.Rate.Period <= 0 || d.ResetAfter < 0 || d.ResetAfter == sluice.Never {
		return 0, false
	}
	var wait time.Duration
	if k := l.Capacity - d.Remaining - 1; k < 0 {
		// Full (or more than full, from a store that reports so): one
		// token's refill time after the first take.
		one, ok := mulDiv(1, uint64(l.Rate.Period), uint64(l.Rate.Tokens), true)
		if !ok || one > uint64(sluice.Never-d.ResetAfter) {
			return 0, false
		}
		wait = d.ResetAfter + time.Duration(one)
	} else {
		above, ok := mulDiv(uint64(k), uint64(l.Rate.Period), uint64(l.Rate.Tokens), false)
		if ok && above < uint64(d.ResetAfter) {
			wait = d.ResetAfter - time.Duration(above)
		}
	}
	if wait <= 0 {
		return 1, true // the next token is due now: the smallest window
	}
	return CeilSeconds(wait), true
}

// mulDiv returns a × b / c rounded down, or up if up is set; false if c is
// zero or the result is above math.MaxInt64 (a wait longer than
// sluice.Never).
func mulDiv(a, b, c uint64, up bool) (uint64, bool) {
	if c == 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return 0, false // the quotient needs more than 64 bits
	}
	q, r := bits.Div64(hi, lo, c)
	if q > math.MaxInt64 {
		return 0, false
	}
	if up && r != 0 {
		q++ // at most 2^63: no wrap
	}
	return q, q <= math.MaxInt64
}
