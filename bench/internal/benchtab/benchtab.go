// Package benchtab holds what the interleaved benchmark tables of
// bench/redis and bench/postgres share: the median of a cell's rounds and
// the formatting of its figures.
package benchtab

import (
	"slices"
	"strconv"
	"strings"
)

// Median returns the median of v (0 for none), leaving v as it was.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Sorted(slices.Values(v))
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// Thousands formats f rounded to a whole number, with commas between
// thousands: 1234567.8 is "1,234,568".
func Thousands(f float64) string {
	s := strconv.FormatFloat(f, 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
