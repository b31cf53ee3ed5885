package simulate

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice"
)

// Report is one or two runs of one trace, as `sluice simulate` prints them.
type Report struct {
	// Source names the trace: a file, "stdin", "generated".
	Source string
	// Trace is the trace the runs replayed.
	Trace []Request
	// Runs are the replays: A, and B when comparing.
	Runs []*Run
	// Notes are lines printed under the runs: what the limits came from,
	// the store's verdict on them, shadow mode.
	Notes []string
	// Charts are the files of the charts drawn, if any.
	Charts []string
}

// Options say what a Report writes beyond the tallies.
type Options struct {
	// Top is the number of worst keys the text lists (JSON lists every
	// key).
	Top int
	// Decisions writes every request's decision first.
	Decisions bool
	// Diffs is the number of differences the text lists, when there are
	// two runs; negative lists all (JSON lists all).
	Diffs int
}

// runName is the name of run i: A, B.
func runName(i int) string { return string(rune('A' + i)) }

// Describe returns the run's kind and limits in words, for example
// "token bucket 20 1/s" or "fixed window 100/minute + 1000/hour".
func (r *Run) Describe() string {
	return r.Kind + " " + strings.Join(r.Limits, " + ")
}

// WriteText writes the report in words and tables.
func (rep *Report) WriteText(w io.Writer, opt Options) error {
	ew := &errWriter{w: w}
	if opt.Decisions {
		rep.writeDecisions(ew)
		ew.printf("\n")
	}
	ew.printf("trace %s: %d %s from %d %s over %s\n", rep.Source, len(rep.Trace), plural(len(rep.Trace), "request", "requests"),
		rep.keys(), plural(rep.keys(), "key", "keys"), formatOffset(Span(rep.Trace)))
	for i, run := range rep.Runs {
		if len(rep.Runs) == 1 {
			ew.printf("%s\n", run.Describe())
		} else {
			ew.printf("%s: %s\n", runName(i), run.Describe())
		}
	}
	for _, n := range rep.Notes {
		ew.printf("%s\n", n)
	}
	ew.printf("\n")

	// Keys are padded to one width, so that the right-aligned table
	// reads them aligned on the left.
	worst := rep.Runs[0].Ranked()
	if len(worst) > opt.Top {
		worst = worst[:opt.Top]
	}
	width := len("all")
	for _, k := range worst {
		width = max(width, len(k.Key))
	}
	pad := func(s string) string { return padTo(s, width) }

	// The errors columns are left out when no request was refused.
	errs := false
	for _, run := range rep.Runs {
		errs = errs || run.Total.Errors > 0
	}
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := pad("") + "\trequests"
	for i := range rep.Runs {
		n := rep.prefix(i)
		head += "\t" + tallyHead(n, errs)
	}
	fmt.Fprintln(tw, head+"\t")
	row := pad("all") + "\t" + strconv.FormatInt(rep.Runs[0].Total.Requests, 10)
	for _, run := range rep.Runs {
		row += "\t" + tallyCells(run.Total, errs)
	}
	fmt.Fprintln(tw, row+"\t")
	tw.Flush()
	var denied []string
	for i, run := range rep.Runs {
		n := keysDenied(run)
		denied = append(denied, fmt.Sprintf("%s%d of %d (%s)", rep.prefix(i), n, rep.keys(), percent(float64(n), float64(rep.keys()))))
	}
	ew.printf("keys denied: %s\n", strings.Join(denied, ", "))
	for i, run := range rep.Runs {
		if run.Total.Errors == 0 {
			continue
		}
		for j, d := range run.Decisions {
			if d.Err != nil {
				r := rep.Trace[j]
				ew.printf("%serrors: %d %s the service would refuse, the first at %s (%s): %v\n", rep.prefix(i), run.Total.Errors,
					plural(int(run.Total.Errors), "request", "requests"), formatOffset(r.At), r.Key, d.Err)
				break
			}
		}
	}

	if len(worst) > 0 {
		by := ""
		if len(rep.Runs) > 1 {
			by = " under A"
		}
		ew.printf("\nworst keys (most denied%s):\n", by)
		tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := pad("key") + "\trequests"
		for i := range rep.Runs {
			n := rep.prefix(i)
			head += "\t" + tallyHead(n, errs)
		}
		fmt.Fprintln(tw, head+"\t"+rep.prefix(0)+"first_denied\t")
		for _, k := range worst {
			row := pad(k.Key) + "\t" + strconv.FormatInt(k.Requests, 10)
			for _, run := range rep.Runs {
				row += "\t" + tallyCells(*run.Keys[k.Key], errs)
			}
			fmt.Fprintln(tw, row+"\t"+firstDenied(k.Tally)+"\t")
		}
		tw.Flush()
	}

	if len(rep.Runs) == 2 {
		rep.writeDifferences(ew, opt.Diffs, opt.Top)
	}
	if len(rep.Charts) > 0 {
		ew.printf("\ncharts: %s\n", strings.Join(rep.Charts, ", "))
	}
	return ew.err
}

