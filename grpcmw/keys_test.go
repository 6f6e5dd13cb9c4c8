package grpcmw_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratewindow/ratewindow/grpcmw"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

func keyfuncsTrustLoopback() keyfuncs.IPOptions {
	return keyfuncs.IPOptions{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
}

type userKey struct{}

// TestKeyFuncs: every key function on calls built by hand, with exact keys
// and errors.
func TestKeyFuncs(t *testing.T) {
	call := func(addr net.Addr, kv ...string) grpcmw.Call {
		ctx := context.WithValue(context.Background(), userKey{}, "u1")
		if addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: addr})
		}
		if kv != nil {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
		}
		return grpcmw.Call{Context: ctx, Method: "/pkg.Svc/Get"}
	}
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	proxy := grpcmw.Peer(netip.MustParsePrefix("10.0.0.0/8"))
	user := grpcmw.Identity(func(ctx context.Context) (string, bool) { id, ok := ctx.Value(userKey{}).(string); return id, ok })
	for _, tc := range []struct {
		name    string
		key     grpcmw.KeyFunc
		call    grpcmw.Call
		want    string
		wantErr error
	}{
		{"peer", grpcmw.Peer(), call(tcp("192.0.2.1:5000")), "ip:192.0.2.1", nil},
		{"peer ipv6 /64", grpcmw.Peer(), call(tcp("[2001:db8:1:2:3::9]:5000")), "ip:2001:db8:1:2::/64", nil},
		{"spoofed forwarded from an untrusted peer", grpcmw.Peer(), call(tcp("192.0.2.1:5000"), "x-forwarded-for", "198.51.100.1"), "ip:192.0.2.1", nil},
		{"trusted proxy", proxy, call(tcp("10.0.0.1:5000"), "x-forwarded-for", "203.0.113.1, 198.51.100.1"), "ip:198.51.100.1", nil},
		{"trusted proxy, junk entry", proxy, call(tcp("10.0.0.1:5000"), "x-forwarded-for", "junk"), "", keyfuncs.ErrBadForwardedFor},
		{"trusted proxy, no entry", proxy, call(tcp("10.0.0.1:5000")), "ip:10.0.0.1", nil},
		{"unix socket", grpcmw.Peer(), call(peerAddr("/run/app.sock")), "", keyfuncs.ErrBadRemoteAddr},
		{"no peer", grpcmw.Peer(), call(nil), "", grpcmw.ErrNoPeer},
		{"metadata", grpcmw.Metadata("X-Api-Key"), call(nil, "x-api-key", "abc"), "md:x-api-key:abc", nil},
		{"metadata missing", grpcmw.Metadata("x-api-key"), call(nil), "", keyfuncs.ErrNoKey},
		{"metadata empty", grpcmw.Metadata("x-api-key"), call(nil, "x-api-key", ""), "", grpcmw.ErrNoMetadata},
		{"metadata too long", grpcmw.Metadata("x-api-key"), call(nil, "x-api-key", strings.Repeat("a", 257)), "", grpcmw.ErrMetadataTooLong},
		{"method", grpcmw.Method(), call(nil), "method:/pkg.Svc/Get", nil},
		{"identity", user, call(nil), "user:u1", nil},
		{"identity missing", grpcmw.Identity(func(context.Context) (string, bool) { return "", false }), call(nil), "", grpcmw.ErrNoIdentity},
		{"join", grpcmw.Join(grpcmw.Metadata("t"), grpcmw.Method()), call(nil, "t", `a|b\c`), `md:t:a\|b\\c|method:/pkg.Svc/Get`, nil},
		{"join fails", grpcmw.Join(grpcmw.Method(), grpcmw.Metadata("t")), call(nil), "", grpcmw.ErrNoMetadata},
		{"join of none", grpcmw.Join(), call(nil), "", keyfuncs.ErrNoKey},
	} {
		got, err := tc.key(tc.call)
		if got != tc.want || (tc.wantErr == nil) != (err == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
			t.Errorf("%s: %q, %v; want %q, %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestKeyFuncPanics: bad arguments to the constructors panic at start-up.
func TestKeyFuncPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"empty metadata name":  func() { grpcmw.Metadata("") },
		"binary metadata name": func() { grpcmw.Metadata("token-bin") },
		"nil identity":         func() { grpcmw.Identity(nil) },
		"nil join":             func() { grpcmw.Join(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}
