package simulate

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Decision is what a Decider decided for one request.
type Decision struct {
	// Allowed reports whether the request was let through (and charged).
	Allowed bool
	// Err is set when the request could not be decided at all, as the
	// service would refuse it (a cost above a capacity); Allowed is then
	// false and the request counts as an error, not a denial.
	Err error
	// Denied is the index of the limit that decided a denial (among those
	// that were short, the one with the longest wait, as
	// sluice.MultiDecision.Combine picks it); -1 when allowed.
	Denied int
	// Short has bit i set when limit i could not cover the cost by itself.
	Short uint32
	// Remaining is the fewest whole tokens (a window: requests) left under
	// any of the limits after the decision.
	Remaining int64
	// RetryAfter is zero when allowed; when denied, the wait after which
	// the same request would be allowed if nothing else came, sluice.Never
	// if waiting cannot help.
	RetryAfter time.Duration
	// ResetAfter is the wait until every limit is back to its start: a
	// bucket full, a window over.
	ResetAfter time.Duration
}

// A Decider decides the requests of a trace one at a time, in the order
// of the trace. Each has its own state: a Decider is used for one replay.
type Decider interface {
	// Decide decides r, charging it if it is allowed.
	Decide(r Request) Decision
	// Limits returns the limits, one per part of a Decision.
	Limits() []string
	// Kind names the algorithm: "token bucket" or "fixed window".
	Kind() string
}

// Bucket decides as the token buckets of a sluice policy: one bucket per
// key and limit, all or nothing across the limits (sluice.Operator.TakeAll),
// with the exact arithmetic of package bucket on a clock of Tick, the
// store's time unit (1ns for the memory store, 1µs for Redis and
// PostgreSQL). A request's offset is the clock, rounded down to a tick.
type Bucket struct {
	limits []sluice.Limit
	plans  []bucket.Plan
	tick   time.Duration
	states map[string][]bucket.State
	parts  []sluice.Decision
}

// NewBucket returns a Bucket of limits, 1 to sluice.MaxParts, on a clock
// of tick (zero or less: 1ns). Errors wrap sluice.ErrInvalidLimit or
// sluice.ErrInvalidOption.
func NewBucket(limits []sluice.Limit, tick time.Duration) (*Bucket, error) {
	if len(limits) == 0 || len(limits) > sluice.MaxParts {
		return nil, fmt.Errorf("%w: %d limits; a policy decides 1 to %d together", sluice.ErrInvalidOption, len(limits), sluice.MaxParts)
	}
	if tick <= 0 {
		tick = time.Nanosecond
	}
	b := &Bucket{limits: append([]sluice.Limit(nil), limits...), tick: tick, states: map[string][]bucket.State{}, parts: make([]sluice.Decision, len(limits))}
	for _, l := range limits {
		p, err := bucket.NewPlan(l, tick)
		if err != nil {
			return nil, err
		}
		b.plans = append(b.plans, p)
	}
	return b, nil
}

// Kind returns "token bucket".
func (b *Bucket) Kind() string { return "token bucket" }

// Limits returns the limits as text, "capacity tokens/period".
func (b *Bucket) Limits() []string {
	out := make([]string, len(b.limits))
	for i, l := range b.limits {
		out[i] = l.String()
	}
	return out
}

// Decide takes r.Cost from the buckets of r.Key under every limit if each
// covers it, and from none otherwise. A cost above a capacity is an error,
// as the service answers it.
func (b *Bucket) Decide(r Request) Decision {
	for i, l := range b.limits {
		req := sluice.Request{Policy: "simulate", Key: r.Key, Cost: r.Cost, Limit: l}
		if err := req.Validate(); err != nil {
			if len(b.limits) > 1 {
				err = fmt.Errorf("limit %d (%v): %w", i, l, err)
			}
			return Decision{Err: err, Denied: -1}
		}
	}
	now := int64(r.At / b.tick)
	states, ok := b.states[r.Key]
	if !ok {
		states = make([]bucket.State, len(b.plans))
		for i := range b.plans {
			states[i] = b.plans[i].Full(now)
		}
		b.states[r.Key] = states
	}
	b.take(states, now, r.Cost)
	md := sluice.MultiDecision{Parts: b.parts}
	md.Combine()
	d := Decision{Allowed: md.Allowed, Denied: md.Denied, RetryAfter: md.RetryAfter, Remaining: math.MaxInt64}
	for i, p := range b.parts {
		if !p.Allowed {
			d.Short |= 1 << i
		}
		d.Remaining = min(d.Remaining, p.Remaining)
		d.ResetAfter = max(d.ResetAfter, p.ResetAfter)
	}
	return d
}

