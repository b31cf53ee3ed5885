package envoyconf

import (
	"strings"
	"testing"
)

// matchYAML is the config of the matcher's table test. Each rule's
// requests_per_unit names it.
const matchYAML = `domain: d
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: ex*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: e*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: mid
    value: /api/*/action
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: multi
    value: a*b*c
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: parent
    value: p
    rate_limit: {unit: minute, requests_per_unit: 7}
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 8}
  - key: greedy
    value: x
    descriptors:
      - key: sub
        value: only
        rate_limit: {unit: second, requests_per_unit: 9}
  - key: greedy
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: leaf
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 11}
  - key: case
    value: Value
    rate_limit: {unit: SECOND, requests_per_unit: 12}
  - key: any
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 13}
  - key: user*
    rate_limit: {unit: second, requests_per_unit: 15}
  - key: deep
    descriptors:
      - key: deeper
        value: v*
        descriptors:
          - key: deepest
            rate_limit: {unit: hour, requests_per_unit: 14}
`

func mustParse(t testing.TB, yaml string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

func TestMatch(t *testing.T) {
	c := mustParse(t, matchYAML)
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    uint32 // the rule's requests_per_unit; 0 for no match
	}{
		{"exact beats wildcards and key only", "d", entries("k", "exact"), 1},
		{"the first wildcard written wins", "d", entries("k", "exa"), 2},
		{"a later wildcard", "d", entries("k", "eq"), 3},
		{"key only", "d", entries("k", "other"), 4},
		{"key only matches an empty value", "d", entries("k", ""), 4},
		{"a wildcard matches an empty rest", "d", entries("k", "ex"), 2},
		{"middle wildcard", "d", entries("mid", "/api/123/action"), 5},
		{"middle wildcard matches empty text", "d", entries("mid", "/api//action"), 5},
		{"middle wildcard wants the suffix", "d", entries("mid", "/api/123/other"), 0},
		{"middle wildcard wants the prefix", "d", entries("mid", "/v2/123/action"), 0},
		{"prefix and suffix may not overlap", "d", entries("mid", "/api/action"), 0},
		{"several wildcards", "d", entries("multi", "aXbYc"), 6},
		{"several wildcards, all empty", "d", entries("multi", "abc"), 6},
		{"several wildcards in order", "d", entries("multi", "acbc"), 6},
		{"several wildcards out of order", "d", entries("multi", "acb"), 0},
		{"a parent's own limit", "d", entries("parent", "p"), 7},
		{"nested", "d", entries("parent", "p", "child", "c1"), 8},
		{"deeper than the config", "d", entries("parent", "p", "child", "c1", "more", "m"), 0},
		{"a parent's limit does not apply deeper", "d", entries("parent", "p", "other", "o"), 0},
		{"no value and no key-only descriptor", "d", entries("parent", "q"), 0},
		{"exact at the first level, then its child", "d", entries("greedy", "x", "sub", "only"), 9},
		{"no backtracking to the key-only sibling", "d", entries("greedy", "x", "sub", "other"), 0},
		{"key only at the first level", "d", entries("greedy", "y", "sub", "other"), 10},
		{"shorter than the rule", "d", entries("greedy", "y"), 0},
		{"a descriptor without rate_limit", "d", entries("leaf", "v"), 0},
		{"values are case-sensitive", "d", entries("case", "value"), 0},
		{"case as written", "d", entries("case", "Value"), 12},
		{"keys are case-sensitive", "d", entries("K", "exact"), 0},
		{"a lone wildcard", "d", entries("any", "whatever"), 13},
		{"a lone wildcard matches empty", "d", entries("any", ""), 13},
		{"nested wildcard", "d", entries("deep", "1", "deeper", "v2", "deepest", "3"), 14},
		{"nested wildcard mismatch", "d", entries("deep", "1", "deeper", "w2", "deepest", "3"), 0},
		{"unknown key", "d", entries("nope", "x"), 0},
		{"unknown domain", "e", entries("k", "exact"), 0},
		{"domains are case-sensitive", "D", entries("k", "exact"), 0},
		{"no entries", "d", nil, 0},
		// The service compares KEY_VALUE texts, and so does Match: these
		// follow from it, and are kept as the service has them.
		{"key a_b without value matches (a, b)", "d", entries("a", "b"), 11},
		{"a wildcard can match a longer key", "d", entries("k_ex", "y"), 2},
		{"a key-only descriptor matches an entry whose key is its text", "d", entries("a_b", "z"), 11},
		{"a wildcard in a key", "d", entries("username", "x"), 15},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := c.Match(tt.domain, tt.entries)
			if tt.want == 0 {
				if ok || r != nil {
					t.Fatalf("Match = %s, true; want no rule", r.Describe())
				}
				return
			}
			if !ok || r == nil {
				t.Fatalf("Match = nil, false; want the rule of %d per unit", tt.want)
			}
			if r.RequestsPerUnit != tt.want {
				t.Errorf("Match = %s; want the rule of %d per unit", r.Describe(), tt.want)
			}
			if len(r.Path) != len(tt.entries) {
				t.Errorf("the rule's path %v has %d entries, the request %d", r.Path, len(r.Path), len(tt.entries))
			}
		})
	}
}

