package sluice_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

const day = 24 * time.Hour

func limit(capacity, tokens int64, period time.Duration) sluice.Limit {
	return sluice.Limit{Capacity: capacity, Rate: sluice.Rate{Tokens: tokens, Period: period}}
}

func TestLimitValidate(t *testing.T) {
	tests := []struct {
		name string
		l    sluice.Limit
		bad  string // a fragment the error must contain; "" means valid
	}{
		{"smallest", limit(1, 0, time.Nanosecond), ""},
		{"largest", limit(sluice.MaxCapacity, sluice.MaxTokens, sluice.MaxPeriod), ""},
		{"typical", limit(100, 10, time.Second), ""},
		{"366 days", limit(1, 1, 366*day), ""},
		{"capacity 0", limit(0, 1, time.Second), "capacity 0 "},
		{"capacity -1", limit(-1, 1, time.Second), "capacity -1 "},
		{"capacity 2^40+1", limit(sluice.MaxCapacity+1, 1, time.Second), "capacity 1099511627777 "},
		{"capacity max int64", limit(1<<63-1, 1, time.Second), "capacity 9223372036854775807 "},
		{"tokens -1", limit(1, -1, time.Second), "rate tokens -1 "},
		{"tokens 2^40+1", limit(1, sluice.MaxTokens+1, time.Second), "rate tokens 1099511627777 "},
		{"period 0", limit(1, 1, 0), "rate period 0 ns"},
		{"period -1ns", limit(1, 1, -1), "rate period -1 ns"},
		{"period 366 days + 1ns", limit(1, 1, sluice.MaxPeriod+1), "rate period 31622400000000001 ns"},
		{"zero value", sluice.Limit{}, "capacity 0 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.Validate()
			switch {
			case tt.bad == "" && err != nil:
				t.Fatalf("%#v.Validate() = %v, want nil", tt.l, err)
			case tt.bad == "":
			case !errors.Is(err, sluice.ErrInvalidLimit):
				t.Fatalf("%#v.Validate() = %v, want an error wrapping ErrInvalidLimit", tt.l, err)
			case !strings.Contains(err.Error(), tt.bad):
				t.Fatalf("%#v.Validate() = %q, want it to name the value (%q)", tt.l, err, tt.bad)
			}
		})
	}
}

func TestRequestValidate(t *testing.T) {
	l := limit(10, 1, time.Second)
	tests := []struct {
		name string
		r    sluice.Request
		want error
	}{
		{"empty policy", sluice.Request{Key: "k", Cost: 1, Limit: l}, sluice.ErrInvalidPolicy},
		{"longest policy", sluice.Request{Policy: strings.Repeat("p", 64), Key: "k", Cost: 1, Limit: l}, nil},
		{"65-byte policy", sluice.Request{Policy: strings.Repeat("p", 65), Key: "k", Cost: 1, Limit: l}, sluice.ErrInvalidPolicy},
		{"policy with a space", sluice.Request{Policy: "a b", Key: "k", Cost: 1, Limit: l}, sluice.ErrInvalidPolicy},
		{"policy with a control byte", sluice.Request{Policy: "a\x00", Key: "k", Cost: 1, Limit: l}, sluice.ErrInvalidPolicy},
		{"policy with a non-ASCII byte", sluice.Request{Policy: "é", Key: "k", Cost: 1, Limit: l}, sluice.ErrInvalidPolicy},
		{"policy of punctuation", sluice.Request{Policy: "api/v1:login.2fa-_~", Key: "k", Cost: 1, Limit: l}, nil},
		{"valid", sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: l}, nil},
		{"longest key, whole capacity, longest ID", sluice.Request{Policy: "p", Key: strings.Repeat("k", 512), Cost: 10, Limit: l, RequestID: strings.Repeat("r", 512)}, nil},
		{"any bytes", sluice.Request{Policy: "p", Key: "\x00\xff", Cost: 1, Limit: l, RequestID: "\x00"}, nil},
		{"empty key", sluice.Request{Policy: "p", Key: "", Cost: 1, Limit: l}, sluice.ErrInvalidKey},
		{"513-byte key", sluice.Request{Policy: "p", Key: strings.Repeat("k", 513), Cost: 1, Limit: l}, sluice.ErrInvalidKey},
		{"cost 0", sluice.Request{Policy: "p", Key: "k", Cost: 0, Limit: l}, sluice.ErrInvalidCost},
		{"cost -1", sluice.Request{Policy: "p", Key: "k", Cost: -1, Limit: l}, sluice.ErrInvalidCost},
		{"cost above capacity", sluice.Request{Policy: "p", Key: "k", Cost: 11, Limit: l}, sluice.ErrInvalidCost},
		{"bad limit", sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: limit(0, 1, time.Second)}, sluice.ErrInvalidLimit},
		{"513-byte request ID", sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: l, RequestID: strings.Repeat("r", 513)}, sluice.ErrInvalidRequestID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			if tt.want == nil && err != nil || !errors.Is(err, tt.want) {
				t.Fatalf("Validate() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestLimitString(t *testing.T) {
	tests := []struct {
		l    sluice.Limit
		want string
	}{
		{limit(100, 10, time.Second), "100 10/s"},
		{limit(5, 1, time.Minute), "5 1/m"},
		{limit(3, 3, 1500*time.Millisecond), "3 3/1.5s"},
		{limit(7, 7, 2*day), "7 7/2d"},
		{limit(1000, 0, time.Second), "1000 0/s"},
		{limit(1, 1, time.Nanosecond), "1 1/ns"},
		{limit(1, 1, time.Microsecond), "1 1/us"},
		{limit(1, 1, time.Millisecond), "1 1/ms"},
		{limit(1, 1, time.Hour), "1 1/h"},
		{limit(1, 1, day), "1 1/d"},
		{limit(1, 1, 366*day), "1 1/366d"},
		{limit(1, 1, 25*time.Hour), "1 1/25h0m0s"},
		{limit(1, 1, 90*time.Minute), "1 1/1h30m0s"},
		{limit(1, 1, 1500*time.Microsecond), "1 1/1.5ms"},
		{limit(1, 1, 1500*time.Nanosecond), "1 1/1.5µs"},
		{limit(1, 1, 1), "1 1/ns"},
		{limit(sluice.MaxCapacity, sluice.MaxTokens, sluice.MaxPeriod), "1099511627776 1099511627776/366d"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.l, got, tt.want)
		}
	}
}

