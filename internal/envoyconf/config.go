package envoyconf

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// Config is a loaded set of rate-limit rules: the domains of one or more
// files. It is immutable and safe for concurrent use.
type Config struct {
	domains  map[string]*node
	names    []string
	rules    []*Rule
	warnings []string
	files    []string
	version  string
}

// node is one configured descriptor; a domain's root node has only
// children.
type node struct {
	entry    Entry
	comp     string   // composite(entry.Key, entry.Value)
	parts    []string // comp split at its wildcards, nil without one
	share    bool     // share_threshold, with a wildcard
	line     int
	children map[string]*node // by comp
	wild     []*node          // the children with a wildcard, in the order written
	order    []*node          // every child, in the order written
	rule     *Rule
}

// child returns the child of n that a request entry matches, as the
// service looks it up: the child whose key and value are the entry's;
// else the first child, in the order written, whose wildcard pattern
// matches; else the child with the entry's key and no value. The service
// compares KEY_VALUE texts (see composite), so a child is found by the
// text of the entry's key, "_" and its value.
func (n *node) child(e Entry) *node {
	comp := e.Key + "_" + e.Value
	if c := n.children[comp]; c != nil {
		return c
	}
	for _, w := range n.wild {
		if glob(w.parts, comp) {
			return w
		}
	}
	return n.children[e.Key]
}

// viaWildcard reports whether the request entry e reaches n through n's
// wildcard rather than through its key and value or its key alone.
func (n *node) viaWildcard(e Entry) bool {
	if n.parts == nil {
		return false
	}
	comp := e.Key + "_" + e.Value
	return comp != n.comp && glob(n.parts, comp)
}

// glob reports whether s matches the pattern split at its wildcards into
// parts: s starts with the first part, ends with the last, and holds the
// others between them in order; each * matches any text, empty included.
func glob(parts []string, s string) bool {
	if len(parts) == 1 {
		return parts[0] == s
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return true
}

// Match returns the rule for one request descriptor of domain, as the
// service finds it: from the domain, each entry in turn selects a
// descriptor among those of the level (its key and value, else the first
// wildcard value that matches, else its key alone), and the search goes
// one level down per entry, never back up to try another choice. The rule
// is that of the descriptor the last entry selects, if that descriptor has
// a rate_limit; a rate_limit of a descriptor above it does not apply, and
// neither does one below it. It returns false if no rule applies (an
// unknown domain, no entries, a level without a match).
func (c *Config) Match(domain string, entries []Entry) (*Rule, bool) {
	if c == nil || len(entries) == 0 {
		return nil, false
	}
	n := c.domains[domain]
	if n == nil {
		return nil, false
	}
	for i, e := range entries {
		next := n.child(e)
		if next == nil {
			return nil, false
		}
		if i == len(entries)-1 {
			return next.rule, next.rule != nil
		}
		n = next
	}
	return nil, false
}

// Rules returns every rule, by domain name and then in the order written.
func (c *Config) Rules() []*Rule {
	if c == nil {
		return nil
	}
	return slices.Clone(c.rules)
}

// Domains returns the domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.names)
}

// Warnings returns what the files allow but are likely not meant, each as
// "FILE:LINE: PATH: MESSAGE": keys the service ignores where they stand,
// a rate_limit that denies everything because it has no
// requests_per_unit, a replaces that names no rule of its domain, files
// of a directory that are not read, and the like.
func (c *Config) Warnings() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.warnings)
}

// Files returns the files read, in the order read.
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.files)
}

// Version is a hash of the names and contents of the files read: 12
// hexadecimal digits, which change when any file does.
func (c *Config) Version() string {
	if c == nil {
		return ""
	}
	return c.version
}

// CheckLimits reports every rule whose limit store cannot decide exactly
// (sluice.CheckLimit): the Redis store, for one, cannot decide a large
// requests_per_unit per month or year. Each problem is an *Error naming
// the rule's file and line, wrapping sluice.ErrInvalidLimit with the
// bound exceeded; nil if the store decides every limit.
func (c *Config) CheckLimits(store sluice.Store) error {
	if c == nil {
		return nil
	}
	var errs []*Error
	for _, r := range c.rules {
		if r.Unlimited || r.Deny {
			continue
		}
		if err := sluice.CheckLimit(store, r.Limit); err != nil {
			errs = append(errs, &Error{File: r.File, Line: r.Line, Path: r.Policy,
				Msg: fmt.Sprintf("%d per %s (a bucket of %v) cannot be decided by the store: %v", r.RequestsPerUnit, r.Unit, r.Limit, err), Err: err})
		}
	}
	return join(errs)
}

// source is one file to parse.
type source struct {
	name string
	data []byte
}

// Parse reads the rules of one config file from its bytes; file names it
// in errors, warnings and Rule.File. The problems found are returned
// together (see Errors), each wrapping ErrInvalid; the Config is then nil.
func Parse(file string, data []byte) (*Config, error) {
	p := &parser{}
	return p.config([]source{{file, data}})
}

