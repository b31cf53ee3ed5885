package simulate

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts are SVG written by hand: no script, no external font, only
// the generic sans-serif family, so that a browser, an image viewer or a
// Markdown page shows them the same without a network. Sizes are in
// pixels of a 960-pixel-wide picture.

const (
	chartWidth  = 960.0
	marginLeft  = 72.0
	marginRight = 72.0
	fontSize    = 12.0
)

// Colours, chosen to be told apart by most kinds of colour blindness:
// blue and orange for the runs, green and red only beside each other's
// labels.
const (
	colourA       = "#1f77b4"
	colourB       = "#e6550d"
	colourAllowed = "#2ca02c"
	colourDenied  = "#d62728"
	colourAxis    = "#333333"
	colourGrid    = "#e5e5e5"
	colourMuted   = "#666666"
	colourBars    = "#d9d9d9"
)

// svg collects the elements of one picture.
type svg struct {
	b      strings.Builder
	height float64
}

func num(f float64) string {
	// One decimal is a tenth of a pixel: finer than any screen shows,
	// and it keeps the files small and their text stable.
	s := strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64)
	if s == "-0" {
		return "0"
	}
	return s
}

func (s *svg) printf(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

// text writes a label; anchor is start, middle or end.
func (s *svg) text(x, y float64, anchor, style, label string) {
	s.printf(`<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", num(x), num(y), anchor, style, html.EscapeString(label))
}

func (s *svg) line(x1, y1, x2, y2 float64, style string) {
	s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" %s/>`+"\n", num(x1), num(y1), num(x2), num(y2), style)
}

// writeTo wraps the elements in the svg element and writes them.
func (s *svg) writeTo(w io.Writer, title string) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="%s">`+"\n",
		num(chartWidth), num(s.height), num(chartWidth), num(s.height), num(fontSize))
	fmt.Fprintf(&b, "<title>%s</title>\n", html.EscapeString(title))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	b.WriteString(s.b.String())
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// textWidth estimates the width of a label in the generic sans-serif
// font: no font is measured, so legends leave room to spare.
func textWidth(label string, size float64) float64 {
	return float64(len([]rune(label))) * size * 0.58
}

// heading writes the title and the line under it.
func (s *svg) heading(title, subtitle string) {
	s.text(marginLeft, 26, "start", ` font-size="16" font-weight="bold"`, title)
	s.text(marginLeft, 46, "start", ` fill="`+colourMuted+`"`, subtitle)
}

// legendItem is one entry of a legend: a swatch drawn at (x, y), the
// middle of the line of text, and its label.
type legendItem struct {
	swatch func(s *svg, x, y float64)
	label  string
}

// legend writes items in rows from y, wrapping before the right margin,
// and returns the y below them.
func (s *svg) legend(y float64, items []legendItem) float64 {
	x := marginLeft
	for _, it := range items {
		w := 28 + textWidth(it.label, fontSize) + 24
		if x > marginLeft && x+w > chartWidth-marginRight {
			x, y = marginLeft, y+20
		}
		it.swatch(s, x, y)
		s.text(x+28, y+4, "start", "", it.label)
		x += w
	}
	return y + 20
}

func lineSwatch(colour, dash string) func(s *svg, x, y float64) {
	return func(s *svg, x, y float64) {
		s.line(x, y, x+22, y, `stroke="`+colour+`" stroke-width="2"`+dash)
	}
}

func tickSwatch(colour string) func(s *svg, x, y float64) {
	return func(s *svg, x, y float64) {
		for _, dx := range []float64{6, 11, 16} {
			s.line(x+dx, y-6, x+dx, y+6, `stroke="`+colour+`" stroke-width="1.5"`)
		}
	}
}

func boxSwatch(colour string) func(s *svg, x, y float64) {
	return func(s *svg, x, y float64) {
		s.printf(`<rect x="%s" y="%s" width="22" height="10" fill="%s"/>`+"\n", num(x), num(y-5), colour)
	}
}

// timeAxis maps offsets to x between the margins.
type timeAxis struct {
	from, to time.Duration
	x0, x1   float64
}

func (a timeAxis) x(t time.Duration) float64 {
	return a.x0 + (a.x1-a.x0)*float64(t-a.from)/float64(a.to-a.from)
}

// timeSteps are the tick intervals of a time axis.
var timeSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour,
	24 * time.Hour, 2 * 24 * time.Hour, 7 * 24 * time.Hour,
}

// timeStep returns the smallest interval of timeSteps that cuts span into
// at most n parts.
func timeStep(span time.Duration, n int) time.Duration {
	for _, s := range timeSteps {
		if span/s <= time.Duration(n) {
			return s
		}
	}
	return timeSteps[len(timeSteps)-1]
}

// formatTick writes an offset without its zero parts: 0, 500ms, 30s,
// 1m30s, 2h, 1d6h.
func formatTick(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	days := d / (24 * time.Hour)
	rest := d % (24 * time.Hour)
	s := ""
	if days > 0 {
		s = strconv.FormatInt(int64(days), 10) + "d"
	}
	if rest == 0 {
		return s
	}
	r := rest.String()
	if strings.HasSuffix(r, "m0s") {
		r = strings.TrimSuffix(r, "0s")
	}
	if strings.HasSuffix(r, "h0m") {
		r = strings.TrimSuffix(r, "0m")
	}
	return s + r
}

// draw writes the ticks, grid and labels of the axis under a plot that
// spans y0 to y1, the labels at labelY.
func (a timeAxis) draw(s *svg, y0, y1, labelY float64) {
	step := timeStep(a.to-a.from, int((a.x1-a.x0)/80))
	first := (a.from + step - 1) / step * step
	for t := first; t <= a.to; t += step {
		x := a.x(t)
		s.line(x, y0, x, y1, `stroke="`+colourGrid+`"`)
		s.line(x, y1, x, y1+5, `stroke="`+colourAxis+`"`)
		s.text(x, labelY, "middle", "", formatTick(t))
	}
	s.line(a.x0, y1, a.x1, y1, `stroke="`+colourAxis+`"`)
	s.text((a.x0+a.x1)/2, labelY+20, "middle", ` fill="`+colourMuted+`"`, "time since the start of the trace")
}

// niceScale returns a top at or above max and a tick step: the step is 1,
// 2 or 5 times a power of ten, cutting the top into at most 8 parts.
func niceScale(max float64) (top, step float64) {
	if max <= 0 || math.IsNaN(max) {
		return 1, 0.5
	}
	raw := max / 5
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		step = m * p
		if math.Ceil(max/step-1e-9) <= 8 {
			break
		}
	}
	return math.Ceil(max/step-1e-9) * step, step
}

// formatNumber writes a tick value: whole numbers as they are, large ones
// with k or M, fractions with what they need.
func formatNumber(f float64) string {
	switch a := math.Abs(f); {
	case a >= 1e6 && math.Mod(f, 1e5) == 0:
		return strconv.FormatFloat(f/1e6, 'f', -1, 64) + "M"
	case a >= 1e4 && math.Mod(f, 100) == 0:
		return strconv.FormatFloat(f/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(math.Round(f*1e6)/1e6, 'f', -1, 64)
}

// valueAxis maps values from 0 to top onto y1 (bottom) to y0 (top).
type valueAxis struct {
	top, step float64
	y0, y1    float64
}

func (a valueAxis) y(v float64) float64 { return a.y1 - (a.y1-a.y0)*v/a.top }

// draw writes the axis on the left (x at the plot's left edge) or the
// right, with a grid across the plot when grid is set, and the label
// written along it.
func (a valueAxis) draw(s *svg, x0, x1 float64, right, grid bool, label, suffix, colour string) {
	x, dir, anchor := x0, -1.0, "end"
	if right {
		x, dir, anchor = x1, 1.0, "start"
	}
	for i := 0; ; i++ {
		v := float64(i) * a.step
		if v > a.top+a.step*1e-9 {
			break
		}
		y := a.y(v)
		if grid {
			s.line(x0, y, x1, y, `stroke="`+colourGrid+`"`)
		}
		s.line(x, y, x+5*dir, y, `stroke="`+colourAxis+`"`)
		s.text(x+8*dir, y+4, anchor, ` fill="`+colour+`"`, formatNumber(v)+suffix)
	}
	s.line(x, a.y0, x, a.y1, `stroke="`+colourAxis+`"`)
	lx := x0 - 52
	if right {
		lx = x1 + 56
	}
	s.printf(`<text x="%s" y="%s" text-anchor="middle" transform="rotate(-90 %s %s)" fill="%s">%s</text>`+"\n",
		num(lx), num((a.y0+a.y1)/2), num(lx), num((a.y0+a.y1)/2), colour, html.EscapeString(label))
}

// point is a vertex of a polyline, in data units.
type point struct {
	t time.Duration
	v float64
}

// polyline writes pts as one path, clipped to the axis's time range, with
// the vertices that fall on one column of pixels reduced to the first,
// the lowest, the highest and the last: the line looks the same, and a
// busy key does not make a picture of megabytes.
func polyline(s *svg, ta timeAxis, va valueAxis, pts []point, style string) {
	var out []point
	for i := 0; i+1 < len(pts); i++ {
		a, b := pts[i], pts[i+1]
		if a.t > b.t {
			a, b = b, a
		}
		if b.t < ta.from || a.t > ta.to {
			continue
		}
		ca, cb := a, b
		if a.t < ta.from {
			ca = point{ta.from, interpolate(a, b, ta.from)}
		}
		if b.t > ta.to {
			cb = point{ta.to, interpolate(a, b, ta.to)}
		}
		out = append(out, ca, cb)
	}
	if len(out) == 0 {
		return
	}
	var d strings.Builder
	type xy struct{ x, y float64 }
	var col []xy
	flush := func() {
		if len(col) == 0 {
			return
		}
		keep := []xy{col[0]}
		if len(col) > 2 {
			lo, hi := col[0], col[0]
			for _, p := range col {
				if p.y > lo.y {
					lo = p
				}
				if p.y < hi.y {
					hi = p
				}
			}
			keep = append(keep, lo, hi)
		}
		if len(col) > 1 {
			keep = append(keep, col[len(col)-1])
		}
		for _, p := range keep {
			if d.Len() == 0 {
				d.WriteString("M")
			} else {
				d.WriteString(" L")
			}
			d.WriteString(num(p.x) + " " + num(p.y))
		}
		col = col[:0]
	}
	lastCol := math.Inf(-1)
	var prev xy
	for i, p := range out {
		q := xy{ta.x(p.t), va.y(p.v)}
		if i > 0 && q == prev {
			continue
		}
		prev = q
		c := math.Floor(q.x * 2)
		if c != lastCol {
			flush()
			lastCol = c
		}
		col = append(col, q)
	}
	flush()
	s.printf(`<path d="%s" fill="none" %s/>`+"\n", d.String(), style)
}

func interpolate(a, b point, t time.Duration) float64 {
	if b.t == a.t {
		return b.v
	}
	return a.v + (b.v-a.v)*float64(t-a.t)/float64(b.t-a.t)
}

// ticks writes a short vertical line at each offset in the axis's range,
// one per half pixel at most, as one path.
func ticks(s *svg, ta timeAxis, at []time.Duration, y0, y1 float64, colour string) {
	var d strings.Builder
	seen := map[float64]bool{}
	for _, t := range at {
		if t < ta.from || t > ta.to {
			continue
		}
		x := math.Round(ta.x(t)*2) / 2
		if seen[x] {
			continue
		}
		seen[x] = true
		fmt.Fprintf(&d, "M%s %sV%s", num(x), num(y0), num(y1))
	}
	if d.Len() > 0 {
		s.printf(`<path d="%s" stroke="%s" stroke-width="1"/>`+"\n", d.String(), colour)
	}
}
