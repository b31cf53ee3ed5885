package promstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/promstore"
)

// A guarded store with its metrics in the program's own registry: the
// guard's hooks record the breaker and the store calls, the wrapper the
// decisions.
func Example() {
	reg := prometheus.NewRegistry()
	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
	if err != nil {
		panic(err)
	}
	mem, err := memstore.New(memstore.Options{}) // stands for redisstore here
	if err != nil {
		panic(err)
	}
	defer mem.Close()
	g, err := guard.New(mem, guard.Options{FailureMode: guard.FailClosed, Hooks: hooks})
	if err != nil {
		panic(err)
	}
	store, err := promstore.New(g, reg, promstore.Options{})
	if err != nil {
		panic(err)
	}

	limit := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Minute)}
	for range 3 {
		store.Take(context.Background(), sluice.Request{Policy: "api", Key: "user-1", Cost: 1, Limit: limit})
	}
	printNonZero(reg, "sluice_decisions_total", "sluice_breaker_state", "sluice_remaining_ratio")
	// Output:
	// sluice_breaker_state{state="closed"} 1
	// sluice_decisions_total{op="take",policy="api",result="allowed"} 2
	// sluice_decisions_total{op="take",policy="api",result="denied"} 1
	// sluice_remaining_ratio count 3
}

// printNonZero prints the series of the named metrics whose value (or
// sample count) is not zero.
func printNonZero(reg *prometheus.Registry, names ...string) {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			switch {
			case m.GetHistogram() != nil:
				fmt.Printf("%s count %d\n", mf.GetName(), m.GetHistogram().GetSampleCount())
			case m.GetCounter().GetValue() != 0:
				fmt.Printf("%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue())
			case m.GetGauge().GetValue() != 0:
				fmt.Printf("%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), m.GetGauge().GetValue())
			}
		}
	}
}

// A multi-take counts once per bucket under its policy, by whether that
// bucket covered its cost, and once as a whole; drains count the tokens
// they took.
func Example_operations() {
	reg := prometheus.NewRegistry()
	now := time.Now()
	mem, err := memstore.New(memstore.Options{Now: func() time.Time { return now }}) // a clock that stands still
	if err != nil {
		panic(err)
	}
	defer mem.Close()
	store, err := promstore.New(mem, reg, promstore.Options{})
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	burst := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Second)}
	daily := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1000, 24*time.Hour)}
	for range 3 { // the third: the burst is short, the daily quota is not
		store.TakeAll(ctx, []sluice.Request{
			{Policy: "burst", Key: "user-1", Cost: 1, Limit: burst},
			{Policy: "daily", Key: "user-1", Cost: 1, Limit: daily},
		})
	}
	store.Drain(ctx, sluice.Request{Policy: "daily", Key: "user-1", Cost: 1500, Limit: daily}) // 998 were there
	printNonZero(reg, "sluice_decisions_total", "sluice_take_all_decisions_total", "sluice_drained_tokens_total")
	// Output:
	// sluice_decisions_total{op="drain",policy="daily",result="denied"} 1
	// sluice_decisions_total{op="take_all",policy="burst",result="allowed"} 2
	// sluice_decisions_total{op="take_all",policy="burst",result="denied"} 1
	// sluice_decisions_total{op="take_all",policy="daily",result="allowed"} 3
	// sluice_drained_tokens_total{policy="daily"} 998
	// sluice_take_all_decisions_total{result="allowed"} 2
	// sluice_take_all_decisions_total{result="denied"} 1
}
