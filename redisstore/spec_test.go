package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestCheckLimit: the limits whose exact arithmetic exceeds Lua's exact
// integers are refused with sluice.ErrInvalidLimit naming the bound.
func TestCheckLimit(t *testing.T) {
	tests := []struct {
		l    sluice.Limit
		want string // in the error; "" for accepted
	}{
		{sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)}, ""},
		{sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(1, 4095*time.Microsecond)}, ""},
		{sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(1, 4096*time.Microsecond)}, "must be below 2^52"},
		{sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(1<<40, sluice.MaxPeriod)}, "reduced period 1930078125µs"},
		{sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(1<<40, time.Microsecond)}, ""},
		{sluice.Limit{Capacity: 142, Rate: sluice.Every(sluice.MaxPeriod)}, ""},
		{sluice.Limit{Capacity: 143, Rate: sluice.Every(sluice.MaxPeriod)}, "capacity 143 × reduced period 31622400000000µs"},
		{sluice.Limit{Capacity: 75_000_000_000, Rate: sluice.Per(1000, time.Minute)}, ""},
		{sluice.Limit{Capacity: 1 << 40, Rate: sluice.Per(0, sluice.MaxPeriod)}, ""},
		{sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Second+time.Nanosecond)}, "not a whole number of microseconds"},
		{sluice.Limit{Capacity: 0, Rate: sluice.PerSecond(1)}, "capacity 0"},
	}
	for _, tt := range tests {
		err := checkLimit(tt.l)
		if tt.want == "" {
			if err != nil {
				t.Errorf("CheckLimit(%v) = %v, want nil", tt.l, err)
			}
			continue
		}
		if !errors.Is(err, sluice.ErrInvalidLimit) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("CheckLimit(%v) = %v, want an error wrapping %v that says %q", tt.l, err, sluice.ErrInvalidLimit, tt.want)
		}
	}
}

// TestLimiterRefusesLimitRedisCannotDecide: a limit valid in the model but
// beyond Lua's exact integers fails when a Limiter is built over the
// store (sluice.CheckLimit asks the store), not on every request.
func TestLimiterRefusesLimitRedisCannotDecide(t *testing.T) {
	s, err := New(offline(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := sluice.ParseLimit("143 1/366d")
	if err != nil {
		t.Fatal(err)
	}
	if lim, err := sluice.NewLimiter(s, "api", l); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("sluice.NewLimiter(redisstore, %q, %v) = %v, %v; want an error wrapping %v", "api", l, lim, err, sluice.ErrInvalidLimit)
	}
	if err := sluice.CheckLimit(s, l); !errors.Is(err, sluice.ErrInvalidLimit) || !strings.Contains(err.Error(), "2^52") {
		t.Errorf("sluice.CheckLimit(redisstore, %v) = %v; want an error wrapping %v naming the bound", l, err, sluice.ErrInvalidLimit)
	}
	ok := sluice.Limit{Capacity: 142, Rate: l.Rate}
	if _, err := sluice.NewLimiter(s, "api", ok); err != nil {
		t.Errorf("sluice.NewLimiter(redisstore, %q, %v) = %v; want a limiter", "api", ok, err)
	}
}
