package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
)

// Validate reports every problem of c, each an *Error without a line (see
// Errors), joined; nil if there is none. Parse and Load validate what they
// return; Validate is for a Config built or changed in code. Version is not
// checked. Whether a store decides each limit exactly (sluice.CheckLimit)
// is not checked either: this package knows no store, and the service
// checks its limits against the store it built.
func (c *Config) Validate() error {
	var out []*Error
	for _, pr := range c.check() {
		out = append(out, pr.err)
	}
	return join(out)
}

// problem is a problem of a value, with the paths of the other fields it
// depends on.
type problem struct {
	err  *Error
	deps []string
}

type checker struct{ problems []problem }

func (ch *checker) add(path string, cause error, deps []string, format string, args ...any) {
	ch.problems = append(ch.problems, problem{
		err:  &Error{Path: path, Msg: fmt.Sprintf(format, args...), Err: cause},
		deps: deps,
	})
}

func (ch *checker) errorf(path, format string, args ...any) {
	ch.add(path, nil, nil, format, args...)
}

func (c *Config) check() []problem {
	ch := &checker{}
	ch.listen(c.Listen)
	ch.auth(c.Auth)
	ch.store(&c.Store)
	ch.guard(c.Guard)
	ch.policies(c.Policies, c.Envoy.Config != "")
	ch.envoy(c.Envoy)
	return ch.problems
}

func (ch *checker) listen(l Listen) {
	ls := []struct{ path, addr string }{{"listen.http", l.HTTP}, {"listen.grpc", l.GRPC}, {"listen.admin", l.Admin}}
	ok := make([]bool, len(ls))
	for i, x := range ls {
		ok[i] = ch.addr(x.path, x.addr, true)
	}
	for i := range ls {
		for j := range i {
			if ok[i] && ok[j] && sameListener(ls[i].addr, ls[j].addr) {
				ch.add(ls[i].path, nil, []string{ls[j].path}, "%q overlaps %s %q (the same port); the two need different ports", ls[i].addr, ls[j].path, ls[j].addr)
				break
			}
		}
	}
}

// addr checks a host:port address; port 0 (a free port) only for a
// listener.
func (ch *checker) addr(path, s string, listener bool) bool {
	if msg := checkAddr(s, listener); msg != "" {
		want := wantDial
		if listener {
			want = wantAddr
		}
		ch.errorf(path, "%s; want %s", msg, want)
		return false
	}
	return true
}

func checkAddr(s string, listener bool) string {
	if s == "" {
		return "is empty"
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return fmt.Sprintf("%s is not host:port (%s)", quoteShort(s), ae.Err)
		}
		return fmt.Sprintf("%s is not host:port", quoteShort(s))
	}
	lo := 1
	if listener {
		lo = 0
	}
	n, err := strconv.Atoi(port)
	if err != nil || strings.Trim(port, "0123456789") != "" || n < lo || n > 65535 {
		return fmt.Sprintf("%s has port %s; a port is a number from %d to 65535", quoteShort(s), quoteShort(port), lo)
	}
	if host == "" && !listener {
		return fmt.Sprintf("%s has no host", quoteShort(s))
	}
	if !validHost(host) {
		return fmt.Sprintf("%s has host %s, neither an IP address nor a host name", quoteShort(s), quoteShort(host))
	}
	return ""
}

// validHost reports whether h is empty, an IP address (with an optional
// IPv6 zone), or a DNS host name.
func validHost(h string) bool {
	if h == "" {
		return true
	}
	if ip, zone, _ := strings.Cut(h, "%"); net.ParseIP(ip) != nil && (zone == "" || strings.Contains(ip, ":")) {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
				return false
			}
		}
	}
	return true
}

// sameListener reports whether two listen addresses would take the same
// port: the same port, and the same host or one of them every interface.
func sameListener(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	na, _ := strconv.Atoi(pa)
	nb, _ := strconv.Atoi(pb)
	if na == 0 || na != nb {
		return false
	}
	return ha == hb || anyHost(ha) || anyHost(hb)
}

func anyHost(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }

// loopback reports whether a listen address accepts only local
// connections.
func loopback(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func (ch *checker) auth(a Auth) {
	if a.BearerTokensFile != "" && a.BearerTokensEnv != "" {
		ch.add("auth", nil, []string{"auth.bearer_tokens_file", "auth.bearer_tokens_env"},
			"sets both bearer_tokens_file and bearer_tokens_env; set one")
	}
	if a.BearerTokensFile != "" {
		ch.path("auth.bearer_tokens_file", a.BearerTokensFile)
	}
	if a.BearerTokensEnv != "" {
		ch.env("auth.bearer_tokens_env", a.BearerTokensEnv)
	}
}

func (ch *checker) path(path, s string) {
	switch {
	case len(s) > 4096:
		ch.errorf(path, "is %d bytes long; want %s of at most 4096 bytes", len(s), wantPath)
	case strings.ContainsRune(s, 0):
		ch.errorf(path, "holds a NUL byte; want %s", wantPath)
	}
}

func (ch *checker) env(path, s string) {
	ok := s != "" && len(s) <= 256
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
	}
	if !ok {
		ch.errorf(path, "is %s; want %s: a letter or _, then letters, digits or _, at most 256 bytes", quoteShort(s), wantEnv)
	}
}

