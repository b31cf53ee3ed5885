package envoyconf

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestYAMLValues checks that values are read as the service's YAML
// library reads them.
func TestYAMLValues(t *testing.T) {
	tests := []struct {
		name, descriptor string
		value            string // the rule's configured value
		perUnit          uint32
		shadow           bool
	}{
		{"yes is true", "shadow_mode: yes", "", 1, true},
		{"On is true", "shadow_mode: On", "", 1, true},
		{"y is true", "shadow_mode: y", "", 1, true},
		{"TRUE is true", "shadow_mode: TRUE", "", 1, true},
		{"no is false", "shadow_mode: no", "", 1, false},
		{"off is false", "shadow_mode: off", "", 1, false},
		{"empty is false", "shadow_mode:", "", 1, false},
		{"a number as a value", "value: 123", "123", 1, false},
		{"a hexadecimal number as written", "value: 0x1F", "0x1F", 1, false},
		{"a boolean as a value", "value: true", "true", 1, false},
		{"yes as a value", "value: yes", "yes", 1, false},
		{"a date as a value", "value: 2024-01-01", "2024-01-01", 1, false},
		{"an empty value is none", "value: ~", "", 1, false},
		{"an empty string is none", `value: ""`, "", 1, false},
		{"a quoted value", `value: "1.5"`, "1.5", 1, false},
		{"a tagged string", "value: !!str 1.5", "1.5", 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, "domain: y\ndescriptors:\n  - key: k\n    "+tt.descriptor+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
			r := c.Rules()[0]
			if r.Path[0].Value != tt.value || r.RequestsPerUnit != tt.perUnit || r.Shadow != tt.shadow {
				t.Errorf("rule %s: value %q, %d per unit, shadow %v; want %q, %d, %v", r.Describe(), r.Path[0].Value, r.RequestsPerUnit, r.Shadow, tt.value, tt.perUnit, tt.shadow)
			}
		})
	}
	for _, tt := range []struct {
		text string
		want uint32
	}{{"0x10", 16}, {"1_000", 1000}, {"0o17", 15}, {"+7", 7}, {"4294967295", 4294967295}} {
		c := mustParse(t, "domain: y\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: "+tt.text+"}\n")
		if got := c.Rules()[0].RequestsPerUnit; got != tt.want {
			t.Errorf("requests_per_unit: %s = %d, want %d", tt.text, got, tt.want)
		}
	}
}

// TestYAMLAliases checks that aliases and merge keys are expanded as the
// service's YAML library expands them: in order, a later key overriding
// an earlier one, the first of a list of merged mappings winning.
func TestYAMLAliases(t *testing.T) {
	c := mustParse(t, `domain: a
descriptors:
  - key: base
    rate_limit: &base {unit: second, requests_per_unit: 1}
  - key: alias
    rate_limit: *base
  - key: merged-then-set
    rate_limit:
      <<: *base
      requests_per_unit: 2
  - key: set-then-merged
    rate_limit:
      requests_per_unit: 3
      <<: *base
  - key: list
    rate_limit:
      <<: [{requests_per_unit: 4}, *base]
      unit: minute
`)
	want := map[string]string{"base": "1/second", "alias": "1/second", "merged-then-set": "2/second", "set-then-merged": "1/second", "list": "4/minute"}
	for key, w := range want {
		r, ok := c.Match("a", entries(key, "v"))
		if !ok {
			t.Errorf("%s: no rule", key)
			continue
		}
		if got := strings.Join([]string{itoa(r.RequestsPerUnit), r.Unit}, "/"); got != w {
			t.Errorf("%s: %s, want %s", key, got, w)
		}
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// TestYAMLAliasBomb checks that nested aliases cannot make a small file
// expand without bound.
func TestYAMLAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: k\n    metadata:\n      a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		b.WriteString("      a" + itoa(uint32(i)) + ": &a" + itoa(uint32(i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + itoa(uint32(i-1)))
		}
		b.WriteString("]\n")
	}
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "once its aliases are expanded") {
		t.Fatalf("Parse = %v; want the error of too many values", err)
	}
}

func TestYAMLDocuments(t *testing.T) {
	c := mustParse(t, "domain: first\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: second\n")
	if d := c.Domains(); len(d) != 1 || d[0] != "first" {
		t.Errorf("Domains = %v, want [first]", d)
	}
	if w := c.Warnings(); len(w) != 1 || !strings.Contains(w[0], "test.yaml:5: a second YAML document") {
		t.Errorf("Warnings = %q, want one of the second document", w)
	}
	// Line ends of \r\n are read as the service reads them.
	c = mustParse(t, "domain: crlf\r\ndescriptors:\r\n  - key: k\r\n    rate_limit: {unit: second, requests_per_unit: 1}\r\n")
	if r := c.Rules(); len(r) != 1 || r[0].Line != 3 {
		t.Errorf("CRLF file: rules %v", r)
	}
}

func TestParseErrors(t *testing.T) {
	big := []byte("domain: big\n" + strings.Repeat("#", MaxFileSize))
	_, err := Parse("big.yaml", big)
	if err == nil || !strings.Contains(err.Error(), "more than 16777216") || !errors.Is(err, ErrInvalid) {
		t.Errorf("Parse of %d bytes = %v", len(big), err)
	}
	// A control character's line is named.
	_, err = Parse("c.yaml", []byte("domain: c\ndescriptors:\n  - key: \"a\"\x01\n"))
	if p := Errors(err); len(p) != 1 || p[0].Line != 3 {
		t.Errorf("control character: %v", err)
	}
	_, err = Parse("u.yaml", []byte("domain: c\n\n  \xff\n"))
	if p := Errors(err); len(p) != 1 || p[0].Line != 3 {
		t.Errorf("invalid UTF-8: %v", err)
	}
	// Past MaxProblems the rest are counted.
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	for i := 0; i < MaxProblems+5; i++ {
		b.WriteString("  - key: k" + itoa(uint32(i)) + "\n    oops: 1\n")
	}
	_, err = Parse("many.yaml", []byte(b.String()))
	if p := Errors(err); len(p) != MaxProblems+1 || !strings.Contains(p[MaxProblems].Msg, "and 5 more problems") {
		t.Errorf("%d problems reported; want %d and a count of the rest", len(p), MaxProblems+1)
	}
}
