// Package envoyconf reads the configuration files of envoyproxy/ratelimit,
// Envoy's reference rate-limit service, as they are, and matches the
// descriptors of Envoy's rate-limit requests to their rules, as that
// service does, so that sluice serve can answer Envoy in its place.
//
// # The format
//
// A file names a domain and lists descriptors; a descriptor has a key, an
// optional value, an optional rate_limit, and optionally descriptors of
// its own, nested:
//
//	domain: messaging
//	descriptors:
//	  # 5 marketing messages a day to each number.
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit:
//	          unit: day
//	          requests_per_unit: 5
//	  # 100 messages a day to each number.
//	  - key: to_number
//	    rate_limit: {unit: day, requests_per_unit: 100}
//	  # Paths under /api/ and ending in /export share 10 a minute.
//	  - key: path
//	    value: /api/*/export
//	    share_threshold: true
//	    rate_limit: {unit: minute, requests_per_unit: 10, name: export}
//
// A rate_limit has a unit (second, minute, hour, day, week, month of 30
// days or year of 365 days, in any case) and requests_per_unit (0 to
// 2^32-1; 0 or none: every request is over the limit); or unlimited: true
// and no unit. It may have a name, and replaces: a list of {name: ...}
// (see Rule). A descriptor may also have shadow_mode, quota_mode,
// detailed_metric, value_to_metric and share_threshold (booleans) and
// metadata (any mapping). A value may hold wildcards: * matches any text,
// at the end, in the middle or several times; share_threshold, allowed
// only with a wildcard, makes every value it matches share one bucket.
//
// Every key the service accepts is accepted, and read where the service
// reads it; a key the service knows, written where it does not read it,
// is ignored as the service ignores it, with a warning (Config.Warnings).
// Values are read as the service's YAML library (yaml.v2) reads them:
// yes, no, on and off are booleans, a number is read as the text it is
// written as where a string belongs, aliases and merge keys (<<) are
// expanded. What the service refuses is refused, with the file and line:
// an unknown key, a number with a fraction, an empty domain or key, a
// unit that is not one, unlimited with a unit, an empty replaces name or
// one naming its own rate_limit, share_threshold without a wildcard, two
// descriptors of one level with the same key and value, and a domain
// defined in two files. A key written twice in one mapping, which the
// service allows (the last wins), is refused too.
//
// # Matching
//
// Match finds the rule of one request descriptor, a list of entries (key,
// value), exactly as the service does: see Config.Match. The service
// compares each entry, as the text KEY_VALUE, with each configured
// descriptor's KEY_VALUE (or KEY without a value), and so does this
// package: the rare configs where the texts of different keys and values
// coincide (key "a", value "b_c" and key "a_b", value "c") behave the same
// here as there.
//
// Every rule with a rate_limit gets a Sluice policy (Rule.Policy) and a
// bucket per request descriptor (Rule.Key); Differences says how the
// buckets behave unlike the service's windows.
package envoyconf
