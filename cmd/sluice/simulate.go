package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoyconf"
	sim "github.com/sluicehq/sluice/internal/simulate"
)

const simulateUsage = `usage: sluice simulate [flags] [TRACE]

Replays a trace of requests under a proposed limit and prints what would
have been allowed and denied, per key and overall, so that a limit can be
tried on recorded or generated traffic before it is deployed. Each request
is decided as sluice serve decides it, with the same exact token-bucket
arithmetic, but nothing is stored and nothing waits: the trace's offsets
are the clock.

It reads the trace from the file TRACE, or from standard input without
one, or makes one with -generate.

` + sim.TraceFormat + `

The limits (one of):
  -limit "CAP N/PERIOD"   a bucket of CAP tokens refilled N per PERIOD, for
                          example "100 10/s"; repeat it for several limits
                          decided together (all or nothing), as the limits
                          of one policy are
  -config FILE -policy NAME
                          the limits of a policy of a sluice serve config;
                          its store.type is the -store
  -envoy-config PATH -descriptor KEY=VALUE[,KEY=VALUE...] [-domain NAME]
                          the rule of envoyproxy/ratelimit config files
                          (a file or a directory) that the descriptor
                          matches; with -config, its envoy.config. Every
                          trace key is a bucket of that rule, as each value
                          of a descriptor is
  -store memory|redis|postgres
                          check each limit against that store's bounds and
                          decide on its clock (1ns memory, 1µs the others)

A second run beside the first (A), on the same trace (B):
  -compare "CAP N/PERIOD" another limit, repeatable as -limit
  -compare-fixed-window   the fixed-window counter of envoyproxy/ratelimit:
                          N per window, windows one unit long aligned to
                          the Unix epoch, every request counted (denied ones
                          too). The window is the envoy rule's, or the
                          -limit's when its capacity is its refill
  -window N/UNIT          the window instead (implies -compare-fixed-window):
                          100/minute, 10/second, 5/hour; repeatable
  -start TIME             the time of offset 0, for the windows: RFC 3339
                          (2025-03-01T09:00:00Z) or Unix seconds; default
                          1970-01-01T00:00:00Z (offset 0 starts a window)
The report then lists the requests decided differently.

Generated traffic instead of a trace (deterministic):
  -generate SOURCE        a traffic source, repeatable (see below)
  -duration D             the length of the trace (default 10m)
  -seed N                 the random seed (default 1)
  -print-trace            print the generated trace and stop

` + sim.SourceFormat + `

Output:
  -json                   the report as JSON: every key, every difference
  -decisions              every request's decision too
  -top N                  the worst keys listed (default 10)
  -diffs N                the differences listed (default 20; -1 all)
  -summary                the tallies only (the default; kept for scripts)
  -svg DIR                draw level.svg (the bucket of -key over time) and
                          deny-rate.svg (the share denied over time, of
                          every run) in DIR; with -compare, level-compare.svg
  -key K                  the key of level.svg (default the most denied)
  -from D, -to D          the time the charts show (default all of it)
  -interval D             the width of a deny-rate bar (default: the span
                          cut into at most 150)

Examples:
  sluice simulate -limit "20 1/s" cmd/sluice/testdata/sample.trace
  sluice simulate -limit "20 1/s" -compare "40 2/s" -svg charts sample.trace
  sluice simulate -config sluice.yaml -policy api < requests.trace
  sluice simulate -limit "100 100/m" -compare-fixed-window -start 2025-03-01T09:00:00Z access.trace
  sluice simulate -generate steady:keys=500 -generate abuser:rate=20/s -limit "30 1/s"

Exit status: 0 the trace was replayed (denials are results, not
failures); 2 bad flags, an unreadable trace or config, or a limit the
store cannot decide exactly.
`

// listFlag is a flag that may be given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ", ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// simulateFlags are the flags of simulate, parsed.
type simulateFlags struct {
	limits, compare, windows, generate listFlag

	configFile, policy, envoyConfig, descriptor, domain, store string
	fixedWindow, printTrace, asJSON, decisions, summary        bool
	start, svgDir, key                                         string
	duration, from, to, interval                               time.Duration
	seed                                                       uint64
	top, diffs                                                 int
	set                                                        map[string]bool
}

