package main

import (
	"errors"
	"fmt"
)

// The HTTP answers are read with a small JSON reader of its own rather
// than encoding/json, which costs the generator CPU time the servers on
// the same machine would otherwise get (bench/http/answer.go is the same
// reader). It reads only the members it counts and checks the syntax of
// the rest as it skips it:
//
//   - sluice's decision: "allowed"; a batch's "results", each a decision
//     or an "error" problem with a "status";
//   - gubernator's GetRateLimitsResp (grpc-gateway, proto names, every
//     field emitted): "responses", each with a "status" of "UNDER_LIMIT"
//     or "OVER_LIMIT" and an "error" string, empty unless the request
//     item failed.

// maxDepth bounds the nesting of skipped values.
const maxDepth = 32

var errSyntax = errors.New("not JSON")

// outcome is what one decision asked for came to.
type outcome struct {
	decided bool // allowed or denied; otherwise the item failed
	allowed bool
}

// readSluiceDecision reads sluice's answer to POST /v1/take.
func readSluiceDecision(b []byte, out []outcome) ([]outcome, error) {
	p := jsonReader{b: b}
	o, err := p.sluiceDecision()
	if err == nil && !p.end() {
		err = fmt.Errorf("%w: data after the decision at byte %d", errSyntax, p.i)
	}
	return append(out[:0], o), err
}

// readSluiceBatch reads sluice's answer to POST /v1/take:batch into out,
// one outcome per result, in order.
func readSluiceBatch(b []byte, out []outcome) ([]outcome, error) {
	return readList(b, out, "results", (*jsonReader).sluiceDecision)
}

// readGubernatorJSON reads gubernator's answer to POST /v1/GetRateLimits
// into out, one outcome per response, in order.
func readGubernatorJSON(b []byte, out []outcome) ([]outcome, error) {
	return readList(b, out, "responses", (*jsonReader).gubernatorResponse)
}

// readList reads an object whose member list is an array of items, each
// read by item, and ignores its other members.
func readList(b []byte, out []outcome, list string, item func(*jsonReader) (outcome, error)) ([]outcome, error) {
	p := jsonReader{b: b}
	out = out[:0]
	seen := false
	err := p.object(func(name []byte) error {
		if string(name) != list {
			return p.skip(0)
		}
		seen = true
		return p.array(func() error {
			o, err := item(&p)
			out = append(out, o)
			return err
		})
	})
	switch {
	case err != nil:
		return out, err
	case !p.end():
		return out, fmt.Errorf("%w: data after the %s at byte %d", errSyntax, list, p.i)
	case !seen:
		return out, fmt.Errorf("no %q member", list)
	}
	return out, nil
}

// sluiceDecision reads a decision or a batch item: an object with
// "allowed", or one with "error" (a problem, not a decision).
func (p *jsonReader) sluiceDecision() (outcome, error) {
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
		}
		return p.skip(0)
	})
	switch {
	case err != nil:
	case problem:
	case allowed:
		o.decided = true
	default:
		err = errors.New(`neither "allowed" nor "error"`)
	}
	return o, err
}

// gubernatorResponse reads one RateLimitResp: decided if its "error" is
// empty and its "status" one of the two.
func (p *jsonReader) gubernatorResponse() (outcome, error) {
	var o outcome
	var status, errText []byte
	var statusSeen bool
	err := p.object(func(name []byte) error {
		var err error
		switch string(name) {
		case "status":
			status, err = p.str()
			statusSeen = true
		case "error":
			errText, err = p.str()
		default:
			err = p.skip(0)
		}
		return err
	})
	switch {
	case err != nil:
	case len(errText) > 0:
	case !statusSeen:
		err = errors.New(`a response without a "status"`)
	case string(status) == "UNDER_LIMIT":
		o = outcome{decided: true, allowed: true}
	case string(status) == "OVER_LIMIT":
		o = outcome{decided: true}
	default:
		err = fmt.Errorf("status %.40q is neither UNDER_LIMIT nor OVER_LIMIT", status)
	}
	return o, err
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
