package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var simulateUpdate = flag.Bool("update", false, "rewrite the simulate .golden files of testdata")

// runSimulate runs "sluice simulate args..." with stdin and returns its
// output; stderr must stay empty, whatever happens, since main prints the
// error once.
func runSimulate(t *testing.T, stdin io.Reader, args ...string) (string, error) {
	t.Helper()
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"simulate"}, args...), stdin, &stdout, &stderr)
	if stderr.Len() > 0 {
		t.Errorf("simulate %q wrote to stderr: %q", args, stderr.String())
	}
	return stdout.String(), err
}

// checkSimulateGolden compares got with the file, or writes it with -update.
func checkSimulateGolden(t *testing.T, file, got string) {
	t.Helper()
	if *simulateUpdate {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -run Simulate -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -run Simulate -update rewrites it):\n%s", file, firstLineDiff(got, string(want)))
	}
}

// firstLineDiff shows the first line where got and want part.
func firstLineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n got: " + clipLine(gl) + "\nwant: " + clipLine(wl)
		}
	}
	return "(no line differs)"
}

func clipLine(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// TestSimulateGoldens runs simulate on the sample trace and the small
// burst trace and compares the whole output with the golden files: the
// simulation is deterministic, so any change in a decision, a tally or
// the layout shows.
func TestSimulateGoldens(t *testing.T) {
	tests := []struct {
		golden string
		stdin  string // a file for stdin, if any
		args   []string
	}{
		{"burst.golden", "testdata/burst.trace", []string{"-limit", "3 1/s"}},
		{"simulate-burst-decisions.golden", "testdata/burst.trace", []string{"-limit", "3 1/s", "-decisions"}},
		{"simulate-sample.golden", "", []string{"-limit", "10 1/s", "testdata/sample.trace"}},
		{"simulate-sample.json.golden", "", []string{"-limit", "10 1/s", "-json", "testdata/sample.trace"}},
		{"simulate-compare.golden", "", []string{"testdata/sample.trace", "-limit", "10 1/s", "-compare", "40 2/s", "-top", "5", "-diffs", "5"}},
		{"simulate-fixed-window.golden", "", []string{"-limit", "60 60/m", "-compare-fixed-window", "-start", "2025-03-01T09:00:30Z", "-top", "5", "-diffs", "10", "testdata/sample.trace"}},
		{"simulate-fixed-window.json.golden", "", []string{"-limit", "3 3/s", "-compare-fixed-window", "-start", "2025-03-01T09:00:00.5Z", "-json", "testdata/burst.trace"}},
		{"simulate-policy.golden", "", []string{"-config", "testdata/simulate/sluice.yaml", "-policy", "login", "-top", "5", "testdata/sample.trace"}},
		{"simulate-envoy.golden", "", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml", "-descriptor", "remote_address=192.0.2.7", "-compare-fixed-window", "-top", "3", "-diffs", "3", "testdata/sample.trace"}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			var stdin io.Reader
			if tt.stdin != "" {
				f, err := os.Open(tt.stdin)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				stdin = f
			}
			got, err := runSimulate(t, stdin, tt.args...)
			if err != nil {
				t.Fatalf("simulate %q: %v", tt.args, err)
			}
			checkSimulateGolden(t, filepath.Join("testdata", tt.golden), got)
			if strings.HasSuffix(tt.golden, ".json.golden") && !json.Valid([]byte(got)) {
				t.Error("the -json output is not JSON")
			}
		})
	}
}

