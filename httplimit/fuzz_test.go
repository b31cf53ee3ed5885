package httplimit

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// FuzzClientIP feeds arbitrary client-written forwarding headers to
// ClientIP. Whatever the client writes: nothing panics; the key is a valid
// sluice key naming an address or network; an untrusted peer's headers are
// never read; and behind a trusted proxy the key is the address that proxy
// appended. Seeds (and any crashers) live in testdata/fuzz/FuzzClientIP.
func FuzzClientIP(f *testing.F) {
	for _, s := range []string{
		"", "203.0.113.7", "1.2.3.4, 10.0.0.2", "unknown", "[2001:db8::1]:80",
		`for="[2001:db8::1]:4711";proto=https`, `for="unterminated`, `for=1.2.3.4;for=5.6.7.8`,
		`for="\"quoted\\", for=10.0.0.9`, ",,,", "::ffff:10.0.0.1", "fe80::1%eth0",
	} {
		f.Add(s, uint8(0))
	}
	clients := []string{"198.51.100.1", "2001:db8:5:6::7", "::ffff:198.51.100.2", "203.0.113.250"}
	trusted := prefixes("10.0.0.0/8", "2001:db8:ffff::/48")
	xff, err := ClientIP(ClientIPOptions{TrustedProxies: trusted})
	if err != nil {
		f.Fatal(err)
	}
	fwd, err := ClientIP(ClientIPOptions{TrustedProxies: trusted, Header: Forwarded})
	if err != nil {
		f.Fatal(err)
	}
	plain, err := ClientIP(ClientIPOptions{})
	if err != nil {
		f.Fatal(err)
	}
	keyOf := func(s string) string {
		return (&clientIP{v4: DefaultIPv4PrefixLen, v6: DefaultIPv6PrefixLen}).keyOf(normalize(netip.MustParseAddr(s)))
	}

	f.Fuzz(func(t *testing.T, header string, sel uint8) {
		client := clients[int(sel)%len(clients)]
		request := func(remote string, h http.Header) *http.Request {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = remote
			r.Header = h
			return r
		}
		check := func(name string, fn KeyFunc, r *http.Request) string {
			t.Helper()
			key, err := fn(r)
			if err != nil {
				t.Fatalf("%s: key(%q) error: %v", name, r.Header, err)
			}
			if err := sluice.ValidateKey(key); err != nil {
				t.Fatalf("%s: key(%q) = %q: %v", name, r.Header, key, err)
			}
			rest, ok := strings.CutPrefix(key, "ip:")
			if !ok {
				t.Fatalf("%s: key(%q) = %q, want an ip: prefix", name, r.Header, key)
			}
			if _, err := netip.ParseAddr(rest); err != nil {
				if _, err := netip.ParsePrefix(rest); err != nil {
					t.Fatalf("%s: key(%q) = %q names neither an address nor a network", name, r.Header, key)
				}
			}
			return key
		}
		both := http.Header{"X-Forwarded-For": {header}, "Forwarded": {header}}

		// Nothing the client writes matters without trusted proxies, or
		// when the peer is not one.
		if got, want := check("plain", plain, request("10.0.0.1:1", both)), "ip:10.0.0.1"; got != want {
			t.Errorf("untrusted headers: key = %q, want %q", got, want)
		}
		if got, want := check("untrusted peer", xff, request("["+clients[1]+"]:1", both)), keyOf(clients[1]); got != want {
			t.Errorf("untrusted peer: key = %q, want %q", got, want)
		}
		if got, want := check("untrusted peer", fwd, request("["+clients[1]+"]:1", both)), keyOf(clients[1]); got != want {
			t.Errorf("untrusted peer: key = %q, want %q", got, want)
		}

		// Behind a trusted proxy: any result is well formed.
		check("xff", xff, request("10.0.0.1:1", both))
		check("forwarded", fwd, request("10.0.0.1:1", both))

		// The proxy appends the client's address to whatever the client
		// sent, on the same line or on a line of its own.
		want := keyOf(client)
		for _, h := range []http.Header{
			{"X-Forwarded-For": {header + ", " + client}},
			{"X-Forwarded-For": {header, client + ", 10.1.2.3"}},
		} {
			if got := check("xff", xff, request("10.0.0.1:1", h)); got != want {
				t.Errorf("key(%q) = %q, want %q", h, got, want)
			}
		}
		node := client
		if strings.Contains(client, ":") {
			node = `"[` + client + `]:4711"`
		}
		for _, h := range []http.Header{
			{"Forwarded": {header + ", for=" + node + ";proto=https"}},
			{"Forwarded": {header, "For=" + node + ", for=10.1.2.3"}},
		} {
			if got := check("forwarded", fwd, request("10.0.0.1:1", h)); got != want {
				t.Errorf("key(%q) = %q, want %q", h, got, want)
			}
		}
	})
}
