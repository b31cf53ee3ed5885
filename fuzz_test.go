package sluice_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
)

// FuzzParseLimit: ParseLimit never panics; what it accepts is valid and
// round-trips through String; what it refuses is ErrInvalidLimit.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{
		"100 10/s", "5 1/m", "3 3/1.5s", "7 7/2d", "1000 0/s", "1 1/µs", "1 1/us", "1 1/1μs", "1 1/366d",
		"1099511627776 1099511627776/8784h", "1 1/1h30m", "1 1/25h0m0s", "1 1/0.000000001s", " 1\t1/ns ",
		"", "100", "100 10", "0 1/s", "1 1/0d", "1 1/367d", "1 1/-1s", "1 -1/s", "1 1/1e3s", "+1 +1/+1s",
		"1 1/9223372036854775807ns", "1 1/9223372036854775808ns", "1 1/.5s", "1 1/1.d", "1 1/d1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := sluice.ParseLimit(s)
		if err != nil {
			if !errors.Is(err, sluice.ErrInvalidLimit) || l != (sluice.Limit{}) {
				t.Fatalf("ParseLimit(%q) = %v, %v; want the zero Limit and an error wrapping ErrInvalidLimit", s, l, err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseLimit(%q) = %#v, which is not valid: %v", s, l, err)
		}
		text := l.String()
		back, err := sluice.ParseLimit(text)
		if err != nil || back != l {
			t.Fatalf("ParseLimit(%q) = %#v; ParseLimit(%q) = %#v, %v", s, l, text, back, err)
		}
		if again := back.String(); again != text {
			t.Fatalf("ParseLimit(%q).String() = %q, then %q", s, text, again)
		}
	})
}