// text checks a name that must be printable ASCII without spaces.
func (ch *checker) text(path, s string, max int) {
	ok := s != "" && len(s) <= max
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 0x21 && s[i] <= 0x7e
	}
	if !ok {
		ch.errorf(path, "is %s; want 1 to %d bytes of printable ASCII without spaces", quoteShort(s), max)
	}
}

func (ch *checker) store(s *Store) {
	if err := s.OnLimitChange.Validate(); err != nil {
		ch.errorf("store.on_limit_change", "is %d; want keep, scale or reset", uint8(s.OnLimitChange))
	}
	ch.duration("store.request_id_ttl", s.RequestIDTTL, minRequestIDTTL, maxRequestIDTTL)
	switch s.Type {
	case StoreMemory, StoreRedis, StorePostgres:
	default:
		ch.errorf("store.type", "is %s; want memory, redis or postgres", quoteShort(string(s.Type)))
		return // which section applies is not known
	}
	sections := []struct {
		t    StoreType
		name string
		v    any
	}{{StoreMemory, "store.memory", s.Memory}, {StoreRedis, "store.redis", s.Redis}, {StorePostgres, "store.postgres", s.Postgres}}
	for _, sec := range sections {
		if sec.t != s.Type && !reflect.ValueOf(sec.v).IsZero() {
			ch.add(sec.name, nil, []string{"store.type"}, "is set, but store.type is %s; %s applies to store.type %s only", s.Type, sec.name, sec.t)
		}
	}
	switch s.Type {
	case StoreMemory:
		ch.memory(s.Memory)
	case StoreRedis:
		ch.redis(s.Redis)
	case StorePostgres:
		ch.postgres(s.Postgres)
	}
}

func (ch *checker) duration(path string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		ch.errorf(path, "is %s; want a duration from %s to %s", formatDuration(d), formatDuration(lo), formatDuration(hi))
	}
}

func (ch *checker) integer(path string, x, lo, hi int64) {
	if x < lo || x > hi {
		ch.errorf(path, "is %d; want a whole number from %d to %d", x, lo, hi)
	}
}

func (ch *checker) memory(m MemoryStore) {
	ch.integer("store.memory.max_keys", int64(m.MaxKeys), 1, maxMemoryKeys)
	switch m.Overflow {
	case OverflowRefuse, OverflowEvictLRU:
	default:
		ch.errorf("store.memory.overflow", "is %s; want refuse (a new key at max_keys is refused) or evict-lru (the least recently used bucket is dropped, granting its key one extra burst)", quoteShort(string(m.Overflow)))
	}
	ch.integer("store.memory.max_request_ids", int64(m.MaxRequestIDs), minRequestIDs, maxMemoryKeys)
	if m.Snapshot != "" && (strings.ContainsRune(m.Snapshot, 0) || strings.HasSuffix(m.Snapshot, "/") || len(m.Snapshot) > 4096) {
		ch.errorf("store.memory.snapshot", "is %s; want the path of a file (not a directory), at most 4096 bytes", quoteShort(m.Snapshot))
	}
	if m.SnapshotMaxAge != 0 {
		if m.Snapshot == "" {
			ch.errorf("store.memory.snapshot_max_age", "is set, but store.memory.snapshot is not; set the snapshot file too, or remove it")
		}
		ch.duration("store.memory.snapshot_max_age", m.SnapshotMaxAge, time.Second, maxSnapshotAge)
	}
}

