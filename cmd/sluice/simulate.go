package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// simulatePolicy is the policy name of a simulation's buckets: one limit,
// one quota.
const simulatePolicy = "simulate"

// simulate replays a trace read from stdin and prints one decision a line,
// then a summary per key.
func simulate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	limitText := fs.String("limit", "", `the limit to try, "capacity tokens/period" (for example "100 10/s")`)
	quiet := fs.Bool("summary", false, "print only the per-key summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("simulate takes no arguments, got %q", fs.Args())
	}
	limit, err := sluice.ParseLimit(*limitText)
	if err != nil {
		return fmt.Errorf("-limit: %w", err)
	}

	start := time.Unix(0, 0)
	now := start
	store, err := memstore.New(memstore.Options{Now: func() time.Time { return now }, SweepInterval: -1})
	if err != nil {
		return err
	}
	defer store.Close()

	type tally struct{ allowed, denied, errors, cost int64 }
	tallies := map[string]*tally{}
	var order []string

	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	if !*quiet {
		fmt.Fprintln(w, "offset\tkey\tcost\tallowed\tremaining\tretry_after\treset_after\t")
	}
	sc := bufio.NewScanner(stdin)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		offset, key, cost, err := parseTraceLine(text)
		if err != nil {
			return fmt.Errorf("trace line %d: %w", line, err)
		}
		now = start.Add(offset)
		d, err := store.Take(ctx, sluice.Request{Policy: simulatePolicy, Key: key, Cost: cost, Limit: limit})
		t := tallies[key]
		if t == nil {
			t = &tally{}
			tallies[key] = t
			order = append(order, key)
		}
		if err != nil {
			// A bad request (cost above capacity, bad key) is reported
			// where it occurs, as the limiter would return it.
			t.errors++
			if !*quiet {
				fmt.Fprintf(w, "%v\t%s\t%d\terror\t-\t-\t-\t  %v\n", offset, key, cost, err)
			}
			continue
		}
		if d.Allowed {
			t.allowed++
			t.cost += cost
		} else {
			t.denied++
		}
		if !*quiet {
			fmt.Fprintf(w, "%v\t%s\t%d\t%t\t%d\t%s\t%s\t\n", offset, key, cost, d.Allowed, d.Remaining, formatWait(d.RetryAfter), formatWait(d.ResetAfter))
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the trace: %w", err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nlimit %v\n", limit)
	w = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "key\tallowed\tdenied\terrors\ttokens_taken\t")
	for _, k := range order {
		t := tallies[k]
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t\n", k, t.allowed, t.denied, t.errors, t.cost)
	}
	return w.Flush()
}

// parseTraceLine reads "offset key [cost]".
func parseTraceLine(text string) (offset time.Duration, key string, cost int64, err error) {
	f := strings.Fields(text)
	if len(f) < 2 || len(f) > 3 {
		return 0, "", 0, fmt.Errorf("%q is not \"offset key [cost]\"", text)
	}
	offset, err = time.ParseDuration(f[0])
	if err != nil {
		return 0, "", 0, fmt.Errorf("offset %q is not a duration such as 150ms", f[0])
	}
	cost = 1
	if len(f) == 3 {
		cost, err = strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return 0, "", 0, fmt.Errorf("cost %q is not a whole number", f[2])
		}
	}
	return offset, f[1], cost, nil
}

func formatWait(d time.Duration) string {
	if d == sluice.Never {
		return "never"
	}
	return d.String()
}
