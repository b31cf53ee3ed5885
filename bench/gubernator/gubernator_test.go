package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestMain runs the test binary as the gubernator daemon when the launcher
// starts it so, as it does this program.
func TestMain(m *testing.M) {
	if os.Getenv(daemonEnv) == "1" {
		ctx, stop := signalContext()
		err := serveGubernator(ctx, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			os.Stderr.WriteString("gubernator daemon: " + err.Error() + "\n")
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestReadGubernatorJSON(t *testing.T) {
	under := `{"status":"UNDER_LIMIT","limit":"100","remaining":"99","reset_time":"1700000000100","error":"","metadata":{}}`
	over := `{"status":"OVER_LIMIT","limit":"100","remaining":"0","reset_time":"1700000000100","error":"","metadata":{"owner":"x"}}`
	failed := `{"status":"UNDER_LIMIT","limit":"0","remaining":"0","reset_time":"0","error":"field 'unique_key' cannot be empty","metadata":{}}`
	for _, tt := range []struct {
		name string
		b    string
		want []outcome
		ok   bool
	}{
		{"one allowed", `{"responses":[` + under + `]}`, []outcome{{true, true}}, true},
		{"mixed", `{"responses":[` + under + `,` + over + `,` + failed + `]}`, []outcome{{true, true}, {true, false}, {}}, true},
		{"empty list", `{"responses":[]}`, nil, true},
		{"no responses", `{"other":1}`, nil, false},
		{"no status", `{"responses":[{"limit":"100"}]}`, []outcome{{}}, false},
		{"unknown status", `{"responses":[{"status":"MAYBE","error":""}]}`, []outcome{{}}, false},
		{"truncated", `{"responses":[` + under[:30], nil, false},
		{"trailing data", `{"responses":[]} x`, nil, false},
	} {
		got, err := readGubernatorJSON([]byte(tt.b), nil)
		if (err == nil) != tt.ok {
			t.Errorf("%s: readGubernatorJSON error %v, want ok %v", tt.name, err, tt.ok)
			continue
		}
		if tt.ok && !equalOutcomes(got, tt.want) {
			t.Errorf("%s: readGubernatorJSON = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestReadGubernatorProto(t *testing.T) {
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	resp := func(rs ...*gubernator.RateLimitResp) []byte {
		return marshal(&gubernator.GetRateLimitsResp{Responses: rs})
	}
	under := &gubernator.RateLimitResp{Status: gubernator.Status_UNDER_LIMIT, Limit: 100, Remaining: 99, ResetTime: 1}
	over := &gubernator.RateLimitResp{Status: gubernator.Status_OVER_LIMIT, Limit: 100, ResetTime: 1, Metadata: map[string]string{"owner": "x"}}
	failed := &gubernator.RateLimitResp{Error: "field 'unique_key' cannot be empty"}
	for _, tt := range []struct {
		name string
		b    []byte
		want []outcome
		ok   bool
	}{
		{"one allowed", resp(under), []outcome{{true, true}}, true},
		{"mixed", resp(under, over, failed), []outcome{{true, true}, {true, false}, {}}, true},
		{"none", resp(), nil, true},
		{"no limit", resp(&gubernator.RateLimitResp{Remaining: 3}), []outcome{{}}, false},
		{"unknown status", resp(&gubernator.RateLimitResp{Status: 7, Limit: 100}), []outcome{{}}, false},
		{"truncated", resp(under, over)[:9], nil, false},
		{"a bad tag", []byte{0xff, 0xff, 0xff}, nil, false},
	} {
		got, err := readGubernatorProto(tt.b, nil)
		if (err == nil) != tt.ok {
			t.Errorf("%s: readGubernatorProto error %v, want ok %v", tt.name, err, tt.ok)
			continue
		}
		if tt.ok && !equalOutcomes(got, tt.want) {
			t.Errorf("%s: readGubernatorProto = %v, want %v", tt.name, got, tt.want)
		}
	}
	// The request the generator builds is one gubernator reads back.
	var list []byte
	for _, k := range []string{"k1", "k2"} {
		item, err := encodeItem(gubernatorServer, cellGRPCBatch, k, gubernatorLimit{algorithm: gubernator.Algorithm_LEAKY_BUCKET, limit: 100, burst: 100, duration: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		list = appendItem(list, item)
	}
	var req gubernator.GetRateLimitsReq
	if err := proto.Unmarshal(list, &req); err != nil {
		t.Fatal(err)
	}
	if len(req.Requests) != 2 || req.Requests[1].UniqueKey != "k2" || req.Requests[1].Duration != 10000 || req.Requests[1].Burst != 100 ||
		req.Requests[1].Algorithm != gubernator.Algorithm_LEAKY_BUCKET || req.Requests[1].Hits != 1 || req.Requests[1].Name != policyName {
		t.Errorf("the encoded batch reads back as %v", req.Requests)
	}
}

func TestReadSluice(t *testing.T) {
	decision := func(allowed bool) []byte {
		b, err := proto.Marshal(&sluicev1.Decision{Allowed: allowed, Remaining: 3, Policy: policyName})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	batch := appendItem(nil, appendItem(nil, decision(true)))   // results[0].decision
	batch = appendItem(batch, appendItem(nil, decision(false))) // results[1].decision
	// results[2].error, a google.rpc.Status of code 8
	batch = appendItem(batch, protowire.AppendBytes(protowire.AppendTag(nil, resultError, protowire.BytesType), []byte{8, 8}))
	for _, tt := range []struct {
		name string
		read func([]byte, []outcome) ([]outcome, error)
		b    []byte
		want []outcome
		ok   bool
	}{
		{"json decision", readSluiceDecision, []byte(`{"allowed":true,"remaining":99,"policy":"bench"}`), []outcome{{true, true}}, true},
		{"json denied", readSluiceDecision, []byte(`{"allowed":false,"retry_after":"0.1s"}`), []outcome{{true, false}}, true},
		{"json neither", readSluiceDecision, []byte(`{"remaining":99}`), nil, false},
		{"json batch", readSluiceBatch, []byte(`{"results":[{"allowed":true},{"allowed":false},{"error":{"status":400}}]}`), []outcome{{true, true}, {true, false}, {}}, true},
		{"json batch without results", readSluiceBatch, []byte(`{}`), nil, false},
		{"proto decision", readTakeProto, decision(true), []outcome{{true, true}}, true},
		{"proto decision without a policy", readTakeProto, []byte{8, 1}, nil, false},
		{"proto batch", readTakeBatchProto, batch, []outcome{{true, true}, {true, false}, {}}, true},
	} {
		got, err := tt.read(tt.b, nil)
		if (err == nil) != tt.ok {
			t.Errorf("%s: error %v, want ok %v", tt.name, err, tt.ok)
			continue
		}
		if tt.ok && !equalOutcomes(got, tt.want) {
			t.Errorf("%s: = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func equalOutcomes(a, b []outcome) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestGubernatorShape(t *testing.T) {
	for _, tt := range []struct {
		limit, algorithm string
		want             gubernatorLimit
		ok               bool
	}{
		{"100 10/s", "leaky", gubernatorLimit{gubernator.Algorithm_LEAKY_BUCKET, 100, 100, 10 * time.Second}, true},
		{"5 1/m", "leaky", gubernatorLimit{gubernator.Algorithm_LEAKY_BUCKET, 5, 5, 5 * time.Minute}, true},
		{"3 2/1s", "leaky", gubernatorLimit{gubernator.Algorithm_LEAKY_BUCKET, 3, 3, 1500 * time.Millisecond}, true},
		{"100 10/s", "token", gubernatorLimit{gubernator.Algorithm_TOKEN_BUCKET, 100, 0, 10 * time.Second}, true},
		{"1000 0/s", "leaky", gubernatorLimit{}, false},
		{"1 1000000/s", "leaky", gubernatorLimit{}, false}, // refills in 1µs
		{"100 10/s", "sliding", gubernatorLimit{}, false},
	} {
		l, err := sluice.ParseLimit(tt.limit)
		if err != nil {
			t.Fatal(err)
		}
		got, err := gubernatorShape(l, tt.algorithm)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("gubernatorShape(%q, %q) = %v, %v; want %v, ok %v", tt.limit, tt.algorithm, got, err, tt.want, tt.ok)
		}
		if err != nil && tt.algorithm == "leaky" && !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("gubernatorShape(%q): error %v does not wrap ErrInvalidLimit", tt.limit, err)
		}
	}
}

func TestFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sluice")
	if err := os.WriteFile(bin, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string // in the error; empty: no error
	}{
		{[]string{"-sluice", bin}, ""},
		{[]string{"-servers", "gubernator"}, ""},
		{nil, "-sluice is empty"},
		{[]string{"-sluice", bin + ".missing"}, "-sluice"},
		{[]string{"-sluice", bin, "-servers", "sluice,sluice"}, "-servers"},
		{[]string{"-sluice", bin, "-servers", "redis"}, "-servers"},
		{[]string{"-sluice", bin, "-cells", "http-single,udp"}, "-cells"},
		{[]string{"-sluice", bin, "-cells", ","}, "-cells is empty"},
		{[]string{"-sluice", bin, "-batch", "1001"}, "-batch 1001"},
		{[]string{"-sluice", bin, "-conns", "65"}, "-conns 65"},
		{[]string{"-sluice", bin, "-in-flight", "0"}, "-in-flight 0"},
		{[]string{"-sluice", bin, "-limit", "100"}, "-limit"},
		{[]string{"-sluice", bin, "-limit", "10 0/s"}, "never refills"},
		{[]string{"-sluice", bin, "-algorithm", "gcra"}, "-algorithm"},
		{[]string{"-sluice", bin, "-duration", "0"}, "-duration 0s"},
		{[]string{"-sluice", bin, "-duration", "0", "-calls", "5"}, ""},
		{[]string{"-sluice", bin, "-wait-idle", "101"}, "-wait-idle"},
		{[]string{"-sluice", bin, "-retry-busy", "-1"}, "-retry-busy"},
		{[]string{"-sluice", bin, "extra"}, "no arguments"},
	} {
		_, _, _, err := parseFlags(tt.args, io.Discard)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.args, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: error %v, want one with %q", tt.args, err, tt.want)
		}
	}
}

// TestCompare runs two rounds of every cell against both servers, each
// run 600 calls on two keys, and checks that the counts add up and that both
// decided as the limit says: every key's burst of 100 allowed, and not
// more than the burst and the refill since the server started.
func TestCompare(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build sluice with")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice")
	build := exec.Command(goBin, "build", "-o", bin, "./cmd/sluice")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sluice: %v\n%s", err, out)
	}
	const keys, capacity, refill, batch = 2, 100, 10, 10
	c, _, _, err := parseFlags([]string{"-sluice", bin, "-rounds", "2", "-calls", "600", "-warmup", "0", "-procs", "0",
		"-keys", "2", "-in-flight", "8", "-conns", "2", "-batch", "10", "-limit", "100 10/s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c.launcher.dir = dir
	c.idleWindow = 0
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	started := time.Now()
	results, err := c.run(ctx, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if want := 2 * len(allCells) * 2; len(results) != want {
		t.Fatalf("%d runs, want %d", len(results), want)
	}
	for i, x := range results {
		name := x.cell + " " + x.server
		if i%2 == 0 && x.server != c.order(x.round)[0] {
			t.Errorf("round %d, %s: %s ran first, want %s", x.round, x.cell, x.server, c.order(x.round)[0])
		}
		per := int64(c.w.perCall(x.cell))
		r := x.r
		if r.calls != 600 || r.decisions != r.calls*per || r.allowed+r.denied+r.errors != r.decisions || r.errors != 0 || r.failed != 0 {
			t.Errorf("%s: %d calls, %d decisions (%d a call): %d allowed + %d denied + %d errors, %d failed (first: %s)",
				name, r.calls, r.decisions, per, r.allowed, r.denied, r.errors, r.failed, r.firstErr)
		}
		if int64(len(r.latencies)) != r.calls {
			t.Errorf("%s: %d latencies of %d calls", name, len(r.latencies), r.calls)
		}
		// Each key is asked for 300 decisions or more: far more than
		// its burst.
		upper := int64(keys * (capacity + refill*time.Since(started).Seconds() + 1))
		if r.allowed < keys*capacity || r.allowed > upper {
			t.Errorf("%s: %d of %d allowed, want %d (every key's burst) to %d (and the refill since the start)", name, r.allowed, r.decisions, keys*capacity, upper)
		}
		if x.serverCPU <= 0 {
			t.Errorf("%s: server CPU time %v", name, x.serverCPU)
		}
	}
	var summary bytes.Buffer
	c.printSummary(&summary, results)
	for _, cell := range allCells {
		if !strings.Contains(summary.String(), cell+" ") || !strings.Contains(summary.String(), "gubernator's decisions/s") {
			t.Errorf("the summary lacks %s:\n%s", cell, summary.String())
		}
	}
}