// simulate runs "sluice simulate": it replays a trace under one or two
// runs of limits and prints the report.
func simulate(ctx context.Context, args []string, stdin io.Reader, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	// The flag package would print an error and the usage itself; the
	// error is returned instead, and printed once by main.
	fs.SetOutput(io.Discard)
	var f simulateFlags
	fs.Var(&f.limits, "limit", "")
	fs.Var(&f.compare, "compare", "")
	fs.Var(&f.windows, "window", "")
	fs.Var(&f.generate, "generate", "")
	fs.StringVar(&f.configFile, "config", "", "")
	fs.StringVar(&f.policy, "policy", "", "")
	fs.StringVar(&f.envoyConfig, "envoy-config", "", "")
	fs.StringVar(&f.descriptor, "descriptor", "", "")
	fs.StringVar(&f.domain, "domain", "", "")
	fs.StringVar(&f.store, "store", "", "")
	fs.BoolVar(&f.fixedWindow, "compare-fixed-window", false, "")
	fs.StringVar(&f.start, "start", "", "")
	fs.DurationVar(&f.duration, "duration", 10*time.Minute, "")
	fs.Uint64Var(&f.seed, "seed", 1, "")
	fs.BoolVar(&f.printTrace, "print-trace", false, "")
	fs.BoolVar(&f.asJSON, "json", false, "")
	fs.BoolVar(&f.decisions, "decisions", false, "")
	fs.BoolVar(&f.summary, "summary", false, "")
	fs.IntVar(&f.top, "top", 10, "")
	fs.IntVar(&f.diffs, "diffs", 20, "")
	fs.StringVar(&f.svgDir, "svg", "", "")
	fs.StringVar(&f.key, "key", "", "")
	fs.DurationVar(&f.from, "from", 0, "")
	fs.DurationVar(&f.to, "to", 0, "")
	fs.DurationVar(&f.interval, "interval", 0, "")
	positional, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		_, err := io.WriteString(stdout, simulateUsage)
		return err
	}
	if err != nil {
		return fmt.Errorf("simulate: %w (sluice simulate -h lists the flags)", err)
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if f.decisions && f.summary {
		return errors.New("simulate: -decisions and -summary say opposite things; give one")
	}
	if f.top < 0 {
		return fmt.Errorf("simulate: -top %d is negative", f.top)
	}
	if f.diffs < -1 {
		return fmt.Errorf("simulate: -diffs %d is below -1 (every difference)", f.diffs)
	}

	// The limits are checked before a trace is read, which may be long:
	// a mistyped flag fails at once.
	var sp *simPlan
	if !f.printTrace {
		if sp, err = simulatePlan(&f); err != nil {
			return err
		}
	}
	trace, source, err := readSimulateTrace(positional, &f, stdin)
	if err != nil {
		return err
	}
	if f.printTrace {
		return sim.WriteTrace(stdout, traceHeader(&f), trace)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	a, err := sim.NewBucket(sp.limits, sp.tick)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	rep := &sim.Report{Source: source, Trace: trace, Notes: sp.notes}
	rep.Runs = append(rep.Runs, sim.Replay(trace, a))
	switch {
	case len(sp.compare) > 0:
		b, err := sim.NewBucket(sp.compare, sp.tick)
		if err != nil {
			return fmt.Errorf("simulate: -compare: %w", err)
		}
		rep.Runs = append(rep.Runs, sim.Replay(trace, b))
	case len(sp.windows) > 0:
		b, err := sim.NewFixedWindow(sp.windows, sp.start)
		if err != nil {
			return fmt.Errorf("simulate: -compare-fixed-window: %w", err)
		}
		rep.Runs = append(rep.Runs, sim.Replay(trace, b))
	}

	if f.svgDir != "" {
		charts, err := drawSimulateCharts(&f, sp, rep)
		if err != nil {
			return err
		}
		rep.Charts = charts
	} else {
		for _, name := range []string{"key", "from", "to", "interval"} {
			if f.set[name] {
				return fmt.Errorf("simulate: -%s is for the charts, which -svg DIR draws", name)
			}
		}
	}
	opt := sim.Options{Top: f.top, Decisions: f.decisions, Diffs: f.diffs}
	if f.asJSON {
		return rep.WriteJSON(stdout, opt)
	}
	return rep.WriteText(stdout, opt)
}

// readSimulateTrace reads the trace of the file argument or stdin, or
// generates it; it returns the trace and its name.
func readSimulateTrace(positional []string, f *simulateFlags, stdin io.Reader) ([]sim.Request, string, error) {
	if len(positional) > 1 {
		return nil, "", fmt.Errorf("simulate reads one trace, got %d arguments %q", len(positional), positional)
	}
	if len(f.generate) > 0 {
		if len(positional) == 1 {
			return nil, "", fmt.Errorf("simulate: -generate makes the trace, so there is no trace file to read; %q is one too many", positional[0])
		}
		sources := make([]sim.Source, len(f.generate))
		for i, g := range f.generate {
			s, err := sim.ParseSource(g)
			if err != nil {
				return nil, "", fmt.Errorf("simulate: -generate %s: %w", g, err)
			}
			sources[i] = s
		}
		trace, err := sim.Generate(sources, f.duration, f.seed)
		if err != nil {
			return nil, "", fmt.Errorf("simulate: -generate: %w", err)
		}
		return trace, "generated", nil
	}
	for _, name := range []string{"duration", "seed", "print-trace"} {
		if f.set[name] {
			return nil, "", fmt.Errorf("simulate: -%s is for -generate, which is not given", name)
		}
	}
	if len(positional) == 0 {
		trace, err := sim.ReadTrace(stdin, "stdin")
		return trace, "stdin", err
	}
	file, err := os.Open(positional[0])
	if err != nil {
		return nil, "", fmt.Errorf("simulate: %w", err)
	}
	defer file.Close()
	trace, err := sim.ReadTrace(file, positional[0])
	return trace, positional[0], err
}

// traceHeader is the comment a printed trace starts with: the format, and
// the command that makes it again.
func traceHeader(f *simulateFlags) string {
	cmd := []string{"sluice", "simulate"}
	for _, g := range f.generate {
		cmd = append(cmd, "-generate", shellQuote(g))
	}
	cmd = append(cmd, "-duration", f.duration.String(), "-seed", strconv.FormatUint(f.seed, 10), "-print-trace")
	return "A trace of sluice simulate: OFFSET KEY [COST] a line.\nMade by: " + strings.Join(cmd, " ")
}

// shellQuote quotes s for a POSIX shell unless it needs none.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,:=/@+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// simPlan is what a simulation runs: the limits of run A, those of run B
// (a bucket or windows), the store's clock, and the notes to print.
type simPlan struct {
	limits  []sluice.Limit
	compare []sluice.Limit
	windows []sim.Window
	start   time.Time
	tick    time.Duration
	notes   []string
}

// simulatePlan reads the limits from the flags, a config or Envoy rules,
// and checks them against the store.
func simulatePlan(f *simulateFlags) (*simPlan, error) {
	sp := &simPlan{tick: time.Nanosecond, start: time.Unix(0, 0).UTC()}
	sources := 0
	for _, on := range []bool{len(f.limits) > 0, f.policy != "", f.descriptor != ""} {
		if on {
			sources++
		}
	}
	switch {
	case sources == 0 && f.configFile != "":
		return nil, errors.New("simulate: -config needs -policy NAME (or -descriptor, for its envoy.config rules)")
	case sources == 0 && f.envoyConfig != "":
		return nil, errors.New("simulate: -envoy-config needs -descriptor KEY=VALUE[,KEY=VALUE...]")
	case sources == 0:
		return nil, errors.New(`simulate: no limit to try: give -limit "CAP N/PERIOD" (for example -limit "100 10/s"), -config FILE -policy NAME, or -envoy-config PATH -descriptor KEY=VALUE`)
	case sources > 1:
		return nil, errors.New("simulate: give the limits one way: -limit, -config with -policy, or -descriptor with -envoy-config")
	}
	if len(f.limits) > 0 && (f.configFile != "" || f.envoyConfig != "") {
		return nil, errors.New("simulate: -limit gives the limits itself; -config and -envoy-config are for -policy and -descriptor")
	}
	if f.domain != "" && f.descriptor == "" {
		return nil, errors.New("simulate: -domain is for -descriptor")
	}

	storeType := config.StoreMemory
	storeNamed := false
	var cfg *config.Config
	if f.configFile != "" {
		c, err := config.Load(f.configFile)
		if err != nil {
			return nil, fmt.Errorf("simulate: -config: %w", err)
		}
		cfg = &c
		storeType, storeNamed = c.Store.Type, true
	}
	if f.store != "" {
		switch t := config.StoreType(f.store); t {
		case config.StoreMemory, config.StoreRedis, config.StorePostgres:
			storeType, storeNamed = t, true
		default:
			return nil, fmt.Errorf("simulate: -store %q is not memory, redis or postgres", f.store)
		}
	}

	var envoyRule *envoyconf.Rule
	switch {
	case len(f.limits) > 0:
		for _, text := range f.limits {
			l, err := sluice.ParseLimit(text)
			if err != nil {
				return nil, fmt.Errorf("simulate: -limit: %w", err)
			}
			sp.limits = append(sp.limits, l)
		}
	case f.policy != "":
		if cfg == nil {
			return nil, errors.New("simulate: -policy names a policy of the -config FILE, which is not given")
		}
		p, ok := cfg.Policy(f.policy)
		if !ok {
			names := make([]string, len(cfg.Policies))
			for i, p := range cfg.Policies {
				names[i] = p.Name
			}
			return nil, fmt.Errorf("simulate: -policy %q is not a policy of %s; it has %s", f.policy, f.configFile, strings.Join(names, ", "))
		}
		sp.limits = p.Limits
		sp.notes = append(sp.notes, fmt.Sprintf("limits of policy %s in %s", p.Name, f.configFile))
		if p.Shadow {
			sp.notes = append(sp.notes, "policy "+p.Name+" is in shadow mode: the service allows every request and counts these denials as would-be denials")
		}
	default:
		rule, note, err := simulateEnvoyRule(f, cfg)
		if err != nil {
			return nil, err
		}
		envoyRule = rule
		sp.limits = []sluice.Limit{rule.Limit}
		sp.notes = append(sp.notes, note)
		if rule.Shadow {
			sp.notes = append(sp.notes, "the rule is in shadow_mode: the service answers OK and counts these denials")
		}
	}
	for _, text := range f.compare {
		l, err := sluice.ParseLimit(text)
		if err != nil {
			return nil, fmt.Errorf("simulate: -compare: %w", err)
		}
		sp.compare = append(sp.compare, l)
	}

	if storeType != config.StoreMemory {
		sp.tick = time.Microsecond
	}
	store := exactness(storeType)
	for _, group := range [][]sluice.Limit{sp.limits, sp.compare} {
		for _, l := range group {
			if err := sluice.CheckLimit(store, l); err != nil {
				return nil, fmt.Errorf("simulate: store %s cannot decide limit %v: %w", storeType, l, err)
			}
		}
	}
	if storeNamed {
		sp.notes = append(sp.notes, fmt.Sprintf("store %s: decides every limit exactly, on a clock of %v", storeType, sp.tick))
	}

	if err := simulateWindows(f, sp, envoyRule); err != nil {
		return nil, err
	}
	return sp, nil
}

// simulateEnvoyRule finds the Envoy rule of -descriptor and says where it
// came from.
func simulateEnvoyRule(f *simulateFlags, cfg *config.Config) (*envoyconf.Rule, string, error) {
	path := f.envoyConfig
	if path == "" && cfg != nil {
		path = cfg.Envoy.Config
	}
	if path == "" {
		return nil, "", errors.New("simulate: -descriptor matches a rule of -envoy-config PATH (or of -config's envoy.config), which is not given")
	}
	rules, err := envoyconf.Load(path)
	if err != nil {
		return nil, "", fmt.Errorf("simulate: -envoy-config: %w", err)
	}
	var entries []envoyconf.Entry
	for _, part := range strings.Split(f.descriptor, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" || v == "" {
			return nil, "", fmt.Errorf("simulate: -descriptor %q: entry %q is not KEY=VALUE", f.descriptor, part)
		}
		entries = append(entries, envoyconf.Entry{Key: k, Value: v})
	}
	domain := f.domain
	if domain == "" {
		ds := rules.Domains()
		if len(ds) != 1 {
			return nil, "", fmt.Errorf("simulate: %s has %d domains (%s): give -domain", path, len(ds), strings.Join(ds, ", "))
		}
		domain = ds[0]
	}
	if !rules.HasDomain(domain) {
		return nil, "", fmt.Errorf("simulate: -domain %q is not a domain of %s; it has %s", domain, path, strings.Join(rules.Domains(), ", "))
	}
	rule, ok := rules.Match(domain, entries)
	if !ok {
		return nil, "", fmt.Errorf("simulate: no rule of domain %s in %s matches -descriptor %s", domain, path, f.descriptor)
	}
	switch {
	case rule.Unlimited:
		return nil, "", fmt.Errorf("simulate: the rule of -descriptor %s is unlimited: every request is answered OK, so there is nothing to try (%s)", f.descriptor, rule.Describe())
	case rule.Deny:
		return nil, "", fmt.Errorf("simulate: the rule of -descriptor %s has requests_per_unit 0: every request is over the limit, so there is nothing to try (%s)", f.descriptor, rule.Describe())
	}
	return rule, "rule " + rule.Describe(), nil
}

