package envoyconf

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// OverrideRule returns the rule of a request descriptor that brings its own
// limit (Envoy's descriptor limit override) in domain: requestsPerUnit per
// multiplier × unit, unit being one of the config format's (in any case).
// The service decides such a descriptor by that limit alone, whatever the
// config's rules say, as envoyproxy/ratelimit does.
//
// All the overrides of one domain share one policy name, PolicyPrefix,
// the domain and "/!override" ("!" is in no rule's name), so that the
// policies, and the metrics labelled by them, stay as few as the domains;
// each limit keeps its own buckets instead, through the key (Key puts the
// limit first), so that two limits sent for one descriptor never convert
// each other's bucket.
func OverrideRule(domain string, requestsPerUnit uint32, unitName string, multiplier uint32) (*Rule, error) {
	u, ok := unitOf(unitName)
	if !ok {
		return nil, fmt.Errorf("%w: the limit's unit %q is not %s", ErrInvalid, unitName, unitList)
	}
	if multiplier == 0 {
		multiplier = 1
	}
	r := &Rule{Domain: domain, RequestsPerUnit: requestsPerUnit, Unit: u.name, override: true}
	name := policyName(domain, nil) + "/!override"
	if len(name) > sluice.MaxPolicyLen {
		// The name of a path of one empty key, which no rule has (the
		// loader refuses empty keys): "envoy/DOMAIN/", or its hashed
		// form when that is too long too.
		name = policyName(domain, []Entry{{}})
	}
	r.Policy = name
	if requestsPerUnit == 0 {
		r.Deny = true
		return r, nil
	}
	period := time.Duration(multiplier) * u.period
	if period/time.Duration(multiplier) != u.period {
		return nil, fmt.Errorf("%w: %d × %s is too long a period", ErrInvalid, multiplier, u.name)
	}
	n := int64(requestsPerUnit)
	r.Limit = sluice.Limit{Capacity: n, Rate: sluice.Per(n, period)}
	if err := r.Limit.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %d per %d %s is not a Sluice limit: %w", ErrInvalid, requestsPerUnit, multiplier, u.name, err)
	}
	r.overrideKey = strconv.FormatInt(n, 10) + "/" + strconv.FormatInt(int64(period), 10) + "ns|"
	return r, nil
}

// Override reports whether r is an OverrideRule: a limit that came with a
// request, not a rule of the config.
func (r *Rule) Override() bool { return r.override }
