package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// FuzzParse checks that no input makes Parse panic, that what it accepts
// validates and describes itself, and that what it refuses is reported as
// problems that wrap the sentinels, each with a message and a line within
// the file.
func FuzzParse(f *testing.F) {
	f.Add([]byte(DefaultYAML))
	for _, pattern := range []string{"testdata/good/*.yaml", "testdata/bad/*.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, sluice.ErrInvalidOption) {
				t.Fatalf("Parse error %v does not wrap ErrInvalid and sluice.ErrInvalidOption", err)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Fatalf("Parse returned %+v with its error, want the zero Config", c)
			}
			problems := Errors(err)
			joined, ok := err.(interface{ Unwrap() []error })
			if len(problems) == 0 || !ok || len(joined.Unwrap()) != len(problems) {
				t.Fatalf("Parse error %v is not a join of *Error problems", err)
			}
			lines := bytes.Count(data, []byte("\n")) + 1
			for _, p := range problems {
				if p.Msg == "" || p.Line < 0 || p.Line > lines || p.File != "" {
					t.Fatalf("problem %+v: want a message and a line from 0 to %d, no file", p, lines)
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v\n%s", err, data)
		}
		if c.Version != version(data) {
			t.Fatalf("Version = %q, want %q", c.Version, version(data))
		}
		if len(c.Policies) == 0 && c.Envoy.Config == "" {
			t.Fatal("Parse accepted a config without policies or envoy rules")
		}
		for _, p := range c.Policies {
			for _, l := range p.Limits {
				if back, err := sluice.ParseLimit(l.String()); err != nil || back != l {
					t.Fatalf("policy %q: limit %v does not read back: %v, %v", p.Name, l, back, err)
				}
			}
		}
		var b strings.Builder
		if err := c.Describe(&b); err != nil || b.String() != c.String() {
			t.Fatalf("Describe = %v, or differs from String", err)
		}
		_ = c.Warnings()
		again, err := Parse(data)
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("a second Parse of the same bytes = %+v, %v; want %+v", again, err, c)
		}
	})
}

// FuzzParseTokens checks that ParseTokens never panics, returns only
// tokens it would accept alone, and refuses with problems that wrap
// ErrInvalid and show no token.
func FuzzParseTokens(f *testing.F) {
	f.Add("0123456789abcdef0123456789abcdef\n# c\n, dG9rZW4tYi1mb3ItdGVzdHM=")
	f.Add("short")
	f.Fuzz(func(t *testing.T, text string) {
		tokens, err := ParseTokens(text)
		if err != nil {
			if !errors.Is(err, ErrInvalid) || tokens != nil {
				t.Fatalf("ParseTokens = %q, %v; want nil and an error wrapping ErrInvalid", tokens, err)
			}
			for _, p := range Errors(err) {
				for _, field := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ',' }) {
					if field = strings.TrimSpace(field); len(field) >= 8 && strings.Contains(p.Msg, field) {
						t.Fatalf("problem %q shows the entry %q", p.Msg, field)
					}
				}
			}
			return
		}
		if len(tokens) == 0 {
			t.Fatal("ParseTokens accepted no token")
		}
		for _, tok := range tokens {
			if checkToken(tok) != "" {
				t.Fatalf("ParseTokens returned %q, which it refuses alone: %s", tok, checkToken(tok))
			}
		}
	})
}