func (ch *checker) redis(r RedisStore) {
	const p = "store.redis"
	var set []string
	if !r.URL.IsZero() {
		set = append(set, "url")
	}
	if len(r.Cluster) > 0 {
		set = append(set, "cluster")
	}
	if r.Sentinel.Master != "" || len(r.Sentinel.Addrs) > 0 {
		set = append(set, "sentinel")
	}
	deps := []string{p + ".url", p + ".cluster", p + ".sentinel"}
	switch len(set) {
	case 0:
		ch.add(p, nil, deps, "names no server; set one of url (one server), cluster (seed addresses of a Redis Cluster) or sentinel (master and addrs)")
	case 1:
	default:
		ch.add(p, nil, deps, "sets %s; set exactly one of url, cluster and sentinel", strings.Join(set, " and "))
	}
	if !r.URL.IsZero() {
		ch.redisURL(p+".url", r.URL)
		if r.Username != "" {
			ch.add(p+".username", nil, []string{p + ".url"}, "is set with url; a URL carries its user: redis://user:password@host:port")
		}
		if r.TLS {
			ch.add(p+".tls", nil, []string{p + ".url"}, "is set with url; for TLS to one server, use the rediss:// scheme")
		}
		if r.PasswordEnv != "" && r.URL.hasPassword() {
			ch.add(p+".password_env", nil, []string{p + ".url"}, "is set, but url holds a password too; keep one (password_env, so the password is not in the file)")
		}
	}
	seen := map[string]int{}
	for i, a := range r.Cluster {
		ip := index(p+".cluster", i)
		if ch.addr(ip, a, false) {
			if j, dup := seen[a]; dup {
				ch.errorf(ip, "%q repeats cluster[%d]", a, j)
			}
			seen[a] = i
		}
	}
	if r.Sentinel.Master != "" || len(r.Sentinel.Addrs) > 0 {
		sp := p + ".sentinel"
		if r.Sentinel.Master == "" {
			ch.errorf(sp+".master", "is missing; want the name the Sentinels monitor the primary under")
		} else {
			ch.text(sp+".master", r.Sentinel.Master, 256)
		}
		if len(r.Sentinel.Addrs) == 0 {
			ch.errorf(sp+".addrs", "is missing; want a list of %s", wantDial)
		}
		seen := map[string]int{}
		for i, a := range r.Sentinel.Addrs {
			ip := index(sp+".addrs", i)
			if ch.addr(ip, a, false) {
				if j, dup := seen[a]; dup {
					ch.errorf(ip, "%q repeats addrs[%d]", a, j)
				}
				seen[a] = i
			}
		}
	}
	if r.Username != "" {
		ch.text(p+".username", r.Username, 256)
	}
	if r.PasswordEnv != "" {
		ch.env(p+".password_env", r.PasswordEnv)
	}
	if r.Prefix == "" || len(r.Prefix) > 64 || strings.ContainsAny(r.Prefix, "{}") || !printable(r.Prefix) {
		ch.errorf(p+".prefix", "is %s; want 1 to 64 bytes of printable ASCII without spaces, '{' or '}' (the store adds a hash tag of its own)", quoteShort(r.Prefix))
	}
	ch.integer(p+".batch", int64(r.Batch), 1, maxRedisBatch)
	ch.integer(p+".pipelines", int64(r.Pipelines), 1, maxRedisPipelines)
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// redisURL checks a Redis URL's shape; go-redis checks its query
// parameters when the service builds the client. No message shows the
// URL as written: it may hold a password.
func (ch *checker) redisURL(path string, u URL) {
	const want = "redis://[user:password@]host[:port][/db], rediss://... for TLS, or unix://[user:password@]/path/to/socket"
	p, err := url.Parse(u.Value())
	if err != nil {
		ch.errorf(path, "is not a valid URL (not shown: it may hold a password; a password with reserved characters must be percent-encoded); want %s", want)
		return
	}
	switch p.Scheme {
	case "redis", "rediss":
		if p.Opaque != "" || p.Host == "" || p.Hostname() == "" {
			ch.errorf(path, "%s has no host; want %s", u, want)
			return
		}
		if port := p.Port(); port != "" {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				ch.errorf(path, "%s has port %q; a port is a number from 1 to 65535", u, port)
			}
		}
		if !validHost(p.Hostname()) {
			ch.errorf(path, "%s has host %s, neither an IP address nor a host name", u, quoteShort(p.Hostname()))
		}
		if db := strings.TrimPrefix(p.Path, "/"); db != "" {
			if n, err := strconv.Atoi(db); err != nil || n < 0 || strings.Trim(db, "0123456789") != "" {
				ch.errorf(path, "%s has the path %s; the path is a database number, for example /0", u, quoteShort(p.Path))
			}
		}
	case "unix":
		if p.Path == "" || p.Host != "" {
			ch.errorf(path, "%s has no socket path (unix:///path/to/socket, with three slashes); want %s", u, want)
		}
	case "":
		ch.errorf(path, "has no scheme; want %s", want)
	default:
		ch.errorf(path, "has the scheme %s; want %s", quoteShort(p.Scheme), want)
	}
	if p.Fragment != "" {
		ch.errorf(path, "has a fragment (#...); want %s", want)
	}
}

