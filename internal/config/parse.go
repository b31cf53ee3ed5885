package config

import (
	"bytes"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice"
)

// MaxSize is the largest config file Parse and Load read, in bytes (1 MiB).
const MaxSize = 1 << 20

// MaxProblems is the most problems of one file reported, in the order of
// their lines; a last one then says how many more there are.
const MaxProblems = 100

// Parse reads a configuration from the bytes of a YAML file and validates
// it. The decoding is strict: an unknown key, a key given twice, a value of
// the wrong type, an anchor, alias or merge key (<<), a second YAML document
// and an empty file are errors. A file holding no document is an error, not
// the defaults: a config file emptied by mistake, or caught half written
// by a reload, must not silently replace every policy with the default one
// (Default is the configuration without a file). Keys left out take their
// defaults. Parse never reads files or the environment.
//
// The error lists every problem found, each an *Error with its line (see
// Errors), and wraps ErrInvalid; the Config is then the zero value.
func Parse(data []byte) (Config, error) {
	c, errs := parse(data)
	if len(errs) > 0 {
		return Config{}, join(errs)
	}
	return c, nil
}

// Load reads the config file at path and parses it (Parse). The problems
// of a file that was read name the file (Error.File); an error that the
// file could not be read is returned as it is and does not wrap
// ErrInvalid.
func Load(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return Config{}, err
	}
	c, errs := parse(data)
	if len(errs) > 0 {
		for _, e := range errs {
			e.File = path
		}
		return Config{}, join(errs)
	}
	return c, nil
}

// parser turns a YAML node tree into a Config, collecting problems.
type parser struct {
	errs []*Error
	// lines maps a field's path to the line of its key (or list item).
	lines map[string]int
	// failed holds the paths whose values could not be read; the checks of
	// the value skip problems on them, which would repeat the same mistake
	// as a misleading second one. failedUnder holds the paths that a
	// failed path is under.
	failed, failedUnder map[string]bool
}

func parse(data []byte) (Config, []*Error) {
	p := &parser{lines: map[string]int{}, failed: map[string]bool{}, failedUnder: map[string]bool{}}
	c := base()
	c.Version = version(data)
	if len(data) > MaxSize {
		p.fail(0, "", nil, "the file is more than %d bytes (1 MiB); a config this large is a mistake", MaxSize)
		return c, p.errs
	}
	if !p.text(data) {
		return c, p.errs
	}
	root := p.document(data)
	if root == nil {
		return c, p.errs
	}
	p.top(root, &c)
	for _, pr := range c.check() {
		if p.skip(pr) {
			continue
		}
		if pr.err.Line == 0 {
			pr.err.Line = p.line(pr.err.Path)
		}
		p.errs = append(p.errs, pr.err)
	}
	sort.SliceStable(p.errs, func(i, j int) bool {
		a, b := p.errs[i].Line, p.errs[j].Line
		return a != 0 && (b == 0 || a < b)
	})
	if n := len(p.errs); n > MaxProblems {
		p.errs = append(p.errs[:MaxProblems:MaxProblems], &Error{Msg: fmt.Sprintf("and %d more problems, not shown", n-MaxProblems)})
	}
	return c, p.errs
}

// fail records a problem at line on path.
func (p *parser) fail(line int, path string, cause error, format string, args ...any) {
	p.errs = append(p.errs, &Error{Line: line, Path: path, Msg: fmt.Sprintf(format, args...), Err: cause})
	p.mark(path)
}

// mark records that the value of path could not be read.
func (p *parser) mark(path string) {
	p.failed[path] = true
	for path != "" {
		path = parent(path)
		p.failedUnder[path] = true
	}
}

// skip reports whether a problem of the value concerns a path that could
// not be read: the path itself, a field under it or one it is under, in
// the problem's path or the paths it depends on. The value there is a
// default, or a policy was left out, so the problem would repeat an
// earlier one or mislead ("no policy is defined").
func (p *parser) skip(pr problem) bool {
	if p.touched(pr.err.Path) {
		return true
	}
	for _, d := range pr.deps {
		if p.touched(d) {
			return true
		}
	}
	return false
}