// TestSimulateJSON reads the JSON report back and checks it against the
// text's numbers: the fields hold what they say.
func TestSimulateJSON(t *testing.T) {
	out, err := runSimulate(t, nil, "-limit", "60 60/m", "-compare-fixed-window", "-json", "-decisions", "testdata/sample.trace")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Trace struct{ Requests, Keys int }
		Runs  []struct {
			Name, Kind string
			Total      struct{ Requests, Allowed, Denied, Errors int }
			Keys       []struct {
				Key             string
				Allowed, Denied int
			}
		}
		Differences struct {
			Count    int
			Requests []struct{ Key, A, B string }
		}
		Decisions []struct {
			Key  string
			Runs []struct{ Allowed bool }
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Kind != "token bucket" || rep.Runs[1].Kind != "fixed window" {
		t.Fatalf("runs = %+v, want a token bucket and a fixed window", rep.Runs)
	}
	if len(rep.Decisions) != rep.Trace.Requests {
		t.Fatalf("%d decisions of %d requests", len(rep.Decisions), rep.Trace.Requests)
	}
	for i, run := range rep.Runs {
		allowed, sum := 0, 0
		for _, d := range rep.Decisions {
			if d.Runs[i].Allowed {
				allowed++
			}
		}
		for _, k := range run.Keys {
			sum += k.Allowed
		}
		if allowed != run.Total.Allowed || sum != run.Total.Allowed || len(run.Keys) != rep.Trace.Keys {
			t.Errorf("run %s: total allowed %d, decisions allowed %d, keys' sum %d over %d keys", run.Name, run.Total.Allowed, allowed, sum, len(run.Keys))
		}
	}
	differ := 0
	for _, d := range rep.Decisions {
		if d.Runs[0].Allowed != d.Runs[1].Allowed {
			differ++
		}
	}
	if differ != rep.Differences.Count || differ != len(rep.Differences.Requests) || differ == 0 {
		t.Errorf("%d decisions differ; differences count %d, list %d", differ, rep.Differences.Count, len(rep.Differences.Requests))
	}
}

// TestSimulateSVGGolden draws the charts of the sample trace and compares
// them with the golden files; each must be well-formed XML with no script
// and no external reference.
func TestSimulateSVGGolden(t *testing.T) {
	dir := t.TempDir()
	out, err := runSimulate(t, nil, "-limit", "10 1/s", "-compare", "40 2/s", "-svg", dir, "testdata/sample.trace")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "charts: "+filepath.Join(dir, "level.svg")) {
		t.Errorf("the report does not list the charts:\n%s", out)
	}
	for _, name := range []string{"level.svg", "deny-rate.svg", "level-compare.svg"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		checkSimulateSVG(t, name, data)
		checkSimulateGolden(t, filepath.Join("testdata", "simulate-"+name+".golden"), string(data))
	}
	// The key drawn by default is the most denied: the scraper.
	level, _ := os.ReadFile(filepath.Join(dir, "level.svg"))
	if !strings.Contains(string(level), "Bucket of scraper-1 under 10 1/s") {
		t.Error("level.svg does not draw the most denied key, scraper-1")
	}
	deny, _ := os.ReadFile(filepath.Join(dir, "deny-rate.svg"))
	for _, want := range []string{"A: token bucket 10 1/s", "B: token bucket 40 2/s", "requests per second"} {
		if !strings.Contains(string(deny), want) {
			t.Errorf("deny-rate.svg has no legend entry %q", want)
		}
	}
}

// checkSimulateSVG parses data as XML and refuses scripts, external references
// and fonts other than the generic family.
func checkSimulateSVG(t *testing.T, name string, data []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", name, err)
		}
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if el.Name.Local == "script" || el.Name.Local == "foreignObject" || el.Name.Local == "image" {
			t.Errorf("%s has a <%s> element", name, el.Name.Local)
		}
		for _, a := range el.Attr {
			if a.Name.Local == "href" || strings.HasPrefix(a.Name.Local, "on") || (a.Name.Local == "font-family" && a.Value != "sans-serif") {
				t.Errorf("%s: <%s %s=%q>", name, el.Name.Local, a.Name.Local, a.Value)
			}
		}
	}
	if bytes.Contains(data, []byte("http")) && bytes.Count(data, []byte("http://www.w3.org/2000/svg")) != bytes.Count(data, []byte("http")) {
		t.Errorf("%s refers to the network", name)
	}
}

