package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

func TestStatusCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"3 1/h\"\n  export:\n    limit: \"10 1/h\"\n    shadow: true\n")
	s := startServe(t, "-config", path, "-watch=false")
	version, _ := statusOf(t, s)

	var out bytes.Buffer
	if err := run(t.Context(), []string{"status", "-server", s.api}, nil, &out, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	want := "config version " + version + ", 2 policies:\n  api: 3 1/h\n  export: 10 1/h (shadow)\n"
	if out.String() != want {
		t.Errorf("sluice status printed %q, want %q", out.String(), want)
	}
	out.Reset()
	if err := run(t.Context(), []string{"status", "-server", s.api, "-json"}, nil, &out, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || st["version"] != version {
		t.Errorf("sluice status -json printed %q (%v), want the status with version %s", out.String(), err, version)
	}
	if err := run(t.Context(), []string{"status", "-server", "http://127.0.0.1:1"}, nil, new(bytes.Buffer), new(bytes.Buffer)); err == nil {
		t.Error("sluice status of a closed port succeeded")
	}
}

func TestAdminEndpoints(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"3 1/h\"\n")
	s := startServe(t, "-config", path, "-watch=false")
	version, _ := statusOf(t, s)

	code, text := get(t, s.admin+"/config")
	if code != 200 || !strings.Contains(text, version) || !strings.Contains(text, "3 1/h") || !strings.Contains(text, path) {
		t.Fatalf("GET /config = %d %q, want the version, the file and the policy", code, text)
	}
	post(t, s.api+"/v1/take", `{"policy":"api","key":"a/b c"}`)
	peek := func(query string) (int, map[string]any) {
		t.Helper()
		code, text := get(t, s.admin+"/peek?"+query)
		var out map[string]any
		json.Unmarshal([]byte(text), &out) //nolint:errcheck // a text answer leaves out nil
		return code, out
	}
	key := "policy=api&key=" + url.QueryEscape("a/b c")
	for range 2 { // a peek takes nothing
		if code, d := peek(key); code != 200 || d["allowed"] != true || d["remaining"] != 2.0 {
			t.Fatalf("GET /peek?%s = %d %v, want allowed with 2 remaining", key, code, d)
		}
	}
	if code, d := peek(key + "&cost=3"); code != 200 || d["allowed"] != false || !within(d["retry_after_ms"], 3590000, 3600000) {
		t.Fatalf("GET /peek of cost 3 = %d %v, want denied, retry in about an hour", code, d)
	}
	if code, d := peek("policy=api&key=never-seen"); code != 200 || d["remaining"] != 3.0 {
		t.Fatalf("GET /peek of a new key = %d %v, want 3 remaining", code, d)
	}
	for query, want := range map[string]int{
		"policy=nope&key=k":       404,
		"policy=api":              400,
		"policy=api&key=k&cost=x": 400,
		"policy=api&key=k&cost=4": 400,
	} {
		if code, _ := peek(query); code != want {
			t.Errorf("GET /peek?%s = %d, want %d", query, code, want)
		}
	}
	// POST /reset fills the bucket again.
	reset := func(query string) int {
		t.Helper()
		resp, err := http.Post(s.admin+"/reset?"+query, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := reset(key); code != 204 {
		t.Fatalf("POST /reset?%s = %d, want 204", key, code)
	}
	if code, d := peek(key + "&cost=3"); code != 200 || d["allowed"] != true || d["remaining"] != 3.0 {
		t.Fatalf("GET /peek after the reset = %d %v, want 3 remaining", code, d)
	}
	for query, want := range map[string]int{"policy=nope&key=k": 404, "policy=api": 400, "key=k": 400} {
		if code := reset(query); code != want {
			t.Errorf("POST /reset?%s = %d, want %d", query, code, want)
		}
	}
	if code, _ := get(t, s.admin+"/reset?"+key); code != 405 {
		t.Errorf("GET /reset = %d, want 405", code)
	}
	// The admin endpoints are not on the API listener.
	if code, _ := get(t, s.api+"/config"); code != 404 {
		t.Errorf("GET /config on the API listener = %d, want 404", code)
	}
}

func within(v any, lo, hi float64) bool {
	f, ok := v.(float64)
	return ok && lo <= f && f <= hi
}
