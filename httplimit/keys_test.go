package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/sluicehq/sluice"
)

func prefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}

func TestClientIP(t *testing.T) {
	lb := prefixes("10.0.0.0/8", "2001:db8:ffff::/48")
	tests := []struct {
		name    string
		opts    ClientIPOptions
		remote  string
		header  map[string][]string
		want    string
		wantErr error
	}{
		{name: "peer ipv4", remote: "203.0.113.7:5555", want: "ip:203.0.113.7"},
		{name: "peer ipv6 grouped by /64", remote: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", want: "ip:2001:db8:1:2::/64"},
		{name: "peer ipv6 full address", opts: ClientIPOptions{IPv6PrefixLen: 128}, remote: "[2001:db8::1]:443", want: "ip:2001:db8::1"},
		{name: "peer ipv6 /56", opts: ClientIPOptions{IPv6PrefixLen: 56}, remote: "[2001:db8:1:2ff::1]:443", want: "ip:2001:db8:1:200::/56"},
		{name: "peer ipv4 /24", opts: ClientIPOptions{IPv4PrefixLen: 24}, remote: "203.0.113.7:1", want: "ip:203.0.113.0/24"},
		{name: "ipv4-mapped peer is ipv4", remote: "[::ffff:203.0.113.7]:80", want: "ip:203.0.113.7"},
		{name: "zone dropped", opts: ClientIPOptions{IPv6PrefixLen: 128}, remote: "[fe80::1%eth0]:80", want: "ip:fe80::1"},
		{name: "remote without port", remote: "203.0.113.7", want: "ip:203.0.113.7"},
		{name: "unix socket", remote: "@", wantErr: ErrNoKey},
		{name: "empty remote", remote: "", wantErr: ErrNoKey},
		{
			name: "forwarding header ignored by default", remote: "203.0.113.7:1",
			header: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}, "Forwarded": {"for=198.51.100.1"}},
			want:   "ip:203.0.113.7",
		},
		{
			name: "forwarding header ignored from an untrusted peer", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "203.0.113.7:1", header: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}},
			want: "ip:203.0.113.7",
		},
		{
			name: "xff one hop", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}},
			want: "ip:198.51.100.1",
		},
		{
			name: "xff spoofed entries left of the client are ignored", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"10.9.9.9, 1.2.3.4, 198.51.100.1, 10.0.0.3"}},
			want: "ip:198.51.100.1",
		},
		{
			name: "xff over several lines", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"1.2.3.4, 198.51.100.1", "10.0.0.3,"}},
			want: "ip:198.51.100.1",
		},
		{
			name: "xff with ports and brackets", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"[2001:db8:5:6::1]:4711, 10.0.0.3:80"}},
			want: "ip:2001:db8:5:6::/64",
		},
		{
			name: "xff ipv6 proxy hop trusted", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "[2001:db8:ffff::1]:1", header: map[string][]string{"X-Forwarded-For": {"198.51.100.1, 2001:db8:ffff::2"}},
			want: "ip:198.51.100.1",
		},
		{
			name: "xff all trusted: the leftmost proxy", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"10.0.0.5, 10.0.0.3"}},
			want: "ip:10.0.0.5",
		},
		{
			name: "xff missing: the proxy", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", want: "ip:10.0.0.1",
		},
		{
			name: "xff garbage from a trusted hop: that hop", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"198.51.100.1, unknown, 10.0.0.3"}},
			want: "ip:10.0.0.3",
		},
		{
			name: "forwarded", opts: ClientIPOptions{TrustedProxies: lb, Header: "forwarded"},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {`for=1.2.3.4, For="[2001:db8:7:8::9]:4711";proto=https;by=10.0.0.1, for=10.0.0.3`}},
			want: "ip:2001:db8:7:8::/64",
		},
		{
			name: "forwarded ignores x-forwarded-for", opts: ClientIPOptions{TrustedProxies: lb, Header: Forwarded},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {"for=198.51.100.1"}, "X-Forwarded-For": {"1.2.3.4"}},
			want: "ip:198.51.100.1",
		},
		{
			name: "x-forwarded-for ignores forwarded", opts: ClientIPOptions{TrustedProxies: lb},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {"for=1.2.3.4"}, "X-Forwarded-For": {"198.51.100.1"}},
			want: "ip:198.51.100.1",
		},
		{
			name: "forwarded unknown: the proxy", opts: ClientIPOptions{TrustedProxies: lb, Header: Forwarded},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {"for=unknown"}},
			want: "ip:10.0.0.1",
		},
		{
			name: "forwarded obfuscated: the proxy", opts: ClientIPOptions{TrustedProxies: lb, Header: Forwarded},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {`for="_gazonk"`}},
			want: "ip:10.0.0.1",
		},
		{
			name: "forwarded without for: the proxy", opts: ClientIPOptions{TrustedProxies: lb, Header: Forwarded},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {"proto=https;by=10.0.0.1"}},
			want: "ip:10.0.0.1",
		},
		{
			name: "forwarded with for twice: the proxy", opts: ClientIPOptions{TrustedProxies: lb, Header: Forwarded},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {"for=1.2.3.4;for=198.51.100.1"}},
			want: "ip:10.0.0.1",
		},
		{
			name: "forwarded: a quoted comma the client wrote does not matter", opts: ClientIPOptions{TrustedProxies: lb, Header: Forwarded},
			remote: "10.0.0.1:1", header: map[string][]string{"Forwarded": {`for="1.2.3.4, for=10.0.0.9", for=198.51.100.1`}},
			want: "ip:198.51.100.1",
		},
		{
			name: "trusted ipv4-mapped network", opts: ClientIPOptions{TrustedProxies: prefixes("::ffff:10.0.0.0/104")},
			remote: "10.0.0.1:1", header: map[string][]string{"X-Forwarded-For": {"198.51.100.1"}},
			want: "ip:198.51.100.1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := ClientIP(tt.opts)
			if err != nil {
				t.Fatalf("ClientIP(%+v): %v", tt.opts, err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tt.remote
			for k, vs := range tt.header {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got, err := key(r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("key() error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("key() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestClientIPInvalidOptions(t *testing.T) {
	for _, o := range []ClientIPOptions{
		{IPv4PrefixLen: 33},
		{IPv4PrefixLen: -1},
		{IPv6PrefixLen: 129},
		{Header: "X-Real-IP"},
		{TrustedProxies: []netip.Prefix{{}}},
	} {
		if _, err := ClientIP(o); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("ClientIP(%+v) error = %v, want %v", o, err, sluice.ErrInvalidOption)
		}
	}
}

func TestHeaderAndFirstKey(t *testing.T) {
	ip, err := ClientIP(ClientIPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failing := errors.New("token verifier down")
	tests := []struct {
		name    string
		fn      KeyFunc
		header  http.Header
		want    string
		wantErr error
	}{
		{name: "header", fn: HeaderKey("x-api-key"), header: http.Header{"X-Api-Key": {"k1", "k2"}}, want: "X-Api-Key:k1"},
		{name: "header missing", fn: HeaderKey("X-Api-Key"), wantErr: ErrNoKey},
		{name: "header empty", fn: HeaderKey("X-Api-Key"), header: http.Header{"X-Api-Key": {""}}, wantErr: ErrNoKey},
		{name: "first: header", fn: FirstKey(HeaderKey("X-Api-Key"), ip), header: http.Header{"X-Api-Key": {"k1"}}, want: "X-Api-Key:k1"},
		{name: "first: ip", fn: FirstKey(HeaderKey("X-Api-Key"), ip), want: "ip:192.0.2.1"},
		{name: "first: none", fn: FirstKey(HeaderKey("A"), HeaderKey("B")), wantErr: ErrNoKey},
		{name: "first: empty", fn: FirstKey(), wantErr: ErrNoKey},
		{
			name: "first: other error stops", wantErr: failing,
			fn: FirstKey(func(*http.Request) (string, error) { return "", failing }, ip),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil) // RemoteAddr 192.0.2.1:1234
			if tt.header != nil {
				r.Header = tt.header
			}
			got, err := tt.fn(r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("key() error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("key() = %q, want %q", got, tt.want)
			}
		})
	}
}
