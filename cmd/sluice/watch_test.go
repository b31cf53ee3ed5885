package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// statusOf returns the answer of GET /v1/status.
func statusOf(t *testing.T, s *server) (version string, limits map[string]string) {
	t.Helper()
	code, text := get(t, s.api+"/v1/status")
	var out struct {
		Version  string
		Policies []struct{ Name, Limit string }
	}
	if err := json.Unmarshal([]byte(text), &out); code != 200 || err != nil {
		t.Fatalf("GET /v1/status = %d %q", code, text)
	}
	limits = make(map[string]string)
	for _, p := range out.Policies {
		limits[p.Name] = p.Limit
	}
	return out.Version, limits
}

func configText(policies string) string {
	return "listen:\n  http: \"127.0.0.1:0\"\n  grpc: \"127.0.0.1:0\"\n  admin: \"127.0.0.1:0\"\npolicies:\n" + policies
}

// TestServeReloadOnWrite: a file written in place is reloaded without a
// SIGHUP; a bad one is refused and the last good config keeps serving.
func TestServeReloadOnWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"1 1/h\"\n")
	s := startServe(t, "-config", path)
	first, _ := statusOf(t, s)

	writeConfig(t, path, "  api:\n    limit: \"3 1/h\"\n")
	waitFor(t, func() bool { v, _ := statusOf(t, s); return v != first })
	second, limits := statusOf(t, s)
	if limits["api"] != "3 1/h" {
		t.Fatalf("after the file changed the policies are %v, want api of 3 1/h", limits)
	}

	if err := os.WriteFile(path, []byte("policies:\n  api:\n    limit: \"3 1/fortnight\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(s.stderr.String(), "config refused") })
	if v, limits := statusOf(t, s); v != second || limits["api"] != "3 1/h" {
		t.Fatalf("after a bad file the status is %v %v, want %v with api of 3 1/h", v, limits, second)
	}
	if code, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"k"}`); code != 200 || body["allowed"] != true {
		t.Fatalf("take after a bad file = %d %v, want allowed under the last good config", code, body)
	}
	if strings.Contains(s.stderr.String(), "SIGHUP") {
		t.Errorf("a file change was logged as a SIGHUP:\n%s", s.stderr)
	}
}

// TestServeReloadSymlinkSwap: a config mounted the way Kubernetes mounts a
// ConfigMap (the file a symlink into "..data", itself a symlink to a
// timestamped directory) is reloaded when "..data" is swapped, although the
// file named in -config is never written.
func TestServeReloadSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	publish := func(name, policies string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "sluice.yaml"), []byte(configText(policies)), 0o600); err != nil {
			t.Fatal(err)
		}
		// As the kubelet does: a new symlink renamed over the old one.
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("..2026_12_01_10_00_00.1", "  api:\n    limit: \"1 1/h\"\n")
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.Symlink(filepath.Join("..data", "sluice.yaml"), path); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "-config", path)
	first, _ := statusOf(t, s)

	publish("..2026_12_01_10_05_00.2", "  api:\n    limit: \"7 1/h\"\n")
	if err := os.RemoveAll(filepath.Join(dir, "..2026_12_01_10_00_00.1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { v, _ := statusOf(t, s); return v != first })
	if _, limits := statusOf(t, s); limits["api"] != "7 1/h" {
		t.Fatalf("after the swap the policies are %v, want api of 7 1/h", limits)
	}

	// A second swap is seen too: the watch is on the directory, which
	// outlives the timestamped directories.
	second, _ := statusOf(t, s)
	publish("..2026_12_01_10_10_00.3", "  api:\n    limit: \"9 1/h\"\n")
	waitFor(t, func() bool { v, _ := statusOf(t, s); return v != second })
	if _, limits := statusOf(t, s); limits["api"] != "9 1/h" {
		t.Fatalf("after the second swap the policies are %v, want api of 9 1/h", limits)
	}
}

// TestServeNoWatch: with -watch=false only SIGHUP reloads.
func TestServeNoWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"1 1/h\"\n")
	s := startServe(t, "-config", path, "-watch=false")
	first, _ := statusOf(t, s)
	writeConfig(t, path, "  api:\n    limit: \"3 1/h\"\n")
	time.Sleep(5 * reloadDebounce)
	if v, _ := statusOf(t, s); v != first {
		t.Fatalf("with -watch=false a file change was reloaded without a SIGHUP (version %v, want %v)", v, first)
	}
	reload(t)
	waitFor(t, func() bool { v, _ := statusOf(t, s); return v != first })
}
