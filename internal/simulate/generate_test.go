package simulate

import (
	"errors"
	"math"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func mustSources(t *testing.T, texts ...string) []Source {
	t.Helper()
	var out []Source
	for _, s := range texts {
		src, err := ParseSource(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, src)
	}
	return out
}

func TestSimulateGenerateDeterministic(t *testing.T) {
	srcs := mustSources(t, "steady:keys=20,rate=6/m", "burst:keys=1,size=5,every=20s", "abuser:rate=2/s,from=10s,to=30s")
	a, err := Generate(srcs, time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(srcs, time.Minute, 3)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same sources, duration and seed made two traces")
	}
	c, _ := Generate(srcs, time.Minute, 4)
	if reflect.DeepEqual(a, c) {
		t.Error("seeds 3 and 4 made the same trace")
	}
	// A source added at the end changes none of the others' requests.
	d, err := Generate(append(srcs, mustSources(t, "steady:keys=5,name=extra")...), time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	var without []Request
	for _, r := range d {
		if !strings.HasPrefix(r.Key, "extra-") {
			without = append(without, r)
		}
	}
	if !reflect.DeepEqual(a, without) {
		t.Error("adding a source changed the requests of the others")
	}
	if !sort.SliceIsSorted(a, func(i, j int) bool { return a[i].At < a[j].At }) {
		t.Error("the trace is not in time order")
	}
	for _, r := range a {
		if r.At%time.Millisecond != 0 || r.At < 0 || r.At >= time.Minute {
			t.Fatalf("request %+v: offset not a whole millisecond in [0, 1m)", r)
		}
	}
}

func count(rs []Request, prefix string) (n int, keys map[string]int) {
	keys = map[string]int{}
	for _, r := range rs {
		if strings.HasPrefix(r.Key, prefix) {
			n++
			keys[r.Key]++
		}
	}
	return n, keys
}

func TestSimulateGenerateShapes(t *testing.T) {
	t.Run("steady", func(t *testing.T) {
		rs, err := Generate(mustSources(t, "steady:keys=200,rate=30/m"), 10*time.Minute, 1)
		if err != nil {
			t.Fatal(err)
		}
		// 200 keys × 0.5/s × 600s = 60,000 expected; Poisson's standard
		// deviation is about 245, so 2% is over eight of them.
		n, keys := count(rs, "user-")
		if math.Abs(float64(n)-60000) > 1200 || len(keys) != 200 {
			t.Errorf("%d requests from %d keys, want about 60000 from 200", n, len(keys))
		}
		if _, ok := keys["user-001"]; !ok {
			t.Errorf("keys are not named user-001 ...: %v", rs[0].Key)
		}
	})
	t.Run("abuser", func(t *testing.T) {
		rs, err := Generate(mustSources(t, "abuser:rate=10/s,from=1m,to=2m,jitter=0"), 5*time.Minute, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 600 || rs[0].At != time.Minute+50*time.Millisecond || rs[1].At-rs[0].At != 100*time.Millisecond || rs[len(rs)-1].At >= 2*time.Minute {
			t.Errorf("%d requests from %v to %v, want 600 every 100ms in [1m, 2m)", len(rs), rs[0].At, rs[len(rs)-1].At)
		}
	})
	t.Run("burst", func(t *testing.T) {
		rs, err := Generate(mustSources(t, "burst:keys=1,size=25,spacing=10ms,every=1m"), time.Hour, 2)
		if err != nil {
			t.Fatal(err)
		}
		// Every request is in a run of 25 spaced 10ms apart (runs may
		// touch each other, so count gaps, not runs).
		n, _ := count(rs, "burst-1")
		runs := 1
		for i := 1; i < len(rs); i++ {
			if rs[i].At-rs[i-1].At > 10*time.Millisecond {
				runs++
			}
		}
		// About 60 bursts an hour.
		if runs < 35 || runs > 90 || n < 25*35 {
			t.Errorf("%d requests in %d runs, want about 60 bursts of 25", n, runs)
		}
	})
	t.Run("diurnal", func(t *testing.T) {
		rs, err := Generate(mustSources(t, "diurnal:keys=100,rate=10/m,period=1h,low=0.1"), time.Hour, 1)
		if err != nil {
			t.Fatal(err)
		}
		// The first tenth of the period is near the trough, the middle
		// tenth near the peak.
		var early, middle int
		for _, r := range rs {
			switch {
			case r.At < 6*time.Minute:
				early++
			case r.At >= 27*time.Minute && r.At < 33*time.Minute:
				middle++
			}
		}
		if middle < 4*early {
			t.Errorf("%d requests near the trough, %d near the peak; want the peak several times busier", early, middle)
		}
	})
	t.Run("cost", func(t *testing.T) {
		rs, err := Generate(mustSources(t, "abuser:rate=1/s,cost=4"), 10*time.Second, 1)
		if err != nil || len(rs) != 10 || rs[0].Cost != 4 {
			t.Errorf("Generate = %d requests (first %+v), %v; want 10 of cost 4", len(rs), rs[0], err)
		}
	})
}

func TestSimulateParseSourceErrors(t *testing.T) {
	tests := []struct{ in, text string }{
		{"flood", `shape "flood" is not steady, diurnal, burst or abuser`},
		{"steady:keys", `parameter "keys" is not NAME=VALUE`},
		{"steady:keys=0", "keys=0 is not a whole number in [1, 100000]"},
		{"steady:keys=1,keys=2", "keys is given twice"},
		{"steady:size=3", `unknown parameter "size"; it takes keys, rate, name, cost, from and to`},
		{"steady:rate=5", "rate=5 is not N/PERIOD"},
		{"steady:rate=-1/s", "is not a number of requests of 0 or more"},
		{"steady:rate=1/fortnight", `period "fortnight" is not a unit`},
		{"abuser:rate=2000000/s", "more than 1e+06"},
		{"diurnal:low=2", "low=2 is not a number in [0, 1]"},
		{"burst:spacing=0s", "spacing=0s is not a duration in [1ms, 1h0m0s]"},
		{"abuser:from=2m,to=1m", "to=1m0s is not after from=2m0s"},
		{"steady:name=a b", `name "a b" is not 1 to 64 bytes`},
		{"steady:cost=0", "cost=0 is not a whole number in [1, 1099511627776]"},
	}
	for _, tt := range tests {
		_, err := ParseSource(tt.in)
		if !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("ParseSource(%q) = %v, want ErrInvalidOption containing %q", tt.in, err, tt.text)
		}
	}
}

func TestSimulateGenerateErrors(t *testing.T) {
	if _, err := Generate(nil, time.Minute, 1); !errors.Is(err, sluice.ErrInvalidOption) {
		t.Errorf("Generate(no sources) = %v, want ErrInvalidOption", err)
	}
	if _, err := Generate(mustSources(t, "steady"), 0, 1); !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), "duration 0s is outside") {
		t.Errorf("Generate(duration 0) = %v", err)
	}
	_, err := Generate(mustSources(t, "abuser:keys=100,rate=1000/s"), 2*time.Minute, 1)
	if !errors.Is(err, sluice.ErrInvalidOption) || !strings.Contains(err.Error(), "about 12000000 requests, more than 10000000") {
		t.Errorf("Generate(12M requests) = %v, want the bound named", err)
	}
}
