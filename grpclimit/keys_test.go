package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
)

func TestPeerIP(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netipAddrPort(t, s)) }
	tests := []struct {
		name    string
		opts    grpclimit.PeerIPOptions
		addr    net.Addr // nil: no peer
		want    string
		wantErr error
	}{
		{name: "ipv4", addr: tcp("203.0.113.7:5555"), want: "ip:203.0.113.7"},
		{name: "ipv4 /24", opts: grpclimit.PeerIPOptions{IPv4PrefixLen: 24}, addr: tcp("203.0.113.7:5555"), want: "ip:203.0.113.0/24"},
		{name: "ipv6 /64", addr: tcp("[2001:db8:1:2:3:4:5:6]:443"), want: "ip:2001:db8:1:2::/64"},
		{name: "ipv6 /128", opts: grpclimit.PeerIPOptions{IPv6PrefixLen: 128}, addr: tcp("[2001:db8::6]:443"), want: "ip:2001:db8::6"},
		{name: "ipv4-mapped", addr: tcp("[::ffff:203.0.113.7]:1"), want: "ip:203.0.113.7"},
		{name: "udp", addr: &net.UDPAddr{IP: net.ParseIP("198.51.100.1"), Port: 1}, want: "ip:198.51.100.1"},
		{name: "other net.Addr with ip:port", addr: fakeAddr("198.51.100.1:1"), want: "ip:198.51.100.1"},
		{name: "unix socket", addr: &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}, wantErr: grpclimit.ErrNoKey},
		{name: "no peer", wantErr: grpclimit.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := grpclimit.PeerIP(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if tt.addr != nil {
				ctx = peer.NewContext(ctx, &peer.Peer{Addr: tt.addr})
			}
			got, err := key(ctx, "/s/M")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("key() error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("key() = %q, want %q", got, tt.want)
			}
		})
	}
	for _, o := range []grpclimit.PeerIPOptions{{IPv4PrefixLen: 33}, {IPv6PrefixLen: -1}, {IPv6PrefixLen: 129}} {
		if _, err := grpclimit.PeerIP(o); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("PeerIP(%+v) error = %v, want %v", o, err, sluice.ErrInvalidOption)
		}
	}
}

type fakeAddr string

func (a fakeAddr) Network() string { return "fake" }
func (a fakeAddr) String() string  { return string(a) }

func TestMetadataAndFirstKey(t *testing.T) {
	ip, err := grpclimit.PeerIP(grpclimit.PeerIPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := func(kv ...string) context.Context {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: fakeAddr("192.0.2.1:1")})
		return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
	}
	tests := []struct {
		name    string
		fn      grpclimit.KeyFunc
		ctx     context.Context
		want    string
		wantErr error
	}{
		{name: "metadata", fn: grpclimit.MetadataKey("X-Api-Key"), ctx: in("x-api-key", "k1", "x-api-key", "k2"), want: "x-api-key:k1"},
		{name: "metadata missing", fn: grpclimit.MetadataKey("x-api-key"), ctx: in(), wantErr: grpclimit.ErrNoKey},
		{name: "metadata empty", fn: grpclimit.MetadataKey("x-api-key"), ctx: in("x-api-key", ""), wantErr: grpclimit.ErrNoKey},
		{name: "no metadata at all", fn: grpclimit.MetadataKey("x-api-key"), ctx: context.Background(), wantErr: grpclimit.ErrNoKey},
		{name: "first: metadata", fn: grpclimit.FirstKey(grpclimit.MetadataKey("x-api-key"), ip), ctx: in("x-api-key", "k1"), want: "x-api-key:k1"},
		{name: "first: peer", fn: grpclimit.FirstKey(grpclimit.MetadataKey("x-api-key"), ip), ctx: in(), want: "ip:192.0.2.1"},
		{name: "first: none", fn: grpclimit.FirstKey(grpclimit.MetadataKey("a")), ctx: in(), wantErr: grpclimit.ErrNoKey},
		{name: "first: empty", fn: grpclimit.FirstKey(), ctx: in(), wantErr: grpclimit.ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.fn(tt.ctx, "/s/M")
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("key() error = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("key() = %q, want %q", got, tt.want)
			}
		})
	}
}

func netipAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}
