package simulate

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Shapes of generated traffic, as a Source names them.
const (
	// Steady keys send at a constant mean rate, with Poisson arrivals.
	Steady = "steady"
	// Diurnal keys send with Poisson arrivals at a rate that follows the
	// day: Low times Rate at the start of each Period, Rate at its middle.
	Diurnal = "diurnal"
	// Burst keys are quiet, then send Size requests Spacing apart; the
	// bursts start at Poisson times, Every apart on average, over a
	// background of Rate (zero by default).
	Burst = "burst"
	// Abuser keys send at a fixed Rate, each request moved by up to
	// Jitter of the interval: a scraper or a retry loop.
	Abuser = "abuser"
)

// SourceFormat describes the text form of a Source, as ParseSource reads it.
const SourceFormat = `A traffic source is SHAPE[:PARAM=VALUE,...]:
  steady   keys sending at a mean rate, Poisson arrivals
           keys=100 rate=1/m
  diurnal  keys whose rate follows the day: low*rate at the start of each
           period, rate at its middle
           keys=100 rate=1/m period=24h low=0.2
  burst    keys sending bursts of size requests spacing apart, every
           apart on average, over a background rate
           keys=2 size=30 spacing=50ms every=2m rate=0/s
  abuser   keys sending at a fixed rate, each request moved by up to
           jitter of the interval: a scraper
           keys=1 rate=10/s jitter=0.5
  every shape also takes name=PREFIX (keys are PREFIX-1, PREFIX-2, ...;
  default user, visitor, burst, scraper), cost=1, and from=0s, to=END:
  when in the trace it sends
A rate is N/PERIOD: 0.5/s, 30/m, 1000/h, 5/10s; it is per key.`

// Source is one kind of generated traffic: Keys keys sending in one Shape.
// ParseSource reads its text form.
type Source struct {
	// Shape is Steady, Diurnal, Burst or Abuser.
	Shape string
	// Keys is the number of keys, 1 to 100,000, named Name-1, Name-2, ...
	Keys int
	// Name is the prefix of the keys' names.
	Name string
	// Rate is each key's requests per second: the mean of Steady, the peak
	// of Diurnal, the background of Burst, the fixed rate of Abuser.
	Rate float64
	// Cost is the cost of every request, 1 to sluice.MaxCapacity.
	Cost int64
	// From and To bound when the keys send; To 0 means the end of the
	// trace.
	From, To time.Duration
	// Period and Low shape Diurnal.
	Period time.Duration
	Low    float64
	// Size, Spacing and Every shape Burst.
	Size    int
	Spacing time.Duration
	Every   time.Duration
	// Jitter shapes Abuser: 0 to 1 of the interval.
	Jitter float64

	text string
}

// String returns the text the source was parsed from.
func (s Source) String() string { return s.text }

// Bounds on generated traffic.
const (
	// MaxKeys is the most keys of one Source.
	MaxKeys = 100_000
	// MaxRequests is the most requests Generate makes.
	MaxRequests = 10_000_000
	// MaxDuration is the longest generated trace: 31 days.
	MaxDuration = 31 * 24 * time.Hour
)

// ParseSource reads a source in the form of SourceFormat. Errors wrap
// sluice.ErrInvalidOption and name the bad parameter and its range.
func ParseSource(text string) (Source, error) {
	shape, params, _ := strings.Cut(strings.TrimSpace(text), ":")
	s := Source{Shape: shape, Cost: 1, text: strings.TrimSpace(text)}
	switch shape {
	case Steady:
		s.Keys, s.Name, s.Rate = 100, "user", 1.0/60
	case Diurnal:
		s.Keys, s.Name, s.Rate, s.Period, s.Low = 100, "visitor", 1.0/60, 24*time.Hour, 0.2
	case Burst:
		s.Keys, s.Name, s.Size, s.Spacing, s.Every = 2, "burst", 30, 50*time.Millisecond, 2*time.Minute
	case Abuser:
		s.Keys, s.Name, s.Rate, s.Jitter = 1, "scraper", 10, 0.5
	default:
		return Source{}, fmt.Errorf("%w: traffic shape %q is not steady, diurnal, burst or abuser", sluice.ErrInvalidOption, shape)
	}
	if params == "" {
		return s, nil
	}
	seen := map[string]bool{}
	for _, p := range strings.Split(params, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return Source{}, fmt.Errorf("%w: %s: parameter %q is not NAME=VALUE", sluice.ErrInvalidOption, shape, p)
		}
		if seen[name] {
			return Source{}, fmt.Errorf("%w: %s: parameter %s is given twice", sluice.ErrInvalidOption, shape, name)
		}
		seen[name] = true
		if err := s.set(name, value); err != nil {
			return Source{}, fmt.Errorf("%w: %s: %v", sluice.ErrInvalidOption, shape, err)
		}
	}
	if s.To != 0 && s.To <= s.From {
		return Source{}, fmt.Errorf("%w: %s: to=%v is not after from=%v", sluice.ErrInvalidOption, shape, s.To, s.From)
	}
	return s, nil
}

