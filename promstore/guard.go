package promstore

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/guard"
)

var breakerStates = []guard.BreakerState{guard.BreakerClosed, guard.BreakerOpen, guard.BreakerHalfOpen}

// GuardHooks registers the metrics of a guard.Store with reg and returns
// the hooks that record them; pass them as guard.Options.Hooks to one
// guard:
//
//   - <ns>_store_duration_seconds{op}: histogram of the time each call
//     to the wrapped store took, failed calls included; op is "take",
//     "peek", "take_all", "drain", "refund" or "reset" (guard.Op).
//   - <ns>_store_errors_total{op, kind}: counter of store calls that
//     ended in an error, by Kind: failures ("timeout", "unavailable",
//     "script", "server", "other"), the errors a store answers with
//     ("invalid", "refused", "misconfigured"), and calls whose caller gave
//     up first ("canceled", "timeout").
//   - <ns>_degraded_total{failure_mode, reason}: counter of decisions made
//     by the failure mode ("local", "closed", "open"), by reason:
//     "breaker_open", "stalled", or the Kind of the store failure. A
//     multi-take counts once. A Refund or Reset the store did not make is
//     not a decision and is not counted here: it is an error, which
//     promstore.New counts in errors_total.
//   - <ns>_breaker_state{state}: gauge, 1 for the breaker's current state
//     ("closed", "open", "half-open"), 0 for the others.
//   - <ns>_breaker_transitions_total{to}: counter of the breaker's
//     changes, by the state entered.
//
// The state gauge starts at closed, as a new guard does. To also log the
// cause of each degraded decision, call the returned Degraded hook from
// your own. It returns an error, and registers nothing, if reg is nil or
// an option is out of range (errors wrapping sluice.ErrInvalidOption), or
// if reg refuses a collector.
func GuardHooks(reg prometheus.Registerer, o Options) (guard.Hooks, error) {
	if err := o.check(); err != nil {
		return guard.Hooks{}, err
	}
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.Namespace, Name: "store_duration_seconds", ConstLabels: o.ConstLabels,
		Help:    "Time each call to the guarded store took, failed calls included, in seconds.",
		Buckets: o.DurationBuckets,
	}, []string{"op"})
	storeErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "store_errors_total", ConstLabels: o.ConstLabels,
		Help: "Calls to the guarded store that ended in an error, by operation and kind (timeout, unavailable, script, server, other; invalid, refused, misconfigured; canceled).",
	}, []string{"op", "kind"})
	degraded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "degraded_total", ConstLabels: o.ConstLabels,
		Help: "Decisions made by the failure mode instead of the store, by failure mode and reason (breaker_open, stalled or the kind of store error).",
	}, []string{"failure_mode", "reason"})
	state := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: o.Namespace, Name: "breaker_state", ConstLabels: o.ConstLabels,
		Help: "1 for the circuit breaker's current state (closed, open, half-open), 0 for the others.",
	}, []string{"state"})
	transitions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.Namespace, Name: "breaker_transitions_total", ConstLabels: o.ConstLabels,
		Help: "Changes of the circuit breaker's state, by the state entered.",
	}, []string{"to"})
	if err := register(reg, duration, storeErrors, degraded, state, transitions); err != nil {
		return guard.Hooks{}, err
	}
	var durations [len(ops)]prometheus.Observer
	for i, op := range ops {
		durations[i] = duration.WithLabelValues(op.String())
		for _, k := range []string{KindTimeout, KindUnavailable, KindScript, KindServer, KindOther} {
			storeErrors.WithLabelValues(op.String(), k)
		}
	}
	var (
		stateGauges [3]prometheus.Gauge
		entered     [3]prometheus.Counter
	)
	for _, st := range breakerStates {
		stateGauges[st] = state.WithLabelValues(st.String())
		entered[st] = transitions.WithLabelValues(st.String())
	}
	stateGauges[guard.BreakerClosed].Set(1)
	return guard.Hooks{
		StoreCall: func(_ context.Context, c guard.Call) {
			if int(c.Op) < len(durations) {
				durations[c.Op].Observe(c.Took.Seconds())
			} else {
				duration.WithLabelValues(c.Op.String()).Observe(c.Took.Seconds())
			}
			if c.Err != nil {
				storeErrors.WithLabelValues(c.Op.String(), o.kind(c.Err)).Inc()
			}
		},
		Degraded: func(_ context.Context, d guard.Degradation) {
			degraded.WithLabelValues(d.FailureMode.String(), o.kind(d.Cause)).Inc()
		},
		BreakerChange: func(from, to guard.BreakerState) {
			stateGauges[from].Set(0)
			stateGauges[to].Set(1)
			entered[to].Inc()
		},
	}, nil
}
