package simulate

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestSimulateReadTrace(t *testing.T) {
	in := `# a comment
0s alice

  150ms   bob 3   # a trailing comment
1m2.5s carol #no space needed after the mark
1m2.5s dave 1#x
`
	_, err := ReadTrace(strings.NewReader(in), "t")
	if err == nil || !strings.Contains(err.Error(), `t:6: cost "1#x"`) {
		t.Fatalf("ReadTrace = %v, want the cost of line 6 refused", err)
	}
	in = in[:strings.LastIndex(in, "1m2.5s dave")]
	got, err := ReadTrace(strings.NewReader(in), "t")
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{At: 0, Key: "alice", Cost: 1, Line: 2},
		{At: 150 * time.Millisecond, Key: "bob", Cost: 3, Line: 4},
		{At: time.Minute + 2500*time.Millisecond, Key: "carol", Cost: 1, Line: 5},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadTrace = %+v, want %+v", got, want)
	}
}

func TestSimulateReadTraceErrors(t *testing.T) {
	long := strings.Repeat("k", sluice.MaxKeyLen+1)
	tests := []struct {
		in       string
		text     string
		sentinel error
	}{
		{"0s\n", `trace:1: "0s" is not "offset key [cost]"`, nil},
		{"0s a 1 2\n", `is not "offset key [cost]"`, nil},
		{"# c\nsoon alice\n", `trace:2: offset "soon" is not a duration`, nil},
		{"-1s alice\n", "offset -1s is negative", nil},
		{"1s alice many\n", `cost "many" is not a whole number`, sluice.ErrInvalidCost},
		{"1s alice 0\n", "cost 0 is outside [1, 1099511627776]", sluice.ErrInvalidCost},
		{"1s " + long + "\n", "more than 512", sluice.ErrInvalidKey},
		{strings.Repeat("x", 70<<10) + "\n", "trace:1: line is longer than 64 KiB", nil},
	}
	for _, tt := range tests {
		_, err := ReadTrace(strings.NewReader(tt.in), "trace")
		if err == nil || !strings.Contains(err.Error(), tt.text) || !errors.Is(err, ErrInvalidTrace) {
			t.Errorf("ReadTrace(%.30q) = %v, want an ErrInvalidTrace containing %q", tt.in, err, tt.text)
			continue
		}
		if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
			t.Errorf("ReadTrace(%.30q) = %v, want it to wrap %v", tt.in, err, tt.sentinel)
		}
	}
}

func TestSimulateWriteTraceRoundTrip(t *testing.T) {
	rs := []Request{
		{At: 0, Key: "a", Cost: 1},
		{At: 1500 * time.Millisecond, Key: "b", Cost: 7},
		{At: time.Hour + 2*time.Minute + 3*time.Millisecond, Key: "c", Cost: 1},
		{At: 1234567 * time.Nanosecond, Key: "d", Cost: 1},
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, "two\nlines", rs); err != nil {
		t.Fatal(err)
	}
	wantText := "# two\n# lines\n0.000s a\n1.500s b 7\n1h2m0.003s c\n1.234567ms d\n"
	if buf.String() != wantText {
		t.Errorf("WriteTrace wrote\n%s\nwant\n%s", buf.String(), wantText)
	}
	back, err := ReadTrace(&buf, "x")
	if err != nil {
		t.Fatal(err)
	}
	for i := range back {
		back[i].Line = 0
	}
	if !reflect.DeepEqual(back, rs) {
		t.Errorf("read back %+v, want %+v", back, rs)
	}
}

func TestSimulateFormatOffset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0.000s",
		5 * time.Millisecond:                  "0.005s",
		59*time.Second + 990*time.Millisecond: "59.990s",
		time.Minute:                           "1m0.000s",
		25*time.Hour + 50*time.Millisecond:    "25h0m0.050s",
		1500 * time.Microsecond:               "1.5ms",
	} {
		if got := formatOffset(d); got != want {
			t.Errorf("formatOffset(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(formatOffset(d)); err != nil || back != d {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", formatOffset(d), back, err, d)
		}
	}
}
