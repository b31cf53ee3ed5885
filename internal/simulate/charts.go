package simulate

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// LevelChart draws the bucket of one key over time: the tokens in it
// under each limit (one panel per limit), the capacity, and each request
// of the key, allowed or denied.
type LevelChart struct {
	// Key is the key drawn.
	Key string
	// Limits and Tick are those of the Bucket the run was made with.
	Limits []sluice.Limit
	Tick   time.Duration
	// From and To bound the time drawn; To zero means the end of the
	// trace. The whole trace is decided either way.
	From, To time.Duration
	// Label names the run in the title, for example "A".
	Label string
}

// levelTrack is the level of one bucket over time.
type levelTrack struct {
	limit sluice.Limit
	pts   []point
}

// tracks replays the key's requests and returns, per limit, the level
// before and after each request and where it reached the capacity, with
// the offsets of the allowed and the denied requests.
func (c LevelChart) tracks(trace []Request, to time.Duration) (tr []levelTrack, allowed, denied []time.Duration, err error) {
	b, err := NewBucket(c.Limits, c.Tick)
	if err != nil {
		return nil, nil, nil, err
	}
	tr = make([]levelTrack, len(b.plans))
	for i, l := range c.Limits {
		tr[i] = levelTrack{limit: l, pts: []point{{0, float64(l.Capacity)}}}
	}
	level := func(p *bucket.Plan, s bucket.State) float64 {
		return float64(s.Tokens) + float64(s.Frac)/float64(p.Scale())
	}
	// full adds the point where a bucket left at s reaches its capacity,
	// if that is before next.
	full := func(i int, s bucket.State, next time.Duration) {
		p := &b.plans[i]
		f := p.FullAt(s)
		if f == math.MaxInt64 || f > int64(next/b.tick) {
			return
		}
		if at := time.Duration(f) * b.tick; at > time.Duration(s.Stamp)*b.tick {
			tr[i].pts = append(tr[i].pts, point{at, float64(p.Limit().Capacity)})
		}
	}
	var last []bucket.State
	for _, r := range trace {
		if r.Key != c.Key {
			continue
		}
		now := int64(r.At / b.tick)
		for i := range b.plans {
			pre := float64(c.Limits[i].Capacity)
			if last != nil {
				full(i, last[i], r.At)
				pre = level(&b.plans[i], b.plans[i].Refill(last[i], now))
			}
			tr[i].pts = append(tr[i].pts, point{r.At, pre})
		}
		d := b.Decide(r)
		switch {
		case d.Err != nil:
		case d.Allowed:
			allowed = append(allowed, r.At)
		default:
			denied = append(denied, r.At)
		}
		last = b.states[r.Key]
		if last == nil {
			// The request was refused before its bucket was made.
			for i := range b.plans {
				tr[i].pts = append(tr[i].pts, point{r.At, float64(c.Limits[i].Capacity)})
			}
			continue
		}
		last = append([]bucket.State(nil), last...)
		for i := range b.plans {
			tr[i].pts = append(tr[i].pts, point{r.At, level(&b.plans[i], last[i])})
		}
	}
	for i := range b.plans {
		if last == nil {
			tr[i].pts = append(tr[i].pts, point{to, float64(c.Limits[i].Capacity)})
			continue
		}
		full(i, last[i], to)
		tr[i].pts = append(tr[i].pts, point{to, level(&b.plans[i], b.plans[i].Refill(last[i], int64(to/b.tick)))})
	}
	return tr, allowed, denied, nil
}