// padTo pads s with spaces to width bytes.
func padTo(s string, width int) string { return s + strings.Repeat(" ", max(0, width-len(s))) }

// prefix is the column prefix of run i: none for a single run, "A " and
// "B " for two.
func (rep *Report) prefix(i int) string {
	if len(rep.Runs) == 1 {
		return ""
	}
	return runName(i) + " "
}

func (rep *Report) keys() int { return len(rep.Runs[0].Keys) }

func keysDenied(run *Run) int {
	n := 0
	for _, t := range run.Keys {
		if t.Denied > 0 {
			n++
		}
	}
	return n
}

// tallyHead is the header of tallyCells, each column's name after
// prefix; errs adds the errors column.
func tallyHead(prefix string, errs bool) string {
	h := prefix + "allowed\t" + prefix + "denied\t"
	if errs {
		h += prefix + "errors\t"
	}
	return h + prefix + "denied%"
}

func tallyCells(t Tally, errs bool) string {
	c := strconv.FormatInt(t.Allowed, 10) + "\t" + strconv.FormatInt(t.Denied, 10) + "\t"
	if errs {
		c += strconv.FormatInt(t.Errors, 10) + "\t"
	}
	return c + percent(float64(t.Denied), float64(t.Allowed+t.Denied))
}

func firstDenied(t Tally) string {
	if t.Denied == 0 {
		return "-"
	}
	return formatOffset(t.FirstDenied)
}

func percent(n, of float64) string {
	if of == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*n/of, 'f', 1, 64) + "%"
}

// writeDecisions writes one line per request: for one run its decision in
// full, for two the outcome of each.
func (rep *Report) writeDecisions(ew *errWriter) {
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	defer tw.Flush()
	if len(rep.Runs) == 2 {
		fmt.Fprintln(tw, "offset\tkey\tcost\tA\tB\t")
		for i, r := range rep.Trace {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t\n", formatOffset(r.At), r.Key, r.Cost, Outcome(rep.Runs[0].Decisions[i]), Outcome(rep.Runs[1].Decisions[i]))
		}
		return
	}
	run := rep.Runs[0]
	multi := len(run.Limits) > 1
	head := "offset\tkey\tcost\tallowed\tremaining\tretry_after\treset_after\t"
	if multi {
		head += "denied_by\t"
	}
	fmt.Fprintln(tw, head)
	for i, r := range rep.Trace {
		d := run.Decisions[i]
		if d.Err != nil {
			// An invalid request is reported where it occurs, as the
			// service would answer it.
			fmt.Fprintf(tw, "%s\t%s\t%d\terror\t-\t-\t-\t  %v\n", formatOffset(r.At), r.Key, r.Cost, d.Err)
			continue
		}
		line := fmt.Sprintf("%s\t%s\t%d\t%t\t%d\t%s\t%s\t", formatOffset(r.At), r.Key, r.Cost, d.Allowed, d.Remaining, formatWait(d.RetryAfter), formatWait(d.ResetAfter))
		if multi {
			by := "-"
			if d.Denied >= 0 {
				by = run.Limits[d.Denied]
			}
			line += by + "\t"
		}
		fmt.Fprintln(tw, line)
	}
}

