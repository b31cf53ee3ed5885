package config

import (
	"fmt"
	"net/url"
	"strings"
)

// URL is a connection URL that may hold a password. It never prints one:
// String, every fmt verb and MarshalText show it redacted (the password,
// and the value of any query parameter whose name contains "pass",
// "secret" or "token", replaced by "xxxxx"). Value returns it whole, for
// the driver.
type URL struct{ raw string }

// NewURL returns the URL raw, unchecked (Config.Validate checks it).
func NewURL(raw string) URL { return URL{raw: raw} }

// Value returns the URL as written, password included.
func (u URL) Value() string { return u.raw }

// IsZero reports whether no URL is set.
func (u URL) IsZero() bool { return u.raw == "" }

// String returns the URL with its secrets redacted, or "(an invalid URL,
// not shown)" if it does not parse.
func (u URL) String() string {
	if u.raw == "" {
		return ""
	}
	p, err := url.Parse(u.raw)
	if err != nil {
		return "(an invalid URL, not shown)"
	}
	return redact(p)
}

// Format implements fmt.Formatter, so that no verb (%v, %+v, %#v, %s, %q,
// %x) prints the password: each formats String.
func (u URL) Format(f fmt.State, verb rune) {
	switch verb {
	case 'q':
		fmt.Fprintf(f, "%q", u.String())
	case 'x':
		fmt.Fprintf(f, "%x", u.String())
	case 'X':
		fmt.Fprintf(f, "%X", u.String())
	default:
		fmt.Fprint(f, u.String())
	}
}

// MarshalText implements encoding.TextMarshaler with String.
func (u URL) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// hasPassword reports whether the URL carries a password in its user
// information.
func (u URL) hasPassword() bool {
	p, err := url.Parse(u.raw)
	if err != nil || p.User == nil {
		return false
	}
	_, ok := p.User.Password()
	return ok
}

func redact(p *url.URL) string {
	q := p.Query()
	changed := false
	for k := range q {
		if secretParam(k) {
			for i := range q[k] {
				q[k][i] = "xxxxx"
			}
			changed = true
		}
	}
	c := *p
	if changed {
		c.RawQuery = q.Encode()
	}
	return c.Redacted()
}

func secretParam(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "pass") || strings.Contains(n, "secret") || strings.Contains(n, "token")
}
