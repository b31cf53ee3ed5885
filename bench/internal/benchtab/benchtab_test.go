package benchtab

import "testing"

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		v    []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		before := append([]float64(nil), tt.v...)
		if got := Median(tt.v); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", before, got, tt.want)
		}
		for i := range before {
			if tt.v[i] != before[i] {
				t.Errorf("Median changed its argument: %v, was %v", tt.v, before)
			}
		}
	}
}

func TestThousands(t *testing.T) {
	for f, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.8: "1,234,568", -4321: "-4,321", 100000: "100,000"} {
		if got := Thousands(f); got != want {
			t.Errorf("Thousands(%v) = %q, want %q", f, got, want)
		}
	}
}
