package httplimit

import (
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitcore"
)

// Header field names (draft-ietf-httpapi-ratelimit-headers-11 and RFC 9110).
const (
	// HeaderRateLimitPolicy is the field that describes the quota
	// policies: a list of one item per limit.
	HeaderRateLimitPolicy = "RateLimit-Policy"
	// HeaderRateLimit is the field that reports the current service
	// limits: a list of one item per limit.
	HeaderRateLimit = "RateLimit"
	// HeaderRetryAfter is the delay, in whole seconds, before a retry can
	// succeed.
	HeaderRetryAfter = "Retry-After"
)

// SetFields sets the RateLimit-Policy and RateLimit fields of h for decision
// d of the named policy, as the middleware does, and Retry-After when d is a
// denial with a wait that can end. It is for servers that decide with a
// sluice.Store themselves and answer in their own format (the Sluice
// service's HTTP API). policy must be a valid policy name
// (sluice.ValidatePolicy).
func SetFields(h http.Header, policy string, d sluice.Decision) {
	quoted := limitcore.QuoteString(policy)
	var retryAfter int64
	if !d.Allowed {
		if s, ok := limitcore.RetryAfterSeconds(d.RetryAfter); ok {
			retryAfter = s
			h.Set(HeaderRetryAfter, strconv.FormatInt(s, 10))
		}
	}
	var buf [128]byte
	h.Set(HeaderRateLimitPolicy, string(limitcore.AppendPolicyItem(buf[:0], quoted, d.Limit)))
	h.Set(HeaderRateLimit, string(limitcore.AppendLimitItem(buf[:0], quoted, d, d.Limit, retryAfter)))
}