// MaxTotalSize is the most bytes Load reads from a directory (64 MiB).
const MaxTotalSize = 64 << 20

// Load reads the rules at path: a config file, or a directory of them.
//
// Of a directory, every file is read whatever its name, as the service
// reads every file of its runtime directory, and so is every file of its
// subdirectories; but not the hidden files and directories, whose names
// start with a dot. That is the service with RUNTIME_IGNOREDOTFILES set,
// which a Kubernetes ConfigMap volume needs: its files are links into a
// hidden directory (config.yaml -> ..data/config.yaml, ..data ->
// ..2024_01_01_00_00_00.0), read once here through the visible link. A
// link to a file is followed; a link to a directory, a dangling link, and
// anything that is not a regular file are not read, with a warning, as
// the service does not read them. A directory without any file to read
// is an error.
//
// The problems of the files are returned together (see Errors); an error
// reading the file system is returned as it is and does not wrap
// ErrInvalid.
func Load(path string) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	p := &parser{}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: %w", path, errNotFile)
		}
		data, err := readFile(path, MaxFileSize)
		if err != nil {
			return nil, err
		}
		return p.config([]source{{path, data}})
	}
	l := &lister{p: p}
	if err := l.dir(path, 0); err != nil {
		return nil, err
	}
	if len(l.files) == 0 && len(p.errs) == 0 {
		p.file = path
		p.fail(0, "", nil, "the directory holds no config file to read (hidden files, whose names start with a dot, are not read)")
	}
	return p.config(l.files)
}

// lister collects the files of a directory.
type lister struct {
	p     *parser
	files []source
	total int
}

// maxDepth bounds the nesting of directories Load reads.
const maxDepth = 16

func (l *lister) dir(dir string, depth int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		full := filepath.Join(dir, name)
		l.p.file = full
		mode := e.Type()
		if mode&fs.ModeSymlink != 0 {
			fi, err := os.Stat(full)
			switch {
			case err != nil:
				l.p.warn(0, "", "is a link to nothing that can be read (%v); not read, as the service does not read it", err)
				continue
			case fi.IsDir():
				l.p.warn(0, "", "is a link to a directory; not read, as the service does not read linked directories")
				continue
			}
			mode = fi.Mode().Type()
		}
		switch {
		case mode.IsDir():
			if depth+1 > maxDepth {
				l.p.fail(0, "", nil, "is a directory nested more than %d deep; not read", maxDepth)
				continue
			}
			if err := l.dir(full, depth+1); err != nil {
				return err
			}
		case mode.IsRegular():
			if len(l.files) == MaxFiles {
				l.p.fail(0, "", nil, "is beyond the %d files a directory of rules may hold; not read", MaxFiles)
				return nil
			}
			data, err := readFile(full, min(MaxFileSize, MaxTotalSize-l.total))
			if err != nil {
				return err
			}
			l.total += len(data)
			l.files = append(l.files, source{full, data})
		default:
			l.p.warn(0, "", "is not a regular file (%v); not read", mode)
		}
	}
	return nil
}

// readFile reads at most limit+1 bytes of the file at path: past limit the
// parser reports the file as too large.
func readFile(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > limit && limit < MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("the files of the directory are more than %d bytes (64 MiB) together", MaxTotalSize)}
	}
	return data, nil
}

// config parses the files and builds the configuration of all of them.
func (p *parser) config(files []source) (*Config, error) {
	rank := map[string]int{}
	var parsed []*fileRules
	h := sha256.New()
	for i, f := range files {
		rank[f.name] = i
		p.file = f.name
		if fr := p.parse(f.data); fr != nil {
			parsed = append(parsed, fr)
		}
		h.Write([]byte(strconv.Itoa(len(f.name)) + ":" + f.name + strconv.Itoa(len(f.data)) + ":"))
		h.Write(f.data)
	}
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		c.files = append(c.files, f.name)
	}
	c.version = hex.EncodeToString(h.Sum(nil))[:12]
	p.build(c, parsed)
	order := func(a, b *Error) int {
		if n := cmp.Compare(rank[a.File], rank[b.File]); n != 0 {
			return n
		}
		// A problem of no line (of the file as a whole) comes last.
		la, lb := a.Line, b.Line
		if la == 0 {
			la = int(^uint(0) >> 1)
		}
		if lb == 0 {
			lb = int(^uint(0) >> 1)
		}
		return cmp.Compare(la, lb)
	}
	if len(p.errs) > 0 {
		slices.SortStableFunc(p.errs, order)
		return nil, join(p.errs)
	}
	slices.SortStableFunc(p.warns, order)
	for _, w := range p.warns {
		c.warnings = append(c.warnings, w.Error())
	}
	return c, nil
}