// params are the parameters of each shape beyond the common ones.
var params = map[string][]string{
	Steady:  {"keys", "rate"},
	Diurnal: {"keys", "rate", "period", "low"},
	Burst:   {"keys", "size", "spacing", "every", "rate"},
	Abuser:  {"keys", "rate", "jitter"},
}

func (s *Source) set(name, value string) error {
	known := name == "name" || name == "cost" || name == "from" || name == "to"
	for _, p := range params[s.Shape] {
		known = known || p == name
	}
	if !known {
		return fmt.Errorf("unknown parameter %q; it takes %s, name, cost, from and to", name, strings.Join(params[s.Shape], ", "))
	}
	var err error
	switch name {
	case "keys":
		var n int64
		n, err = intIn(name, value, 1, MaxKeys)
		s.Keys = int(n)
	case "size":
		var n int64
		n, err = intIn(name, value, 1, 100_000)
		s.Size = int(n)
	case "name":
		if value == "" || strings.ContainsAny(value, " \t#") || len(value) > 64 {
			return fmt.Errorf("name %q is not 1 to 64 bytes without spaces or #", value)
		}
		s.Name = value
	case "cost":
		s.Cost, err = intIn(name, value, 1, sluice.MaxCapacity)
	case "rate":
		s.Rate, err = parseRate(value)
	case "low":
		s.Low, err = floatIn(name, value, 0, 1)
	case "jitter":
		s.Jitter, err = floatIn(name, value, 0, 1)
	case "from":
		s.From, err = durationIn(name, value, 0, MaxDuration)
	case "to":
		s.To, err = durationIn(name, value, time.Millisecond, MaxDuration)
	case "period":
		s.Period, err = durationIn(name, value, time.Second, MaxDuration)
	case "spacing":
		s.Spacing, err = durationIn(name, value, time.Millisecond, time.Hour)
	case "every":
		s.Every, err = durationIn(name, value, time.Second, MaxDuration)
	}
	return err
}

func intIn(name, value string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%s is not a whole number in [%d, %d]", name, value, lo, hi)
	}
	return n, nil
}

func floatIn(name, value string, lo, hi float64) (float64, error) {
	f, err := strconv.ParseFloat(value, 64)
	if err != nil || !(f >= lo && f <= hi) {
		return 0, fmt.Errorf("%s=%s is not a number in [%g, %g]", name, value, lo, hi)
	}
	return f, nil
}

func durationIn(name, value string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err != nil || d < lo || d > hi {
		return 0, fmt.Errorf("%s=%s is not a duration in [%v, %v]", name, value, lo, hi)
	}
	return d, nil
}

// maxRate is the fastest rate of one key: a million requests a second.
const maxRate = 1e6