// touched reports whether path, a path it is under, or one under it
// failed.
func (p *parser) touched(path string) bool {
	if p.failedUnder[path] {
		return true
	}
	for path != "" {
		if p.failed[path] {
			return true
		}
		path = parent(path)
	}
	return false
}

// parent returns the path path is under, "" at the top. A quoted name
// with dots or brackets yields paths of no field on the way up, which
// match nothing.
func parent(path string) string {
	if i := strings.LastIndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return ""
}

// line returns the line of path's key, or of the nearest enclosing key
// that has one.
func (p *parser) line(path string) int {
	for ; path != ""; path = parent(path) {
		if l, ok := p.lines[path]; ok {
			return l
		}
	}
	return 0
}

var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// document decodes data's one YAML document and returns its top mapping,
// or nil after recording why there is none.
func (p *parser) document(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := decode(dec, &doc); err == io.EOF {
		p.fail(0, "", nil, "the file is empty (no YAML document); define at least one policy, or run without a config file for the defaults")
		return nil
	} else if err != nil {
		p.syntax(data, err)
		return nil
	}
	var next yaml.Node
	if err := decode(dec, &next); err == nil {
		p.fail(next.Line, "", nil, "a second YAML document starts here; a config file holds one document")
		return nil
	} else if err != io.EOF {
		p.syntax(data, err)
		return nil
	}
	if len(doc.Content) == 0 || isNull(doc.Content[0]) {
		p.fail(doc.Line, "", nil, "the file has no keys (an empty YAML document); define at least one policy, or run without a config file for the defaults")
		return nil
	}
	root := doc.Content[0]
	if !p.plain("", root) {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		p.fail(root.Line, "", nil, "the file is %s; want a mapping of the keys %s", describe(root), names(topFields))
		return nil
	}
	return root
}

// decode decodes the next document of dec into n.
func decode(dec *yaml.Decoder, n *yaml.Node) error { return DecodeNode(dec, n) }

// DecodeNode decodes the next YAML document of dec into n, for every file
// the service reads. The YAML parser is not expected to panic, but a
// config reload must not bring the service down if it does: a panic
// becomes a syntax error.
func DecodeNode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: the YAML parser failed on this file: %v", r)
		}
	}()
	return dec.Decode(n)
}

// syntax records a YAML syntax error. yaml.v3 counts the lines of its
// scanner's errors from 1 but those of its parser's from 0, and names no
// line for either on the first line (it prints a line only if the
// zero-based one is not 0); syntax corrects both, so that every syntax
// error has its line. Errors of another kind (an unknown anchor, too much
// nesting) name no line, and get none.
func (p *parser) syntax(data []byte, err error) {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
		if parserProblems[msg] {
			line++
		}
		// At the end of the file the scanner adds a line of its own.
		line = min(line, lastLine(data))
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
		if parserProblems[msg] || scannerProblem(msg) {
			line = 1
		}
	}
	p.fail(line, "", err, "the file is not valid YAML: %s", msg)
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

// parserProblems are the messages of the errors of yaml.v3's parser, whose
// lines it counts from 0.
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

// scannerProblem reports whether msg is the message of an error of
// yaml.v3's scanner.
func scannerProblem(msg string) bool {
	for _, prefix := range []string{"found ", "did not find ", "could not find ", "mapping values are not allowed", "block sequence entries are not allowed", "block mapping entries are not allowed"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

// text refuses what YAML does not allow in a file, invalid UTF-8 and
// control characters, which yaml.v3 refuses without a line; and the line
// breaks other than a line feed (with or without a carriage return before
// it), which YAML counts as line breaks but editors do not, so that the
// line of every problem is the line an editor shows.
func (p *parser) text(data []byte) bool {
	line, col := 1, 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			p.fail(line, "", nil, "the file is not UTF-8 text: column %d holds a byte that is not UTF-8", col)
			return false
		case r == '\n':
			line, col = line+1, 0
		case r == '\r' && i+1 < len(data) && data[i+1] == '\n', r == '\t':
		case r == '\r' || r == 0x85 || r == 0x2028 || r == 0x2029:
			p.fail(line, "", nil, "column %d holds U+%04X, a line break that editors do not show as one; end lines with a line feed (\\n or \\r\\n), or write the character escaped in a double-quoted string", col, r)
			return false
		case r < 0x20 || r == 0x7f || 0x80 <= r && r < 0xa0 || 0xd800 <= r && r < 0xe000 || r == 0xfffe || r == 0xffff:
			p.fail(line, "", nil, "column %d holds the control character U+%04X, which YAML does not allow; write it escaped in a double-quoted string", col, r)
			return false
		}
		i += size
		col++
	}
	return true
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" && n.Anchor == ""
}

