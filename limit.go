package sluice

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// Bounds on a Limit. Within them every decision is computed exactly with
// 128-bit integer intermediates; outside them a limit is ErrInvalidLimit.
const (
	// MaxCapacity is the largest capacity: 2^40 tokens.
	MaxCapacity = 1 << 40
	// MaxTokens is the largest number of tokens a Rate may add per period: 2^40.
	MaxTokens = 1 << 40
	// MaxPeriod is the longest refill period: 366 days.
	MaxPeriod = 366 * 24 * time.Hour
)

// Rate is a refill rate: Tokens whole tokens are added every Period. It is
// an exact rational number, never a float: Per(100, time.Minute) is 100/1m,
// not 1.6667/s. Tokens == 0 means the bucket never refills. The zero value
// is not a valid Rate (Period must be positive).
type Rate struct {
	Tokens int64
	Period time.Duration
}

// PerSecond returns a Rate of n tokens every second.
func PerSecond(n int64) Rate { return Rate{Tokens: n, Period: time.Second} }

// Per returns a Rate of n tokens every d.
func Per(n int64, d time.Duration) Rate { return Rate{Tokens: n, Period: d} }

// Every returns a Rate of one token every d.
func Every(d time.Duration) Rate { return Rate{Tokens: 1, Period: d} }

// String formats r as "tokens/period", for example "10/s", "5/m", "3/1.5s" or
// "7/2d". ParseLimit reads this form back.
func (r Rate) String() string {
	return strconv.FormatInt(r.Tokens, 10) + "/" + formatPeriod(r.Period)
}

// Limit is the shape of one bucket: at most Capacity tokens (the largest
// burst), refilled at Rate. A bucket seen for the first time is full.
// The zero value is not a valid Limit.
type Limit struct {
	Capacity int64
	Rate     Rate
}

// Validate reports whether l is within the bounds every store computes
// exactly: 1 <= Capacity <= MaxCapacity, 0 <= Rate.Tokens <= MaxTokens and
// 1ns <= Rate.Period <= MaxPeriod. The error wraps ErrInvalidLimit and names
// the value and the allowed range.
func (l Limit) Validate() error {
	switch {
	case l.Capacity < 1 || l.Capacity > MaxCapacity:
		return fmt.Errorf("%w: capacity %d is outside [1, %d]", ErrInvalidLimit, l.Capacity, int64(MaxCapacity))
	case l.Rate.Tokens < 0 || l.Rate.Tokens > MaxTokens:
		return fmt.Errorf("%w: rate tokens %d is outside [0, %d]", ErrInvalidLimit, l.Rate.Tokens, int64(MaxTokens))
	case l.Rate.Period < 1 || l.Rate.Period > MaxPeriod:
		return fmt.Errorf("%w: rate period %d ns is outside [1ns, %v (366 days)]", ErrInvalidLimit, int64(l.Rate.Period), MaxPeriod)
	}
	return nil
}

// String formats l as "capacity tokens/period", for example "100 10/s".
// ParseLimit(l.String()) returns l.
func (l Limit) String() string {
	return strconv.FormatInt(l.Capacity, 10) + " " + l.Rate.String()
}

// ParseLimit parses the short text form of a Limit: a capacity, white space,
// and a rate "tokens/period". The period is a unit (ns, us or µs, ms, s, m, h,
// d meaning one of it), a whole number of days ("2d"), or a Go duration
// ("1500ms", "1h30m"). Examples: "100 10/s" (burst 100, 10 tokens a second),
// "5 1/m", "1000 0/s" (never refills). The result is validated; errors wrap
// ErrInvalidLimit.
func ParseLimit(s string) (Limit, error) {
	fields := strings.Fields(s)
	if len(fields) != 2 {
		return Limit{}, fmt.Errorf("%w: %q is not of the form \"capacity tokens/period\" (for example \"100 10/s\")", ErrInvalidLimit, s)
	}
	capacity, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return Limit{}, fmt.Errorf("%w: capacity %q is not a whole number", ErrInvalidLimit, fields[0])
	}
	tokensText, periodText, ok := strings.Cut(fields[1], "/")
	if !ok {
		return Limit{}, fmt.Errorf("%w: rate %q is not of the form \"tokens/period\" (for example \"10/s\")", ErrInvalidLimit, fields[1])
	}
	tokens, err := strconv.ParseInt(tokensText, 10, 64)
	if err != nil {
		return Limit{}, fmt.Errorf("%w: rate tokens %q is not a whole number", ErrInvalidLimit, tokensText)
	}
	period, err := parsePeriod(periodText)
	if err != nil {
		return Limit{}, err
	}
	l := Limit{Capacity: capacity, Rate: Rate{Tokens: tokens, Period: period}}
	if err := l.Validate(); err != nil {
		return Limit{}, err
	}
	return l, nil
}

