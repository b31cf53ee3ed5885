package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSnapshotConfig(t *testing.T, dir, snapshot string) string {
	t.Helper()
	path := filepath.Join(dir, "sluice.yaml")
	text := "listen:\n  http: \"127.0.0.1:0\"\n  grpc: \"127.0.0.1:0\"\n  admin: \"127.0.0.1:0\"\nstore:\n  memory:\n    snapshot: " + snapshot +
		"\npolicies:\n  api:\n    limit: \"10 1/h\"\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A restart with a snapshot keeps every bucket: 7 of 10 taken before the
// restart leaves 3 after it, where without the snapshot all 10 would be
// back. A corrupt snapshot stops the start and says what to do.
func TestServeSnapshot(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "buckets.snap")
	cfg := writeSnapshotConfig(t, dir, snap)

	s := startServe(t, "-config", cfg)
	if status, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"alice","cost":7}`); status != 200 || body["remaining"] != 3.0 {
		t.Fatalf("take of 7 = %d %v", status, body)
	}
	s.stop()
	if err := <-s.done; err != nil {
		t.Fatalf("serve stopped with %v; stderr:\n%s", err, s.stderr)
	}
	s.done <- nil // for the cleanup
	if !strings.Contains(s.stderr.String(), "snapshot written") {
		t.Fatalf("no snapshot written; stderr:\n%s", s.stderr)
	}
	if fi, err := os.Stat(snap); err != nil || fi.Size() == 0 {
		t.Fatalf("snapshot file: %v, %v", fi, err)
	}

	s = startServe(t, "-config", cfg)
	if !strings.Contains(s.stderr.String(), "snapshot loaded") {
		t.Fatalf("no snapshot loaded; stderr:\n%s", s.stderr)
	}
	if status, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"alice","cost":3}`); status != 200 || body["allowed"] != true || body["remaining"] != 0.0 {
		t.Fatalf("take of 3 after the restart = %d %v; want allowed with 0 left", status, body)
	}
	if status, body := post(t, s.api+"/v1/take", `{"policy":"api","key":"alice"}`); status != 200 || body["allowed"] != false {
		t.Fatalf("take after the restart = %d %v; want denied: the restart gave no fresh burst", status, body)
	}
	s.stop()
	<-s.done
	s.done <- nil

	// Corrupt it: the start fails, names the file, and nothing serves.
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 1
	if err := os.WriteFile(snap, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut syncBuffer
	err = run(t.Context(), []string{"serve", "-config", cfg}, strings.NewReader(""), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), snap) || !strings.Contains(err.Error(), "checksum") || !strings.Contains(err.Error(), "move the file away") {
		t.Fatalf("serve with a corrupt snapshot = %v; want an error naming the file, the checksum and the way out", err)
	}
	if strings.Contains(out.String(), "serving") {
		t.Fatalf("serve announced itself with a corrupt snapshot:\n%s", out.String())
	}
}
