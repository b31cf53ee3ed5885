package envoyconf

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

const keyYAML = `domain: keys
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a:b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: own
    value: own/*
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    value: t*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10}
`

func key(t *testing.T, c *Config, kv ...string) string {
	t.Helper()
	e := entries(kv...)
	r, ok := c.Match("keys", e)
	if !ok {
		t.Fatalf("no rule matches %v", e)
	}
	k := r.Key(e)
	if err := sluice.ValidateKey(k); err != nil {
		t.Errorf("Key(%v) = %q: %v", e, k, err)
	}
	return k
}

func TestKey(t *testing.T) {
	c := mustParse(t, keyYAML)
	if a, b := key(t, c, "a", "b:c"), key(t, c, "a:b", "c"); a == b {
		t.Errorf(`("a", "b:c") and ("a:b", "c") have the same key %q`, a)
	}
	if got, want := key(t, c, "a", "b:c"), "1:a=3:b:c"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
	if a, b := key(t, c, "a", "x"), key(t, c, "a", "y"); a == b {
		t.Errorf("two values of a key-only rule share the key %q", a)
	}
	if a, b := key(t, c, "own", "own/a.pdf"), key(t, c, "own", "own/b.csv"); a == b {
		t.Errorf("two values of a wildcard without share_threshold share the key %q", a)
	}
	if a, b := key(t, c, "files", "files/a.pdf"), key(t, c, "files", "files/b.csv"); a != b {
		t.Errorf("values of a shared wildcard have the keys %q and %q, want one", a, b)
	}
	if got, want := key(t, c, "files", "files/a.pdf"), "5:files=7:files/*"; got != want {
		t.Errorf("shared Key = %q, want %q", got, want)
	}
	// Sharing applies at the level of the wildcard; the entries below it
	// keep their values.
	if a, b := key(t, c, "tenant", "t1", "user", "u1"), key(t, c, "tenant", "t2", "user", "u1"); a != b {
		t.Errorf("a shared wildcard above a rule: keys %q and %q, want one", a, b)
	}
	if a, b := key(t, c, "tenant", "t1", "user", "u1"), key(t, c, "tenant", "t1", "user", "u2"); a == b {
		t.Errorf("two users under a shared wildcard share the key %q", a)
	}
}

func TestKeyLength(t *testing.T) {
	c := mustParse(t, keyYAML)
	r, _ := c.Match("keys", entries("a", "x"))
	// 1:a=NNN:value is 8 bytes and the value.
	fits := entries("a", strings.Repeat("v", sluice.MaxKeyLen-8))
	if k := r.Key(fits); len(k) != sluice.MaxKeyLen || strings.HasPrefix(k, KeyPrefixHashed) {
		t.Errorf("a key of %d bytes was hashed: %q", sluice.MaxKeyLen, k)
	}
	long1 := entries("a", strings.Repeat("v", sluice.MaxKeyLen-7))
	long2 := entries("a", strings.Repeat("v", sluice.MaxKeyLen-8)+"w")
	k1, k2 := r.Key(long1), r.Key(long2)
	if !strings.HasPrefix(k1, KeyPrefixHashed) || len(k1) != len(KeyPrefixHashed)+64 {
		t.Errorf("a key over %d bytes is %q, want the hashed form", sluice.MaxKeyLen, k1)
	}
	if k1 == k2 {
		t.Errorf("two long keys hash alike: %q", k1)
	}
	if err := sluice.ValidateKey(r.Key(nil)); err != nil {
		t.Errorf("Key(nil): %v", err)
	}
}

func TestPolicyNames(t *testing.T) {
	c, err := Load("testdata/multi")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]*Rule{}
	for _, r := range c.Rules() {
		if err := sluice.ValidatePolicy(r.Policy); err != nil {
			t.Errorf("%s: %v", r.Describe(), err)
		}
		if !strings.HasPrefix(r.Policy, PolicyPrefix) {
			t.Errorf("policy %q lacks the prefix %q", r.Policy, PolicyPrefix)
		}
		if other := seen[r.Policy]; other != nil {
			t.Errorf("rules %s and %s share the policy %q", other.Describe(), r.Describe(), r.Policy)
		}
		seen[r.Policy] = r
	}
}