// simulateWindows sets the fixed windows of run B, if there is one: from
// -window, the Envoy rule, or the limits.
func simulateWindows(f *simulateFlags, sp *simPlan, rule *envoyconf.Rule) error {
	fixed := f.fixedWindow || len(f.windows) > 0
	if !fixed {
		if f.start != "" {
			return errors.New("simulate: -start places the trace among -compare-fixed-window's windows, which are not asked for")
		}
		return nil
	}
	if len(sp.compare) > 0 {
		return errors.New("simulate: -compare and -compare-fixed-window are both a second run; give one")
	}
	for _, text := range f.windows {
		w, err := sim.ParseWindow(text)
		if err != nil {
			return fmt.Errorf("simulate: -window: %w", err)
		}
		sp.windows = append(sp.windows, w)
	}
	if len(sp.windows) == 0 {
		if rule != nil {
			sp.windows = []sim.Window{{Requests: int64(rule.RequestsPerUnit), Unit: rule.Limit.Rate.Period}}
		} else {
			for _, l := range sp.limits {
				w, ok := sim.WindowOf(l)
				if !ok {
					return fmt.Errorf("simulate: -compare-fixed-window: limit %v is no fixed window's translation (its capacity is not its refill per period); give -window N/UNIT", l)
				}
				sp.windows = append(sp.windows, w)
			}
		}
	}
	if f.start != "" {
		t, err := parseStart(f.start)
		if err != nil {
			return err
		}
		sp.start = t
		sp.notes = append(sp.notes, "offset 0 is "+t.UTC().Format(time.RFC3339Nano)+" (-start): the windows start at multiples of their unit since the Unix epoch")
	} else {
		sp.notes = append(sp.notes, "offset 0 is 1970-01-01T00:00:00Z, the start of a window of every unit; -start places a recorded trace")
	}
	return nil
}

