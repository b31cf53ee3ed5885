package envoyconf

import (
	"bytes"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/config"
)

// maxValues bounds the values of one file once its aliases are expanded,
// so that a few lines of nested aliases cannot make a reload take the
// memory of billions of values.
const maxValues = 1 << 20

// value is a YAML value with its aliases and merge keys resolved as the
// YAML library of envoyproxy/ratelimit (gopkg.in/yaml.v2) resolves them:
// an alias is a copy of its anchor's value, and a merge key (<<) sets the
// keys of the mapping (or mappings) it names, in order, a later key
// overriding an earlier one.
type value struct {
	kind  yaml.Kind // ScalarNode, MappingNode or SequenceNode; 0 for null
	node  *yaml.Node
	line  int
	pairs []pair   // of a mapping, each key once, in the order first set
	items []*value // of a sequence
}

// pair is one key of a mapping and its value.
type pair struct {
	key   *value
	name  string // the key's text, if it is a scalar
	line  int
	value *value
}

// null is a value that is empty: a YAML null, or a value left out after an
// error.
func (v *value) null() bool {
	return v == nil || v.kind == 0
}

// tag returns the scalar's resolved tag ("!!str", "!!int", ...).
func (v *value) tag() string {
	if v.node == nil {
		return ""
	}
	return v.node.ShortTag()
}

// text returns the scalar's text, unescaped.
func (v *value) text() string {
	if v.node == nil {
		return ""
	}
	return v.node.Value
}

// oldBool reports whether v is one of the words that YAML 1.1, and so the
// service's YAML library, reads as a boolean when written plain (not
// quoted): y, yes, on, n, no, off and their capitalised forms, besides true
// and false. It returns the boolean.
func (v *value) oldBool() (b, ok bool) {
	if v.kind != yaml.ScalarNode {
		return false, false
	}
	if v.tag() == "!!bool" {
		b, ok = boolWords[v.text()]
		return b, ok
	}
	if v.node.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 || v.node.Tag == "!!str" && v.node.Style&yaml.TaggedStyle != 0 {
		return false, false
	}
	b, ok = boolWords[v.text()]
	return b, ok
}

var boolWords = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
	"true": true, "True": true, "TRUE": true,
	"on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false,
	"false": false, "False": false, "FALSE": false,
	"off": false, "Off": false, "OFF": false,
}

// describe names the kind of v for messages.
func describe(v *value) string {
	switch {
	case v.null():
		return "empty (null)"
	case v.kind == yaml.MappingNode:
		return "a mapping"
	case v.kind == yaml.SequenceNode:
		return "a list"
	}
	if _, ok := v.oldBool(); ok {
		return "the boolean " + clip(v.text())
	}
	switch v.tag() {
	case "!!str":
		return "the string " + strconv.Quote(clip(v.text()))
	case "!!int", "!!float":
		return "the number " + clip(v.text())
	}
	return "a value tagged " + clip(v.tag())
}

// clip shortens s for a message.
func clip(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// expander turns the node tree of one document into values.
type expander struct {
	p      *parser
	count  int
	full   bool
	active map[*yaml.Node]bool
}

func (x *expander) expand(n *yaml.Node) *value {
	if n == nil || x.full {
		return &value{}
	}
	x.count++
	if x.count > maxValues {
		x.full = true
		x.p.fail(n.Line, "", nil, "the file holds more than %d values once its aliases are expanded; write the values out instead of nesting aliases", maxValues)
		return &value{line: n.Line}
	}
	switch n.Kind {
	case yaml.AliasNode:
		target := n.Alias
		if target == nil {
			return &value{line: n.Line}
		}
		if x.active[target] {
			x.p.fail(n.Line, "", nil, "the alias *%s refers to a value that contains the alias itself", clip(n.Value))
			return &value{line: n.Line}
		}
		x.active[target] = true
		v := x.expand(target)
		delete(x.active, target)
		return v
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return &value{node: n, line: n.Line}
		}
		return &value{kind: yaml.ScalarNode, node: n, line: n.Line}
	case yaml.SequenceNode:
		v := &value{kind: yaml.SequenceNode, node: n, line: n.Line}
		for _, c := range n.Content {
			v.items = append(v.items, x.expand(c))
		}
		return v
	case yaml.MappingNode:
		return x.mapping(n)
	}
	return &value{line: n.Line}
}

