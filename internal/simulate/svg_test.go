package simulate

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

func TestSimulateNiceScale(t *testing.T) {
	tests := []struct{ max, top, step float64 }{
		{10.8, 12, 2},
		{64.8, 70, 10},
		{1, 1, 0.2},
		{3.24, 3.5, 0.5},
		{87, 100, 20},
		{21.6, 25, 5},
		{0, 1, 0.5},
	}
	for _, tt := range tests {
		top, step := niceScale(tt.max)
		if top != tt.top || step != tt.step || top < tt.max || top/step > 8 {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", tt.max, top, step, tt.top, tt.step)
		}
	}
}

func TestSimulateTimeTicks(t *testing.T) {
	steps := map[time.Duration]time.Duration{
		10 * time.Minute: time.Minute,
		30 * time.Second: 5 * time.Second,
		24 * time.Hour:   3 * time.Hour,
		time.Second:      100 * time.Millisecond,
	}
	for span, want := range steps {
		if got := timeStep(span, 10); got != want {
			t.Errorf("timeStep(%v, 10) = %v, want %v", span, got, want)
		}
	}
	labels := map[time.Duration]string{
		0: "0", 500 * time.Millisecond: "500ms", 90 * time.Second: "1m30s", 2 * time.Minute: "2m",
		2 * time.Hour: "2h", 90 * time.Minute: "1h30m", 30 * time.Hour: "1d6h", 48 * time.Hour: "2d",
	}
	for d, want := range labels {
		if got := formatTick(d); got != want {
			t.Errorf("formatTick(%v) = %q, want %q", d, got, want)
		}
	}
}

// texts returns the text elements of an SVG, checking it is well formed.
func texts(t *testing.T, data []byte) []string {
	t.Helper()
	var out []string
	dec := xml.NewDecoder(bytes.NewReader(data))
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				out = append(out, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
}

func TestSimulateLevelChart(t *testing.T) {
	trace := []Request{
		{At: 0, Key: "<k&>", Cost: 1}, {At: 0, Key: "<k&>", Cost: 1}, {At: 0, Key: "<k&>", Cost: 1},
		{At: 500 * time.Millisecond, Key: "other", Cost: 1},
		{At: 2 * time.Second, Key: "<k&>", Cost: 2},
	}
	var buf bytes.Buffer
	c := LevelChart{Key: "<k&>", Limits: mustLimits(t, "2 1/s", "5 1/m")}
	if err := c.Write(&buf, trace); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(texts(t, buf.Bytes()), "|")
	for _, want := range []string{"Bucket of <k&> under 2 1/s + 5 1/m", "4 requests of this key from 0 to 2s: 3 allowed, 1 denied",
		"limit 0: 2 1/s", "limit 1: 5 1/m", "capacity 2", "capacity 5", "time since the start of the trace", "tokens", "allowed", "denied"} {
		if !strings.Contains(all, want) {
			t.Errorf("the level chart has no text %q; it has %s", want, all)
		}
	}
	if strings.Contains(buf.String(), "<k&>") {
		t.Error("the key is not escaped")
	}
	// One panel per limit, each with its capacity line.
	if n := strings.Count(buf.String(), `stroke-dasharray="6 4"/>`); n != 3 { // two capacities and the legend's swatch
		t.Errorf("%d dashed lines, want the legend's and one capacity per limit", n)
	}
}

func TestSimulateDenyRateChart(t *testing.T) {
	trace := []Request{{At: 0, Key: "a", Cost: 1}, {At: 0, Key: "a", Cost: 1}, {At: 3 * time.Second, Key: "a", Cost: 1}}
	b1, _ := NewBucket(mustLimits(t, "1 1/s"), 0)
	b2, _ := NewBucket(mustLimits(t, "2 1/s"), 0)
	runs := []*Run{Replay(trace, b1), Replay(trace, b2)}
	var buf bytes.Buffer
	if err := (DenyRateChart{Runs: runs, Source: "t", Interval: time.Second}).Write(&buf, trace); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(texts(t, buf.Bytes()), "|")
	for _, want := range []string{"Share of requests denied, per 1s", "t: 3 requests from 1 key; A denied 1 (33.3%), B denied 0 (0.0%)",
		"A: token bucket 1 1/s", "B: token bucket 2 1/s", "requests per second, all keys (right axis)", "50%", "denied, % of requests"} {
		if !strings.Contains(all, want) {
			t.Errorf("the deny-rate chart has no text %q; it has %s", want, all)
		}
	}
	// A's line: 50% over the first second, a gap, 0% over the fourth.
	if !strings.Contains(buf.String(), `stroke="`+colourA+`"`) || !strings.Contains(buf.String(), `stroke="`+colourB+`"`) {
		t.Error("a run's line is missing")
	}
	if err := (DenyRateChart{Runs: runs, From: 2 * time.Second, To: time.Second}).Write(io.Discard, trace); err == nil {
		t.Error("a chart ending before it starts was drawn")
	}
	if err := (DenyRateChart{Runs: append(runs, runs[0])}).Write(io.Discard, trace); err == nil {
		t.Error("a chart of three runs was drawn")
	}
}

// TestPolylineThins checks that a busy line keeps at most four vertices
// per half-pixel column, and its lowest and highest points.
func TestSimulatePolylineThins(t *testing.T) {
	var pts []point
	for i := range 10000 {
		v := float64(i % 10)
		pts = append(pts, point{time.Duration(i) * time.Millisecond, v})
	}
	s := &svg{}
	ta := timeAxis{from: 0, to: 10 * time.Second, x0: 0, x1: 100}
	va := valueAxis{top: 10, step: 2, y0: 0, y1: 100}
	polyline(s, ta, va, pts, "")
	n := strings.Count(s.b.String(), "L") + 1
	if n > 4*200+4 {
		t.Errorf("%d vertices for 200 half-pixel columns", n)
	}
	if !strings.Contains(s.b.String(), " 10 ") && !strings.Contains(s.b.String(), " 10L") {
		// v = 9 is y = 10: the highest point must survive.
		t.Errorf("the highest points were thinned away: %.200s", s.b.String())
	}
}