// Write draws the chart of trace as SVG.
func (c LevelChart) Write(w io.Writer, trace []Request) error {
	from, to, err := chartRange(c.From, c.To, trace)
	if err != nil {
		return err
	}
	tracks, allowed, denied, err := c.tracks(trace, to)
	if err != nil {
		return err
	}
	inRange := func(ts []time.Duration) int {
		n := 0
		for _, t := range ts {
			if t >= from && t <= to {
				n++
			}
		}
		return n
	}
	limits := make([]string, len(c.Limits))
	for i, l := range c.Limits {
		limits[i] = l.String()
	}
	s := &svg{}
	title := fmt.Sprintf("Bucket of %s under %s", shorten(c.Key, 60), strings.Join(limits, " + "))
	if c.Label != "" {
		title = c.Label + ": " + title
	}
	na, nd := inRange(allowed), inRange(denied)
	s.heading(title, fmt.Sprintf("%d %s of this key from %s to %s: %d allowed, %d denied",
		na+nd, plural(na+nd, "request", "requests"), formatTick(from), formatTick(to), na, nd))
	y := s.legend(72, []legendItem{
		{lineSwatch(colourA, ""), "tokens in the bucket"},
		{lineSwatch(colourMuted, ` stroke-dasharray="6 4"`), "capacity"},
		{tickSwatch(colourAllowed), "allowed request"},
		{tickSwatch(colourDenied), "denied request"},
	})
	ta := timeAxis{from: from, to: to, x0: marginLeft, x1: chartWidth - marginRight}
	panelH := 240.0
	if len(tracks) > 1 {
		panelH = 170
	}
	top := y + 6
	bottom := top + float64(len(tracks))*(panelH+14) - 14
	stripTop := bottom + 10
	rowH := 14.0
	stripBottom := stripTop + 2*rowH + 6
	ta.draw(s, top, stripBottom, stripBottom+18)
	for i, tr := range tracks {
		y0 := top + float64(i)*(panelH+14)
		capacity := float64(tr.limit.Capacity)
		t, step := niceScale(capacity * 1.08)
		va := valueAxis{top: t, step: step, y0: y0, y1: y0 + panelH}
		va.draw(s, ta.x0, ta.x1, false, true, "tokens", "", colourAxis)
		s.printf(`<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#999999"/>`+"\n", num(ta.x0), num(y0), num(ta.x1-ta.x0), num(panelH))
		cy := va.y(capacity)
		s.line(ta.x0, cy, ta.x1, cy, `stroke="`+colourMuted+`" stroke-width="1.5" stroke-dasharray="6 4"`)
		s.text(ta.x1-6, cy-5, "end", ` fill="`+colourMuted+`"`, "capacity "+formatNumber(capacity))
		if len(tracks) > 1 {
			s.text(ta.x0+8, y0+16, "start", ` font-weight="bold"`, fmt.Sprintf("limit %d: %v", i, tr.limit))
		}
		polyline(s, ta, va, tr.pts, `stroke="`+colourA+`" stroke-width="1.5" stroke-linejoin="round"`)
	}
	s.text(ta.x0-8, stripTop+rowH-3, "end", ` fill="`+colourAllowed+`"`, "allowed")
	s.text(ta.x0-8, stripTop+2*rowH+3, "end", ` fill="`+colourDenied+`"`, "denied")
	ticks(s, ta, allowed, stripTop+2, stripTop+rowH, colourAllowed)
	ticks(s, ta, denied, stripTop+rowH+6, stripTop+2*rowH+4, colourDenied)
	s.height = stripBottom + 52
	return s.writeTo(w, title)
}

// shorten cuts s to n runes, marking the cut with "...", so that a long
// key does not run off the picture.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}

// chartRange returns the offsets a chart spans: from and to, to zero
// meaning the end of the trace (at least a second after from).
func chartRange(from, to time.Duration, trace []Request) (time.Duration, time.Duration, error) {
	if from < 0 {
		return 0, 0, fmt.Errorf("%w: chart start %v is negative", sluice.ErrInvalidOption, from)
	}
	if to == 0 {
		// The end of the trace, rounded up to a tick of the axis, so that
		// the last tick has a label.
		to = max(Span(trace), from+time.Second)
		step := timeStep(to-from, 10)
		to = from + (to-from+step-1)/step*step
	}
	if to <= from {
		return 0, 0, fmt.Errorf("%w: chart end %v is not after its start %v", sluice.ErrInvalidOption, to, from)
	}
	return from, to, nil
}

// DenyRateChart draws, for one or two runs of a trace, the share of the
// requests denied in each interval, over the requests per second of all
// keys.
type DenyRateChart struct {
	// Runs are the runs drawn, named A and B.
	Runs []*Run
	// Source names the trace in the subtitle.
	Source string
	// From and To bound the time drawn; To zero means the end of the
	// trace.
	From, To time.Duration
	// Interval is the width of a bar; zero picks one that cuts the span
	// into 150 or fewer, from 100ms.
	Interval time.Duration
}

// denyInterval returns the interval of a span: the smallest tick step
// from 100ms that cuts it into at most 150 parts.
func denyInterval(span time.Duration) time.Duration {
	return max(timeStep(span, 150), 100*time.Millisecond)
}