// parseRate reads "N/PERIOD" as requests per second.
func parseRate(value string) (float64, error) {
	n, period, ok := strings.Cut(value, "/")
	if !ok {
		return 0, fmt.Errorf("rate=%s is not N/PERIOD (for example 0.5/s or 30/m)", value)
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil || !(f >= 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("rate=%s: %q is not a number of requests of 0 or more", value, n)
	}
	l, err := sluice.ParseLimit("1 1/" + period)
	if err != nil || strings.ContainsAny(period, " \t") {
		return 0, fmt.Errorf("rate=%s: period %q is not a unit (s, m, h, d) or a duration such as 10s", value, period)
	}
	r := f / l.Rate.Period.Seconds()
	if r > maxRate {
		return 0, fmt.Errorf("rate=%s is %g requests a second per key, more than %g", value, r, float64(maxRate))
	}
	return r, nil
}

// Generate makes a trace of duration from sources, the same for the same
// sources, duration and seed: each key has its own random stream, derived
// from the seed, the source's place in the list and the key's number, so
// that adding a source changes no other's requests. Offsets are whole
// milliseconds, as a request log records them; the requests are sorted by
// offset, those of one offset in the order of the sources and keys. Errors
// wrap sluice.ErrInvalidOption.
func Generate(sources []Source, duration time.Duration, seed uint64) ([]Request, error) {
	if duration < time.Second || duration > MaxDuration {
		return nil, fmt.Errorf("%w: duration %v is outside [1s, %v]", sluice.ErrInvalidOption, duration, MaxDuration)
	}
	if len(sources) == 0 {
		return nil, fmt.Errorf("%w: no traffic source to generate", sluice.ErrInvalidOption)
	}
	// The expected count is checked first, so that a mistyped rate is
	// refused at once instead of after millions of requests.
	var expected float64
	for _, s := range sources {
		span := (min(cmp.Or(s.To, duration), duration) - s.From).Seconds()
		if span <= 0 {
			continue
		}
		perKey := s.Rate * span
		if s.Shape == Burst {
			perKey += float64(s.Size) * span / s.Every.Seconds()
		}
		expected += float64(s.Keys) * perKey
	}
	if expected > MaxRequests {
		return nil, fmt.Errorf("%w: the sources make about %.0f requests, more than %d; shorten the duration or lower the rates", sluice.ErrInvalidOption, expected, MaxRequests)
	}
	var out []Request
	for si, s := range sources {
		from, to := s.From, s.To
		if to == 0 || to > duration {
			to = duration
		}
		if from >= to {
			continue
		}
		width := len(strconv.Itoa(s.Keys))
		for k := 1; k <= s.Keys; k++ {
			g := &gen{src: rand.NewPCG(seed, uint64(si)<<32|uint64(k)), from: from, to: to}
			key := fmt.Sprintf("%s-%0*d", s.Name, width, k)
			emit := func(at time.Duration) bool {
				if len(out) >= MaxRequests {
					return false
				}
				out = append(out, Request{At: at, Key: key, Cost: s.Cost})
				return true
			}
			if !g.run(s, emit) {
				return nil, fmt.Errorf("%w: the sources make more than %d requests; shorten the duration or lower the rates", sluice.ErrInvalidOption, MaxRequests)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out, nil
}

// gen is the random stream of one key.
type gen struct {
	src      *rand.PCG
	from, to time.Duration
}

// uniform returns a number in [0, 1) from the top 53 bits of the stream,
// independent of math/rand's own float methods.
func (g *gen) uniform() float64 { return float64(g.src.Uint64()>>11) / (1 << 53) }

// exp returns an exponential wait of mean 1.
func (g *gen) exp() float64 { return -math.Log(1 - g.uniform()) }

// ms rounds seconds to whole milliseconds.
func ms(seconds float64) time.Duration {
	return time.Duration(math.Round(seconds*1e3)) * time.Millisecond
}

// run emits the requests of one key of s in time order; false if emit
// refused one.
func (g *gen) run(s Source, emit func(time.Duration) bool) bool {
	from, to := g.from.Seconds(), g.to.Seconds()
	switch s.Shape {
	case Steady:
		return g.poisson(s.Rate, from, to, func(float64) float64 { return 1 }, emit)
	case Diurnal:
		p := s.Period.Seconds()
		shape := func(t float64) float64 {
			return s.Low + (1-s.Low)*(1-math.Cos(2*math.Pi*t/p))/2
		}
		return g.poisson(s.Rate, from, to, shape, emit)
	case Burst:
		var times []time.Duration
		collect := func(at time.Duration) bool { times = append(times, at); return true }
		g.poisson(s.Rate, from, to, func(float64) float64 { return 1 }, collect)
		every := s.Every.Seconds()
		for t := from + every*g.exp(); t < to; t += every * g.exp() {
			for i := 0; i < s.Size; i++ {
				at := t + float64(i)*s.Spacing.Seconds()
				if at >= to {
					break
				}
				times = append(times, ms(at))
			}
		}
		sort.SliceStable(times, func(i, j int) bool { return times[i] < times[j] })
		for _, at := range times {
			if !emit(at) {
				return false
			}
		}
		return true
	case Abuser:
		if s.Rate <= 0 {
			return true
		}
		interval := 1 / s.Rate
		for n := 0; ; n++ {
			base := from + (float64(n)+0.5)*interval
			if base >= to {
				return true
			}
			at := base + (g.uniform()-0.5)*s.Jitter*interval
			if at < from || at >= to {
				continue
			}
			if !emit(ms(at)) {
				return false
			}
		}
	}
	return true
}

// poisson emits Poisson arrivals of rate peak*shape(t) per second between
// from and to, by thinning: candidates at rate peak, each kept with
// probability shape(t).
func (g *gen) poisson(peak, from, to float64, shape func(float64) float64, emit func(time.Duration) bool) bool {
	if peak <= 0 {
		return true
	}
	for t := from + g.exp()/peak; t < to; t += g.exp() / peak {
		keep := shape(t)
		if keep < 1 && g.uniform() >= keep {
			continue
		}
		at := ms(t)
		if at >= g.to {
			break
		}
		if !emit(at) {
			return false
		}
	}
	return true
}
