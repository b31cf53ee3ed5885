package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTake(t *testing.T) {
	const token = "test-token-0123456789abcdef"
	t.Setenv("SLUICE_TEST_TOKENS", token)
	t.Setenv("SLUICE_TEST_TOKEN", token)
	t.Setenv("SLUICE_TEST_WRONG", "wrong-token-0123456789abcdef")
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	text := "listen:\n  http: \"127.0.0.1:0\"\n  grpc: \"127.0.0.1:0\"\n  admin: \"127.0.0.1:0\"\nauth:\n  bearer_tokens_env: SLUICE_TEST_TOKENS\n" +
		"policies:\n  api:\n    limit: \"3 1/h\"\n  frozen:\n    limit: \"1 0/s\"\n"
	if err := writeFile(path, text); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "-config", path)
	auth := []string{"-server", s.api, "-token-env", "SLUICE_TEST_TOKEN"}
	tests := []struct {
		args    []string
		wantErr error // nil, errDenied, or errOther for any other error
		want    string
	}{
		{[]string{"api", "me"}, nil, "allowed: 2 tokens left of policy api (3 1/h); full in 1h0m0s"},
		// Flags after the arguments, as the usage line shows them.
		{[]string{"api", "me", "-cost", "2", "-request-id", "r1"}, nil, "allowed: 0 tokens left"},
		{[]string{"api", "me", "-cost", "2", "-request-id", "r1"}, nil, "replayed"},
		{[]string{"api", "me"}, errDenied, "denied: 0 tokens left of policy api (3 1/h); retry in "},
		{[]string{"frozen", "me"}, nil, "allowed: 0 tokens left of policy frozen (1 0/s); never refills"},
		{[]string{"frozen", "me"}, errDenied, "never allowed"},
		{[]string{"nope", "me"}, errOther, "404"},
		{[]string{"api", "me", "-cost", "4"}, errOther, "400"},
		{[]string{"api"}, errOther, "a policy and a key"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), append(append([]string{"take"}, tt.args...), auth...), nil, &stdout, &stderr)
		if !matches(err, tt.wantErr) {
			t.Errorf("take %q error %v, want %v", tt.args, err, tt.wantErr)
			continue
		}
		got := stdout.String()
		if err != nil && !errors.Is(err, errDenied) {
			got = err.Error()
		}
		if !strings.Contains(got, tt.want) {
			t.Errorf("take %q printed %q, want it to contain %q", tt.args, got, tt.want)
		}
	}

	// -json prints the service's answer.
	var stdout bytes.Buffer
	err := run(t.Context(), append([]string{"take", "-json", "api", "other"}, auth...), nil, &stdout, new(bytes.Buffer))
	var d map[string]any
	if jerr := json.Unmarshal(stdout.Bytes(), &d); err != nil || jerr != nil || d["allowed"] != true || d["remaining"] != 2.0 {
		t.Fatalf("take -json = %v, printed %q, want an allowed decision with 2 remaining", err, stdout.String())
	}

	// No token, or a wrong one: an error, not a denial.
	for _, extra := range [][]string{nil, {"-token-env", "SLUICE_TEST_WRONG"}} {
		err := run(t.Context(), append([]string{"take", "api", "me", "-server", s.api}, extra...), nil, new(bytes.Buffer), new(bytes.Buffer))
		if !matches(err, errOther) || !strings.Contains(err.Error(), "401") {
			t.Errorf("take with token %v = %v, want an error naming 401", extra, err)
		}
	}
	// Nobody listening: an error.
	if err := run(t.Context(), []string{"take", "api", "me", "-server", "http://127.0.0.1:1"}, nil, new(bytes.Buffer), new(bytes.Buffer)); !matches(err, errOther) {
		t.Errorf("take from a closed port = %v, want an error", err)
	}
}

var errOther = errors.New("any error but errDenied")

func matches(err, want error) bool {
	switch want {
	case nil:
		return err == nil
	case errOther:
		return err != nil && !errors.Is(err, errDenied)
	}
	return errors.Is(err, want)
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o600) }
