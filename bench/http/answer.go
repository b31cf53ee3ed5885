package main

import (
	"errors"
	"fmt"
)

// The answers are read with a small JSON reader of their own rather than
// encoding/json, which took a sixth of the generator's CPU time on single
// takes and most of it on batches: time the service on the same machine
// did not get. It reads only the members it counts ("allowed" of a
// decision, "status" of a batch item's "error"), checks the syntax of the
// rest as it skips it, and refuses anything it cannot read.

// maxDepth bounds the nesting of skipped values.
const maxDepth = 32

var errSyntax = errors.New("not JSON")

// outcome is what one decision came to.
type outcome struct {
	decided bool // allowed or denied; otherwise status is the problem's
	allowed bool
	status  int
}

// readDecision reads the answer to a single take.
func readDecision(b []byte) (outcome, error) {
	p := jsonReader{b: b}
	o, err := p.decision()
	if err == nil && !p.end() {
		err = fmt.Errorf("%w: data after the decision at byte %d", errSyntax, p.i)
	}
	return o, err
}

// readBatch reads the answer to a batch into out, one outcome per result,
// in order.
func readBatch(b []byte, out []outcome) ([]outcome, error) {
	p := jsonReader{b: b}
	out = out[:0]
	seen := false
	err := p.object(func(name []byte) error {
		if string(name) != "results" {
			return p.skip(0)
		}
		seen = true
		return p.array(func() error {
			o, err := p.decision()
			out = append(out, o)
			return err
		})
	})
	switch {
	case err != nil:
		return out, err
	case !p.end():
		return out, fmt.Errorf("%w: data after the results at byte %d", errSyntax, p.i)
	case !seen:
		return out, errors.New(`no "results" member`)
	}
	return out, nil
}

// jsonReader reads JSON values from b.
type jsonReader struct {
	b []byte
	i int
}

func (p *jsonReader) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonReader) end() bool {
	p.space()
	return p.i == len(p.b)
}

// next returns the byte starting the next value or token, after space;
// 0 at the end.
func (p *jsonReader) next() byte {
	p.space()
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *jsonReader) token(c byte) error {
	if p.next() != c {
		return fmt.Errorf("%w: want %q at byte %d", errSyntax, c, p.i)
	}
	p.i++
	return nil
}

// decision reads a decision or a batch item: an object with "allowed", or
// one with "error".
func (p *jsonReader) decision() (outcome, error) {
	var o outcome
	var allowed, problem bool
	err := p.object(func(name []byte) error {
		switch string(name) {
		case "allowed":
			v, err := p.boolean()
			o.allowed, allowed = v, true
			return err
		case "error":
			problem = true
			return p.object(func(name []byte) error {
				if string(name) != "status" {
					return p.skip(0)
				}
				n, err := p.integer()
				o.status = n
				return err
			})
		}
		return p.skip(0)
	})
	switch {
	case err != nil:
	case problem:
		if o.status == 0 {
			err = errors.New("a problem without a status")
		}
	case allowed:
		o.decided = true
	default:
		err = errors.New(`neither "allowed" nor "error"`)
	}
	return o, err
}

// object reads an object, calling member with each member's name (the raw
// text between the quotes) to read its value.
func (p *jsonReader) object(member func(name []byte) error) error {
	if err := p.token('{'); err != nil {
		return err
	}
	if p.next() == '}' {
		p.i++
		return nil
	}
	for {
		name, err := p.str()
		if err != nil {
			return err
		}
		if err := p.token(':'); err != nil {
			return err
		}
		if err := member(name); err != nil {
			return err
		}
		switch p.next() {
		case ',':
			p.i++
		case '}':
			p.i++
			return nil
		default:
			return fmt.Errorf("%w: want , or } at byte %d", errSyntax, p.i)
		}
	}
}

// array reads an array, calling elem to read each element.
func (p *jsonReader) array(elem func() error) error {
	if err := p.token('['); err != nil {
		return err
	}
	if p.next() == ']' {
		p.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch p.next() {
		case ',':
			p.i++
		case ']':
			p.i++
			return nil
		default:
			return fmt.Errorf("%w: want , or ] at byte %d", errSyntax, p.i)
		}
	}
}

// str reads a string and returns its raw text, escapes left as they are.
func (p *jsonReader) str() ([]byte, error) {
	if err := p.token('"'); err != nil {
		return nil, err
	}
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], nil
		case c == '\\':
			p.i += 2
		case c < 0x20:
			return nil, fmt.Errorf("%w: control byte in a string at byte %d", errSyntax, p.i)
		default:
			p.i++
		}
	}
	return nil, fmt.Errorf("%w: unterminated string", errSyntax)
}

func (p *jsonReader) literal(word string) bool {
	if len(p.b)-p.i >= len(word) && string(p.b[p.i:p.i+len(word)]) == word {
		p.i += len(word)
		return true
	}
	return false
}

func (p *jsonReader) boolean() (bool, error) {
	p.space()
	switch {
	case p.literal("true"):
		return true, nil
	case p.literal("false"):
		return false, nil
	}
	return false, fmt.Errorf("%w: want true or false at byte %d", errSyntax, p.i)
}

// integer reads a non-negative whole number of at most 9 digits.
func (p *jsonReader) integer() (int, error) {
	p.space()
	n, digits := 0, 0
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' && digits < 9; p.i++ {
		n = n*10 + int(p.b[p.i]-'0')
		digits++
	}
	if digits == 0 {
		return 0, fmt.Errorf("%w: want a whole number at byte %d", errSyntax, p.i)
	}
	return n, nil
}

// skip reads any value and drops it.
func (p *jsonReader) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: nested deeper than %d", errSyntax, maxDepth)
	}
	switch c := p.next(); {
	case c == '{':
		return p.object(func([]byte) error { return p.skip(depth + 1) })
	case c == '[':
		return p.array(func() error { return p.skip(depth + 1) })
	case c == '"':
		_, err := p.str()
		return err
	case c == '-' || c >= '0' && c <= '9':
		start := p.i
		for p.i < len(p.b) {
			c := p.b[p.i]
			if !(c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
				break
			}
			p.i++
		}
		if p.b[start] == '-' && p.i == start+1 {
			return fmt.Errorf("%w: a lone minus at byte %d", errSyntax, start)
		}
		return nil
	case p.literal("true"), p.literal("false"), p.literal("null"):
		return nil
	}
	return fmt.Errorf("%w: want a value at byte %d", errSyntax, p.i)
}
