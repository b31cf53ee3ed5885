package redisstore

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestDecisionReply: decision reads the script's reply of five values,
// with waits as integers or, from 2^53 µs on, as decimal text, and refuses
// every other shape as a *ScriptError, which wraps sluice.ErrMisconfigured.
func TestDecisionReply(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	good := []struct {
		reply     []any
		want      sluice.Decision
		converted bool
	}{
		{[]any{"ok", int64(1), int64(9), int64(0), int64(1_000_000)},
			sluice.Decision{Allowed: true, Remaining: 9, ResetAfter: time.Second, Limit: l}, false},
		{[]any{"conv", int64(1), int64(9), int64(0), int64(1_000_000)},
			sluice.Decision{Allowed: true, Remaining: 9, ResetAfter: time.Second, Limit: l}, true},
		{[]any{"ok", int64(0), int64(0), int64(1), int64(-1)},
			sluice.Decision{Remaining: 0, RetryAfter: time.Microsecond, ResetAfter: sluice.Never, Limit: l}, false},
		{[]any{"replay", int64(0), int64(3), int64(-1), int64(math.MaxInt64)},
			sluice.Decision{Remaining: 3, RetryAfter: sluice.Never, ResetAfter: sluice.Never, Limit: l, Replayed: true}, false},
		{[]any{"ok", int64(0), int64(0), "9007199254740993", "9223372036854775"},
			sluice.Decision{Remaining: 0, RetryAfter: 9007199254740993 * time.Microsecond, ResetAfter: 9223372036854775 * time.Microsecond, Limit: l}, false},
		{[]any{"ok", int64(0), int64(0), "9223372036854776", "13510798882111486"},
			sluice.Decision{Remaining: 0, RetryAfter: sluice.Never, ResetAfter: sluice.Never, Limit: l}, false},
	}
	for _, tt := range good {
		got, converted, err := decision(tt.reply, l)
		if err != nil || got != tt.want || converted != tt.converted {
			t.Errorf("decision(%v) = %+v, %v, %v; want %+v, %v", tt.reply, got, converted, err, tt.want, tt.converted)
		}
	}
	bad := [][]any{
		nil,
		{"ok", int64(1), int64(9), int64(0)},
		{"ok", int64(1), int64(9), int64(0), int64(0), int64(0)},
		{"conflict", int64(1), int64(9), int64(0), int64(0)},
		{"foreign", "ERR sluice: bucket key holds a value sluice did not write", int64(0), int64(0), int64(0)},
		{"ok", int64(2), int64(9), int64(0), int64(0)},
		{"ok", "1", int64(9), int64(0), int64(0)},
		{"ok", int64(1), int64(-1), int64(0), int64(0)},
		{"ok", int64(1), int64(9), int64(-2), int64(0)},
		{"ok", int64(1), int64(9), int64(0), "n"},
		{"ok", int64(1), int64(9), int64(0), "-1"},
		{"ok", int64(1), int64(9), int64(0), "012"},
		{"ok", int64(1), int64(9), int64(0), ""},
		{int64(1), int64(1), int64(9), int64(0), int64(0)},
	}
	for _, reply := range bad {
		var se *ScriptError
		if d, _, err := decision(reply, l); !errors.As(err, &se) || !errors.Is(err, sluice.ErrMisconfigured) {
			t.Errorf("decision(%v) = %+v, %v; want a *ScriptError wrapping %v", reply, d, err, sluice.ErrMisconfigured)
		}
	}
}

// TestMovedDecisionReply: a drain's or a refund's reply is a decision and
// the tokens moved, a non-negative integer; every other shape is a
// *ScriptError.
func TestMovedDecisionReply(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	d, moved, converted, err := movedDecision([]any{"conv", int64(1), int64(4), int64(0), int64(6_000_000), int64(3)}, l)
	if want := (sluice.Decision{Allowed: true, Remaining: 4, ResetAfter: 6 * time.Second, Limit: l}); err != nil || d != want || moved != 3 || !converted {
		t.Errorf("movedDecision = %+v, %d, %v, %v; want %+v, 3, true", d, moved, converted, err, want)
	}
	bad := [][]any{
		nil,
		{"ok", int64(1), int64(4), int64(0), int64(0)},
		{"ok", int64(1), int64(4), int64(0), int64(0), int64(-1)},
		{"ok", int64(1), int64(4), int64(0), int64(0), "3"},
		{"ok", int64(1), int64(4), int64(0), int64(0), int64(3), int64(0)},
		{"unknown"},
		{"conflict", "1", "10", "1", "1000000", int64(0)},
		{"ok", int64(2), int64(4), int64(0), int64(0), int64(3)},
	}
	for _, reply := range bad {
		var se *ScriptError
		if d, moved, _, err := movedDecision(reply, l); !errors.As(err, &se) || !errors.Is(err, sluice.ErrMisconfigured) {
			t.Errorf("movedDecision(%v) = %+v, %d, %v; want a *ScriptError wrapping %v", reply, d, moved, err, sluice.ErrMisconfigured)
		}
	}
}

// TestRecordLimit: the limit of a request ID's record is named as a limit
// is written, or as its numbers if they are not one.
func TestRecordLimit(t *testing.T) {
	for _, tt := range []struct {
		v    []any
		want string
	}{
		{[]any{"10", "3", "1000000"}, `"10 3/s"`},
		{[]any{"5", "1", "3600000000"}, `"5 1/h"`},
		{[]any{"5", "x", "3"}, `"5 x/3µs"`},
		{[]any{"5", "1", "99999999999999999"}, `"5 1/99999999999999999µs"`},
	} {
		if got := recordLimit(tt.v); got != tt.want {
			t.Errorf("recordLimit(%q) = %s, want %s", tt.v, got, tt.want)
		}
	}
}
