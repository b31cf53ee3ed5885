package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestSimulateGolden(t *testing.T) {
	trace, err := os.Open("testdata/burst.trace")
	if err != nil {
		t.Fatal(err)
	}
	defer trace.Close()
	want, err := os.ReadFile("testdata/burst.golden")
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"simulate", "-limit", "3 1/s"}, trace, &stdout, &stderr); err != nil {
		t.Fatalf("run error %v (stderr %q)", err, stderr.String())
	}
	if got := stdout.String(); got != string(want) {
		t.Errorf("simulate output:\n%s\nwant:\n%s", got, want)
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		args    []string
		stdin   string
		wantErr string
	}{
		{nil, "", "missing command"},
		{[]string{"frobnicate"}, "", `"frobnicate"`},
		{[]string{"simulate"}, "", "-limit"},
		{[]string{"simulate", "-limit", "0 1/s"}, "", "capacity 0 is outside"},
		{[]string{"simulate", "-limit", "3 1/s", "extra"}, "", "open extra"},
		{[]string{"simulate", "-limit", "3 1/s"}, "soon alice\n", `offset "soon"`},
		{[]string{"simulate", "-limit", "3 1/s"}, "1s alice many\n", `cost "many"`},
		{[]string{"simulate", "-limit", "3 1/s"}, "1s\n", "not \"offset key [cost]\""},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("run(%q) error %v, want one containing %q", tt.args, err, tt.wantErr)
		}
	}
	if err := run(context.Background(), nil, nil, new(bytes.Buffer), new(bytes.Buffer)); !errors.Is(err, errUsage) {
		t.Errorf("run(nil) error %v, want errUsage", err)
	}
}

// Every subcommand's -h succeeds, prints to stdout what the command reads
// with an example, and nothing to stderr.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "-h"}, {"take", "-h"}, {"status", "-h"}, {"migrate", "-h"},
		{"config", "check", "-h"}, {"config", "-h"}, {"simulate", "-h"}, {"loadgen", "-h"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr); err != nil {
			t.Errorf("%v: %v", args, err)
		}
		out := stdout.String()
		if !strings.Contains(out, "usage: sluice "+args[0]) || !strings.Contains(strings.ToLower(out), "example") || !strings.Contains(strings.ToLower(out), "exit status") {
			t.Errorf("%v printed no usage line, example or exit status:\n%s", args, out)
		}
		if stderr.Len() != 0 {
			t.Errorf("%v wrote to stderr: %q", args, stderr.String())
		}
	}
}