// TestSimulateSampleTrace makes the sample trace again with the command
// its header gives, so that the committed file is what it says it is.
func TestSimulateSampleTrace(t *testing.T) {
	want, err := os.ReadFile("testdata/sample.trace")
	if err != nil {
		t.Fatal(err)
	}
	header := strings.SplitN(string(want), "\n", 3)[1]
	cmd, ok := strings.CutPrefix(header, "# Made by: sluice simulate ")
	if !ok {
		t.Fatalf("the sample's second line %q does not say how it was made", header)
	}
	got, err := runSimulate(t, nil, strings.Fields(cmd)...)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s makes another trace than testdata/sample.trace:\n%s", cmd, firstLineDiff(got, string(want)))
	}
}

func TestSimulateHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help", "--help"} {
		out, err := runSimulate(t, nil, h)
		if err != nil {
			t.Fatalf("simulate %s = %v, want nil (exit 0)", h, err)
		}
		for _, want := range []string{"usage: sluice simulate", "reads the trace from the file TRACE", "OFFSET KEY [COST]", "Examples:", "-compare-fixed-window", "steady", "abuser"} {
			if !strings.Contains(out, want) {
				t.Errorf("simulate %s does not say %q", h, want)
			}
		}
	}
	// Every flag is in the usage.
	out, _ := runSimulate(t, nil, "-h")
	for _, name := range []string{"limit", "config", "policy", "envoy-config", "descriptor", "domain", "store", "compare", "compare-fixed-window", "window", "start",
		"generate", "duration", "seed", "print-trace", "json", "decisions", "top", "diffs", "summary", "svg", "key", "from", "to", "interval"} {
		if !strings.Contains(out, "-"+name+" ") && !strings.Contains(out, "-"+name+",") && !strings.Contains(out, "-"+name+"\n") {
			t.Errorf("the usage does not list -%s", name)
		}
	}
}

