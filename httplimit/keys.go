package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitcore"
)

// KeyFunc returns the key of the bucket a request is charged to. It returns
// an error wrapping ErrNoKey when the request carries nothing to key it by;
// any other error is answered as a failure of the application (500 by
// default). A KeyFunc is called concurrently and must not modify the
// request.
type KeyFunc func(r *http.Request) (string, error)

// Forwarding headers ClientIP can read.
const (
	// XForwardedFor is the de facto "X-Forwarded-For" header: a
	// comma-separated list of addresses, each proxy appending the address
	// of the peer it received the request from.
	XForwardedFor = "X-Forwarded-For"
	// Forwarded is the RFC 7239 "Forwarded" header; its "for" parameters
	// are read.
	Forwarded = "Forwarded"
)

// Default prefix lengths of ClientIP.
const (
	// DefaultIPv4PrefixLen keys an IPv4 client by its whole address.
	DefaultIPv4PrefixLen = 32
	// DefaultIPv6PrefixLen keys an IPv6 client by its /64, the smallest
	// network normally given to one subscriber, so that one client cannot
	// get a new bucket for each of the 2^64 addresses it can use.
	DefaultIPv6PrefixLen = 64
)

// ClientIPOptions configure ClientIP. The zero value keys a request by the
// address of the connection's peer (http.Request.RemoteAddr), an IPv6 peer
// by its /64, and trusts no forwarding header.
type ClientIPOptions struct {
	// TrustedProxies are the networks of the reverse proxies in front of
	// the server. Default: none, and then forwarding headers are ignored:
	// any client can write them. When the peer is in one of these
	// networks, the forwarding header is read right to left, skipping
	// addresses of trusted proxies, and the first other address is the
	// client. List every proxy hop (load balancer, ingress, CDN ranges);
	// a hop that is missing from the list is taken for the client.
	TrustedProxies []netip.Prefix
	// Header is the forwarding header the trusted proxies append to:
	// XForwardedFor (the default) or Forwarded. Only one is read, because
	// a proxy that maintains one usually passes the other through
	// unchanged from the client.
	Header string
	// IPv4PrefixLen is how many leading bits of an IPv4 address make the
	// key, 1 to 32. Default DefaultIPv4PrefixLen (32).
	IPv4PrefixLen int
	// IPv6PrefixLen is how many leading bits of an IPv6 address make the
	// key, 1 to 128. Default DefaultIPv6PrefixLen (64).
	IPv6PrefixLen int
}

// ClientIP returns a KeyFunc that keys a request by the address of its
// client, grouped by prefix: "ip:203.0.113.7" for an IPv4 client,
// "ip:2001:db8:1:2::/64" for an IPv6 one with the default prefix length.
// IPv4-mapped IPv6 addresses count as IPv4 and zones are dropped.
//
// Without trusted proxies the client is the connection's peer. With them,
// see ClientIPOptions.TrustedProxies. If a trusted proxy forwarded an entry
// that is not an address (Forwarded's "unknown" or an obfuscated
// identifier), or forwarded nothing, the key is that proxy's own address:
// such clients share one bucket. A RemoteAddr that is not an IP address (a
// Unix socket) is ErrNoKey.
//
// The error wraps sluice.ErrInvalidOption if a prefix length, a trusted
// network or the header is not valid.
func ClientIP(o ClientIPOptions) (KeyFunc, error) {
	c := &clientIP{v4: o.IPv4PrefixLen, v6: o.IPv6PrefixLen}
	if c.v4 == 0 {
		c.v4 = DefaultIPv4PrefixLen
	}
	if c.v6 == 0 {
		c.v6 = DefaultIPv6PrefixLen
	}
	if c.v4 < 1 || c.v4 > 32 {
		return nil, fmt.Errorf("%w: IPv4 prefix length %d is outside [1, 32]", sluice.ErrInvalidOption, o.IPv4PrefixLen)
	}
	if c.v6 < 1 || c.v6 > 128 {
		return nil, fmt.Errorf("%w: IPv6 prefix length %d is outside [1, 128]", sluice.ErrInvalidOption, o.IPv6PrefixLen)
	}
	switch http.CanonicalHeaderKey(o.Header) {
	case "", XForwardedFor:
		c.header, c.parse = XForwardedFor, parseNode
	case Forwarded:
		c.header, c.parse = Forwarded, parseForwardedFor
	default:
		return nil, fmt.Errorf("%w: forwarding header %q is neither %q nor %q", sluice.ErrInvalidOption, o.Header, XForwardedFor, Forwarded)
	}
	for _, p := range o.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: trusted proxy network %v is not a valid prefix", sluice.ErrInvalidOption, p)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		c.trusted = append(c.trusted, p.Masked())
	}
	return c.key, nil
}

type clientIP struct {
	trusted []netip.Prefix
	header  string
	parse   func(string) (netip.Addr, bool)
	v4, v6  int
}

