package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// A policy of several limits in a config file is decided together by
// sluice serve: the daily quota's denial waits for the daily quota, the
// burst is not charged for it, and sluice status shows both limits.
func TestServeSeveralLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  login:\n    limits: [\"5 5/s\", \"3 3/d\"]\n")
	s := startServe(t, "-config", path, "-watch=false")
	for i := range 3 {
		if status, body := post(t, s.api+"/v1/take", `{"policy":"login","key":"bob"}`); status != 200 || body["allowed"] != true {
			t.Fatalf("take %d = %d %v", i, status, body)
		}
	}
	status, body := post(t, s.api+"/v1/take", `{"policy":"login","key":"bob"}`)
	if status != 200 || body["allowed"] != false || body["limit"] != "3 3/d" || body["retry_after_ms"].(float64) < 28_000_000 {
		t.Fatalf("4th take = %d %v; want denied by the daily quota, hours", status, body)
	}
	limits, _ := body["limits"].([]any)
	if len(limits) != 2 || limits[0].(map[string]any)["remaining"] != 2.0 {
		t.Fatalf("limits = %v; want two, the burst not charged for the denial (2 left)", body["limits"])
	}
	var out bytes.Buffer
	if err := run(t.Context(), []string{"status", "-server", s.api}, nil, &out, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "login: 5 5/s and 3 3/d, decided together") {
		t.Errorf("sluice status printed %q", out.String())
	}
}
