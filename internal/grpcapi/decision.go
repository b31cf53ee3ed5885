package grpcapi

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limitcore"
	"github.com/sluicehq/sluice/internal/service"
)

// decision is the answer of res. The waits are exact, as the store
// computed them (the HTTP API rounds them up to milliseconds); a wait that
// cannot end (sluice.Never) is no duration and a true "never" flag, so that
// no client reads it as a wait of 292 years, or of zero.
func decision(res service.Result) *sluicev1.Decision {
	d := &sluicev1.Decision{
		Allowed:      res.Allowed,
		Remaining:    res.Remaining,
		Policy:       res.Policy.Name,
		Limit:        limit(res.Decision.Limit),
		Replayed:     res.Replayed,
		Degraded:     res.Degraded,
		ShadowDenied: res.ShadowDenied,
		Taken:        res.Taken,
	}
	d.RetryAfter, d.Never = wait(res.RetryAfter)
	d.ResetAfter, d.ResetNever = wait(res.ResetAfter)
	if len(res.Parts) > 0 {
		d.Limits = make([]*sluicev1.LimitDecision, len(res.Parts))
		for i, p := range res.Parts {
			ld := &sluicev1.LimitDecision{
				Bucket:    res.Policy.Bucket(i),
				Limit:     limit(p.Limit),
				Allowed:   p.Allowed,
				Remaining: p.Remaining,
				Taken:     p.Taken,
				Decided:   i == res.Denied,
			}
			ld.RetryAfter, ld.Never = wait(p.RetryAfter)
			ld.ResetAfter, ld.ResetNever = wait(p.ResetAfter)
			d.Limits[i] = ld
		}
	}
	return d
}

// wait is d as a duration, or no duration and true for sluice.Never.
func wait(d time.Duration) (*durationpb.Duration, bool) {
	if d == sluice.Never {
		return nil, true
	}
	return durationpb.New(d), false
}

// maxLimits bounds the limits whose messages are kept: a limit comes
// from the config, but a request may bring its own (an Envoy override).
const maxLimits = 1024

// limits holds the Limit message of each limit, built once: a message
// that answers share (protobuf messages may be marshalled concurrently),
// so that no decision formats its limit's text or allocates its period.
var limits limitcore.Cache[sluice.Limit, *sluicev1.Limit]

// limit is l as the API's Limit. The message is shared: it must not be
// changed.
func limit(l sluice.Limit) *sluicev1.Limit {
	return limits.Get(l, maxLimits, func() *sluicev1.Limit { return newLimit(l) })
}

// newLimit builds the Limit message of l.
func newLimit(l sluice.Limit) *sluicev1.Limit {
	return &sluicev1.Limit{
		Capacity:     l.Capacity,
		RefillTokens: l.Rate.Tokens,
		RefillPeriod: durationpb.New(l.Rate.Period),
		Text:         l.String(),
	}
}