// build makes the domains of the parsed files: a domain defined in two
// files is an error, as in the service without MERGE_DOMAIN_CONFIG.
func (p *parser) build(c *Config, files []*fileRules) {
	where := map[string]string{}
	byDomain := map[string][]*Rule{}
	for _, f := range files {
		p.file = f.file
		if first, dup := where[f.domain]; dup {
			p.fail(f.domainLine, "domain", nil, "%q is also the domain of %s; a domain is defined in one file (the service refuses it too, unless MERGE_DOMAIN_CONFIG is set, which is not supported)", clip(f.domain), first)
			continue
		}
		where[f.domain] = fmt.Sprintf("%s:%d", f.file, f.domainLine)
		root := &node{children: map[string]*node{}}
		var rules []*Rule
		p.level(f.domain, root, f.descs, nil, nil, &rules)
		c.domains[f.domain] = root
		c.names = append(c.names, f.domain)
		byDomain[f.domain] = rules
	}
	slices.Sort(c.names)
	policies := map[string]*Rule{}
	for _, d := range c.names {
		names := map[string]bool{}
		for _, r := range byDomain[d] {
			if r.Name != "" {
				names[r.Name] = true
			}
		}
		for _, r := range byDomain[d] {
			r.Policy = policyName(r.Domain, r.Path)
			if other, dup := policies[r.Policy]; dup {
				// Distinct paths have distinct names but for a collision of
				// 64-bit hashes.
				p.file = r.File
				p.fail(r.Line, r.path, nil, "the rule's policy name %s is also that of the rule at %s:%d; change one of the paths", r.Policy, other.File, other.Line)
			}
			policies[r.Policy] = r
			for _, name := range r.Replaces {
				if !names[name] {
					p.file = r.File
					p.warn(r.Line, r.path+".rate_limit.replaces", "names %q, but no rate_limit of the domain %q has that name; it replaces nothing", clip(name), clip(d))
				}
			}
			c.rules = append(c.rules, r)
		}
	}
}

// level adds the descriptors descs under parent, whose path from the
// domain is path (and nodes), collecting their rules.
func (p *parser) level(domain string, parent *node, descs []*desc, path []Entry, nodes []*node, rules *[]*Rule) {
	for _, d := range descs {
		if d.key == "" {
			continue
		}
		comp := composite(d.key, d.value)
		if prev, dup := parent.children[comp]; dup {
			if prev.entry == (Entry{d.key, d.value}) {
				p.fail(d.line, d.path, nil, "repeats the descriptor of line %d (key %q, value %q) at the same level; the service refuses this as a duplicate descriptor", prev.line, clip(d.key), clip(d.value))
			} else {
				p.fail(d.line, d.path, nil, "key %q value %q and the descriptor of line %d (key %q value %q) are both %q to the service, which finds a descriptor by its key and value joined with \"_\" and refuses them as duplicates", clip(d.key), clip(d.value), prev.line, clip(prev.entry.Key), clip(prev.entry.Value), clip(comp))
			}
			continue
		}
		n := &node{entry: Entry{d.key, d.value}, comp: comp, line: d.line, children: map[string]*node{}}
		if strings.Contains(comp, "*") {
			n.parts = strings.Split(comp, "*")
			n.share = d.share
			parent.wild = append(parent.wild, n)
		}
		parent.children[comp] = n
		parent.order = append(parent.order, n)
		np := append(path[:len(path):len(path)], n.entry)
		nn := append(nodes[:len(nodes):len(nodes)], n)
		if d.limit != nil && !d.limit.bad && !d.bad {
			if r := p.rule(domain, d, np, nn); r != nil {
				n.rule = r
				*rules = append(*rules, r)
			}
		}
		p.level(domain, n, d.children, np, nn, rules)
	}
}

// rule makes the rule of the descriptor d.
func (p *parser) rule(domain string, d *desc, path []Entry, nodes []*node) *Rule {
	l := d.limit
	r := &Rule{
		Domain: domain, Path: path, Name: l.name, Replaces: l.replaces,
		RequestsPerUnit: l.perUnit, Unlimited: l.unlimited,
		Shadow: d.shadow, Quota: d.quota, DetailedMetric: d.detailed, Metadata: d.metadata,
		File: p.file, Line: d.line, nodes: nodes, path: d.path,
	}
	if r.Unlimited {
		return r
	}
	u, _ := unitOf(l.unit)
	r.Unit = u.name
	if l.perUnit == 0 {
		r.Deny = true
		return r
	}
	n := int64(l.perUnit)
	r.Limit = sluice.Limit{Capacity: n, Rate: sluice.Per(n, u.period)}
	if err := r.Limit.Validate(); err != nil {
		p.fail(d.line, sub(d.path, "rate_limit"), err, "%d per %s is not a Sluice limit (capacity in [1, %d], period at most 366 days): %v", n, u.name, int64(sluice.MaxCapacity), err)
		return nil
	}
	return r
}

// errNotFile is returned for a path that is neither a file nor a
// directory.
var errNotFile = errors.New("not a regular file or a directory")