func TestMatchNilConfig(t *testing.T) {
	var c *Config
	if r, ok := c.Match("d", entries("k", "v")); ok || r != nil {
		t.Errorf("nil Config: Match = %v, %v", r, ok)
	}
	if c.Rules() != nil || c.Domains() != nil || c.Warnings() != nil || c.Files() != nil || c.Version() != "" || c.CheckLimits(nil) != nil {
		t.Error("a nil Config is not empty")
	}
}

func TestRuleFields(t *testing.T) {
	c := mustParse(t, `domain: f
descriptors:
  - key: unlimited
    rate_limit: {unlimited: true}
  - key: deny
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    detailed_metric: true
    quota_mode: on
    metadata: {team: a, tier: 2, tags: [x, y], nested: {ok: yes}}
    rate_limit: {unit: day, requests_per_unit: 7, name: s}
  - key: replacer
    rate_limit:
      unit: second
      requests_per_unit: 1
      name: r
      replaces: [{name: s}, {name: other}]
`)
	get := func(key string) *Rule {
		r, ok := c.Match("f", entries(key, "v"))
		if !ok {
			t.Fatalf("no rule for %s", key)
		}
		return r
	}
	if r := get("unlimited"); !r.Unlimited || r.Deny || r.Unit != "" || r.Limit.Capacity != 0 {
		t.Errorf("unlimited rule: %+v", r)
	}
	if r := get("deny"); !r.Deny || r.Unlimited || r.Unit != "hour" || r.Limit.Capacity != 0 {
		t.Errorf("deny rule: %+v", r)
	}
	r := get("shadow")
	if !r.Shadow || !r.DetailedMetric || !r.Quota || r.Name != "s" || r.Unit != "day" || r.RequestsPerUnit != 7 {
		t.Errorf("shadow rule: %+v", r)
	}
	if r.Metadata["team"] != "a" || r.Metadata["tier"] != int64(2) || len(r.Metadata["tags"].([]any)) != 2 || r.Metadata["nested"].(map[string]any)["ok"] != true {
		t.Errorf("metadata = %#v", r.Metadata)
	}
	if r := get("replacer"); r.Name != "r" || len(r.Replaces) != 2 || r.Replaces[0] != "s" || r.Replaces[1] != "other" {
		t.Errorf("replacer rule: %+v", r)
	}
	if r.File != "test.yaml" || r.Line != 7 || r.Domain != "f" || r.Path[0] != (Entry{"shadow", ""}) {
		t.Errorf("rule place: %s:%d %s %v", r.File, r.Line, r.Domain, r.Path)
	}
}

