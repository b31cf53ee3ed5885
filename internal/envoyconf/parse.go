package envoyconf

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/config"
)

// Bounds on what Parse and Load read.
const (
	// MaxFileSize is the largest config file read, in bytes (16 MiB).
	MaxFileSize = 16 << 20
	// MaxFiles is the most files Load reads from a directory.
	MaxFiles = 10000
	// MaxProblems is the most problems reported; a last one then says how
	// many more there are.
	MaxProblems = 100
)

// parser reads the files of one configuration, collecting problems and
// warnings.
type parser struct {
	file  string
	errs  []*Error
	warns []*Error
	// lines is the number of lines of the file being parsed, as YAML
	// counts them; 0 outside a file.
	lines int
}

// fail records a problem at line on path.
func (p *parser) fail(line int, path string, cause error, format string, args ...any) {
	line = p.clamp(line)
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...), Err: cause})
}

// warn records what the file allows but is likely not meant.
func (p *parser) warn(line int, path string, format string, args ...any) {
	line = p.clamp(line)
	p.warns = append(p.warns, &Error{File: p.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// clamp keeps line within the file: the YAML library places an empty
// value at the end of a file on the line after the last.
func (p *parser) clamp(line int) int {
	if p.lines > 0 {
		return min(line, p.lines)
	}
	return line
}

// fileRules is what one file defines.
type fileRules struct {
	file       string
	domain     string
	domainLine int
	descs      []*desc
}

// desc is one descriptor as written.
type desc struct {
	path                                 string
	line                                 int
	key, value                           string
	limit                                *rawLimit
	children                             []*desc
	shadow, quota, detailed, valueMetric bool
	share                                bool
	metadata                             map[string]any
	bad                                  bool // a problem of its own was reported
}

// rawLimit is a rate_limit block as written.
type rawLimit struct {
	unit      string
	perUnit   uint32
	perUnitOK bool // requests_per_unit was written (not empty)
	unlimited bool
	name      string
	replaces  []string
	bad       bool // a problem was reported: the block makes no rule
}

// The keys the service accepts, each where it is read. The service checks
// every key of a file against the union of these sets alone, wherever it
// stands: a key of another level is accepted and ignored.
var (
	topKeys        = []string{"domain", "descriptors"}
	descriptorKeys = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	rateLimitKeys  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces"}
	replacesKeys   = []string{"name"}
)

// knownKeys maps each key the service accepts to where it is read.
var knownKeys = map[string]string{
	"domain": "at the top of a file", "descriptors": "at the top of a file or in a descriptor",
	"key": "in a descriptor", "value": "in a descriptor", "rate_limit": "in a descriptor",
	"shadow_mode": "in a descriptor", "quota_mode": "in a descriptor", "detailed_metric": "in a descriptor",
	"value_to_metric": "in a descriptor", "share_threshold": "in a descriptor", "metadata": "in a descriptor",
	"unit": "in a rate_limit", "requests_per_unit": "in a rate_limit", "unlimited": "in a rate_limit",
	"name": "in a rate_limit or a replaces item", "replaces": "in a rate_limit",
}

// parse reads one file's bytes.
func (p *parser) parse(data []byte) *fileRules {
	if len(data) > MaxFileSize {
		p.fail(0, "", nil, "the file is %d bytes, more than %d (16 MiB)", len(data), MaxFileSize)
		return nil
	}
	p.lines = yamlLines(data)
	defer func() { p.lines = 0 }()
	root, ok := p.document(data)
	if !ok {
		return nil
	}
	f := &fileRules{file: p.file}
	switch {
	case root.null():
		p.fail(max(root.line, 1), "", nil, "the file has no domain (it holds no YAML mapping); a config file is a mapping of domain and descriptors")
		return nil
	case root.kind != yaml.MappingNode:
		p.fail(root.line, "", nil, "the file is %s; want a mapping of the keys %s", describe(root), strings.Join(topKeys, ", "))
		return nil
	}
	domainSet, domainOK := false, true
	before := len(p.errs)
	p.fields("", root, topKeys, func(key, path string, pr pair) {
		switch key {
		case "domain":
			domainSet = true
			f.domainLine = pr.line
			domainOK = p.str(path, pr.value, &f.domain)
		case "descriptors":
			f.descs = p.descriptors(path, pr.value)
		}
	})
	if f.domain == "" {
		keyFailed := false
		for _, e := range p.errs[before:] {
			keyFailed = keyFailed || e.Path == ""
		}
		switch {
		case keyFailed:
			// A key that is not a string may have been meant as domain.
		case !domainSet:
			p.fail(root.line, "", nil, "the file names no domain; add \"domain: NAME\" (the domain Envoy's rate-limit filter sends)")
		case domainOK:
			p.fail(f.domainLine, "domain", nil, "is empty; want the name of the domain Envoy's rate-limit filter sends")
		}
		return nil
	}
	return f
}

// fields reads the mapping m, whose keys are keys, calling read with each
// of them. A key the service knows from another level is ignored with a
// warning, as the service ignores it; any other key is an error.
func (p *parser) fields(path string, m *value, keys []string, read func(key, path string, pr pair)) {
	for _, pr := range m.pairs {
		if !p.name(path, pr) {
			continue
		}
		kp := sub(path, pr.name)
		if contains(keys, pr.name) {
			read(pr.name, kp, pr)
			continue
		}
		where := "at the top of a file"
		if path != "" {
			where = "under " + path
		}
		if belongs, ok := knownKeys[pr.name]; ok {
			p.warn(pr.line, kp, "is not read %s: %s belongs %s; the service ignores it here too", where, pr.name, belongs)
			p.check(kp, pr.value)
			continue
		}
		hint := ""
		if s := config.Suggest(pr.name, keys); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		}
		p.fail(pr.line, kp, nil, "is not a known key%s; the keys %s are %s", hint, where, strings.Join(keys, ", "))
	}
}

// name checks that the key of pr is a string, as the service requires.
func (p *parser) name(path string, pr pair) bool {
	_, isBool := pr.key.oldBool()
	if pr.key.kind != yaml.ScalarNode || pr.key.tag() != "!!str" || isBool {
		where := "the file"
		if path != "" {
			where = path
		}
		p.fail(pr.line, path, nil, "%s has a key that is %s; keys are names (the service refuses a key that is not a string)", where, describe(pr.key))
		return false
	}
	return true
}

// check refuses in a value that is otherwise ignored what the service
// refuses anywhere: a key it does not know, a list of something other
// than mappings, a number with a fraction or one too large for a 64-bit
// integer. What is under metadata is not checked.
func (p *parser) check(path string, v *value) {
	switch {
	case v.null():
	case v.kind == yaml.ScalarNode:
		p.scalar(path, v)
	case v.kind == yaml.SequenceNode:
		for i, item := range v.items {
			ip := index(path, i)
			if item.kind != yaml.MappingNode {
				p.fail(item.line, ip, nil, "is %s; the lists of this format hold mappings", describe(item))
				continue
			}
			p.check(ip, item)
		}
	case v.kind == yaml.MappingNode:
		for _, pr := range v.pairs {
			if !p.name(path, pr) {
				continue
			}
			kp := sub(path, pr.name)
			if _, ok := knownKeys[pr.name]; !ok {
				p.fail(pr.line, kp, nil, "is not a known key; the service refuses it")
				continue
			}
			if pr.name != "metadata" {
				p.check(kp, pr.value)
			}
		}
	}
}

// scalar refuses the scalars the service refuses wherever they stand: a
// number with a fraction, and an integer beyond 64 bits.
func (p *parser) scalar(path string, v *value) bool {
	switch v.tag() {
	case "!!float":
		p.fail(v.line, path, nil, "is the number %s, which the service refuses (it reads no fractions); quote it to make it a string, or write a whole number", clip(v.text()))
		return false
	case "!!int":
		var n int64
		if err := v.node.Decode(&n); err != nil {
			p.fail(v.line, path, nil, "is the number %s, which the service refuses (it is beyond 64 bits); quote it to make it a string", clip(v.text()))
			return false
		}
	case "!!binary":
		p.fail(v.line, path, nil, "is binary data (!!binary); want text")
		return false
	}
	return true
}

// str reads a string. A number or boolean is read as the text it is
// written as, as the service reads it.
func (p *parser) str(path string, v *value, dst *string) bool {
	switch {
	case v.null():
		*dst = ""
		return true
	case v.kind != yaml.ScalarNode:
		p.fail(v.line, path, nil, "is %s; want a string", describe(v))
		return false
	case !p.scalar(path, v):
		return false
	}
	*dst = v.text()
	return true
}

// boolean reads true or false, in any of the forms the service reads
// (yes, no, on, off, y and n too, unquoted).
func (p *parser) boolean(path string, v *value, dst *bool) bool {
	if v.null() {
		*dst = false
		return true
	}
	b, ok := v.oldBool()
	if !ok {
		p.fail(v.line, path, nil, "is %s; want true or false", describe(v))
		return false
	}
	*dst = b
	return true
}

// count reads requests_per_unit: a whole number from 0 to 2^32-1.
func (p *parser) count(path string, v *value, dst *uint32) bool {
	var n int64
	if v.kind != yaml.ScalarNode || v.tag() != "!!int" || v.node.Decode(&n) != nil || n < 0 || n > math.MaxUint32 {
		p.fail(v.line, path, nil, "is %s; want a whole number of requests from 0 to %d", describe(v), uint32(math.MaxUint32))
		return false
	}
	*dst = uint32(n)
	return true
}

// list calls each with every item of the list v, which must be mappings.
func (p *parser) list(path string, v *value, what, one string, each func(path string, item *value)) {
	if v.null() {
		return
	}
	if v.kind != yaml.SequenceNode {
		p.fail(v.line, path, nil, "is %s; want a list of %s", describe(v), what)
		return
	}
	for i, item := range v.items {
		ip := index(path, i)
		if item.kind != yaml.MappingNode {
			p.fail(max(item.line, v.line), ip, nil, "is %s; want %s", describe(item), one)
			continue
		}
		each(ip, item)
	}
}

// descriptors reads a list of descriptors.
func (p *parser) descriptors(path string, v *value) []*desc {
	var out []*desc
	p.list(path, v, "descriptors", "a descriptor: a mapping of key, value, rate_limit, descriptors and the like", func(ip string, item *value) {
		out = append(out, p.descriptor(ip, item))
	})
	return out
}

// descriptor reads one descriptor.
func (p *parser) descriptor(path string, m *value) *desc {
	d := &desc{path: path, line: m.line}
	before := len(p.errs)
	shareLine, keyRead := 0, true
	p.fields(path, m, descriptorKeys, func(key, kp string, pr pair) {
		v := pr.value
		switch key {
		case "key":
			keyRead = p.str(kp, v, &d.key)
		case "value":
			p.str(kp, v, &d.value)
		case "rate_limit":
			d.limit = p.rateLimit(kp, v)
		case "descriptors":
			d.children = p.descriptors(kp, v)
		case "shadow_mode":
			p.boolean(kp, v, &d.shadow)
		case "quota_mode":
			p.boolean(kp, v, &d.quota)
		case "detailed_metric":
			p.boolean(kp, v, &d.detailed)
		case "value_to_metric":
			p.boolean(kp, v, &d.valueMetric)
		case "share_threshold":
			shareLine = pr.line
			p.boolean(kp, v, &d.share)
		case "metadata":
			d.metadata = p.metadata(kp, v)
		}
	})
	if d.key == "" && keyRead {
		p.fail(m.line, path, nil, "has no key (or an empty one); every descriptor needs a key")
	}
	if d.share && !strings.Contains(composite(d.key, d.value), "*") {
		p.fail(shareLine, sub(path, "share_threshold"), nil, "is true, but the descriptor (key %q, value %q) has no wildcard (*); share_threshold shares one bucket among the values a wildcard matches", clip(d.key), clip(d.value))
	}
	// A problem under rate_limit is the rule's own; one elsewhere in the
	// descriptor (its key, its flags) makes no rule either.
	for _, e := range p.errs[before:] {
		if !strings.HasPrefix(e.Path, path+".descriptors[") {
			d.bad = true
		}
	}
	return d
}

// rateLimit reads a rate_limit block. An empty rate_limit is none, as in
// the service.
func (p *parser) rateLimit(path string, v *value) *rawLimit {
	if v.null() {
		return nil
	}
	l := &rawLimit{}
	if v.kind != yaml.MappingNode {
		p.fail(v.line, path, nil, "is %s; want a mapping of the keys %s", describe(v), strings.Join(rateLimitKeys, ", "))
		l.bad = true
		return l
	}
	before := len(p.errs)
	unitLine, perUnitLine, unitSet, unitRead := v.line, v.line, false, true
	var replacesLines []int
	p.fields(path, v, rateLimitKeys, func(key, kp string, pr pair) {
		switch key {
		case "unit":
			unitLine, unitSet = pr.line, true
			unitRead = p.str(kp, pr.value, &l.unit)
		case "requests_per_unit":
			perUnitLine = pr.line
			if !pr.value.null() {
				l.perUnitOK = p.count(kp, pr.value, &l.perUnit)
			}
		case "unlimited":
			p.boolean(kp, pr.value, &l.unlimited)
		case "name":
			p.str(kp, pr.value, &l.name)
		case "replaces":
			p.list(kp, pr.value, "replaces items", "a replaces item: a mapping of name", func(ip string, item *value) {
				name := ""
				p.fields(ip, item, replacesKeys, func(_, np string, npr pair) {
					p.str(np, npr.value, &name)
				})
				l.replaces = append(l.replaces, name)
				replacesLines = append(replacesLines, item.line)
			})
		}
	})
	_, unitOK := unitOf(l.unit)
	switch {
	case !unitRead:
		// Reported already.
	case l.unlimited && unitOK:
		p.fail(unitLine, sub(path, "unit"), nil, "is %q, but the rate_limit is unlimited; an unlimited rate_limit takes no unit (the service refuses both)", clip(l.unit))
	case l.unlimited:
		if unitSet && l.unit != "" {
			p.warn(unitLine, sub(path, "unit"), "%q is ignored: the rate_limit is unlimited", clip(l.unit))
		}
		if l.perUnitOK {
			p.warn(perUnitLine, sub(path, "requests_per_unit"), "is ignored: the rate_limit is unlimited")
		}
	case !unitSet || l.unit == "":
		p.fail(unitLine, sub(path, "unit"), nil, "is missing; want one of %s (in any case), or unlimited: true", unitList)
	case !unitOK:
		p.fail(unitLine, sub(path, "unit"), nil, "is %q, not a unit; want one of %s (in any case)", clip(l.unit), unitList)
	case !l.perUnitOK && len(p.errs) == before:
		p.warn(perUnitLine, sub(path, "requests_per_unit"), "is not given, so it is 0: every request is over the limit (as in the service); write requests_per_unit: 0 if that is meant")
	}
	for i, name := range l.replaces {
		ip := index(sub(path, "replaces"), i)
		switch {
		case name == "":
			p.fail(replacesLines[i], ip, nil, "has no name; each replaces item names the rate_limit it replaces")
		case name == l.name:
			p.fail(replacesLines[i], ip, nil, "names this rate_limit itself (%q); a rate_limit cannot replace itself", clip(name))
		}
	}
	l.bad = len(p.errs) > before
	return l
}

// metadata reads a descriptor's metadata: any mapping, which the service
// returns to Envoy and which decides nothing.
func (p *parser) metadata(path string, v *value) map[string]any {
	if v.null() {
		return nil
	}
	if v.kind != yaml.MappingNode {
		p.fail(v.line, path, nil, "is %s; want a mapping", describe(v))
		return nil
	}
	m, _ := p.plainValue(path, v).(map[string]any)
	return m
}

// plainValue turns v into Go values: maps, slices, strings, int64,
// float64, booleans and nil.
func (p *parser) plainValue(path string, v *value) any {
	switch {
	case v.null():
		return nil
	case v.kind == yaml.MappingNode:
		m := make(map[string]any, len(v.pairs))
		for _, pr := range v.pairs {
			if pr.key.kind != yaml.ScalarNode {
				p.fail(pr.line, path, nil, "has a key that is %s; keys are names", describe(pr.key))
				continue
			}
			m[pr.name] = p.plainValue(sub(path, pr.name), pr.value)
		}
		return m
	case v.kind == yaml.SequenceNode:
		s := make([]any, len(v.items))
		for i, item := range v.items {
			s[i] = p.plainValue(index(path, i), item)
		}
		return s
	}
	if b, ok := v.oldBool(); ok {
		return b
	}
	switch v.tag() {
	case "!!int":
		var n int64
		if v.node.Decode(&n) == nil {
			return n
		}
		var f float64
		if v.node.Decode(&f) == nil {
			return f
		}
	case "!!float":
		var f float64
		if v.node.Decode(&f) == nil {
			return f
		}
	}
	return v.text()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
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
	return path + "[" + strconv.Quote(clip(key)) + "]"
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