// Write draws the chart of trace, which the runs replayed, as SVG.
func (c DenyRateChart) Write(w io.Writer, trace []Request) error {
	from, to, err := chartRange(c.From, c.To, trace)
	if err != nil {
		return err
	}
	if len(c.Runs) == 0 || len(c.Runs) > 2 {
		return fmt.Errorf("%w: a deny-rate chart draws 1 or 2 runs, not %d", sluice.ErrInvalidOption, len(c.Runs))
	}
	iv := c.Interval
	if iv <= 0 {
		iv = denyInterval(to - from)
	}
	n := int((to - from + iv - 1) / iv)
	if n > 10_000 {
		return fmt.Errorf("%w: interval %v cuts %v into %d bars, more than 10000", sluice.ErrInvalidOption, iv, to-from, n)
	}
	requests := make([]int64, n)
	decided := make([][]int64, len(c.Runs))
	denied := make([][]int64, len(c.Runs))
	for k := range c.Runs {
		decided[k], denied[k] = make([]int64, n), make([]int64, n)
	}
	for i, r := range trace {
		if r.At < from || r.At >= from+time.Duration(n)*iv {
			continue
		}
		bin := int((r.At - from) / iv)
		requests[bin]++
		for k, run := range c.Runs {
			d := run.Decisions[i]
			if d.Err != nil {
				continue
			}
			decided[k][bin]++
			if !d.Allowed {
				denied[k][bin]++
			}
		}
	}
	maxRate, maxShare := 0.0, 0.0
	for b := range n {
		maxRate = math.Max(maxRate, float64(requests[b])/iv.Seconds())
		for k := range c.Runs {
			if decided[k][b] > 0 {
				maxShare = math.Max(maxShare, 100*float64(denied[k][b])/float64(decided[k][b]))
			}
		}
	}

	s := &svg{}
	title := "Share of requests denied, per " + formatTick(iv)
	var parts []string
	for k, run := range c.Runs {
		parts = append(parts, fmt.Sprintf("%s denied %d (%s)", runName(k), run.Total.Denied, percent(float64(run.Total.Denied), float64(run.Total.Allowed+run.Total.Denied))))
	}
	s.heading(title, fmt.Sprintf("%s: %d %s from %d %s; %s", c.Source, len(trace), plural(len(trace), "request", "requests"),
		len(c.Runs[0].Keys), plural(len(c.Runs[0].Keys), "key", "keys"), strings.Join(parts, ", ")))
	items := []legendItem{}
	colours := []string{colourA, colourB}
	for k, run := range c.Runs {
		items = append(items, legendItem{lineSwatch(colours[k], ""), runName(k) + ": " + run.Describe()})
	}
	items = append(items, legendItem{boxSwatch(colourBars), "requests per second, all keys (right axis)"})
	y := s.legend(72, items)

	ta := timeAxis{from: from, to: to, x0: marginLeft, x1: chartWidth - marginRight}
	y0, y1 := y+6, y+6+300
	st, sstep := niceScale(math.Max(maxShare, 1))
	if st > 100 {
		st, sstep = 100, 20
	}
	left := valueAxis{top: st, step: sstep, y0: y0, y1: y1}
	rt, rstep := niceScale(maxRate)
	right := valueAxis{top: rt, step: rstep, y0: y0, y1: y1}
	ta.draw(s, y0, y1, y1+18)
	left.draw(s, ta.x0, ta.x1, false, true, "denied, % of requests", "%", colourAxis)
	right.draw(s, ta.x0, ta.x1, true, false, "requests per second", "", colourMuted)

	// The traffic, as bars behind the lines.
	var bars strings.Builder
	for b := range n {
		if requests[b] == 0 {
			continue
		}
		xa, xb := ta.x(from+time.Duration(b)*iv), ta.x(min(from+time.Duration(b+1)*iv, to))
		if xb-xa > 3 {
			xb -= 1
		}
		yt := right.y(float64(requests[b]) / iv.Seconds())
		fmt.Fprintf(&bars, "M%s %sH%sV%sH%sZ", num(xa), num(y1), num(xb), num(yt), num(xa))
	}
	if bars.Len() > 0 {
		s.printf(`<path d="%s" fill="%s"/>`+"\n", bars.String(), colourBars)
	}
	s.printf(`<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#999999"/>`+"\n", num(ta.x0), num(y0), num(ta.x1-ta.x0), num(y1-y0))
	// Each run's share as steps: flat over each interval, broken where
	// an interval has no decided request.
	for k := range c.Runs {
		var d strings.Builder
		open := false
		for b := range n {
			if decided[k][b] == 0 {
				open = false
				continue
			}
			xa, xb := ta.x(from+time.Duration(b)*iv), ta.x(min(from+time.Duration(b+1)*iv, to))
			yv := left.y(100 * float64(denied[k][b]) / float64(decided[k][b]))
			if open {
				fmt.Fprintf(&d, "V%sH%s", num(yv), num(xb))
			} else {
				fmt.Fprintf(&d, "M%s %sH%s", num(xa), num(yv), num(xb))
			}
			open = true
		}
		if d.Len() > 0 {
			dash := ""
			if k == 1 {
				dash = ` stroke-dasharray="7 3"`
			}
			s.printf(`<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", d.String(), colours[k], dash)
		}
	}
	s.height = y1 + 58
	return s.writeTo(w, title)
}
