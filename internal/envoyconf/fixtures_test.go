package envoyconf

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

var update = flag.Bool("update", false, "rewrite the .want and .golden files of testdata")

// TestErrorFixtures loads each fixture of testdata/errors (a file, or a
// directory of files) and compares the error with the fixture's .want
// file: every problem, each with its file and line.
func TestErrorFixtures(t *testing.T) {
	entries, err := os.ReadDir("testdata/errors")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".want") {
			continue
		}
		n++
		path := filepath.Join("testdata/errors", name)
		want := strings.TrimSuffix(path, ".yaml") + ".want"
		t.Run(name, func(t *testing.T) {
			c, err := Load(path)
			if err == nil {
				t.Fatalf("Load = %v, nil; want an error", c.Domains())
			}
			if c != nil {
				t.Errorf("Load returned a config with its error")
			}
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, sluice.ErrInvalidOption) {
				t.Errorf("error %v does not wrap ErrInvalid and sluice.ErrInvalidOption", err)
			}
			problems := Errors(err)
			if len(problems) == 0 {
				t.Fatalf("Errors(%v) is empty", err)
			}
			for _, p := range problems {
				if p.File == "" || !strings.HasPrefix(p.File, path) {
					t.Errorf("problem %q names the file %q, want %s or a file in it", p, p.File, path)
				}
			}
			got := err.Error() + "\n"
			if *update {
				if err := os.WriteFile(want, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			data, err := os.ReadFile(want)
			if err != nil {
				t.Fatalf("%v (run the tests with -update to write it)", err)
			}
			if got != string(data) {
				t.Errorf("Load(%s) error:\n%s\nwant (%s):\n%s", path, got, want, data)
			}
		})
	}
	if n < 30 {
		t.Errorf("%d error fixtures; want one per kind of problem", n)
	}
}

// describeConfig is what a fixture's .golden file holds.
func describeConfig(c *Config) string {
	var b strings.Builder
	b.WriteString("version " + c.Version() + "\n")
	b.WriteString("files:\n")
	for _, f := range c.Files() {
		b.WriteString("  " + f + "\n")
	}
	b.WriteString("domains: " + strings.Join(c.Domains(), ", ") + "\n")
	b.WriteString("rules:\n")
	for _, r := range c.Rules() {
		b.WriteString("  " + r.Describe() + "\n")
	}
	b.WriteString("warnings:\n")
	for _, w := range c.Warnings() {
		b.WriteString("  " + w + "\n")
	}
	return b.String()
}

// TestGoodFixtures loads the good fixtures and compares what they define
// with their .golden files, which pin every rule's translation and
// policy name.
func TestGoodFixtures(t *testing.T) {
	for _, path := range []string{"testdata/multi", "testdata/warnings.yaml"} {
		t.Run(path, func(t *testing.T) {
			c, err := Load(path)
			if err != nil {
				t.Fatalf("Load = %v", err)
			}
			got := describeConfig(c)
			golden := strings.TrimSuffix(path, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run the tests with -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("Load(%s):\n%s\nwant (%s):\n%s", path, got, golden, want)
			}
		})
	}
}
