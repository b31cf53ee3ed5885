package httplimit

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// Header field names (draft-ietf-httpapi-ratelimit-headers-11 and RFC 9110).
const (
	// HeaderRateLimitPolicy is the field that describes the quota policy.
	HeaderRateLimitPolicy = "RateLimit-Policy"
	// HeaderRateLimit is the field that reports the current service limit.
	HeaderRateLimit = "RateLimit"
	// HeaderRetryAfter is the delay, in whole seconds, before a retry can
	// succeed.
	HeaderRetryAfter = "Retry-After"
)

// appendPolicyField appends the RateLimit-Policy item of limit l under the
// quoted policy name: q is the capacity (the largest burst), w the time to
// refill an empty bucket in whole seconds rounded up. w is left out when the
// bucket never refills or takes longer than sluice.Never (about 292 years)
// to fill; every value written is far below the 15-digit bound of a
// Structured Field Integer.
func appendPolicyField(b []byte, quoted string, l sluice.Limit) []byte {
	b = append(b, quoted...)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, l.Capacity, 10)
	if w, ok := refillSeconds(l); ok {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, w, 10)
	}
	return b
}

// appendLimitField appends the RateLimit item of decision d under limit l:
// r is the whole tokens remaining, t the seconds until r grows (see
// growSeconds), capped at retryAfter when that is positive so that t never
// ends after Retry-After. t is left out when r will not grow by waiting.
func appendLimitField(b []byte, quoted string, d sluice.Decision, l sluice.Limit, retryAfter int64) []byte {
	b = append(b, quoted...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
	if t, ok := growSeconds(d, l); ok {
		if retryAfter > 0 {
			t = min(t, retryAfter)
		}
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
	}
	return b
}

// quoteString returns s as a Structured Field String (RFC 9651 section
// 3.3.3). s must be printable ASCII (sluice.ValidatePolicy allows
// nothing else in a policy name).
func quoteString(s string) string {
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

// retryAfterSeconds returns d rounded up to whole seconds and at least 1,
// and false for sluice.Never or a non-positive d: no Retry-After.
func retryAfterSeconds(d time.Duration) (int64, bool) {
	if d <= 0 || d == sluice.Never {
		return 0, false
	}
	return ceilSeconds(d), true
}

// ceilSeconds returns d (> 0) in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// refillSeconds returns the time an empty bucket of l takes to fill,
// Capacity × Period / Tokens, in whole seconds rounded up; false if it never
// fills or takes longer than sluice.Never.
func refillSeconds(l sluice.Limit) (int64, bool) {
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

// growSeconds returns the number of whole seconds, rounded up and at least
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
func growSeconds(d sluice.Decision, l sluice.Limit) (int64, bool) {
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
	return ceilSeconds(wait), true
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

// SetFields sets the RateLimit-Policy and RateLimit fields of h for decision
// d of the named policy, as the middleware does, and Retry-After when d is a
// denial with a wait that can end. It is for servers that decide with a
// sluice.Store themselves and answer in their own format (the Sluice
// service's HTTP API). policy must be a valid policy name
// (sluice.ValidatePolicy).
func SetFields(h http.Header, policy string, d sluice.Decision) {
	quoted := quoteString(policy)
	var retryAfter int64
	if !d.Allowed {
		if s, ok := retryAfterSeconds(d.RetryAfter); ok {
			retryAfter = s
			h.Set(HeaderRetryAfter, strconv.FormatInt(s, 10))
		}
	}
	var buf [128]byte
	h.Set(HeaderRateLimitPolicy, string(appendPolicyField(buf[:0], quoted, d.Limit)))
	h.Set(HeaderRateLimit, string(appendLimitField(buf[:0], quoted, d, d.Limit, retryAfter)))
}
