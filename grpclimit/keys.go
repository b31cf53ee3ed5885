package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitcore"
)

// KeyFunc returns the key of the bucket a call is charged to. It returns an
// error wrapping ErrNoKey when the call carries nothing to key it by; any
// other error is answered as a failure of the service (codes.Internal by
// default). A KeyFunc is called concurrently.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// Default prefix lengths of PeerIP.
const (
	// DefaultIPv4PrefixLen keys an IPv4 peer by its whole address.
	DefaultIPv4PrefixLen = 32
	// DefaultIPv6PrefixLen keys an IPv6 peer by its /64, so that one
	// client cannot get a new bucket for each address of its network.
	DefaultIPv6PrefixLen = 64
)

// PeerIPOptions configure PeerIP. The zero value keys an IPv4 peer by its
// address and an IPv6 peer by its /64.
type PeerIPOptions struct {
	// IPv4PrefixLen is how many leading bits of an IPv4 address make the
	// key, 1 to 32. Default DefaultIPv4PrefixLen (32).
	IPv4PrefixLen int
	// IPv6PrefixLen is how many leading bits of an IPv6 address make the
	// key, 1 to 128. Default DefaultIPv6PrefixLen (64).
	IPv6PrefixLen int
}

// PeerIP returns a KeyFunc that keys a call by the address of the
// connection's peer (peer.FromContext), grouped by prefix:
// "ip:203.0.113.7", "ip:2001:db8:1:2::/64". IPv4-mapped IPv6 addresses count
// as IPv4 and zones are dropped. A peer that is not an IP address (a Unix
// socket, an in-memory connection) is ErrNoKey. Metadata such as
// x-forwarded-for is never read: behind a proxy, every call would have the
// proxy's key; key by authenticated metadata (MetadataKey) there.
//
// The error wraps sluice.ErrInvalidOption if a prefix length is out of
// range.
func PeerIP(o PeerIPOptions) (KeyFunc, error) {
	v4, v6 := o.IPv4PrefixLen, o.IPv6PrefixLen
	if v4 == 0 {
		v4 = DefaultIPv4PrefixLen
	}
	if v6 == 0 {
		v6 = DefaultIPv6PrefixLen
	}
	if v4 < 1 || v4 > 32 {
		return nil, fmt.Errorf("%w: IPv4 prefix length %d is outside [1, 32]", sluice.ErrInvalidOption, o.IPv4PrefixLen)
	}
	if v6 < 1 || v6 > 128 {
		return nil, fmt.Errorf("%w: IPv6 prefix length %d is outside [1, 128]", sluice.ErrInvalidOption, o.IPv6PrefixLen)
	}
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: the call has no peer", ErrNoKey)
		}
		a, ok := peerAddr(p.Addr)
		if !ok {
			return "", fmt.Errorf("%w: peer address %q (%s) is not an IP address", ErrNoKey, p.Addr.String(), p.Addr.Network())
		}
		bits := v6
		if a.Is4() {
			bits = v4
		}
		if bits == a.BitLen() {
			return "ip:" + a.String(), nil
		}
		pre, _ := a.Prefix(bits) // bits is within [1, BitLen]: never fails
		return "ip:" + pre.String(), nil
	}, nil
}

func peerAddr(addr net.Addr) (netip.Addr, bool) {
	var a netip.Addr
	switch t := addr.(type) {
	case *net.TCPAddr:
		a = t.AddrPort().Addr()
	case *net.UDPAddr:
		a = t.AddrPort().Addr()
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	if !a.IsValid() {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// MetadataKey returns a KeyFunc that keys a call by the first value of the
// incoming metadata key name (lower-cased, as gRPC stores it), as
// "name:value". Missing or empty metadata is ErrNoKey. Key by metadata only
// once something has authenticated it (an interceptor that checks the API
// key runs first), or a client can make up a new bucket for every call.
func MetadataKey(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) == 0 || vs[0] == "" {
			return "", fmt.Errorf("%w: metadata %s is missing or empty", ErrNoKey, name)
		}
		return name + ":" + vs[0], nil
	}
}

// FirstKey returns a KeyFunc that tries fns in order and returns the first
// key found. A function's error other than ErrNoKey is returned at once; if
// every function returns ErrNoKey, the errors are joined.
func FirstKey(fns ...KeyFunc) KeyFunc {
	in := make([]func(call) (string, error), len(fns))
	for i, fn := range fns {
		in[i] = func(c call) (string, error) { return fn(c.ctx, c.method) }
	}
	first := limitcore.FirstKey(ErrNoKey, in)
	return func(ctx context.Context, method string) (string, error) { return first(call{ctx, method}) }
}