// plain refuses an alias or an anchored node: every value of a config is
// written where it applies, so that each problem has the line of its value
// and no key can be given twice through an alias.
func (p *parser) plain(path string, n *yaml.Node) bool {
	switch {
	case n.Kind == yaml.AliasNode:
		p.fail(n.Line, path, nil, "is an alias (*%s); aliases and anchors are not supported: write the value out", n.Value)
		return false
	case n.Anchor != "":
		p.fail(n.Line, path, nil, "has an anchor (&%s); aliases and anchors are not supported: write the value out", n.Anchor)
		return false
	}
	return true
}

// describe names the kind of a node for messages. It never shows a string
// value: a string where a list or mapping belongs could be a secret.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!null":
		return "empty (null)"
	case "!!str":
		return "a string"
	case "!!bool":
		return "the boolean " + n.Value
	case "!!int", "!!float":
		if len(n.Value) > 40 {
			return "a number"
		}
		return "the number " + n.Value
	}
	if len(n.ShortTag()) > 40 {
		return "a value with a tag"
	}
	return "a value tagged " + n.ShortTag()
}

// field is one key of a mapping and the function that reads its value.
type field struct {
	name string
	read func(path string, v *yaml.Node)
}

func names(fs []field) string {
	var b strings.Builder
	for i, f := range fs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.name)
	}
	return b.String()
}

// each calls fn with every key of the mapping n in order, refusing a node
// that is not a mapping (an empty value is an empty mapping), a key that
// is not a plain string, a merge key and a key given twice.
func (p *parser) each(path string, n *yaml.Node, want string, fn func(key string, k, v *yaml.Node)) {
	if !p.plain(path, n) || isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		p.fail(n.Line, path, nil, "is %s; want %s", describe(n), want)
		return
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !p.plain(path, k) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.fail(k.Line, path, nil, "has a key that is %s; keys are names", describe(k))
			continue
		}
		switch k.ShortTag() {
		case "!!merge":
			p.fail(k.Line, path, nil, "has a merge key (<<); merge keys are not supported: write the keys out")
			continue
		case "!!null":
			p.fail(k.Line, path, nil, "has an empty key; keys are names")
			continue
		}
		kp := sub(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			p.fail(k.Line, kp, nil, "is given twice (first at line %d); each key may appear once", first)
			continue
		}
		seen[k.Value] = k.Line
		fn(k.Value, k, v)
	}
}

// fields reads the mapping n, whose keys are fs, and refuses other keys.
func (p *parser) fields(path string, n *yaml.Node, fs []field) {
	want := "a mapping of the keys " + names(fs)
	p.each(path, n, want, func(key string, k, v *yaml.Node) {
		kp := sub(path, key)
		for _, f := range fs {
			if f.name == key {
				p.lines[kp] = k.Line
				f.read(kp, v)
				return
			}
		}
		where := "at the top"
		if path != "" {
			where = "under " + path
		}
		hint := ""
		if s := suggest(key, fs); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		}
		p.fail(k.Line, kp, nil, "is not a known key%s; the keys %s are %s", hint, where, names(fs))
	})
}