func (c *clientIP) key(r *http.Request) (string, error) {
	cur, ok := parseRemoteAddr(r.RemoteAddr)
	if !ok {
		return "", fmt.Errorf("%w: remote address %q is not an IP address", ErrNoKey, r.RemoteAddr)
	}
	if !c.isTrusted(cur) {
		return c.keyOf(cur), nil
	}
	// Right to left: each entry was appended by the hop whose address is
	// cur, which is trusted; the first untrusted address is the client.
	lines := r.Header.Values(c.header)
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var elem string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				elem, line = line[j+1:], line[:j]
			} else {
				elem, line = line, ""
			}
			elem = strings.Trim(elem, " \t")
			if elem == "" {
				continue // empty list elements are allowed in HTTP lists
			}
			a, ok := c.parse(elem)
			if !ok {
				return c.keyOf(cur), nil
			}
			cur = a
			if !c.isTrusted(cur) {
				return c.keyOf(cur), nil
			}
		}
	}
	return c.keyOf(cur), nil
}

func (c *clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// keyOf returns the key of a normalized address: the address itself when
// the prefix length covers it, otherwise its network.
func (c *clientIP) keyOf(a netip.Addr) string {
	bits := c.v6
	if a.Is4() {
		bits = c.v4
	}
	if bits == a.BitLen() {
		return "ip:" + a.String()
	}
	p, _ := a.Prefix(bits) // bits is within [1, BitLen]: never fails
	return "ip:" + p.String()
}

// parseRemoteAddr parses http.Request.RemoteAddr, normally "host:port".
func parseRemoteAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	return parseNode(s)
}

// parseNode parses one address as X-Forwarded-For and Forwarded write it:
// "192.0.2.1", "192.0.2.1:8080", "2001:db8::1", "[2001:db8::1]" or
// "[2001:db8::1]:8080". The port, if any, is not checked (Forwarded allows
// obfuscated ports). The address is normalized: IPv4-mapped addresses
// become IPv4 and zones are dropped.
func parseNode(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}
	if rest, ok := strings.CutPrefix(s, "["); ok {
		host, port, ok := strings.Cut(rest, "]")
		if !ok || (port != "" && port[0] != ':') {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return normalize(a), true
	}
	if host, _, ok := strings.Cut(s, ":"); ok {
		if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func normalize(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// parseForwardedFor parses one element of a Forwarded header (RFC 7239
// section 4: "for=192.0.2.60;proto=http;by=203.0.113.43") and returns the
// address of its "for" parameter. An element that is malformed, has no
// "for", has it twice, or whose "for" is not an address ("unknown",
// "_hidden") is not ok.
func parseForwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for s := elem; ; {
		s = strings.TrimLeft(s, " \t")
		name, rest, ok := strings.Cut(s, "=")
		if !ok || name == "" || strings.ContainsAny(name, " \t;\"") {
			return netip.Addr{}, false
		}
		var value string
		if strings.HasPrefix(rest, `"`) {
			value, rest, ok = unquote(rest)
			if !ok {
				return netip.Addr{}, false
			}
		} else {
			end := strings.IndexByte(rest, ';')
			if end < 0 {
				end = len(rest)
			}
			value, rest = strings.TrimRight(rest[:end], " \t"), rest[end:]
			if value == "" || strings.ContainsAny(value, " \t\"") {
				return netip.Addr{}, false
			}
		}
		if strings.EqualFold(name, "for") {
			if found {
				return netip.Addr{}, false
			}
			node, found = value, true
		}
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			break
		}
		if rest[0] != ';' {
			return netip.Addr{}, false
		}
		s = rest[1:]
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseNode(node)
}

// unquote reads an HTTP quoted-string at the start of s and returns its
// value and the rest of s.
func unquote(s string) (value, rest string, ok bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], true
		case '\\':
			if i++; i == len(s) {
				return "", "", false
			}
			b.WriteByte(s[i])
		default:
			b.WriteByte(c)
		}
	}
	return "", "", false
}

// HeaderKey returns a KeyFunc that keys a request by the value of header
// name (the first one, as http.Header.Get reads it), as "Name:value" with
// the name in canonical form, so that its keys never collide with
// ClientIP's. A missing or empty header is ErrNoKey.
//
// The value is whatever the client sent: key by a header only behind
// something that authenticates it (an API key checked before this
// middleware), or a client can make up a new key, and so a new bucket,
// for every request.
func HeaderKey(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: header %s is missing or empty", ErrNoKey, name)
		}
		return name + ":" + v, nil
	}
}

// FirstKey returns a KeyFunc that tries fns in order and returns the first
// key found: FirstKey(HeaderKey("X-Api-Key"), ip) keys authenticated
// requests by their API key and the others by address. A function's error
// other than ErrNoKey is returned at once; if every function returns
// ErrNoKey, the errors are joined.
func FirstKey(fns ...KeyFunc) KeyFunc {
	in := make([]func(*http.Request) (string, error), len(fns))
	for i, fn := range fns {
		in[i] = fn
	}
	return limitcore.FirstKey(ErrNoKey, in)
}