func TestParseLimit(t *testing.T) {
	tests := []struct {
		in   string
		want sluice.Limit
	}{
		{"100 10/s", limit(100, 10, time.Second)},
		{"1 1/ns", limit(1, 1, time.Nanosecond)},
		{"1 1/us", limit(1, 1, time.Microsecond)},
		{"1 1/µs", limit(1, 1, time.Microsecond)},  // U+00B5 micro sign
		{"1 1/μs", limit(1, 1, time.Microsecond)},  // U+03BC Greek mu
		{"1 1/1μs", limit(1, 1, time.Microsecond)}, // U+03BC Greek mu, as a Go duration
		{"1 1/ms", limit(1, 1, time.Millisecond)},
		{"5 1/m", limit(5, 1, time.Minute)},
		{"1 1/h", limit(1, 1, time.Hour)},
		{"1 1/d", limit(1, 1, day)},
		{"7 7/2d", limit(7, 7, 2*day)},
		{"1 1/366d", limit(1, 1, 366*day)},
		{"3 3/1500ms", limit(3, 3, 1500*time.Millisecond)},
		{"3 3/1.5s", limit(3, 3, 1500*time.Millisecond)},
		{"1 1/1h30m", limit(1, 1, 90*time.Minute)},
		{"1000 0/s", limit(1000, 0, time.Second)},
		{"1099511627776 1099511627776/366d", limit(sluice.MaxCapacity, sluice.MaxTokens, sluice.MaxPeriod)},
		{"  100\t10/s\n", limit(100, 10, time.Second)},
		{"+100 +10/s", limit(100, 10, time.Second)},
		{"010 010/010s", limit(10, 10, 10*time.Second)},
		{"1 1/8784h", limit(1, 1, sluice.MaxPeriod)},
	}
	for _, tt := range tests {
		got, err := sluice.ParseLimit(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseLimit(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseLimitErrors(t *testing.T) {
	tests := []struct {
		in   string
		name string // a fragment the error must contain
	}{
		{"", `""`},
		{"100", `"100"`},
		{"100 10/s extra", `"100 10/s extra"`},
		{"100 10", `rate "10"`},
		{"100 10/", `period ""`},
		{"100 /s", `rate tokens ""`},
		{"x 10/s", `capacity "x"`},
		{"1e3 10/s", `capacity "1e3"`},
		{"100 1.5/s", `rate tokens "1.5"`},
		{"100 10/x", `period "x"`},
		{"100 10/sec", `period "sec"`},
		{"100 10/0d", `period "0d"`},
		{"100 10/367d", `period "367d"`},
		{"100 10/-1d", `period "-1d"`},
		{"100 10/1.5d", `period "1.5d"`},
		{"100 10/1d12h", `period "1d12h"`},
		{"100 10/S", `period "S"`},
		{"100 10/ s", `"100 10/ s"`},
		{"100 10//s", `period "/s"`},
		{"0 10/s", "capacity 0 "},
		{"-1 10/s", "capacity -1 "},
		{"1099511627777 1/s", "capacity 1099511627777 "},
		{"99999999999999999999 1/s", `capacity "99999999999999999999"`},
		{"100 -1/s", "rate tokens -1 "},
		{"100 1099511627777/s", "rate tokens 1099511627777 "},
		// The period is echoed as typed, not as a number of nanoseconds.
		{"10 5/0s", `period "0s" is outside [1ns, 366d]`},
		{"100 10/-1s", `period "-1s"`},
		{"100 10/8785h", `period "8785h" is outside [1ns, 366d]`},
		{"100 10/3000000h", `period "3000000h"`}, // overflows a time.Duration
		// A word ending in d is not a number of days.
		{"100 10/second", `period "second" is not a unit`},
		{"100 10/1.5second", `period "1.5second" is not a unit`},
		// Fractions of a nanosecond are refused, not rounded to 0 or 1ns.
		{"10 5/0.5ns", `period "0.5ns" is not a whole number of nanoseconds`},
		{"10 5/1.5ns", `period "1.5ns" is not a whole number of nanoseconds`},
		{"10 5/1.0000000001s", `period "1.0000000001s" is not a whole number of nanoseconds`},
		{"10 5/+1s", `period "+1s"`},
		{"10 5/1..5s", `period "1..5s"`},
		{"10 5/.s", `period ".s"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := sluice.ParseLimit(tt.in)
			if !errors.Is(err, sluice.ErrInvalidLimit) {
				t.Fatalf("ParseLimit(%q) = %v, %v; want an error wrapping ErrInvalidLimit", tt.in, got, err)
			}
			if got != (sluice.Limit{}) {
				t.Errorf("ParseLimit(%q) = %v with an error, want the zero Limit", tt.in, got)
			}
			if !strings.Contains(err.Error(), tt.name) {
				t.Errorf("ParseLimit(%q) error %q does not name the value (%q)", tt.in, err, tt.name)
			}
		})
	}
}

// TestParseLimitRoundTrip checks ParseLimit(l.String()) == l on the edges
// and on random valid limits.
func TestParseLimitRoundTrip(t *testing.T) {
	periods := []time.Duration{
		1, 999, time.Microsecond, 1001, time.Millisecond, time.Second, 1500 * time.Millisecond,
		time.Minute, 61 * time.Second, time.Hour, 90 * time.Minute, day, day + 1, 2 * day, 365 * day,
		sluice.MaxPeriod - 1, sluice.MaxPeriod,
	}
	var limits []sluice.Limit
	for _, p := range periods {
		limits = append(limits, limit(1, 0, p), limit(sluice.MaxCapacity, sluice.MaxTokens, p))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		p := time.Duration(1 + rng.Int64N(int64(sluice.MaxPeriod)))
		switch rng.IntN(4) {
		case 0:
			p = p / time.Second * time.Second
		case 1:
			p = p / day * day
		case 2:
			p = p % time.Second
		}
		limits = append(limits, limit(1+rng.Int64N(sluice.MaxCapacity), rng.Int64N(sluice.MaxTokens+1), max(p, 1)))
	}
	for _, l := range limits {
		s := l.String()
		got, err := sluice.ParseLimit(s)
		if err != nil || got != l {
			t.Fatalf("ParseLimit(%q) = %v, %v; want %#v", s, got, err, l)
		}
	}
}

func TestRateConstructors(t *testing.T) {
	tests := []struct {
		got, want sluice.Rate
	}{
		{sluice.PerSecond(10), sluice.Rate{Tokens: 10, Period: time.Second}},
		{sluice.Per(100, time.Minute), sluice.Rate{Tokens: 100, Period: time.Minute}},
		{sluice.Every(time.Hour), sluice.Rate{Tokens: 1, Period: time.Hour}},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %#v, want %#v", tt.got, tt.want)
		}
	}
}

func TestConversion(t *testing.T) {
	tests := []struct {
		c    sluice.Conversion
		want string
	}{
		{sluice.KeepTokens, "keep"},
		{sluice.ScaleTokens, "scale"},
		{sluice.ResetTokens, "reset"},
		{7, "Conversion(7)"},
	}
	for _, tt := range tests {
		if got := tt.c.String(); got != tt.want {
			t.Errorf("Conversion(%d).String() = %q, want %q", uint8(tt.c), got, tt.want)
		}
		back, err := sluice.ParseConversion(tt.want)
		if valid := tt.c.Validate() == nil; valid != (err == nil) || valid && back != tt.c {
			t.Errorf("ParseConversion(%q) = %v, %v; Validate() valid = %v", tt.want, back, err, valid)
		}
	}
	if _, err := sluice.ParseConversion("clamp"); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("ParseConversion(%q) error = %v, want %v", "clamp", err, sluice.ErrInvalidOption)
	}
}

func TestValidatePeek(t *testing.T) {
	l := limit(10, 1, time.Second)
	r := sluice.Request{Policy: "p", Key: "k", Cost: 10, Limit: l}
	if err := r.ValidatePeek(); err != nil {
		t.Fatalf("ValidatePeek(%+v) = %v, want nil", r, err)
	}
	r.RequestID = "id"
	if err := r.ValidatePeek(); !errors.Is(err, sluice.ErrInvalidRequestID) {
		t.Fatalf("ValidatePeek with a request ID = %v, want %v", err, sluice.ErrInvalidRequestID)
	}
	r.RequestID, r.Cost = "", 11
	if err := r.ValidatePeek(); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Fatalf("ValidatePeek with cost 11 = %v, want %v", err, sluice.ErrInvalidCost)
	}
}