// sub returns the path of key under path: "a.b", or a["x.y"] for a key
// that is not a plain name.
func sub(path, key string) string {
	if plainName(key) {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	return path + "[" + strconv.Quote(key) + "]"
}

func plainName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// suggest returns the known key closest to key, if it is within two edits.
func suggest(key string, fs []field) string {
	known := make([]string, len(fs))
	for i, f := range fs {
		known[i] = f.name
	}
	return Suggest(key, known)
}

// Suggest returns the key of known closest to key (compared in lower
// case), if it is within two edits, for a "did you mean" of an unknown key;
// "" if none is.
func Suggest(key string, known []string) string {
	if len(key) > 64 {
		return ""
	}
	best, dist := "", 3
	for _, k := range known {
		if d := editDistance(strings.ToLower(key), k); d < dist {
			best, dist = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// scalar refuses a node that is not a plain scalar with a value.
func (p *parser) scalar(path string, v *yaml.Node, want string) bool {
	if !p.plain(path, v) {
		return false
	}
	if v.Kind != yaml.ScalarNode || v.ShortTag() == "!!null" {
		p.fail(v.Line, path, nil, "is %s; want %s", describe(v), want)
		return false
	}
	return true
}

// str reads a non-empty string.
func (p *parser) str(path string, v *yaml.Node, want string) (string, bool) {
	if !p.scalar(path, v, want) {
		return "", false
	}
	if v.ShortTag() != "!!str" {
		p.fail(v.Line, path, nil, "is %s; want %s (a string: quote it)", describe(v), want)
		return "", false
	}
	if v.Value == "" {
		p.fail(v.Line, path, nil, "is an empty string; want %s, or leave the key out for its default", want)
		return "", false
	}
	return v.Value, true
}

// integer reads a whole number in [min, max].
func (p *parser) integer(path string, v *yaml.Node, lo, hi int64) (int64, bool) {
	want := fmt.Sprintf("a whole number from %d to %d", lo, hi)
	if !p.scalar(path, v, want) {
		return 0, false
	}
	var x int64
	if v.ShortTag() != "!!int" || v.Decode(&x) != nil {
		p.fail(v.Line, path, nil, "is %s; want %s", describe(v), want)
		return 0, false
	}
	if x < lo || x > hi {
		p.fail(v.Line, path, nil, "is %d; want %s", x, want)
		return 0, false
	}
	return x, true
}

// boolean reads true or false.
func (p *parser) boolean(path string, v *yaml.Node) (bool, bool) {
	if !p.scalar(path, v, "true or false") {
		return false, false
	}
	var b bool
	if v.ShortTag() != "!!bool" || v.Decode(&b) != nil {
		p.fail(v.Line, path, nil, "is %s; want true or false", describe(v))
		return false, false
	}
	return b, true
}

// duration reads a Go duration such as 50ms, 1m30s.
func (p *parser) duration(path string, v *yaml.Node, lo, hi time.Duration) (time.Duration, bool) {
	want := fmt.Sprintf("a duration from %s to %s", formatDuration(lo), formatDuration(hi))
	if !p.scalar(path, v, want) {
		return 0, false
	}
	if t := v.ShortTag(); t != "!!str" && t != "!!int" {
		p.fail(v.Line, path, nil, "is %s; want %s", describe(v), want)
		return 0, false
	}
	d, err := time.ParseDuration(v.Value)
	if err != nil {
		p.fail(v.Line, path, nil, "is %s, not a duration; want %s, written with a unit (ms, s, m, h), for example 50ms or 2s", quoteShort(v.Value), want)
		return 0, false
	}
	if d < lo || d > hi {
		p.fail(v.Line, path, nil, "is %s; want %s", formatDuration(d), want)
		return 0, false
	}
	return d, true
}

// quoteShort quotes a value for a message, cut to its first 64 bytes. A
// value holding '@' may be a URL with a password written in the wrong
// place (a cluster address, a limit): it is shown redacted if it parses as
// a URL, and not at all if not.
func quoteShort(s string) string {
	if strings.Contains(s, "@") {
		if u, err := url.Parse(s); err == nil && u.User != nil {
			s = redact(u)
		} else {
			return "(a value holding '@', not shown: it may hold a password)"
		}
	}
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}

// list reads a list of non-empty strings; an empty value is an empty list.
func (p *parser) list(path string, v *yaml.Node, want string) ([]string, bool) {
	if !p.plain(path, v) {
		return nil, false
	}
	if isNull(v) {
		return nil, true
	}
	if v.Kind != yaml.SequenceNode {
		p.fail(v.Line, path, nil, "is %s; want a list of %s", describe(v), want)
		return nil, false
	}
	out := make([]string, 0, len(v.Content))
	ok := true
	for i, item := range v.Content {
		ip := index(path, i)
		p.lines[ip] = item.Line
		s, good := p.str(ip, item, want)
		ok = ok && good
		out = append(out, s)
	}
	return out, ok
}

// Descriptions of the values fields want, for messages.
const (
	wantAddr      = `an address host:port, for example ":8080" or "127.0.0.1:9090"`
	wantDial      = `an address host:port, for example "10.0.0.1:6379"`
	wantPath      = `a file path, for example "/etc/sluice/tokens"`
	wantEnvoyPath = `the path of an envoyproxy/ratelimit config file or directory, for example "/etc/ratelimit/config"`
	wantEnv       = `the name of an environment variable, for example "SLUICE_TOKENS"`
	wantName      = `a name`
	wantURL       = `a URL`
	wantLimit     = `a limit "capacity tokens/period", for example "100 10/s"`
)

var topFields = []field{{name: "listen"}, {name: "auth"}, {name: "store"}, {name: "guard"}, {name: "policies"}, {name: "envoy"}}

func (p *parser) top(n *yaml.Node, c *Config) {
	fs := []field{
		{"listen", func(path string, v *yaml.Node) { p.listen(path, v, &c.Listen) }},
		{"auth", func(path string, v *yaml.Node) { p.auth(path, v, &c.Auth) }},
		{"store", func(path string, v *yaml.Node) { p.store(path, v, &c.Store) }},
		{"guard", func(path string, v *yaml.Node) { p.guard(path, v, &c.Guard) }},
		{"policies", func(path string, v *yaml.Node) { p.policies(path, v, c) }},
		{"envoy", func(path string, v *yaml.Node) { p.envoy(path, v, &c.Envoy) }},
	}
	p.fields("", n, fs)
}

// setStr returns a field reading a string into dst.
func (p *parser) setStr(name, want string, dst *string) field {
	return field{name, func(path string, v *yaml.Node) {
		if s, ok := p.str(path, v, want); ok {
			*dst = s
		}
	}}
}

func (p *parser) setInt(name string, lo, hi int64, dst *int) field {
	return field{name, func(path string, v *yaml.Node) {
		if x, ok := p.integer(path, v, lo, hi); ok {
			*dst = int(x)
		}
	}}
}

func (p *parser) setDuration(name string, lo, hi time.Duration, dst *time.Duration) field {
	return field{name, func(path string, v *yaml.Node) {
		if d, ok := p.duration(path, v, lo, hi); ok {
			*dst = d
		}
	}}
}

func (p *parser) listen(path string, n *yaml.Node, l *Listen) {
	p.fields(path, n, []field{
		p.setStr("http", wantAddr, &l.HTTP),
		p.setStr("grpc", wantAddr, &l.GRPC),
		p.setStr("admin", wantAddr, &l.Admin),
	})
}

func (p *parser) envoy(path string, n *yaml.Node, e *Envoy) {
	p.fields(path, n, []field{
		p.setStr("config", wantEnvoyPath, &e.Config),
		{"legacy_headers", func(path string, v *yaml.Node) {
			if b, ok := p.boolean(path, v); ok {
				e.LegacyHeaders = b
			}
		}},
	})
}

func (p *parser) auth(path string, n *yaml.Node, a *Auth) {
	p.fields(path, n, []field{
		p.setStr("bearer_tokens_file", wantPath, &a.BearerTokensFile),
		p.setStr("bearer_tokens_env", wantEnv, &a.BearerTokensEnv),
	})
}

func (p *parser) store(path string, n *yaml.Node, s *Store) {
	// The type decides which section applies and its defaults, wherever
	// the key is written; read it first. A second "type" key is refused
	// by fields below.
	typeGiven := false
	if n.Kind == yaml.MappingNode && n.Anchor == "" {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Anchor != "" || k.ShortTag() != "!!str" || k.Value != "type" {
				continue
			}
			typeGiven = true
			tp := sub(path, "type")
			p.lines[tp] = k.Line
			t, ok := p.str(tp, n.Content[i+1], "memory, redis or postgres")
			if !ok {
				break
			}
			switch StoreType(t) {
			case StoreMemory:
			case StoreRedis:
				s.Type, s.Memory = StoreRedis, MemoryStore{}
				s.Redis.Prefix = DefaultRedisPrefix
				s.Redis.Batch, s.Redis.Pipelines = DefaultRedisBatch, DefaultRedisPipelines
			case StorePostgres:
				s.Type, s.Memory = StorePostgres, MemoryStore{}
				s.Postgres.Schema, s.Postgres.Table = DefaultSchema, DefaultTable
				s.Postgres.StatementTimeout, s.Postgres.LockTimeout = DefaultStatementTimeout, DefaultLockTimeout
				s.Postgres.Batch, s.Postgres.Transactions = DefaultPGBatch, DefaultPGTransactions
			default:
				p.fail(n.Content[i+1].Line, tp, nil, "is %s; want memory, redis or postgres", quoteShort(t))
			}
			break
		}
	}
	section := func(t StoreType, read func(path string, v *yaml.Node)) func(string, *yaml.Node) {
		return func(sp string, v *yaml.Node) {
			if s.Type == t {
				read(sp, v)
				return
			}
			tp := sub(path, "type")
			if p.failed[tp] {
				p.mark(sp) // which section applies is not known
				return
			}
			dflt := ""
			if !typeGiven {
				dflt = " (the default)"
			}
			p.fail(p.lines[sp], sp, nil, "is given, but store.type is %s%s; set store.type: %s, or remove %s", s.Type, dflt, t, sp)
		}
	}
	p.fields(path, n, []field{
		{"type", func(string, *yaml.Node) {}},
		{"on_limit_change", func(path string, v *yaml.Node) {
			t, ok := p.str(path, v, "keep, scale or reset")
			if !ok {
				return
			}
			c, err := sluice.ParseConversion(t)
			if err != nil {
				p.fail(v.Line, path, nil, "is %s; want keep (the level carries over, up to the new capacity), scale (the level keeps its fraction of the capacity) or reset (the bucket starts full)", quoteShort(t))
				return
			}
			s.OnLimitChange = c
		}},
		p.setDuration("request_id_ttl", minRequestIDTTL, maxRequestIDTTL, &s.RequestIDTTL),
		{"memory", section(StoreMemory, func(path string, v *yaml.Node) { p.memory(path, v, &s.Memory) })},
		{"redis", section(StoreRedis, func(path string, v *yaml.Node) { p.redis(path, v, &s.Redis) })},
		{"postgres", section(StorePostgres, func(path string, v *yaml.Node) { p.postgres(path, v, &s.Postgres) })},
	})
}

func (p *parser) memory(path string, n *yaml.Node, m *MemoryStore) {
	p.fields(path, n, []field{
		p.setInt("max_keys", 1, maxMemoryKeys, &m.MaxKeys),
		{"overflow", func(path string, v *yaml.Node) {
			if s, ok := p.str(path, v, "refuse or evict-lru"); ok {
				m.Overflow = Overflow(s)
			}
		}},
		p.setInt("max_request_ids", minRequestIDs, maxMemoryKeys, &m.MaxRequestIDs),
		{"snapshot", func(path string, v *yaml.Node) {
			if s, ok := p.str(path, v, "a file path"); ok {
				m.Snapshot = s
			}
		}},
		p.setDuration("snapshot_max_age", time.Second, maxSnapshotAge, &m.SnapshotMaxAge),
	})
}

func (p *parser) redis(path string, n *yaml.Node, r *RedisStore) {
	p.fields(path, n, []field{
		{"url", func(path string, v *yaml.Node) {
			if s, ok := p.str(path, v, wantURL+` redis://host:port, rediss://host:port or unix:///path`); ok {
				r.URL = NewURL(s)
			}
		}},
		{"cluster", func(path string, v *yaml.Node) {
			if l, ok := p.list(path, v, wantDial); ok {
				r.Cluster = l
			}
		}},
		{"sentinel", func(path string, v *yaml.Node) {
			p.fields(path, v, []field{
				p.setStr("master", wantName, &r.Sentinel.Master),
				{"addrs", func(path string, v *yaml.Node) {
					if l, ok := p.list(path, v, wantDial); ok {
						r.Sentinel.Addrs = l
					}
				}},
			})
		}},
		p.setStr("username", wantName, &r.Username),
		p.setStr("password_env", wantEnv, &r.PasswordEnv),
		{"tls", func(path string, v *yaml.Node) {
			if b, ok := p.boolean(path, v); ok {
				r.TLS = b
			}
		}},
		p.setStr("prefix", `a key prefix, for example "sluice:"`, &r.Prefix),
		{"batch", func(path string, v *yaml.Node) {
			if x, ok := p.integer(path, v, 1, maxRedisBatch); ok {
				r.Batch = int(x)
			}
		}},
		{"pipelines", func(path string, v *yaml.Node) {
			if x, ok := p.integer(path, v, 1, maxRedisPipelines); ok {
				r.Pipelines = int(x)
			}
		}},
	})
}

func (p *parser) postgres(path string, n *yaml.Node, pg *PostgresStore) {
	p.fields(path, n, []field{
		{"url", func(path string, v *yaml.Node) {
			if s, ok := p.str(path, v, wantURL+` postgres://host:port/database`); ok {
				pg.URL = NewURL(s)
			}
		}},
		p.setStr("schema", "an identifier", &pg.Schema),
		p.setStr("table", "an identifier", &pg.Table),
		p.setDuration("statement_timeout", minPGTimeout, maxPGTimeout, &pg.StatementTimeout),
		p.setDuration("lock_timeout", minPGTimeout, maxPGTimeout, &pg.LockTimeout),
		{"per_transaction_timeouts", func(path string, v *yaml.Node) {
			if b, ok := p.boolean(path, v); ok {
				pg.PerTransactionTimeouts = b
			}
		}},
		{"batch", func(path string, v *yaml.Node) {
			if x, ok := p.integer(path, v, 1, maxPGBatch); ok {
				pg.Batch = int(x)
			}
		}},
		{"transactions", func(path string, v *yaml.Node) {
			if x, ok := p.integer(path, v, 1, maxPGTransactions); ok {
				pg.Transactions = int(x)
			}
		}},
	})
}

func (p *parser) guard(path string, n *yaml.Node, g *Guard) {
	p.fields(path, n, []field{
		p.setDuration("timeout", minTimeout, maxTimeout, &g.Timeout),
		{"failure_mode", func(path string, v *yaml.Node) {
			if s, ok := p.str(path, v, "local, closed or open"); ok {
				g.FailureMode = FailureMode(s)
			}
		}},
		{"local_divisor", func(path string, v *yaml.Node) {
			if x, ok := p.integer(path, v, 1, maxLocalDivisor); ok {
				g.LocalDivisor = x
			}
		}},
		p.setInt("local_max_keys", 1, maxMemoryKeys, &g.LocalMaxKeys),
		{"breaker", func(path string, v *yaml.Node) {
			b := &g.Breaker
			p.fields(path, v, []field{
				p.setInt("consecutive_failures", 0, maxBreakerCount, &b.ConsecutiveFailures),
				p.setInt("failure_percent", 0, 100, &b.FailurePercent),
				p.setDuration("window", minWindow, maxWindow, &b.Window),
				p.setInt("min_calls", 1, maxBreakerCount, &b.MinCalls),
				p.setDuration("probe_interval", minProbe, maxProbe, &b.ProbeInterval),
			})
		}},
	})
}

func (p *parser) policies(path string, n *yaml.Node, c *Config) {
	p.each(path, n, "a mapping of policy names to policies", func(name string, k, v *yaml.Node) {
		pp := sub(path, name)
		p.lines[pp] = k.Line
		before := len(p.errs)
		if err := sluice.ValidatePolicy(name); err != nil {
			p.fail(k.Line, pp, err, "%s", trimSentinel(err, sluice.ErrInvalidPolicy))
		}
		pol := Policy{Name: name}
		var single, several bool
		if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" && v.Anchor == "" {
			p.fail(v.Line, pp, nil, "is a string; a policy is a mapping: write %s: {limit: %s}", name, quoteShort(v.Value))
		} else {
			p.fields(pp, v, []field{
				{"limit", func(path string, v *yaml.Node) {
					single = true
					if l, ok := p.limit(path, v); ok {
						pol.Limits = append(pol.Limits, l)
					}
				}},
				{"limits", func(path string, v *yaml.Node) {
					several = true
					items, ok := p.list(path, v, wantLimit)
					if !ok {
						return
					}
					for i := range items {
						ip := index(path, i)
						if l, ok := p.limit(ip, v.Content[i]); ok {
							pol.Limits = append(pol.Limits, l)
						}
					}
				}},
				{"shadow", func(path string, v *yaml.Node) {
					if b, ok := p.boolean(path, v); ok {
						pol.Shadow = b
					}
				}},
			})
		}
		switch {
		case len(p.errs) > before:
		case single && several:
			p.fail(k.Line, pp, nil, "has both limit and limits; write limit for one limit, or limits for several decided together")
		case !single && !several:
			p.fail(k.Line, pp, nil, `has no limit; write limit: "100 10/s", or limits: ["5 5/s", "20 20/d"] for several decided together`)
		}
		if len(p.errs) > before {
			return // left out of the value; its problems are reported
		}
		c.Policies = append(c.Policies, pol)
	})
}

// limit reads one limit in the ParseLimit form.
func (p *parser) limit(path string, v *yaml.Node) (sluice.Limit, bool) {
	s, ok := p.str(path, v, wantLimit)
	if !ok {
		return sluice.Limit{}, false
	}
	l, err := sluice.ParseLimit(s)
	if err != nil && strings.Contains(s, "@") {
		// ParseLimit's message would show the value, which may be a URL
		// with a password.
		p.fail(v.Line, path, err, "%s is not a limit; want %s", quoteShort(s), wantLimit)
		return sluice.Limit{}, false
	}
	if err != nil {
		msg := trimSentinel(err, sluice.ErrInvalidLimit)
		if !strings.Contains(msg, "for example") {
			msg += `; a limit is "capacity tokens/period", for example "100 10/s"`
		}
		if strings.Contains(msg, strconv.Quote(s)) {
			p.fail(v.Line, path, err, "is not a limit: %s", msg)
		} else {
			p.fail(v.Line, path, err, "%s is not a limit: %s", quoteShort(s), msg)
		}
		return sluice.Limit{}, false
	}
	return l, true
}

// trimSentinel returns err's message without the text of the sentinel it
// starts with.
func trimSentinel(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}

// Ranges of the values, besides those of package sluice.
const (
	minRequestIDTTL   = time.Second
	maxRequestIDTTL   = 24 * time.Hour
	maxMemoryKeys     = 1 << 30
	minRequestIDs     = 256 // one per shard of the memory store
	minTimeout        = time.Millisecond
	minPGTimeout      = time.Millisecond
	maxPGTimeout      = time.Minute
	maxPGBatch        = 1000 // pgstore.MaxBatch
	maxPGTransactions = 256
	maxRedisBatch     = 1000
	maxRedisPipelines = 64
	maxTimeout        = 10 * time.Second
	maxLocalDivisor   = 10000
	maxBreakerCount   = 1000000
	minWindow         = 100 * time.Millisecond
	maxWindow         = 10 * time.Minute
	minProbe          = 10 * time.Millisecond
	maxProbe          = 10 * time.Minute
	maxLimits         = 8
	maxSnapshotAge    = 366 * 24 * time.Hour
)
