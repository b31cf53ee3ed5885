package config

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Describe writes what c would run, for `sluice config check` and the
// service's start-up log: the addresses, the authentication, the store (its
// URLs redacted), the guard, and each policy with its limits in the
// ParseLimit form. It prints no secret: tokens are never in a Config, and
// passwords in URLs are replaced by "xxxxx". Warnings are not included.
func (c *Config) Describe(w io.Writer) error {
	var b strings.Builder
	c.describe(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// String returns what Describe writes.
func (c *Config) String() string {
	var b strings.Builder
	c.describe(&b)
	return b.String()
}

func (c *Config) describe(b *strings.Builder) {
	line := func(format string, args ...any) {
		fmt.Fprintf(b, format, args...)
		b.WriteByte('\n')
	}
	line("config version %s", c.Version)
	line("listen:   http %s, grpc %s, admin %s (metrics, health)", c.Listen.HTTP, c.Listen.GRPC, c.Listen.Admin)
	switch a := c.Auth; {
	case a.BearerTokensFile != "":
		line("auth:     bearer tokens from the file %s", a.BearerTokensFile)
	case a.BearerTokensEnv != "":
		line("auth:     bearer tokens from the environment variable %s", a.BearerTokensEnv)
	default:
		line("auth:     none: any client that reaches %s or %s may call the API", c.Listen.HTTP, c.Listen.GRPC)
	}
	s := c.Store
	switch s.Type {
	case StoreMemory:
		m := s.Memory
		kept := "not kept over a restart"
		if m.Snapshot != "" {
			kept = "kept over a restart in " + m.Snapshot
			if m.SnapshotMaxAge > 0 {
				kept += fmt.Sprintf(" if under %v old", m.SnapshotMaxAge)
			}
		}
		line("store:    memory (per process, %s), at most %d keys (overflow: %s), %d request IDs", kept, m.MaxKeys, m.Overflow, m.MaxRequestIDs)
	case StoreRedis:
		line("store:    redis %s, key prefix %q", redisTarget(s.Redis), s.Redis.Prefix)
		if s.Redis.Batch > 1 {
			line("          concurrent decisions share pipelines of up to %d, %d in flight", s.Redis.Batch, s.Redis.Pipelines)
		} else {
			line("          every decision sent on its own (batch: 1)")
		}
	case StorePostgres:
		pg := s.Postgres
		in := "the sessions"
		if pg.PerTransactionTimeouts {
			in = "each transaction"
		}
		line("store:    postgres %s, table %s.%s, statement timeout %s, lock timeout %s (set in %s)", pg.URL, pg.Schema, pg.Table, formatDuration(pg.StatementTimeout), formatDuration(pg.LockTimeout), in)
		if pg.Batch > 1 {
			line("          concurrent takes share transactions of up to %d takes, %d in flight", pg.Batch, pg.Transactions)
		} else {
			line("          every take in a transaction of its own (batch: 1)")
		}
	default:
		line("store:    %s", s.Type)
	}
	line("          request IDs remembered %s; on a limit change, %s", formatDuration(s.RequestIDTTL), conversion(s))
	g := c.Guard
	line("guard:    timeout %s, failure mode %s", formatDuration(g.Timeout), failureMode(g))
	line("          breaker %s", breaker(g.Breaker))
	line("policies:")
	width := 0
	for _, p := range c.Policies {
		width = max(width, min(len(p.Name), 24))
	}
	for _, p := range c.Policies {
		limits := make([]string, len(p.Limits))
		for i, l := range p.Limits {
			limits[i] = l.String()
		}
		text := strings.Join(limits, ", ")
		if len(limits) > 1 {
			text += " (decided together: allowed only if all allow)"
		}
		if p.Shadow {
			text += "; shadow: decided and counted, always allowed"
		}
		line("  %-*s  %s", width, p.Name, text)
	}
	if len(c.Policies) == 0 {
		line("  (none of its own)")
	}
	if e := c.Envoy; e.Config != "" {
		headers := "RateLimit and RateLimit-Policy"
		if e.LegacyHeaders {
			headers += ", and RateLimit-Limit, -Remaining and -Reset"
		}
		line("envoy:    rules from %s (envoyproxy/ratelimit format); headers %s", e.Config, headers)
	}
}

func redisTarget(r RedisStore) string {
	var extra []string
	if r.Username != "" {
		extra = append(extra, "user "+r.Username)
	}
	if r.PasswordEnv != "" {
		extra = append(extra, "password from $"+r.PasswordEnv)
	}
	if r.TLS {
		extra = append(extra, "TLS")
	}
	var s string
	switch r.RedisMode() {
	case "url":
		s = r.URL.String()
	case "cluster":
		s = "cluster of " + strings.Join(r.Cluster, " ")
	case "sentinel":
		s = fmt.Sprintf("primary %q through the Sentinels %s", r.Sentinel.Master, strings.Join(r.Sentinel.Addrs, " "))
	}
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

func conversion(s Store) string {
	switch s.OnLimitChange.String() {
	case "keep":
		return "keep the level (up to the new capacity)"
	case "scale":
		return "scale the level to the new capacity"
	case "reset":
		return "reset the bucket to full"
	}
	return s.OnLimitChange.String()
}

func failureMode(g Guard) string {
	switch g.FailureMode {
	case FailLocal:
		share := "the whole of each limit (local_divisor not set)"
		if g.LocalDivisor > 1 {
			share = fmt.Sprintf("1/%d of each limit", g.LocalDivisor)
		} else if g.LocalDivisor == 1 {
			share = "the whole of each limit"
		}
		return fmt.Sprintf("local: while the store cannot decide, each instance decides alone with %s, for at most %d keys", share, g.LocalMaxKeys)
	case FailClosed:
		return "closed: deny while the store cannot decide"
	case FailOpen:
		return "open: allow while the store cannot decide"
	}
	return string(g.FailureMode)
}

func breaker(b Breaker) string {
	var when []string
	if b.ConsecutiveFailures > 0 {
		when = append(when, fmt.Sprintf("after %d failures in a row", b.ConsecutiveFailures))
	}
	if b.FailurePercent > 0 {
		when = append(when, fmt.Sprintf("when %d%% of at least %d calls in %s fail", b.FailurePercent, b.MinCalls, formatDuration(b.Window)))
	}
	if len(when) == 0 {
		return "never opens (both triggers are off)"
	}
	return "opens " + strings.Join(when, ", or ") + "; probes the store every " + formatDuration(b.ProbeInterval) + " while open"
}

// warnTimeout is the guard timeout above which Warnings speaks.
const (
	warnTimeout  = 100 * time.Millisecond
	envoyTimeout = 20 * time.Millisecond // the default timeout of Envoy's rate-limit filter
)

// Warnings returns what c allows but is likely not meant, one sentence
// each, in a fixed order: a guard timeout above 100ms, failure mode open
// with a policy that looks like it protects authentication, failure mode
// local with a shared store and no local_divisor, a breaker that never
// opens, no authentication on an HTTP address reachable from the network,
// each shadow policy, and each limit that never refills. Whether a store
// decides every limit exactly is for the service to check against the
// store it built (sluice.CheckLimit).
func (c *Config) Warnings() []string {
	var out []string
	warn := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	g := c.Guard
	if c.Envoy.Config != "" && g.Timeout >= envoyTimeout {
		warn("guard.timeout is %s, and Envoy's rate-limit filter gives up after 20ms by default: a slow store is then decided by Envoy's failure_mode_deny, not by guard.failure_mode; keep guard.timeout under the filter's timeout",
			formatDuration(g.Timeout))
	} else if g.Timeout > warnTimeout {
		warn("guard.timeout is %s, above %s: callers with shorter deadlines (Envoy's rate-limit filter defaults to 20ms) give up first, so their requests fail instead of being decided by the failure mode, and the breaker does not count those calls",
			formatDuration(g.Timeout), formatDuration(warnTimeout))
	}
	if g.FailureMode == FailOpen {
		var auth []string
		for _, p := range c.Policies {
			if authLike(p.Name) {
				auth = append(auth, fmt.Sprintf("%q", p.Name))
			}
		}
		switch len(auth) {
		case 0:
		case 1:
			warn("guard.failure_mode is open and the policy %s looks like it protects authentication: during a store outage its limit does not hold, and guessing is unlimited; closed denies instead", auth[0])
		default:
			warn("guard.failure_mode is open and the policies %s look like they protect authentication: during a store outage their limits do not hold, and guessing is unlimited; closed denies instead", strings.Join(auth, ", "))
		}
	}
	if g.FailureMode == FailLocal && c.Store.Type.Shared() && g.LocalDivisor == 0 {
		warn("guard.local_divisor is not set: during a store outage each instance allows each key the whole limit, so N instances allow up to N times it; set it to the number of instances sharing the %s store (1 if there is one)", c.Store.Type)
	}
	if g.Breaker.ConsecutiveFailures == 0 && g.Breaker.FailurePercent == 0 {
		warn("guard.breaker never opens (consecutive_failures and failure_percent are 0): during an outage every request waits for the store up to guard.timeout")
	}
	var exposed []string
	for _, l := range []struct{ path, addr string }{{"listen.http", c.Listen.HTTP}, {"listen.grpc", c.Listen.GRPC}} {
		if !loopback(l.addr) {
			exposed = append(exposed, fmt.Sprintf("%s %q", l.path, l.addr))
		}
	}
	if !c.Auth.Enabled() && len(exposed) == 1 {
		warn("auth is not set and %s accepts connections from the network: any client that reaches it can spend any key's quota, and so deny others", exposed[0])
	} else if !c.Auth.Enabled() && len(exposed) == 2 {
		warn("auth is not set and %s and %s accept connections from the network: any client that reaches them can spend any key's quota, and so deny others", exposed[0], exposed[1])
	}
	for _, p := range c.Policies {
		if p.Shadow {
			warn("policy %q is in shadow mode: its denials are counted, and every request is allowed", p.Name)
		}
	}
	for _, p := range c.Policies {
		for _, l := range p.Limits {
			if l.Rate.Tokens == 0 {
				warn("policy %q: limit %q never refills: each key gets %d tokens in all, for as long as the store keeps its bucket", p.Name, l.String(), l.Capacity)
			}
		}
	}
	return out
}

// authLike reports whether a policy name has a word that names
// authentication (login, signin, auth, password, otp, mfa, 2fa ...).
func authLike(name string) bool {
	words := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return !('a' <= r && r <= 'z' || '0' <= r && r <= '9')
	})
	for _, w := range words {
		switch w {
		case "login", "logon", "signin", "auth", "authn", "authenticate", "password", "passwd", "otp", "totp", "mfa", "2fa":
			return true
		}
	}
	return false
}

// formatDuration writes d as time.Duration.String does, without zero
// minutes and seconds: 5m, 1h, 1h30m, 1m30s, 50ms.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