// writeDifferences writes the requests the two runs decided differently:
// how many each way, the top keys they are of, then up to limit of them
// (all if limit < 0).
func (rep *Report) writeDifferences(ew *errWriter, limit, top int) {
	diffs := Differences(rep.Trace, rep.Runs[0], rep.Runs[1])
	ab, ba := countWays(diffs)
	ew.printf("\ndecided differently: %d %s", len(diffs), plural(len(diffs), "request", "requests"))
	if len(diffs) == 0 {
		ew.printf("\n")
		return
	}
	ew.printf(" (A allowed, B denied: %d; A denied, B allowed: %d)\n", ab, ba)
	byKey := DifferencesByKey(diffs)
	if top >= 0 && len(byKey) > top {
		byKey = byKey[:top]
	}
	if len(byKey) > 0 {
		ew.printf("\nby key (most first):\n")
		width := len("key")
		for _, k := range byKey {
			width = max(width, len(k.Key))
		}
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, padTo("key", width)+"\tdiffer\tA allowed, B denied\tA denied, B allowed\tfirst\tlast\t")
		for _, k := range byKey {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t\n", padTo(k.Key, width), k.Count, k.AAllowedBDenied, k.ADeniedBAllowed, formatOffset(k.First), formatOffset(k.Last))
		}
		tw.Flush()
	}
	shown := diffs
	if limit >= 0 && len(shown) > limit {
		shown = shown[:limit]
	}
	if len(shown) == 0 {
		ew.printf("\n-diffs N lists the first N of the requests, -diffs -1 every one\n")
		return
	}
	if len(shown) > 0 {
		ew.printf("\n")
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "offset\tkey\tcost\tA\tB\t")
		for _, d := range shown {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t\n", formatOffset(d.At), d.Key, d.Cost, d.A, d.B)
		}
		tw.Flush()
	}
	if more := len(diffs) - len(shown); more > 0 {
		ew.printf("... and %d more (-diffs -1 lists every one)\n", more)
	}
}

// countWays counts the differences that A allowed and B denied, and the
// other way round; errors are in neither.
func countWays(diffs []Difference) (ab, ba int) {
	for _, d := range diffs {
		switch {
		case d.A == "allowed" && d.B == "denied":
			ab++
		case d.A == "denied" && d.B == "allowed":
			ba++
		}
	}
	return ab, ba
}

// The JSON form of a report.
type (
	jsonReport struct {
		Trace       jsonTrace       `json:"trace"`
		Notes       []string        `json:"notes"`
		Runs        []jsonRun       `json:"runs"`
		Differences *jsonDiffs      `json:"differences,omitempty"`
		Decisions   []jsonDecisions `json:"decisions,omitempty"`
		Charts      []string        `json:"charts,omitempty"`
	}
	jsonTrace struct {
		Source   string `json:"source"`
		Requests int    `json:"requests"`
		Keys     int    `json:"keys"`
		Span     string `json:"span"`
	}
	jsonRun struct {
		Name       string    `json:"name"`
		Kind       string    `json:"kind"`
		Limits     []string  `json:"limits"`
		Total      jsonTally `json:"total"`
		KeysDenied int       `json:"keys_denied"`
		Keys       []jsonKey `json:"keys"`
	}
	jsonTally struct {
		Requests    int64   `json:"requests"`
		Allowed     int64   `json:"allowed"`
		Denied      int64   `json:"denied"`
		Errors      int64   `json:"errors"`
		TokensTaken int64   `json:"tokens_taken"`
		FirstDenied *string `json:"first_denied"`
	}
	jsonKey struct {
		Key string `json:"key"`
		jsonTally
	}
	jsonDiffs struct {
		Count             int           `json:"count"`
		AAllowedBDenied   int           `json:"a_allowed_b_denied"`
		ADeniedBAllowed   int           `json:"a_denied_b_allowed"`
		Keys              []jsonDiffKey `json:"keys"`
		DifferentRequests []jsonDiff    `json:"requests"`
	}
	jsonDiffKey struct {
		Key             string `json:"key"`
		Count           int    `json:"count"`
		AAllowedBDenied int    `json:"a_allowed_b_denied"`
		ADeniedBAllowed int    `json:"a_denied_b_allowed"`
		First           string `json:"first"`
		Last            string `json:"last"`
	}
	jsonDiff struct {
		Line   int    `json:"line,omitempty"`
		Offset string `json:"offset"`
		Key    string `json:"key"`
		Cost   int64  `json:"cost"`
		A      string `json:"a"`
		B      string `json:"b"`
	}
	jsonDecisions struct {
		Line   int            `json:"line,omitempty"`
		Offset string         `json:"offset"`
		Key    string         `json:"key"`
		Cost   int64          `json:"cost"`
		Runs   []jsonDecision `json:"runs"`
	}
	jsonDecision struct {
		Allowed      bool    `json:"allowed"`
		Error        string  `json:"error,omitempty"`
		Remaining    int64   `json:"remaining"`
		RetryAfterMS *int64  `json:"retry_after_ms"`
		ResetAfterMS *int64  `json:"reset_after_ms"`
		DeniedBy     *string `json:"denied_by"`
	}
)

func toJSONTally(t Tally) jsonTally {
	j := jsonTally{Requests: t.Requests, Allowed: t.Allowed, Denied: t.Denied, Errors: t.Errors, TokensTaken: t.Taken}
	if t.Denied > 0 {
		s := formatOffset(t.FirstDenied)
		j.FirstDenied = &s
	}
	return j
}

