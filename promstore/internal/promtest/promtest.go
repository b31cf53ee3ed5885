// Package promtest reads metrics back from a registry in the tests of
// promstore and its subpackages.
package promtest

import (
	"testing"

	"github.com/sluicehq/sluice"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the counter or gauge name{labels} in reg, or
// the sample count of a histogram; -1 if there is no such series. Labels
// not in labels may have any value; the first matching series is read.
func Value(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// Operations runs a multi-take, a drain, a refund and a reset through s,
// a promstore registered on reg in front of a real store with limit l
// (capacity 10, refilling slowly), and checks each was counted.
func Operations(t testing.TB, s sluice.Operator, reg prometheus.Gatherer, limit sluice.Limit) {
	t.Helper()
	ctx := t.Context()
	r := sluice.Request{Policy: "p", Key: "k", Cost: 4, Limit: limit}
	q := sluice.Request{Policy: "q", Key: "k", Cost: 1, Limit: limit}
	if md, err := s.TakeAll(ctx, []sluice.Request{r, q}); err != nil || !md.Allowed {
		t.Fatalf("TakeAll = %+v, %v; want allowed", md, err)
	}
	r.Cost = 8
	if d, err := s.Drain(ctx, r); err != nil || d.Taken != 6 {
		t.Fatalf("Drain(8) of 6 = %+v, %v; want 6 taken", d, err)
	}
	r.Cost = 3
	if d, err := s.Refund(ctx, r); err != nil || d.Taken != -3 {
		t.Fatalf("Refund(3) = %+v, %v; want 3 given back", d, err)
	}
	if err := s.Reset(ctx, "q", "k"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sluice_decisions_total", map[string]string{"policy": "p", "op": "take_all", "result": "allowed"}, 1},
		{"sluice_decisions_total", map[string]string{"policy": "q", "op": "take_all", "result": "allowed"}, 1},
		{"sluice_take_all_decisions_total", map[string]string{"result": "allowed"}, 1},
		{"sluice_decisions_total", map[string]string{"policy": "p", "op": "drain", "result": "denied"}, 1},
		{"sluice_drained_tokens_total", map[string]string{"policy": "p"}, 6},
		{"sluice_refunded_tokens_total", map[string]string{"policy": "p"}, 3},
		{"sluice_decisions_total", map[string]string{"policy": "q", "op": "reset", "result": "allowed"}, 1},
	} {
		if got := Value(t, reg, tt.name, tt.labels); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
}
