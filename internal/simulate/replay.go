package simulate

import (
	"sort"
	"time"
)

// Tally counts the decisions of a set of requests.
type Tally struct {
	// Requests is every request; Allowed + Denied + Errors.
	Requests int64
	// Allowed and Denied count the decided requests.
	Allowed, Denied int64
	// Errors counts the requests that could not be decided (a cost above
	// a capacity).
	Errors int64
	// Taken is the cost of the allowed requests.
	Taken int64
	// FirstDenied is the offset of the first denial, -1 if none.
	FirstDenied time.Duration
}

// DeniedShare returns the denied share of the decided requests, 0 to 1.
func (t Tally) DeniedShare() float64 {
	if t.Allowed+t.Denied == 0 {
		return 0
	}
	return float64(t.Denied) / float64(t.Allowed+t.Denied)
}

func (t *Tally) add(r Request, d Decision) {
	t.Requests++
	switch {
	case d.Err != nil:
		t.Errors++
	case d.Allowed:
		t.Allowed++
		t.Taken += r.Cost
	default:
		if t.Denied == 0 || r.At < t.FirstDenied {
			t.FirstDenied = r.At
		}
		t.Denied++
	}
}

// Run is one replay of a trace: the decision of every request, in the
// order of the trace, and their tallies.
type Run struct {
	// Kind is the Decider's Kind; Limits its Limits.
	Kind   string
	Limits []string
	// Decisions holds one Decision per request of the trace.
	Decisions []Decision
	// Total tallies every request; Keys each key's.
	Total Tally
	Keys  map[string]*Tally
}

// Replay decides every request of trace with d, in order.
func Replay(trace []Request, d Decider) *Run {
	run := &Run{Kind: d.Kind(), Limits: d.Limits(), Decisions: make([]Decision, len(trace)), Keys: map[string]*Tally{}}
	run.Total.FirstDenied = -1
	for i, r := range trace {
		dec := d.Decide(r)
		run.Decisions[i] = dec
		t := run.Keys[r.Key]
		if t == nil {
			t = &Tally{FirstDenied: -1}
			run.Keys[r.Key] = t
		}
		t.add(r, dec)
		run.Total.add(r, dec)
	}
	return run
}

// KeyTally is the tally of one key.
type KeyTally struct {
	Key string
	Tally
}

// Ranked returns every key's tally, the most denied first; keys denied as
// often by the most errors, then the most requests, then by key, so that
// the order depends on nothing but the decisions.
func (r *Run) Ranked() []KeyTally {
	out := make([]KeyTally, 0, len(r.Keys))
	for k, t := range r.Keys {
		out = append(out, KeyTally{k, *t})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case a.Denied != b.Denied:
			return a.Denied > b.Denied
		case a.Errors != b.Errors:
			return a.Errors > b.Errors
		case a.Requests != b.Requests:
			return a.Requests > b.Requests
		}
		return a.Key < b.Key
	})
	return out
}

// Worst returns the key the charts show by default: the most denied key,
// or the busiest if none was denied; "" for an empty run.
func (r *Run) Worst() string {
	ranked := r.Ranked()
	if len(ranked) == 0 {
		return ""
	}
	return ranked[0].Key
}

// Outcome names a decision: "allowed", "denied" or "error".
func Outcome(d Decision) string {
	switch {
	case d.Err != nil:
		return "error"
	case d.Allowed:
		return "allowed"
	}
	return "denied"
}

// Difference is a request two runs decided differently.
type Difference struct {
	// Index is the request's index in the trace.
	Index int
	Request
	// A and B are the outcomes (Outcome) of the two runs.
	A, B string
}

// Differences returns the requests whose outcome differs between a and
// b, replays of the same trace, in the order of the trace.
func Differences(trace []Request, a, b *Run) []Difference {
	var out []Difference
	for i := range trace {
		oa, ob := Outcome(a.Decisions[i]), Outcome(b.Decisions[i])
		if oa != ob {
			out = append(out, Difference{Index: i, Request: trace[i], A: oa, B: ob})
		}
	}
	return out
}

// KeyDifferences sums up the differences of one key.
type KeyDifferences struct {
	Key string
	// Count is the key's differences; AAllowedBDenied and ADeniedBAllowed
	// the two ways (a request that is an error in one run is neither).
	Count                            int
	AAllowedBDenied, ADeniedBAllowed int
	// First and Last are the offsets of the first and the last.
	First, Last time.Duration
}

// DifferencesByKey sums up diffs per key, the most first (then by key).
func DifferencesByKey(diffs []Difference) []KeyDifferences {
	byKey := map[string]*KeyDifferences{}
	var out []*KeyDifferences
	for _, d := range diffs {
		k := byKey[d.Key]
		if k == nil {
			k = &KeyDifferences{Key: d.Key, First: d.At, Last: d.At}
			byKey[d.Key] = k
			out = append(out, k)
		}
		k.Count++
		k.First, k.Last = min(k.First, d.At), max(k.Last, d.At)
		switch {
		case d.A == "allowed" && d.B == "denied":
			k.AAllowedBDenied++
		case d.A == "denied" && d.B == "allowed":
			k.ADeniedBAllowed++
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Key < out[j].Key
	})
	res := make([]KeyDifferences, len(out))
	for i, k := range out {
		res[i] = *k
	}
	return res
}