func TestUnits(t *testing.T) {
	tests := []struct {
		unit   string
		want   string
		period string // of the Limit's rate
	}{
		{"second", "second", "5/s"},
		{"SECOND", "second", "5/s"},
		{"Minute", "minute", "5/m"},
		{"hOuR", "hour", "5/h"},
		{"day", "day", "5/d"},
		{"week", "week", "5/7d"},
		{"month", "month", "5/30d"},
		{"year", "year", "5/365d"},
		// The service upper-cases with strings.ToUpper, which maps the long
		// s (U+017F) to S.
		{"ſecond", "second", "5/s"},
	}
	for _, tt := range tests {
		c, err := Parse("u.yaml", []byte("domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tt.unit+", requests_per_unit: 5}\n"))
		if err != nil {
			t.Errorf("unit %q: %v", tt.unit, err)
			continue
		}
		r := c.Rules()[0]
		if r.Unit != tt.want || r.Limit.Capacity != 5 || r.Limit.Rate.String() != tt.period {
			t.Errorf("unit %q: Unit %q, Limit %v; want %q, capacity 5, rate %s", tt.unit, r.Unit, r.Limit, tt.want, tt.period)
		}
		if err := r.Limit.Validate(); err != nil {
			t.Errorf("unit %q: %v", tt.unit, err)
		}
	}
	for _, bad := range []string{"seconds", "sec", "s", "UNKNOWN", "fortnight", "1s"} {
		if _, err := Parse("u.yaml", []byte("domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+bad+", requests_per_unit: 5}\n")); err == nil {
			t.Errorf("unit %q accepted", bad)
		}
	}
}

func TestLimitRange(t *testing.T) {
	for _, unit := range []string{"second", "minute", "hour", "day", "week", "month", "year"} {
		for _, n := range []string{"1", "4294967295"} {
			c, err := Parse("l.yaml", []byte("domain: l\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+unit+", requests_per_unit: "+n+"}\n"))
			if err != nil {
				t.Errorf("%s per %s: %v", n, unit, err)
				continue
			}
			r := c.Rules()[0]
			if err := r.Limit.Validate(); err != nil || r.Limit.Capacity != r.Limit.Rate.Tokens {
				t.Errorf("%s per %s: Limit %v: %v", n, unit, r.Limit, err)
			}
		}
	}
}

func TestReplaced(t *testing.T) {
	c, err := Load("testdata/multi")
	if err != nil {
		t.Fatal(err)
	}
	marketing, _ := c.Match("messaging", entries("message_type", "marketing", "to_number", "1"))
	perNumber, _ := c.Match("messaging", entries("to_number", "1"))
	vip, _ := c.Match("messaging", entries("account", "vip", "to_number", "1"))
	if marketing == nil || perNumber == nil || vip == nil {
		t.Fatal("the messaging rules do not match")
	}
	tests := []struct {
		name    string
		matched []*Rule
		want    []bool
	}{
		{"none", nil, []bool{}},
		{"no replacer", []*Rule{marketing, perNumber}, []bool{false, false}},
		{"replaced across descriptors", []*Rule{marketing, nil, vip, perNumber}, []bool{true, false, false, false}},
		{"the replacer first", []*Rule{vip, marketing}, []bool{false, true}},
		{"twice the replaced rule", []*Rule{marketing, vip, marketing}, []bool{true, false, true}},
	}
	for _, tt := range tests {
		got := Replaced(tt.matched)
		if len(got) != len(tt.want) {
			t.Errorf("%s: Replaced = %v, want %v", tt.name, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: Replaced = %v, want %v", tt.name, got, tt.want)
				break
			}
		}
	}
	// A rule that is itself replaced still replaces others, and an
	// unlimited rule's replaces count too.
	c2 := mustParse(t, `domain: r
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, name: A, replaces: [{name: B}]}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, name: B, replaces: [{name: A}]}
  - key: u
    rate_limit: {unlimited: true, replaces: [{name: C}]}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, name: C}
`)
	a, _ := c2.Match("r", entries("a", "1"))
	b, _ := c2.Match("r", entries("b", "1"))
	u, _ := c2.Match("r", entries("u", "1"))
	cc, _ := c2.Match("r", entries("c", "1"))
	if got := Replaced([]*Rule{a, b, u, cc}); !got[0] || !got[1] || got[2] || !got[3] {
		t.Errorf("Replaced(A, B, unlimited, C) = %v, want [true true false true]", got)
	}
}

// TestMatchConcurrent matches from several goroutines at once, for the
// race detector: a Config is only read.
func TestMatchConcurrent(t *testing.T) {
	c := mustParse(t, matchYAML)
	done := make(chan bool)
	for g := 0; g < 4; g++ {
		go func() {
			ok := true
			for i := 0; i < 200; i++ {
				r, found := c.Match("d", entries("parent", "p", "child", "c"))
				ok = ok && found && r.Key(entries("parent", "p", "child", "c")) != ""
				_ = c.Rules()
			}
			done <- ok
		}()
	}
	for g := 0; g < 4; g++ {
		if !<-done {
			t.Error("a concurrent Match failed")
		}
	}
}

func TestDifferences(t *testing.T) {
	d := Differences()
	if len(d) < 5 {
		t.Fatalf("Differences has %d items", len(d))
	}
	seen := map[string]bool{}
	for _, s := range d {
		if seen[s] || !strings.HasSuffix(s, ".") || strings.Contains(s, "\n") {
			t.Errorf("difference %q: want one sentence or more, once, on one line", s)
		}
		seen[s] = true
	}
}