// parseStart reads -start: RFC 3339 or Unix seconds.
func parseStart(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 && n < 7258118400 {
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("simulate: -start %q is neither an RFC 3339 time (2025-03-01T09:00:00Z) nor Unix seconds from 0 to 7258118399 (year 2199)", s)
}

// drawSimulateCharts writes the charts into f.svgDir and returns their
// paths.
func drawSimulateCharts(f *simulateFlags, sp *simPlan, rep *sim.Report) ([]string, error) {
	key := f.key
	if key == "" {
		key = rep.Runs[0].Worst()
	} else if _, ok := rep.Runs[0].Keys[key]; !ok {
		return nil, fmt.Errorf("simulate: -key %q is not a key of the trace", key)
	}
	if key == "" {
		return nil, errors.New("simulate: -svg: the trace has no request to draw")
	}
	if err := os.MkdirAll(f.svgDir, 0o755); err != nil {
		return nil, fmt.Errorf("simulate: -svg: %w", err)
	}
	type chart struct {
		name  string
		write func(io.Writer) error
	}
	label := ""
	if len(rep.Runs) > 1 {
		label = "A"
	}
	charts := []chart{
		{"level.svg", func(w io.Writer) error {
			return sim.LevelChart{Key: key, Limits: sp.limits, Tick: sp.tick, From: f.from, To: f.to, Label: label}.Write(w, rep.Trace)
		}},
		{"deny-rate.svg", func(w io.Writer) error {
			return sim.DenyRateChart{Runs: rep.Runs, Source: rep.Source, From: f.from, To: f.to, Interval: f.interval}.Write(w, rep.Trace)
		}},
	}
	if len(sp.compare) > 0 {
		charts = append(charts, chart{"level-compare.svg", func(w io.Writer) error {
			return sim.LevelChart{Key: key, Limits: sp.compare, Tick: sp.tick, From: f.from, To: f.to, Label: "B"}.Write(w, rep.Trace)
		}})
	}
	var paths []string
	for _, c := range charts {
		path := filepath.Join(f.svgDir, c.name)
		if err := writeFileWith(path, c.write); err != nil {
			return nil, fmt.Errorf("simulate: -svg: %w", err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// writeFileWith writes path with write, and reports the first error of
// writing or closing it.
func writeFileWith(path string, write func(io.Writer) error) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(file); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}
