package envoyconf

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fileA = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("symbolic links: %v", err)
	}
}

// TestLoadConfigMap lays out a directory as a Kubernetes ConfigMap volume
// does and checks that each file is read once, through its visible link.
func TestLoadConfigMap(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "..2024_01_01_00_00_00.1", "a.yaml"), fileA)
	write(t, filepath.Join(dir, "..2024_01_01_00_00_00.1", "b.yml"), strings.Replace(fileA, "domain: a", "domain: b", 1))
	symlink(t, "..2024_01_01_00_00_00.1", filepath.Join(dir, "..data"))
	symlink(t, "..data/a.yaml", filepath.Join(dir, "a.yaml"))
	symlink(t, "..data/b.yml", filepath.Join(dir, "b.yml"))
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load = %v", err)
	}
	if d := c.Domains(); len(d) != 2 || d[0] != "a" || d[1] != "b" {
		t.Errorf("Domains = %v, want [a b]", d)
	}
	if f := c.Files(); len(f) != 2 || f[0] != filepath.Join(dir, "a.yaml") || f[1] != filepath.Join(dir, "b.yml") {
		t.Errorf("Files = %v, want the two links", f)
	}
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("Warnings = %q", w)
	}
	// The service's runtime root is a link to the directory in use.
	current := filepath.Join(t.TempDir(), "current")
	symlink(t, dir, current)
	if c2, err := Load(current); err != nil || len(c2.Rules()) != 2 {
		t.Errorf("Load through a linked directory = %v", err)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), fileA)
	write(t, filepath.Join(dir, "limits.conf"), strings.Replace(fileA, "domain: a", "domain: conf", 1))
	write(t, filepath.Join(dir, "sub", "c.yaml"), strings.Replace(fileA, "domain: a", "domain: c", 1))
	write(t, filepath.Join(dir, ".hidden.yaml"), "not: read")
	write(t, filepath.Join(dir, ".git", "config"), "not: read")
	other := t.TempDir()
	symlink(t, other, filepath.Join(dir, "linked-dir"))
	symlink(t, filepath.Join(dir, "missing.yaml"), filepath.Join(dir, "dangling.yaml"))
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load = %v", err)
	}
	if d := strings.Join(c.Domains(), " "); d != "a c conf" {
		t.Errorf("Domains = %s, want a c conf: every file but the hidden ones, whatever its name", d)
	}
	w := strings.Join(c.Warnings(), "\n")
	if !strings.Contains(w, "linked-dir: is a link to a directory") || !strings.Contains(w, "dangling.yaml: is a link to nothing") {
		t.Errorf("Warnings = %s; want the linked directory and the dangling link", w)
	}
	if _, err := Load(filepath.Join(dir, "a.yaml")); err != nil {
		t.Errorf("Load of one file = %v", err)
	}
	if _, err := Load(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("Load of no file = %v, want a not-exist error that is not ErrInvalid", err)
	}
}

func TestLoadProblemsOfSeveralFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "1.yaml"), "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: parsec}\n")
	write(t, filepath.Join(dir, "2.yaml"), "domain: two\nbogus: 1\n")
	_, err := Load(dir)
	p := Errors(err)
	if len(p) != 2 || p[0].File != filepath.Join(dir, "1.yaml") || p[0].Line != 4 || p[1].File != filepath.Join(dir, "2.yaml") || p[1].Line != 2 {
		t.Errorf("Load = %v; want one problem of each file, with its line", err)
	}
}