// WriteJSON writes the report as one JSON object: the trace, the notes,
// each run with its tally and every key's (most denied first), the
// differences of two runs in full, and with opt.Decisions every decision.
func (rep *Report) WriteJSON(w io.Writer, opt Options) error {
	out := jsonReport{
		Trace:  jsonTrace{Source: rep.Source, Requests: len(rep.Trace), Keys: rep.keys(), Span: formatOffset(Span(rep.Trace))},
		Notes:  append([]string{}, rep.Notes...),
		Charts: rep.Charts,
	}
	for i, run := range rep.Runs {
		jr := jsonRun{Name: runName(i), Kind: run.Kind, Limits: run.Limits, Total: toJSONTally(run.Total), KeysDenied: keysDenied(run), Keys: []jsonKey{}}
		for _, k := range run.Ranked() {
			jr.Keys = append(jr.Keys, jsonKey{Key: k.Key, jsonTally: toJSONTally(k.Tally)})
		}
		out.Runs = append(out.Runs, jr)
	}
	if len(rep.Runs) == 2 {
		diffs := Differences(rep.Trace, rep.Runs[0], rep.Runs[1])
		jd := &jsonDiffs{Count: len(diffs), Keys: []jsonDiffKey{}, DifferentRequests: []jsonDiff{}}
		jd.AAllowedBDenied, jd.ADeniedBAllowed = countWays(diffs)
		for _, k := range DifferencesByKey(diffs) {
			jd.Keys = append(jd.Keys, jsonDiffKey{Key: k.Key, Count: k.Count, AAllowedBDenied: k.AAllowedBDenied, ADeniedBAllowed: k.ADeniedBAllowed, First: formatOffset(k.First), Last: formatOffset(k.Last)})
		}
		for _, d := range diffs {
			jd.DifferentRequests = append(jd.DifferentRequests, jsonDiff{Line: d.Line, Offset: formatOffset(d.At), Key: d.Key, Cost: d.Cost, A: d.A, B: d.B})
		}
		out.Differences = jd
	}
	if opt.Decisions {
		for i, r := range rep.Trace {
			jd := jsonDecisions{Line: r.Line, Offset: formatOffset(r.At), Key: r.Key, Cost: r.Cost}
			for _, run := range rep.Runs {
				jd.Runs = append(jd.Runs, toJSONDecision(run, run.Decisions[i]))
			}
			out.Decisions = append(out.Decisions, jd)
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func toJSONDecision(run *Run, d Decision) jsonDecision {
	if d.Err != nil {
		return jsonDecision{Error: d.Err.Error()}
	}
	j := jsonDecision{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfterMS: millis(d.RetryAfter), ResetAfterMS: millis(d.ResetAfter)}
	if d.Denied >= 0 {
		j.DeniedBy = &run.Limits[d.Denied]
	}
	return j
}

// millis is d in whole milliseconds rounded up, as the HTTP API writes a
// wait, or nil for sluice.Never.
func millis(d time.Duration) *int64 {
	if d == sluice.Never {
		return nil
	}
	var ms int64
	if d > 0 {
		ms = int64((d-1)/time.Millisecond) + 1
	}
	return &ms
}

// formatOffset writes an offset as a duration that ReadTrace reads back:
// one of whole milliseconds with all three digits (1m2.050s, 0.300s), so
// that a column of them lines up; any other as time.Duration writes it.
func formatOffset(d time.Duration) string {
	if d < 0 || d%time.Millisecond != 0 {
		return d.String()
	}
	var b []byte
	if h := d / time.Hour; h > 0 {
		b = strconv.AppendInt(b, int64(h), 10)
		b = append(b, 'h')
		d -= h * time.Hour
	}
	if m := d / time.Minute; m > 0 || len(b) > 0 {
		b = strconv.AppendInt(b, int64(m), 10)
		b = append(b, 'm')
		d -= m * time.Minute
	}
	ms := int64(d / time.Millisecond)
	b = strconv.AppendInt(b, ms/1000, 10)
	b = append(b, '.', byte('0'+ms/100%10), byte('0'+ms/10%10), byte('0'+ms%10), 's')
	return string(b)
}

func formatWait(d time.Duration) string {
	if d == sluice.Never {
		return "never"
	}
	return d.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// errWriter keeps the first write error, so that a report is written
// without checking every line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	fmt.Fprintf(e, format, args...)
}
