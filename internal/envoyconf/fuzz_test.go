package envoyconf

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// seedFiles returns the YAML fixtures of testdata, for the fuzzers'
// corpora.
func seedFiles(f *testing.F) [][]byte {
	var out [][]byte
	err := filepath.WalkDir("testdata", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".want") || strings.HasSuffix(path, ".golden") || strings.Contains(path, "testdata/fuzz") {
			return err
		}
		data, err := os.ReadFile(path)
		if err == nil {
			out = append(out, data)
		}
		return err
	})
	if err != nil || len(out) == 0 {
		f.Fatalf("no seed files: %v", err)
	}
	return append(out, []byte(matchYAML), []byte(keyYAML))
}

// FuzzParse checks that no input makes Parse panic, that what it refuses
// is reported as problems that wrap the sentinels, each with a message and
// a line within the file, and that what it accepts is a valid config.
func FuzzParse(f *testing.F) {
	for _, data := range seedFiles(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatal("Parse returned a config with its error")
			}
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, sluice.ErrInvalidOption) {
				t.Fatalf("Parse error %v does not wrap ErrInvalid and sluice.ErrInvalidOption", err)
			}
			problems := Errors(err)
			if len(problems) == 0 || len(problems) > MaxProblems+1 {
				t.Fatalf("Parse error %v holds %d problems", err, len(problems))
			}
			lines := strings.Count(strings.NewReplacer("\r\n", "\n", "\r", "\n", "\u0085", "\n", "\u2028", "\n", "\u2029", "\n").Replace(string(data)), "\n") + 1
			for _, p := range problems {
				if p.Msg == "" || p.Line < 0 || p.Line > lines || p.File != "fuzz.yaml" && p.File != "" {
					t.Fatalf("problem %+v: want a message, a line from 0 to %d and the file", p, lines)
				}
			}
			return
		}
		domains := c.Domains()
		if len(domains) != 1 || domains[0] == "" {
			t.Fatalf("Domains = %q, want one that is not empty", domains)
		}
		policies := map[string]bool{}
		for _, r := range c.Rules() {
			if r.Domain != domains[0] || len(r.Path) == 0 || r.File != "fuzz.yaml" || r.Line < 1 || r.Describe() == "" {
				t.Fatalf("rule %+v", r)
			}
			if err := sluice.ValidatePolicy(r.Policy); err != nil || policies[r.Policy] {
				t.Fatalf("rule %s: policy %q: %v (or a repeat)", r.Describe(), r.Policy, err)
			}
			policies[r.Policy] = true
			switch {
			case r.Unlimited:
				if r.Deny || r.Unit != "" || r.Limit != (sluice.Limit{}) {
					t.Fatalf("unlimited rule %+v", r)
				}
			case r.Deny:
				if r.RequestsPerUnit != 0 || r.Limit != (sluice.Limit{}) {
					t.Fatalf("deny rule %+v", r)
				}
			default:
				if err := r.Limit.Validate(); err != nil || r.Limit.Capacity != int64(r.RequestsPerUnit) || r.Limit.Rate.Tokens != int64(r.RequestsPerUnit) {
					t.Fatalf("rule %s: limit %v: %v", r.Describe(), r.Limit, err)
				}
			}
			if _, ok := units[strings.ToUpper(r.Unit)]; !ok && !r.Unlimited {
				t.Fatalf("rule %s: unit %q", r.Describe(), r.Unit)
			}
		}
		for _, w := range c.Warnings() {
			if !strings.HasPrefix(w, "fuzz.yaml:") {
				t.Fatalf("warning %q does not name the file", w)
			}
		}
	})
}

// refChild is the service's choice among the descriptors of a level,
// written apart from Match's: a scan in the order written, with the
// wildcards as regular expressions.
func refChild(n *node, e Entry) *node {
	text := e.Key + "_" + e.Value
	for _, c := range n.order {
		if c.comp == text {
			return c
		}
	}
	for _, c := range n.order {
		if strings.Contains(c.comp, "*") && refGlob(c.comp, text) {
			return c
		}
	}
	for _, c := range n.order {
		if c.comp == e.Key {
			return c
		}
	}
	return nil
}

func refGlob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?s)\A` + strings.Join(parts, ".*") + `\z`).MatchString(s)
}

func refMatch(c *Config, domain string, es []Entry) *Rule {
	n := c.domains[domain]
	if n == nil || len(es) == 0 {
		return nil
	}
	for _, e := range es {
		if n = refChild(n, e); n == nil {
			return nil
		}
	}
	return n.rule
}

// decodeEntries reads entries from fuzz input: keys and values separated
// by NUL bytes, at most 8 entries.
func decodeEntries(data []byte) []Entry {
	parts := strings.Split(string(data), "\x00")
	var es []Entry
	for i := 0; i+1 < len(parts) && len(es) < 8; i += 2 {
		es = append(es, Entry{parts[i], parts[i+1]})
	}
	return es
}

func encodeEntries(es []Entry) []byte {
	var parts []string
	for _, e := range es {
		parts = append(parts, e.Key, e.Value)
	}
	return []byte(strings.Join(parts, "\x00"))
}

// FuzzMatch checks Match on fixed configs against refMatch, and that a
// rule it returns matches the request at every level and gives it a
// valid bucket key.
func FuzzMatch(f *testing.F) {
	multi, err := Load("testdata/multi")
	if err != nil {
		f.Fatal(err)
	}
	configs := []*Config{multi, mustParse(f, matchYAML), mustParse(f, keyYAML)}
	for _, c := range configs {
		for _, r := range c.Rules() {
			es := make([]Entry, len(r.Path))
			for i, e := range r.Path {
				es[i] = Entry{e.Key, strings.ReplaceAll(e.Value, "*", "x")}
				if e.Value == "" {
					es[i].Value = "any"
				}
			}
			f.Add(r.Domain, encodeEntries(es))
		}
	}
	f.Add("d", encodeEntries(entries("greedy", "x", "sub", "other")))
	f.Add("d", encodeEntries(entries("a", "b")))
	f.Fuzz(func(t *testing.T, domain string, data []byte) {
		es := decodeEntries(data)
		for _, c := range configs {
			r, ok := c.Match(domain, es)
			if ref := refMatch(c, domain, es); r != ref || ok != (ref != nil) {
				t.Fatalf("Match(%q, %q) = %v, %v; the reference finds %v", domain, es, r, ok, ref)
			}
			if !ok {
				continue
			}
			if r.Domain != domain || len(r.Path) != len(es) {
				t.Fatalf("Match(%q, %q) = %s", domain, es, r.Describe())
			}
			for i, e := range es {
				p := r.Path[i]
				text, own := e.Key+"_"+e.Value, composite(p.Key, p.Value)
				if text != own && own != e.Key && !(strings.Contains(own, "*") && refGlob(own, text)) {
					t.Fatalf("Match(%q, %q) = %s, whose entry %d does not match", domain, es, r.Describe(), i)
				}
			}
			if err := sluice.ValidateKey(r.Key(es)); err != nil {
				t.Fatalf("Key(%q): %v", es, err)
			}
		}
	})
}