func TestSimulateErrors(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		stdin string
		want  string
	}{
		{"no limit", nil, "0s a\n", "no limit to try"},
		{"bad limit", []string{"-limit", "0 1/s"}, "", "capacity 0 is outside"},
		{"unknown flag", []string{"-limt", "3 1/s"}, "", "flag provided but not defined: -limt (sluice simulate -h lists the flags)"},
		{"two traces", []string{"-limit", "3 1/s", "a", "b"}, "", "reads one trace, got 2"},
		{"missing file", []string{"-limit", "3 1/s", "testdata/none.trace"}, "", "testdata/none.trace: no such file"},
		{"bad offset", []string{"-limit", "3 1/s"}, "soon alice\n", `stdin:1: offset "soon"`},
		{"bad cost", []string{"-limit", "3 1/s"}, "1s alice many\n", `cost "many"`},
		{"short line", []string{"-limit", "3 1/s"}, "1s\n", `not "offset key [cost]"`},
		{"two sources", []string{"-limit", "3 1/s", "-config", "testdata/simulate/sluice.yaml", "-policy", "api"}, "", "give the limits one way"},
		{"limit and config", []string{"-limit", "3 1/s", "-config", "testdata/simulate/sluice.yaml"}, "", "-limit gives the limits itself"},
		{"config without policy", []string{"-config", "testdata/simulate/sluice.yaml"}, "", "-config needs -policy"},
		{"unknown policy", []string{"-config", "testdata/simulate/sluice.yaml", "-policy", "nope"}, "", `-policy "nope" is not a policy of testdata/simulate/sluice.yaml; it has api, login, export`},
		{"policy without config", []string{"-policy", "api"}, "", "-policy names a policy of the -config FILE"},
		{"bad config", []string{"-config", "testdata/simulate/ratelimit.yaml", "-policy", "api"}, "", "-config: testdata/simulate/ratelimit.yaml:"},
		{"bad store", []string{"-limit", "3 1/s", "-store", "mysql"}, "", `-store "mysql" is not memory, redis or postgres`},
		{"redis bound", []string{"-limit", "1099511627776 1/h", "-store", "redis"}, "", "store redis cannot decide limit 1099511627776 1/h"},
		{"postgres clock", []string{"-limit", "3 1/1500ns", "-store", "postgres"}, "", "not a whole number of microseconds"},
		{"envoy no descriptor", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml"}, "", "-envoy-config needs -descriptor"},
		{"envoy bad descriptor", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml", "-descriptor", "remote_address"}, "", `entry "remote_address" is not KEY=VALUE`},
		{"envoy no match", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml", "-descriptor", "path=/x"}, "", "no rule of domain edge"},
		{"envoy unknown domain", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml", "-descriptor", "a=b", "-domain", "web"}, "", `-domain "web" is not a domain`},
		{"envoy unlimited", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml", "-descriptor", "health=x"}, "", "is unlimited"},
		{"envoy deny", []string{"-envoy-config", "testdata/simulate/ratelimit.yaml", "-descriptor", "blocked=x"}, "", "requests_per_unit 0"},
		{"window and compare", []string{"-limit", "3 3/s", "-compare", "5 1/s", "-compare-fixed-window"}, "", "give one"},
		{"no window", []string{"-limit", "3 1/s", "-compare-fixed-window"}, "", "limit 3 1/s is no fixed window's translation"},
		{"bad window", []string{"-limit", "3 1/s", "-window", "3/fortnight"}, "", `window unit "fortnight"`},
		{"start without windows", []string{"-limit", "3 1/s", "-start", "0"}, "", "-start places the trace"},
		{"bad start", []string{"-limit", "3 3/s", "-compare-fixed-window", "-start", "yesterday"}, "", `-start "yesterday" is neither`},
		{"generate and file", []string{"-limit", "3 1/s", "-generate", "steady", "testdata/sample.trace"}, "", "is one too many"},
		{"bad source", []string{"-limit", "3 1/s", "-generate", "steady:keys=-1"}, "", "-generate steady:keys=-1"},
		{"seed without generate", []string{"-limit", "3 1/s", "-seed", "3"}, "", "-seed is for -generate"},
		{"key without svg", []string{"-limit", "3 1/s", "-key", "a"}, "0s a\n", "-key is for the charts"},
		{"unknown key", []string{"-limit", "3 1/s", "-key", "zed", "-svg", "SVGDIR"}, "0s a\n", `-key "zed" is not a key of the trace`},
		{"bad chart range", []string{"-limit", "3 1/s", "-svg", "SVGDIR", "-from", "2s", "-to", "1s"}, "0s a\n", "chart end 1s is not after its start 2s"},
		{"decisions and summary", []string{"-limit", "3 1/s", "-decisions", "-summary"}, "", "say opposite things"},
		{"negative top", []string{"-limit", "3 1/s", "-top", "-1"}, "", "-top -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string(nil), tt.args...)
			for i, a := range args {
				if a == "SVGDIR" {
					args[i] = t.TempDir()
				}
			}
			out, err := runSimulate(t, strings.NewReader(tt.stdin), args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("simulate %q = %v, want an error containing %q", args, err, tt.want)
			}
			if out != "" {
				t.Errorf("simulate %q printed %q before failing", args, out)
			}
		})
	}
}

func TestSimulateGenerate(t *testing.T) {
	out, err := runSimulate(t, nil, "-generate", "steady:keys=50,rate=10/m", "-generate", "abuser:rate=5/s", "-duration", "1m", "-seed", "2", "-limit", "20 1/s", "-top", "1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "trace generated: ") || !strings.Contains(out, "scraper-1") {
		t.Errorf("simulate -generate:\n%s\nwant the generated trace's report, the scraper worst", out)
	}
	again, _ := runSimulate(t, nil, "-generate", "steady:keys=50,rate=10/m", "-generate", "abuser:rate=5/s", "-duration", "1m", "-seed", "2", "-limit", "20 1/s", "-top", "1")
	if again != out {
		t.Error("the same -generate and -seed gave two reports")
	}
}

// TestSimulateStdinAndFile reads the same trace from a file and from
// stdin: only its name differs.
func TestSimulateStdinAndFile(t *testing.T) {
	fromFile, err := runSimulate(t, nil, "-limit", "3 1/s", "testdata/burst.trace")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("testdata/burst.trace")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fromStdin, err := runSimulate(t, f, "-limit", "3 1/s")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Replace(fromFile, "trace testdata/burst.trace:", "trace stdin:", 1) != fromStdin {
		t.Errorf("file:\n%s\nstdin:\n%s", fromFile, fromStdin)
	}
}

// TestSimulateGuide runs the commands of docs/choosing-a-limit.md and
// compares their output with the output printed there, and draws its
// pictures again, so that the guide shows what the command does.
func TestSimulateGuide(t *testing.T) {
	guide, err := os.ReadFile("../../docs/choosing-a-limit.md")
	if err != nil {
		t.Fatal(err)
	}
	charts := t.TempDir()
	t.Chdir("../..")
	ran := 0
	for _, block := range strings.Split(string(guide), "```")[1:] {
		if !strings.HasPrefix(block, "\n$ sluice simulate ") {
			continue
		}
		lines := strings.Split(strings.TrimPrefix(block, "\n$ "), "\n")
		cmd := lines[0]
		for strings.HasSuffix(cmd, `\`) && len(lines) > 1 {
			cmd = strings.TrimSuffix(cmd, `\`) + lines[1]
			lines = lines[1:]
		}
		want := strings.Join(lines[1:], "\n")
		args := shellWords(t, cmd)[2:]
		for i := range args {
			if i > 0 && args[i-1] == "-svg" {
				args[i] = filepath.Join(charts, args[i])
			}
		}
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"simulate"}, args...), strings.NewReader(""), &stdout, &stderr)
		got := strings.ReplaceAll(stdout.String(), charts+string(filepath.Separator), "")
		if err != nil {
			got += "sluice: " + err.Error() + "\n"
		}
		if got != want {
			t.Errorf("the guide's %s prints\n%s", cmd, firstLineDiff(got, want))
		}
		ran++
	}
	if ran < 5 {
		t.Errorf("ran %d commands of the guide, want its 5 or more", ran)
	}

	pictures := []struct {
		file string
		args []string
	}{
		{"simulate-burst-level.svg", []string{"-limit", "10 1/s", "-key", "burst-2", "-from", "2m10s", "-to", "2m40s"}},
		{"simulate-compare-deny-rate.svg", []string{"-limit", "10 1/s", "-compare", "40 1/s"}},
		{"simulate-scraper-level.svg", []string{"-limit", "40 1/s", "-key", "scraper-1", "-from", "2m50s", "-to", "3m30s"}},
		{"simulate-fixed-window-deny-rate.svg", []string{"-envoy-config", "cmd/sluice/testdata/simulate/ratelimit.yaml", "-descriptor", "remote_address=192.0.2.7", "-compare-fixed-window", "-start", "2025-03-01T09:00:20Z"}},
	}
	for _, p := range pictures {
		dir := filepath.Join(charts, p.file)
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), append([]string{"simulate", "-svg", dir, "cmd/sluice/testdata/sample.trace"}, p.args...), nil, &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		chart := "level.svg"
		if strings.Contains(p.file, "deny-rate") {
			chart = "deny-rate.svg"
		}
		got, err := os.ReadFile(filepath.Join(dir, chart))
		if err != nil {
			t.Fatal(err)
		}
		checkSimulateGolden(t, filepath.Join("docs", "img", p.file), string(got))
	}
}

// shellWords splits a command line as a POSIX shell would for the
// guide's commands: words, and text in double quotes.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	in, inWord := false, false
	for _, r := range line {
		switch {
		case r == '"':
			in, inWord = !in, true
		case (r == ' ' || r == '\t') && !in:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if in {
		t.Fatalf("unbalanced quotes in %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
