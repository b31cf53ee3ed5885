package envoyconf

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Entry is one key and value of a descriptor. In a request it is what
// Envoy sent; in a Rule's Path it is what the config wrote, the value ""
// for a descriptor without one (which matches any value of its key).
type Entry struct{ Key, Value string }

// Rule is one descriptor of a configuration that has a rate_limit: what
// applies to a request descriptor that Match matches to it.
//
// Replaces and Name work per request, as in the service: each descriptor
// of a request is matched to at most one rule; the names listed in the
// Replaces of every matched rule are gathered (those of unlimited rules,
// and of rules that are themselves replaced, included); then each matched
// rule whose Name is among them is dropped: it is not checked and nothing
// is taken from its bucket, and its descriptor is answered OK (an
// unlimited rule stays unlimited). This applies across all the
// descriptors of one request, and only within it: one request has one
// domain, so a rule replaces only rules of its domain. Names need not be
// unique (every matched rule of a replaced name is dropped), a rule
// without a Name is never dropped, and a rule cannot replace itself (the
// config refuses it).
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path is the descriptors from the domain to the rule: each one's key
	// and configured value ("" for key only; a value may hold wildcards,
	// *). A request descriptor matched to the rule has as many entries.
	Path []Entry
	// Name is rate_limit.name, "" if none.
	Name string
	// Replaces is the names of rate_limit.replaces, in order.
	Replaces []string
	// Unit is the unit of the limit, lower-cased: second, minute, hour,
	// day, week, month (30 days) or year (365 days); "" when Unlimited.
	Unit string
	// RequestsPerUnit is rate_limit.requests_per_unit (0 if not given);
	// it means nothing when Unlimited.
	RequestsPerUnit uint32
	// Unlimited is rate_limit.unlimited: the descriptor is answered OK
	// without asking the store.
	Unlimited bool
	// Deny means requests_per_unit is 0 (and the rule is not unlimited):
	// the descriptor is always over the limit, and there is no bucket.
	Deny bool
	// Shadow is shadow_mode: the rule is decided, and its descriptor
	// answered OK whatever the decision.
	Shadow bool
	// Quota is quota_mode. In the service an over-limit quota-mode
	// descriptor fails a request only if every quota-mode descriptor of
	// the request is over its limit (and any over-limit descriptor that is
	// not in quota mode fails it as usual).
	Quota bool
	// DetailedMetric is detailed_metric. Like value_to_metric it changes
	// only the names of the service's statistics, never a decision.
	DetailedMetric bool
	// Metadata is the descriptor's metadata mapping, nil if none: data the
	// service returns to Envoy as dynamic metadata when a request passes.
	// Its values are maps of strings, slices, strings, int64, float64,
	// booleans and nil.
	Metadata map[string]any
	// Limit is the Sluice limit of the rule: RequestsPerUnit per Unit is a
	// bucket of capacity RequestsPerUnit refilled RequestsPerUnit tokens
	// per Unit. It is the zero Limit when Unlimited or Deny.
	Limit sluice.Limit
	// Policy is the Sluice policy name of the rule's buckets, valid for
	// sluice.ValidatePolicy and unique in the configuration. It depends
	// only on Domain and Path, never on the limit, so that a rule whose
	// limit changes keeps its buckets (converted as the store's
	// conversion says). It is "envoy/DOMAIN/KEY=VALUE/KEY...", each part
	// with the bytes other than letters, digits and -_.:*@+ written %XX,
	// when that fits in sluice.MaxPolicyLen bytes; otherwise the start of
	// it, "~" and 16 hexadecimal digits of the SHA-256 of the domain and
	// path.
	Policy string
	// File and Line are where the rule's descriptor is written.
	File string
	Line int

	// nodes are the descriptors of Path, for Key; path is the YAML path
	// of the descriptor, for messages.
	nodes []*node
	// override marks an OverrideRule; overrideKey starts its keys.
	override    bool
	overrideKey string
	path        string
}