// mapping expands a mapping node: its merge keys are applied where they
// stand, and a key written twice is an error (the service's YAML library
// would keep the last silently; a key given twice is a mistake).
func (x *expander) mapping(n *yaml.Node) *value {
	v := &value{kind: yaml.MappingNode, node: n, line: n.Line}
	at := map[string]int{}      // a key's index in v.pairs
	written := map[string]int{} // the line a key is written on
	set := func(p pair) {
		if p.key.kind != yaml.ScalarNode {
			v.pairs = append(v.pairs, p)
			return
		}
		if i, ok := at[p.name]; ok {
			v.pairs[i] = p
			return
		}
		at[p.name] = len(v.pairs)
		v.pairs = append(v.pairs, p)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		key := x.expand(kn)
		if key.kind == yaml.ScalarNode && key.tag() == "!!merge" {
			merged := x.expand(vn)
			switch merged.kind {
			case yaml.MappingNode:
				for _, p := range merged.pairs {
					set(p)
				}
			case yaml.SequenceNode:
				// Of several mappings, the first that has a key sets it.
				for j := len(merged.items) - 1; j >= 0; j-- {
					m := merged.items[j]
					if m.kind != yaml.MappingNode {
						x.p.fail(m.line, "", nil, "a merge key (<<) takes a mapping or a list of mappings; item %d is %s", j, describe(m))
						continue
					}
					for _, p := range m.pairs {
						set(p)
					}
				}
			default:
				x.p.fail(kn.Line, "", nil, "a merge key (<<) takes a mapping or a list of mappings, not %s", describe(merged))
			}
			continue
		}
		p := pair{key: key, line: kn.Line, value: x.expand(vn)}
		if key.kind == yaml.ScalarNode {
			p.name = key.text()
			if first, dup := written[p.name]; dup {
				x.p.fail(kn.Line, "", nil, "the key %q is given twice in one mapping (first at line %d); each key may appear once", clip(p.name), first)
				continue
			}
			written[p.name] = kn.Line
		}
		set(p)
	}
	return v
}

var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// parserProblems are the messages of errors of the YAML parser whose
// lines it counts from 0 rather than from 1.
var parserProblems = map[string]bool{
	"did not find expected <document start>": true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
	"found undefined tag handle":             true,
	"did not find expected node content":     true,
	"did not find expected '-' indicator":    true,
	"did not find expected key":              true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
}

// document reads the first YAML document of data and expands it. The
// service reads only the first document of a file; the rest is ignored
// here too, with a warning. It returns nil after recording why there is
// no document to read.
func (p *parser) document(data []byte) (*value, bool) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := config.DecodeNode(dec, &doc); err == io.EOF {
		return &value{line: 1}, true
	} else if err != nil {
		p.syntax(data, err)
		return nil, false
	}
	var next yaml.Node
	if err := config.DecodeNode(dec, &next); err == nil {
		p.warn(next.Line, "", "a second YAML document starts here; only the first document of a file is read (the service reads only the first too): put each domain in a file of its own")
	} else if err != io.EOF {
		p.warn(lastLine(data), "", "the text after the first YAML document is not read (the service reads only the first document of a file)")
	}
	if len(doc.Content) == 0 {
		return &value{line: doc.Line}, true
	}
	x := &expander{p: p, active: map[*yaml.Node]bool{}}
	v := x.expand(doc.Content[0])
	return v, !x.full
}

// syntax records a YAML syntax error with its line, correcting the YAML
// library's count (from 0 for its parser's errors, none on the first
// line).
func (p *parser) syntax(data []byte, err error) {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
		if parserProblems[msg] {
			line++
		}
		line = min(line, lastLine(data))
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
		switch {
		case parserProblems[msg] || strings.HasPrefix(msg, "found ") || strings.HasPrefix(msg, "did not find ") || strings.HasPrefix(msg, "could not find ") || strings.HasPrefix(msg, "mapping values are not allowed") || strings.HasPrefix(msg, "block sequence entries are not allowed"):
			// Only an error on the first line is reported without one.
			line = 1
		case strings.HasPrefix(msg, "control characters are not allowed") || strings.HasPrefix(msg, "invalid "):
			line = badCharacter(data)
		}
	}
	p.fail(line, "", err, "the file is not valid YAML: %s", msg)
}

// badCharacter returns the line of the first byte of data that is not
// UTF-8 or is a character YAML does not allow, 0 if there is none.
func badCharacter(data []byte) int {
	line := 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return line
		case r == '\n':
			line++
		case r == '\t' || r == '\r' || r == 0x85:
		case r < 0x20 || r == 0x7f || 0x80 <= r && r < 0xa0 || 0xd800 <= r && r < 0xe000 || r == 0xfffe || r == 0xffff:
			return line
		}
		i += size
	}
	return 0
}

// yamlLines returns the number of lines of data as YAML counts them: a
// line feed, a carriage return (alone or before a line feed), NEL, LS
// and PS each end one. An empty last line is not counted.
func yamlLines(data []byte) int {
	n := 0
	last := rune(-1)
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch r {
		case '\n':
			if last != '\r' {
				n++
			}
		case '\r', 0x85, 0x2028, 0x2029:
			n++
		}
		last = r
		i += size
	}
	if last == -1 || last != '\n' && last != '\r' && last != 0x85 && last != 0x2028 && last != 0x2029 {
		n++
	}
	return max(n, 1)
}

// lastLine returns the number of the last line of data, not counting an
// empty one after a final line feed.
func lastLine(data []byte) int {
	n := bytes.Count(data, []byte("\n"))
	if len(data) == 0 || data[len(data)-1] != '\n' {
		n++
	}
	return max(n, 1)
}