// TestPolicyStable checks that a rule's policy name depends on its domain
// and path only: a changed limit, another order and other rules leave it.
func TestPolicyStable(t *testing.T) {
	before := mustParse(t, `domain: s
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /a/*
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 5}
`)
	after := mustParse(t, `domain: s
descriptors:
  - key: other
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /a/*
    shadow_mode: true
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 500, name: renamed}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 50}
`)
	for _, e := range [][]Entry{entries("user", "u"), entries("path", "/a/b", "method", "GET")} {
		r1, ok1 := before.Match("s", e)
		r2, ok2 := after.Match("s", e)
		if !ok1 || !ok2 {
			t.Fatalf("%v: no match", e)
		}
		if r1.Policy != r2.Policy {
			t.Errorf("%v: policy %q became %q", e, r1.Policy, r2.Policy)
		}
		if r1.Limit == r2.Limit {
			t.Errorf("%v: the limits are equal; the test changes them", e)
		}
	}
}

func TestPolicyName(t *testing.T) {
	long := strings.Repeat("x", 70)
	tests := []struct {
		domain string
		path   []Entry
		want   string // "" to check only validity and the hashed form
	}{
		{"d", entries("k", ""), "envoy/d/k"},
		{"d", entries("k", "v", "k2", ""), "envoy/d/k=v/k2"},
		{"d", entries("path", "/a/*"), "envoy/d/path=%2Fa%2F*"},
		{"d", entries("b=c", ""), "envoy/d/b%3Dc"},
		{"d", entries("b", "c"), "envoy/d/b=c"},
		{"d", entries("tilde~", ""), "envoy/d/tilde%7E"},
		{"d", entries("sp ace", "\x00\xff"), "envoy/d/sp%20ace=%00%FF"},
		{"dómain", entries("k", ""), "envoy/d%C3%B3main/k"},
		{"d", entries(long, ""), ""},
		{"d", entries(long+"y", ""), ""},
	}
	names := map[string]bool{}
	for _, tt := range tests {
		got := policyName(tt.domain, tt.path)
		if err := sluice.ValidatePolicy(got); err != nil {
			t.Errorf("policyName(%q, %v) = %q: %v", tt.domain, tt.path, got, err)
		}
		if names[got] {
			t.Errorf("policyName(%q, %v) = %q, the name of another path", tt.domain, tt.path, got)
		}
		names[got] = true
		switch {
		case tt.want != "" && got != tt.want:
			t.Errorf("policyName(%q, %v) = %q, want %q", tt.domain, tt.path, got, tt.want)
		case tt.want == "" && (len(got) != sluice.MaxPolicyLen || got[sluice.MaxPolicyLen-17] != '~' || !strings.HasPrefix(got, "envoy/d/xxx")):
			t.Errorf("policyName(%q, %v) = %q, want a readable prefix, ~ and 16 hexadecimal digits", tt.domain, tt.path, got)
		}
		if again := policyName(tt.domain, tt.path); again != got {
			t.Errorf("policyName is not stable: %q, then %q", got, again)
		}
	}
}

// fakeStore decides no limit of a capacity above 1000, as a store whose
// arithmetic is narrower would.
type fakeStore struct{ sluice.Store }

func (fakeStore) CheckLimit(l sluice.Limit) error {
	if l.Capacity > 1000 {
		return sluice.ErrInvalidLimit
	}
	return nil
}

func TestCheckLimits(t *testing.T) {
	c, err := Load("testdata/multi")
	if err != nil {
		t.Fatal(err)
	}
	err = c.CheckLimits(fakeStore{})
	problems := Errors(err)
	want := 0
	for _, r := range c.Rules() {
		if !r.Unlimited && !r.Deny && r.Limit.Capacity > 1000 {
			want++
		}
	}
	if want == 0 || len(problems) != want {
		t.Fatalf("CheckLimits = %v; want %d problems", err, want)
	}
	for _, p := range problems {
		if p.File == "" || p.Line == 0 || !strings.Contains(p.Error(), "cannot be decided by the store") {
			t.Errorf("problem %q: want its file, line and reason", p)
		}
	}
	if err := c.CheckLimits(nil); err != nil {
		t.Errorf("CheckLimits(nil) = %v, want nil: every rule's limit is valid", err)
	}
}