// unit is one time unit of the config format.
type unit struct {
	name   string
	period time.Duration
}

const day = 24 * time.Hour

// units are the units the service accepts, by their upper-case names; the
// service upper-cases the unit written (strings.ToUpper) to look it up.
var units = map[string]unit{
	"SECOND": {"second", time.Second},
	"MINUTE": {"minute", time.Minute},
	"HOUR":   {"hour", time.Hour},
	"DAY":    {"day", day},
	"WEEK":   {"week", 7 * day},
	"MONTH":  {"month", 30 * day},
	"YEAR":   {"year", 365 * day},
}

const unitList = "second, minute, hour, day, week, month (30 days) or year (365 days)"

// unitOf returns the unit s names, in any case.
func unitOf(s string) (unit, bool) {
	u, ok := units[strings.ToUpper(s)]
	return u, ok
}

// composite is the text by which the service finds a configured
// descriptor: its key, and "_" and its value if it has one. A request
// entry is looked up as key "_" value.
func composite(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

// KeyPrefixHashed starts the key of a request descriptor whose encoding
// is longer than sluice.MaxKeyLen: it is followed by the hexadecimal
// SHA-256 of the encoding. An encoding never starts so: it starts with a
// digit.
const KeyPrefixHashed = "sha256:"

// Key returns the bucket key, under the rule's Policy, of a request
// descriptor that Match matched to r (entries of another descriptor get a
// key, but not one that means anything): each entry as LEN:KEY=LEN:VALUE
// (the lengths in bytes, in decimal), joined with "/". The lengths make
// the encoding unambiguous whatever the keys and values hold, so that
// ("a", "b:c") and ("a:b", "c") are two buckets. Every actual value is
// kept, so a rule with a wildcard or without a value has a bucket per
// value, as in the service; except where the descriptor matched through
// a wildcard with share_threshold, whose entry holds the wildcard pattern
// instead of the value, so that every value it matches shares one bucket.
// An encoding longer than sluice.MaxKeyLen bytes (or an empty one) is
// replaced by KeyPrefixHashed and the hexadecimal SHA-256 of it.
//
// The key of an OverrideRule starts with its limit ("N/PERIODns|"): the
// overrides of a domain share a policy, and each limit has its own buckets.
func (r *Rule) Key(entries []Entry) string {
	var b strings.Builder
	b.WriteString(r.overrideKey)
	for i, e := range entries {
		v := e.Value
		if i < len(r.nodes) {
			if n := r.nodes[i]; n.share && n.viaWildcard(e) {
				v = strings.TrimPrefix(n.comp, e.Key+"_")
			}
		}
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(strconv.Itoa(len(e.Key)))
		b.WriteByte(':')
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	if b.Len() == len(r.overrideKey) || b.Len() > sluice.MaxKeyLen {
		sum := sha256.Sum256([]byte(b.String()))
		return KeyPrefixHashed + hex.EncodeToString(sum[:])
	}
	return b.String()
}

// PolicyPrefix starts the policy name of every rule.
const PolicyPrefix = "envoy/"

// policyName returns the policy name of the rule at path in domain:
// PolicyPrefix, the domain, and "/KEY" or "/KEY=VALUE" for each entry,
// each part escaped (see escape); if that is longer than
// sluice.MaxPolicyLen, as much of it as leaves room for "~" and 16
// hexadecimal digits of the SHA-256 of the domain and path. An escaped
// part holds no "/", "=" or "~", so a name that is not hashed is never
// the name of another path, and never looks hashed.
func policyName(domain string, path []Entry) string {
	var b strings.Builder
	b.WriteString(PolicyPrefix)
	escape(&b, domain)
	for _, e := range path {
		b.WriteByte('/')
		escape(&b, e.Key)
		if e.Value != "" {
			b.WriteByte('=')
			escape(&b, e.Value)
		}
	}
	name := b.String()
	if len(name) <= sluice.MaxPolicyLen {
		return name
	}
	// The hash covers an unambiguous encoding of the path: lengths and
	// parts.
	h := sha256.New()
	h.Write([]byte(strconv.Itoa(len(domain)) + ":" + domain))
	for _, e := range path {
		h.Write([]byte("/" + strconv.Itoa(len(e.Key)) + ":" + e.Key + "=" + strconv.Itoa(len(e.Value)) + ":" + e.Value))
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	return name[:sluice.MaxPolicyLen-1-len(sum)] + "~" + sum
}

// escape writes s with every byte that is not a letter, a digit or one of
// -_.:*@+ written as %XX (two upper-case hexadecimal digits), so that the
// name is printable ASCII without spaces, and ambiguous in no way.
func escape(b *strings.Builder, s string) {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:*@+", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
}

// Describe returns one line saying what r does: its domain and path, the
// limit as written, and what Sluice makes of it, for example
// `messaging: message_type=marketing, to_number -> 5 per day -> capacity 5, refill 5/d (config.yaml:4, policy envoy/messaging/message_type=marketing/to_number)`.
func (r *Rule) Describe() string {
	var b strings.Builder
	b.WriteString(quoteIfNeeded(r.Domain))
	b.WriteString(": ")
	for i, e := range r.Path {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quoteIfNeeded(e.Key))
		if e.Value != "" {
			b.WriteByte('=')
			b.WriteString(quoteIfNeeded(e.Value))
		}
	}
	switch {
	case r.Unlimited:
		b.WriteString(" -> unlimited: answered OK, no bucket")
	case r.Deny:
		b.WriteString(" -> 0 per " + r.Unit + " -> every request over the limit, no bucket")
	default:
		b.WriteString(" -> " + strconv.FormatUint(uint64(r.RequestsPerUnit), 10) + " per " + r.Unit)
		b.WriteString(" -> capacity " + strconv.FormatInt(r.Limit.Capacity, 10) + ", refill " + r.Limit.Rate.String())
	}
	var notes []string
	if r.Shadow {
		notes = append(notes, "shadow: answered OK whatever it decides")
	}
	if r.Quota {
		notes = append(notes, "quota mode")
	}
	if r.Name != "" {
		notes = append(notes, "name "+quoteIfNeeded(r.Name))
	}
	if len(r.Replaces) > 0 {
		q := make([]string, len(r.Replaces))
		for i, n := range r.Replaces {
			q[i] = quoteIfNeeded(n)
		}
		notes = append(notes, "replaces "+strings.Join(q, ", "))
	}
	if len(notes) > 0 {
		b.WriteString(" [" + strings.Join(notes, "; ") + "]")
	}
	b.WriteString(" (" + r.File + ":" + strconv.Itoa(r.Line))
	if !r.Unlimited && !r.Deny {
		b.WriteString(", policy " + r.Policy)
	}
	b.WriteString(")")
	return b.String()
}

// quoteIfNeeded returns s as it is if it is printable ASCII without
// spaces or the separators of Describe, and quoted otherwise.
func quoteIfNeeded(s string) string {
	if s == "" {
		return `""`
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"=,;[]()\`, c) >= 0 {
			return strconv.Quote(s)
		}
	}
	return s
}

// Replaced applies the replaces of the rules matched to the descriptors of
// one request (nil where a descriptor matched none), as the service does:
// it reports, for each, whether the rule is dropped because its Name is in
// the Replaces of any rule of the request (see Rule).
func Replaced(matched []*Rule) []bool {
	out := make([]bool, len(matched))
	var names map[string]bool
	for _, r := range matched {
		if r == nil {
			continue
		}
		for _, name := range r.Replaces {
			if names == nil {
				names = map[string]bool{}
			}
			names[name] = true
		}
	}
	if names == nil {
		return out
	}
	for i, r := range matched {
		out[i] = r != nil && r.Name != "" && names[r.Name]
	}
	return out
}