// take decides cost against states at tick now into b.parts, as
// Model.TakeAll does: every bucket is brought up to date, and each cost
// taken only if every bucket covers its own.
func (b *Bucket) take(states []bucket.State, now int64, cost int64) {
	if len(b.plans) == 1 {
		b.plans[0].Take(&states[0], now, cost, &b.parts[0])
		return
	}
	all := true
	for i := range b.plans {
		if b.plans[i].Refill(states[i], now).Tokens < cost {
			all = false
		}
	}
	for i := range b.plans {
		if all {
			b.plans[i].Take(&states[i], now, cost, &b.parts[i])
			continue
		}
		b.parts[i] = b.plans[i].Peek(states[i], now, cost)
		states[i] = b.plans[i].Refill(states[i], now)
	}
}

// Window is one fixed-window limit of envoyproxy/ratelimit: Requests per
// Unit, counted in windows of length Unit aligned to the Unix epoch.
type Window struct {
	// Requests is requests_per_unit: the most requests (hits) a window
	// allows. Zero denies every request.
	Requests int64
	// Unit is the length of a window.
	Unit time.Duration
}

// envoyUnits are the units of envoyproxy/ratelimit, by name.
var envoyUnits = []struct {
	name   string
	length time.Duration
}{
	{"second", time.Second},
	{"minute", time.Minute},
	{"hour", time.Hour},
	{"day", 24 * time.Hour},
	{"week", 7 * 24 * time.Hour},
	{"month", 30 * 24 * time.Hour},
	{"year", 365 * 24 * time.Hour},
}

// String formats w as "N/unit", with the unit's name when it is one of
// envoyproxy/ratelimit's ("100/minute"), else a duration ("100/90s").
func (w Window) String() string {
	for _, u := range envoyUnits {
		if u.length == w.Unit {
			return fmt.Sprintf("%d/%s", w.Requests, u.name)
		}
	}
	return fmt.Sprintf("%d/%v", w.Requests, w.Unit)
}

// ParseWindow reads "N/UNIT": N a whole number from 0 to 2^32-1 (the range
// of requests_per_unit), UNIT one of envoyproxy/ratelimit's units (second,
// minute, hour, day, week, month of 30 days, year of 365 days, in any
// case), a unit of a sluice limit (s, m, h, d) or a duration such as 90s.
// Errors wrap sluice.ErrInvalidLimit.
func ParseWindow(s string) (Window, error) {
	n, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Window{}, fmt.Errorf("%w: window %q is not \"requests/unit\" (for example \"100/minute\")", sluice.ErrInvalidLimit, s)
	}
	var w Window
	if _, err := fmt.Sscan(n, &w.Requests); err != nil || strings.Trim(n, "0123456789") != "" {
		return Window{}, fmt.Errorf("%w: window requests %q is not a whole number", sluice.ErrInvalidLimit, n)
	}
	if w.Requests > math.MaxUint32 {
		return Window{}, fmt.Errorf("%w: window requests %d is outside [0, %d]", sluice.ErrInvalidLimit, w.Requests, uint32(math.MaxUint32))
	}
	for _, u := range envoyUnits {
		if strings.EqualFold(unit, u.name) {
			w.Unit = u.length
			return w, nil
		}
	}
	// The period forms of a sluice limit: a unit, days, or a duration.
	l, err := sluice.ParseLimit("1 1/" + unit)
	if err != nil || strings.ContainsAny(unit, " \t") {
		return Window{}, fmt.Errorf("%w: window unit %q is not second, minute, hour, day, week, month or year, nor a duration such as 90s", sluice.ErrInvalidLimit, unit)
	}
	w.Unit = l.Rate.Period
	return w, nil
}