const day = 24 * time.Hour

var periodUnits = map[string]time.Duration{
	"ns": time.Nanosecond,
	"us": time.Microsecond,
	"µs": time.Microsecond, // micro sign U+00B5
	"μs": time.Microsecond, // Greek mu U+03BC
	"ms": time.Millisecond,
	"s":  time.Second,
	"m":  time.Minute,
	"h":  time.Hour,
	"d":  day,
}

func parsePeriod(s string) (time.Duration, error) {
	if d, ok := periodUnits[s]; ok {
		return d, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok && days != "" && strings.Trim(days, "0123456789") == "" {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 1 || n > int64(MaxPeriod/day) {
			return 0, fmt.Errorf("%w: period %q is not a whole number of days in [1, %d]", ErrInvalidLimit, s, int64(MaxPeriod/day))
		}
		return time.Duration(n) * day, nil
	}
	ns, ok := durationNanos(s)
	if !ok {
		return 0, fmt.Errorf("%w: period %q is not a unit (ns, us, ms, s, m, h, d), a whole number of days such as 2d, or a duration such as 1500ms", ErrInvalidLimit, s)
	}
	if !ns.IsInt() {
		return 0, fmt.Errorf("%w: period %q is not a whole number of nanoseconds", ErrInvalidLimit, s)
	}
	if ns.Cmp(big.NewRat(1, 1)) < 0 || ns.Cmp(new(big.Rat).SetInt64(int64(MaxPeriod))) > 0 {
		return 0, fmt.Errorf("%w: period %q is outside [1ns, 366d]", ErrInvalidLimit, s)
	}
	return time.Duration(ns.Num().Int64()), nil
}

// durationUnits are the units of a Go duration, in nanoseconds.
var durationUnits = map[string]int64{
	"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6,
	"s": 1e9, "m": 60e9, "h": 3600e9,
}

// durationNanos reads a Go duration such as "1h30m" or "1.5s" exactly, as
// a number of nanoseconds that may have a fraction (time.ParseDuration
// drops fractions of a nanosecond silently). It accepts no sign: a period
// is positive.
func durationNanos(s string) (*big.Rat, bool) {
	total := new(big.Rat)
	if s == "" {
		return nil, false
	}
	for s != "" {
		i := 0
		for i < len(s) && (s[i] == '.' || s[i] >= '0' && s[i] <= '9') {
			i++
		}
		number := s[:i]
		if number == "" || number == "." || strings.Count(number, ".") > 1 {
			return nil, false
		}
		s = s[i:]
		j := 0
		for j < len(s) && s[j] != '.' && (s[j] < '0' || s[j] > '9') {
			j++
		}
		unit, ok := durationUnits[s[:j]]
		if !ok {
			return nil, false
		}
		s = s[j:]
		v, ok := new(big.Rat).SetString(number)
		if !ok {
			return nil, false
		}
		total.Add(total, v.Mul(v, new(big.Rat).SetInt64(unit)))
		if total.Cmp(new(big.Rat).SetInt64(int64(MaxPeriod))) > 0 {
			return total, true // out of range; the caller says so
		}
	}
	return total, true
}

func formatPeriod(d time.Duration) string {
	switch d {
	case time.Nanosecond:
		return "ns"
	case time.Microsecond:
		return "us"
	case time.Millisecond:
		return "ms"
	case time.Second:
		return "s"
	case time.Minute:
		return "m"
	case time.Hour:
		return "h"
	case day:
		return "d"
	}
	if d > 0 && d%day == 0 && d/day <= MaxPeriod/day {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}