func (ch *checker) postgres(pg PostgresStore) {
	const p = "store.postgres"
	const want = "postgres://[user@]host[:port]/database[?param=value] (postgresql:// too)"
	if pg.URL.IsZero() {
		ch.errorf(p+".url", "is missing; want %s", want)
	} else if u, err := url.Parse(pg.URL.Value()); err != nil {
		ch.errorf(p+".url", "is not a valid URL (not shown: it may hold a password; a password with reserved characters must be percent-encoded); want %s", want)
	} else {
		switch {
		case u.Scheme != "postgres" && u.Scheme != "postgresql":
			if u.Scheme == "" {
				ch.errorf(p+".url", "has no scheme; want %s", want)
			} else {
				ch.errorf(p+".url", "has the scheme %s; want %s", quoteShort(u.Scheme), want)
			}
		case u.Opaque != "":
			ch.errorf(p+".url", "%s is not of the form %s", pg.URL, want)
		case u.Fragment != "":
			ch.errorf(p+".url", "has a fragment (#...); want %s", want)
		}
	}
	ch.ident(p+".schema", pg.Schema, 63)
	ch.ident(p+".table", pg.Table, 43)
	ch.duration(p+".statement_timeout", pg.StatementTimeout, minPGTimeout, maxPGTimeout)
	ch.duration(p+".lock_timeout", pg.LockTimeout, minPGTimeout, maxPGTimeout)
	ch.integer(p+".batch", int64(pg.Batch), 1, maxPGBatch)
	ch.integer(p+".transactions", int64(pg.Transactions), 1, maxPGTransactions)
}

// ident checks a PostgreSQL identifier as package pgstore takes it.
func (ch *checker) ident(path, s string, max int) {
	ok := s != "" && len(s) <= max
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
	}
	if !ok {
		ch.errorf(path, "is %s; want an identifier of 1 to %d bytes: an ASCII letter or _, then letters, digits or _", quoteShort(s), max)
	}
}

func (ch *checker) guard(g Guard) {
	ch.duration("guard.timeout", g.Timeout, minTimeout, maxTimeout)
	switch g.FailureMode {
	case FailLocal, FailClosed, FailOpen:
	default:
		ch.errorf("guard.failure_mode", "is %s; want local (decide against in-process buckets holding 1/local_divisor of each limit), closed (deny) or open (allow)", quoteShort(string(g.FailureMode)))
	}
	if g.LocalDivisor != 0 {
		ch.integer("guard.local_divisor", g.LocalDivisor, 1, maxLocalDivisor)
	}
	ch.integer("guard.local_max_keys", int64(g.LocalMaxKeys), 1, maxMemoryKeys)
	b := g.Breaker
	ch.integer("guard.breaker.consecutive_failures", int64(b.ConsecutiveFailures), 0, maxBreakerCount)
	ch.integer("guard.breaker.failure_percent", int64(b.FailurePercent), 0, 100)
	ch.duration("guard.breaker.window", b.Window, minWindow, maxWindow)
	ch.integer("guard.breaker.min_calls", int64(b.MinCalls), 1, maxBreakerCount)
	ch.duration("guard.breaker.probe_interval", b.ProbeInterval, minProbe, maxProbe)
}

func (ch *checker) envoy(e Envoy) {
	if e.Config != "" && strings.ContainsRune(e.Config, 0) {
		ch.errorf("envoy.config", "holds a NUL byte; want %s", wantEnvoyPath)
	}
}

// policies checks the named policies; with envoy rules (envoy.config
// set), a config may have none of its own.
func (ch *checker) policies(ps []Policy, envoy bool) {
	if len(ps) == 0 && !envoy {
		ch.errorf("policies", `no policy is defined; want at least one, for example policies: {api: {limit: "100 10/s"}}`)
	}
	seen := map[string]bool{}
	for _, pol := range ps {
		pp := sub("policies", pol.Name)
		if err := sluice.ValidatePolicy(pol.Name); err != nil {
			ch.add(pp, err, nil, "%s", trimSentinel(err, sluice.ErrInvalidPolicy))
		} else if seen[pol.Name] {
			ch.errorf(pp, "is defined twice")
		}
		seen[pol.Name] = true
		switch n := len(pol.Limits); {
		case n == 0:
			ch.errorf(pp, `has no limit; want one, for example "100 10/s", or up to %d decided together`, maxLimits)
		case n > maxLimits:
			ch.errorf(sub(pp, "limits"), "has %d limits; want at most %d", n, maxLimits)
		}
		for i, l := range pol.Limits {
			lp := index(sub(pp, "limits"), i)
			if err := l.Validate(); err != nil {
				ch.add(lp, err, nil, "%s", trimSentinel(err, sluice.ErrInvalidLimit))
				continue
			}
			for j := range i {
				if pol.Limits[j] == l {
					ch.errorf(lp, "%q repeats limits[%d]", l.String(), j)
					break
				}
			}
		}
	}
}