// WindowOf returns the window a token-bucket limit stands for: N per
// period when its capacity is N and it refills N per period, as
// envoyconf translates a rule; false otherwise.
func WindowOf(l sluice.Limit) (Window, bool) {
	if l.Capacity != l.Rate.Tokens {
		return Window{}, false
	}
	return Window{Requests: l.Capacity, Unit: l.Rate.Period}, true
}

// FixedWindow decides as envoyproxy/ratelimit does: a counter per key and
// window, the windows of each limit aligned to the Unix epoch, every
// request added to the counters of all the limits before they are checked
// (a denied request is counted too), and a request over the limit when a
// counter, with it added, exceeds Requests.
type FixedWindow struct {
	windows []Window
	start   int64 // Unix nanoseconds of offset 0
	counts  map[windowKey]int64
}

type windowKey struct {
	limit int
	key   string
	index int64
}

// NewFixedWindow returns a FixedWindow of windows, 1 to sluice.MaxParts,
// for a trace whose offset 0 is start: the windows are aligned to the
// Unix epoch, not to the start of the trace. Errors wrap
// sluice.ErrInvalidLimit or sluice.ErrInvalidOption.
func NewFixedWindow(windows []Window, start time.Time) (*FixedWindow, error) {
	if len(windows) == 0 || len(windows) > sluice.MaxParts {
		return nil, fmt.Errorf("%w: %d windows; give 1 to %d", sluice.ErrInvalidOption, len(windows), sluice.MaxParts)
	}
	for _, w := range windows {
		if w.Requests < 0 || w.Requests > math.MaxUint32 {
			return nil, fmt.Errorf("%w: window requests %d is outside [0, %d]", sluice.ErrInvalidLimit, w.Requests, uint32(math.MaxUint32))
		}
		if w.Unit < time.Second || w.Unit%time.Second != 0 {
			return nil, fmt.Errorf("%w: window unit %v is not a whole number of seconds, as envoyproxy/ratelimit counts", sluice.ErrInvalidLimit, w.Unit)
		}
	}
	if start.Year() < 1970 || start.Year() > 2200 {
		return nil, fmt.Errorf("%w: start %s is outside the years 1970 to 2200", sluice.ErrInvalidOption, start.UTC().Format(time.RFC3339))
	}
	return &FixedWindow{windows: append([]Window(nil), windows...), start: start.UnixNano(), counts: map[windowKey]int64{}}, nil
}

// Kind returns "fixed window".
func (f *FixedWindow) Kind() string { return "fixed window" }

// Limits returns the windows as text, "N/unit".
func (f *FixedWindow) Limits() []string {
	out := make([]string, len(f.windows))
	for i, w := range f.windows {
		out[i] = w.String()
	}
	return out
}

// Decide adds r.Cost to the counter of r.Key's current window of every
// limit, then allows r if no counter exceeds its limit.
func (f *FixedWindow) Decide(r Request) Decision {
	t := f.start + int64(r.At)
	d := Decision{Allowed: true, Denied: -1, Remaining: math.MaxInt64}
	for i, w := range f.windows {
		unit := int64(w.Unit)
		index := t / unit // t is not negative: the start is after 1970
		k := windowKey{i, r.Key, index}
		c := f.counts[k]
		if c <= math.MaxInt64-r.Cost {
			c += r.Cost
		} else {
			c = math.MaxInt64
		}
		f.counts[k] = c
		// The window's end is when this counter stops counting.
		reset := time.Duration((index+1)*unit - t)
		d.ResetAfter = max(d.ResetAfter, reset)
		d.Remaining = min(d.Remaining, max(0, w.Requests-c))
		if c > w.Requests {
			d.Short |= 1 << i
			wait := reset
			if r.Cost > w.Requests {
				wait = sluice.Never
			}
			if d.Allowed || wait > d.RetryAfter {
				d.Denied, d.RetryAfter = i, wait
			}
			d.Allowed = false
		}
	}
	return d
}
