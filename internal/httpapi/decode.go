package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// decode reads a JSON body of at most limit bytes into v (a
// *decisionRequest or a *batchRequest), strictly (unknown fields and
// trailing data are errors), answering the problem itself when it cannot.
// The body is read as JSON whatever its Content-Type says, so that a plain
// "curl -d" works.
//
// The body is read in full first, so a body over the limit is refused as
// too large (413) whatever it holds. A body in the shape clients send (see
// scanner) is then parsed by hand; any other is left to encoding/json,
// which accepts or refuses it: the hand parser changes what is fast, never
// what is accepted or how it is read.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	buf := getBuf()
	defer putBuf(buf)
	body, err := readAll(http.MaxBytesReader(w, r.Body, limit), *buf)
	*buf = body
	if err == nil {
		switch v := v.(type) {
		case *decisionRequest:
			if s := (scanner{b: body}); s.request(v) && s.end() {
				return true
			}
		case *batchRequest:
			if s := (scanner{b: body}); s.batch(v) && s.end() {
				return true
			}
		}
		err = decodeStrict(body, v)
	}
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeProblem(w, http.StatusRequestEntityTooLarge, problem{Title: "request body too large", Detail: fmt.Sprintf("the body is over %d bytes", tooLarge.Limit)})
			return false
		}
		p := problem{Title: "invalid JSON body", Detail: err.Error()}
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			p.Field = typeErr.Field
			p.Detail = fmt.Sprintf("field %q must be a JSON %s, not %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		writeProblem(w, http.StatusBadRequest, p)
		return false
	}
	return true
}

// readAll appends what r reads to b up to the end, growing b as needed.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// decodeStrict decodes body into v with encoding/json: one JSON value, no
// unknown fields, nothing after it but white space.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			err = errors.New("data after the JSON object")
		}
	}
	return err
}

// maxFastDigits bounds the digits of a cost the scanner reads: 18 digits
// never overflow an int64.
const maxFastDigits = 18

// scanner parses the bodies clients send, in the one shape they send them,
// and reports false for anything else. The shape is a subset of what
// decodeStrict accepts, parsed to the same value:
//
//   - a request is an object of the members "policy", "key", "request_id"
//     (strings) and "cost" (a number), each at most once, names spelled
//     exactly so;
//   - a string holds printable ASCII only, without escapes (encoding/json
//     would keep such a string as it is);
//   - a cost is 0 or digits without a leading zero, at most 18 of them;
//   - a batch is an object of the one member "requests", an array of
//     requests;
//   - white space (space, tab, CR, LF) anywhere between tokens.
//
// Everything else, from null or a duplicate member to an escape, a minus
// sign or a name in other case (which encoding/json matches case
// insensitively), is left to decodeStrict.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// token consumes c, after white space.
func (s *scanner) token(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// str consumes a string and returns its content, which aliases s.b.
func (s *scanner) str() ([]byte, bool) {
	if !s.token('"') {
		return nil, false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := s.b[s.i:j]
			s.i = j + 1
			return v, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// cost consumes a whole number of at most maxFastDigits digits.
func (s *scanner) cost() (int64, bool) {
	s.space()
	j := s.i
	for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
		j++
	}
	digits := s.b[s.i:j]
	if len(digits) == 0 || len(digits) > maxFastDigits || digits[0] == '0' && len(digits) > 1 {
		return 0, false
	}
	if j < len(s.b) {
		// A fraction or an exponent: a number this scanner does not read.
		if c := s.b[j]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	var n int64
	for _, d := range digits {
		n = n*10 + int64(d-'0')
	}
	s.i = j
	return n, true
}

// request parses one request object into v; v is unchanged if it reports
// false.
func (s *scanner) request(v *decisionRequest) bool {
	if !s.token('{') {
		return false
	}
	var req decisionRequest
	if s.token('}') {
		*v = req
		return true
	}
	var seen uint8
	for {
		name, ok := s.str()
		if !ok || !s.token(':') {
			return false
		}
		var bit uint8
		switch string(name) {
		case "policy":
			bit = 1
			var p []byte
			p, ok = s.str()
			req.Policy = string(p)
		case "key":
			bit = 2
			var k []byte
			k, ok = s.str()
			req.Key = string(k)
		case "request_id":
			bit = 4
			var id []byte
			id, ok = s.str()
			req.RequestID = string(id)
		case "cost":
			bit = 8
			var c int64
			c, ok = s.cost()
			req.Cost = &c
		}
		if !ok || bit == 0 || seen&bit != 0 {
			return false
		}
		seen |= bit
		if s.token(',') {
			continue
		}
		if !s.token('}') {
			return false
		}
		*v = req
		return true
	}
}

// batch parses a batch object into v; v is unchanged if it reports false.
func (s *scanner) batch(v *batchRequest) bool {
	if !s.token('{') {
		return false
	}
	name, ok := s.str()
	if !ok || string(name) != "requests" || !s.token(':') || !s.token('[') {
		return false
	}
	reqs := []decisionRequest{}
	if !s.token(']') {
		for {
			var r decisionRequest
			if !s.request(&r) {
				return false
			}
			reqs = append(reqs, r)
			if s.token(',') {
				continue
			}
			if !s.token(']') {
				return false
			}
			break
		}
	}
	if !s.token('}') {
		return false
	}
	v.Requests = reqs
	return true
}
