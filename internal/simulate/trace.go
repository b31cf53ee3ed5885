package simulate

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Request is one request of a trace: Cost tokens asked of the bucket of
// Key, At after the start of the trace.
type Request struct {
	// At is the offset from the start of the trace, never negative.
	At time.Duration
	// Key is the bucket key (sluice.ValidateKey).
	Key string
	// Cost is the tokens asked, 1 to sluice.MaxCapacity.
	Cost int64
	// Line is the line of the trace the request was read from; 0 for a
	// generated request.
	Line int
}

// TraceFormat describes the text form of a trace, as ReadTrace reads it.
const TraceFormat = `A trace has one request a line: OFFSET KEY [COST]
  OFFSET  the time since the start of the trace, a duration: 0s, 150ms, 2m3.5s
  KEY     the bucket key, without spaces: a user, an API key, an address
  COST    the tokens the request takes, a whole number from 1; default 1
Blank lines, lines starting with # and the rest of a line from a word
starting with # are comments. Requests are decided in the order written:
an offset earlier than the one before is the clock stepping back, which
refills nothing.`

// ErrInvalidTrace is wrapped by every error of a trace that cannot be read.
var ErrInvalidTrace = errors.New("simulate: invalid trace")

// TraceError is a line of a trace that is not a request.
type TraceError struct {
	// Name names the trace (a file name, "stdin").
	Name string
	// Line is the line number, from 1.
	Line int
	// Msg says what is wrong.
	Msg string
	// Err is the sluice sentinel the problem falls under, if any
	// (sluice.ErrInvalidKey, sluice.ErrInvalidCost).
	Err error
}

// Error formats e as "NAME:LINE: MSG".
func (e *TraceError) Error() string {
	return e.Name + ":" + strconv.Itoa(e.Line) + ": " + e.Msg
}

// Unwrap returns ErrInvalidTrace and the sentinel, if any.
func (e *TraceError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalidTrace, e.Err}
	}
	return []error{ErrInvalidTrace}
}

// maxLine is the longest trace line ReadTrace reads: a key of
// sluice.MaxKeyLen bytes with room for the offset, the cost and a comment.
const maxLine = 64 << 10

// ReadTrace reads a trace in the form of TraceFormat from r; name names it
// in errors. The first bad line is returned as a *TraceError.
func ReadTrace(r io.Reader, name string) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	line := 0
	for sc.Scan() {
		line++
		req, ok, err := parseLine(sc.Text())
		if err != nil {
			err.Name, err.Line = name, line
			return nil, err
		}
		if ok {
			req.Line = line
			out = append(out, req)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &TraceError{Name: name, Line: line + 1, Msg: fmt.Sprintf("line is longer than %d KiB", maxLine>>10)}
		}
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return out, nil
}

// parseLine reads one line: a request (ok), or a comment or blank line.
func parseLine(text string) (Request, bool, *TraceError) {
	f := strings.Fields(text)
	for i, w := range f {
		if strings.HasPrefix(w, "#") {
			f = f[:i]
			break
		}
	}
	if len(f) == 0 {
		return Request{}, false, nil
	}
	if len(f) > 3 || len(f) < 2 {
		return Request{}, false, &TraceError{Msg: fmt.Sprintf("%q is not \"offset key [cost]\"", strings.TrimSpace(text))}
	}
	at, err := time.ParseDuration(f[0])
	if err != nil {
		return Request{}, false, &TraceError{Msg: fmt.Sprintf("offset %q is not a duration such as 150ms or 2m3.5s", f[0])}
	}
	if at < 0 {
		return Request{}, false, &TraceError{Msg: fmt.Sprintf("offset %s is negative; offsets count from the start of the trace", f[0])}
	}
	if err := sluice.ValidateKey(f[1]); err != nil {
		return Request{}, false, &TraceError{Msg: err.Error(), Err: sluice.ErrInvalidKey}
	}
	cost := int64(1)
	if len(f) == 3 {
		cost, err = strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return Request{}, false, &TraceError{Msg: fmt.Sprintf("cost %q is not a whole number", f[2]), Err: sluice.ErrInvalidCost}
		}
		if cost < 1 || cost > sluice.MaxCapacity {
			return Request{}, false, &TraceError{Msg: fmt.Sprintf("cost %d is outside [1, %d]", cost, int64(sluice.MaxCapacity)), Err: sluice.ErrInvalidCost}
		}
	}
	return Request{At: at, Key: f[1], Cost: cost}, true, nil
}

// WriteTrace writes rs in the form ReadTrace reads, after header, whose
// lines are written as comments. A cost of 1 is left out.
func WriteTrace(w io.Writer, header string, rs []Request) error {
	bw := bufio.NewWriter(w)
	if header != "" {
		for _, l := range strings.Split(strings.TrimRight(header, "\n"), "\n") {
			bw.WriteString(strings.TrimRight("# "+l, " ") + "\n")
		}
	}
	for _, r := range rs {
		bw.WriteString(formatOffset(r.At))
		bw.WriteByte(' ')
		bw.WriteString(r.Key)
		if r.Cost != 1 {
			bw.WriteByte(' ')
			bw.WriteString(strconv.FormatInt(r.Cost, 10))
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// Span returns the offset of the last request of rs (the largest
// offset), zero for an empty trace.
func Span(rs []Request) time.Duration {
	var end time.Duration
	for _, r := range rs {
		end = max(end, r.At)
	}
	return end
}
