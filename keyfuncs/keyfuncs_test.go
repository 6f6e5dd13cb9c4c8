package keyfuncs_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/ratewindow/ratewindow/keyfuncs"
)

// proxies are the trusted proxy prefixes of the tests.
var proxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("fd00::/8"),
}

// req builds a request from RemoteAddr and header lines given as name, value pairs.
func req(remote string, kv ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(kv); i += 2 {
		r.Header.Add(kv[i], kv[i+1])
	}
	return r
}

func TestIP(t *testing.T) {
	const xff = "X-Forwarded-For"
	tests := []struct {
		name    string
		opts    keyfuncs.IPOptions
		remote  string
		headers []string // name, value pairs; repeated names make several lines
		want    string
		wantErr error
		// wantErrText, when set, is the exact text of the error.
		wantErrText string
	}{
		// The peer.
		{name: "v4 ip:port", remote: "203.0.113.5:4711", want: "ip:203.0.113.5"},
		{name: "v4 bare", remote: "203.0.113.5", want: "ip:203.0.113.5"},
		{name: "v6 bracket port", remote: "[2001:db8:1:2:aaaa::1]:443", want: "ip:2001:db8:1:2::/64"},
		{name: "v6 bare", remote: "2001:db8:1:2::5", want: "ip:2001:db8:1:2::/64"},
		{name: "v6 bracket no port", remote: "[2001:db8:1:2::5]", want: "ip:2001:db8:1:2::/64"},
		{name: "v6 same /64 other host", remote: "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", want: "ip:2001:db8:1:2::/64"},
		{name: "v6 other /64", remote: "[2001:db8:1:3::5]:1", want: "ip:2001:db8:1:3::/64"},
		{name: "v6 zone dropped", remote: "[fe80::1%eth0]:8080", want: "ip:fe80::/64"},
		{name: "v6 bare zone dropped", remote: "fe80::1%eth0", want: "ip:fe80::/64"},
		{name: "v6 full length", opts: keyfuncs.IPOptions{IPv6Bits: 128}, remote: "[fe80::1%eth0]:1", want: "ip:fe80::1"},
		{name: "v4-mapped peer", remote: "[::ffff:192.0.2.7]:1234", want: "ip:192.0.2.7"},
		{name: "v4-mapped bare peer", remote: "::ffff:192.0.2.7", want: "ip:192.0.2.7"},
		{name: "v4 peer same key as mapped", remote: "192.0.2.7:1", want: "ip:192.0.2.7"},

		// Prefix lengths.
		{name: "v6 /48", opts: keyfuncs.IPOptions{IPv6Bits: 48}, remote: "[2001:db8:1:2::5]:1", want: "ip:2001:db8:1::/48"},
		{name: "v6 /56", opts: keyfuncs.IPOptions{IPv6Bits: 56}, remote: "[2001:db8:1:2ff::5]:1", want: "ip:2001:db8:1:200::/56"},
		{name: "v6 /128", opts: keyfuncs.IPOptions{IPv6Bits: 128}, remote: "[2001:db8:1:2::5]:1", want: "ip:2001:db8:1:2::5"},
		{name: "v4 /24", opts: keyfuncs.IPOptions{IPv4Bits: 24}, remote: "203.0.113.5:1", want: "ip:203.0.113.0/24"},
		{name: "v4 bits leave v6 alone", opts: keyfuncs.IPOptions{IPv4Bits: 24}, remote: "[2001:db8:1:2::5]:1", want: "ip:2001:db8:1:2::/64"},
		{name: "mapped peer uses v4 bits", opts: keyfuncs.IPOptions{IPv4Bits: 16, IPv6Bits: 32}, remote: "[::ffff:192.0.2.7]:1", want: "ip:192.0.0.0/16"},

		// Untrusted peers: headers are never read.
		{name: "no trusted, XFF ignored", remote: "203.0.113.5:1", headers: []string{xff, "198.51.100.1"}, want: "ip:203.0.113.5"},
		{name: "untrusted peer, XFF ignored", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "203.0.113.5:1",
			headers: []string{xff, "198.51.100.1, 10.0.0.1"}, want: "ip:203.0.113.5"},
		{name: "untrusted peer, other headers ignored", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "203.0.113.5:1",
			headers: []string{"X-Real-IP", "198.51.100.1", "True-Client-IP", "198.51.100.2", "CF-Connecting-IP", "198.51.100.3", "Forwarded", "for=198.51.100.4"},
			want:    "ip:203.0.113.5"},

		// Trusted proxies.
		{name: "spoofed entry left of the client", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.51.100.66, 203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "single entry", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "chain of trusted proxies", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.51.100.66, 203.0.113.5, 10.1.1.1, fd00::7, 10.2.2.2"}, want: "ip:203.0.113.5"},
		{name: "all trusted: leftmost", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "10.9.9.9, 10.1.1.1, 10.2.2.2"}, want: "ip:10.9.9.9"},
		{name: "no XFF: peer", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1", want: "ip:10.0.0.1"},
		{name: "trusted peer, X-Real-IP never read", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{"X-Real-IP", "198.51.100.1", "True-Client-IP", "198.51.100.2", "CF-Connecting-IP", "198.51.100.3", "Forwarded", "for=198.51.100.4"},
			want:    "ip:10.0.0.1"},
		{name: "trusted v6 peer", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "[fd00::1]:1",
			headers: []string{xff, "203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "v6 client grouped", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "2001:db8:1:2::99, 10.0.0.2"}, want: "ip:2001:db8:1:2::/64"},
		{name: "v6 client custom bits", opts: keyfuncs.IPOptions{Trusted: proxies, IPv6Bits: 48}, remote: "10.0.0.1:1",
			headers: []string{xff, "2001:db8:1:2::99"}, want: "ip:2001:db8:1::/48"},

		// Several lines are one list.
		{name: "two lines merged", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.51.100.66", xff, "203.0.113.5, 10.0.0.2"}, want: "ip:203.0.113.5"},
		{name: "client in the first line", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.51.100.66, 203.0.113.5", xff, "10.0.0.3", xff, "10.0.0.2"}, want: "ip:203.0.113.5"},
		{name: "last line is rightmost", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.9", xff, "203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "all trusted over lines: leftmost", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "10.9.9.9", xff, "10.0.0.3"}, want: "ip:10.9.9.9"},
		{name: "garbage in an earlier line is never read", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "unknown", xff, "203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "garbage in the last line is the client's entry", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5", xff, "unknown"}, wantErr: keyfuncs.ErrBadForwardedFor},

		// Entry forms.
		{name: "whitespace", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, " \t203.0.113.5\t ,  10.0.0.2 "}, want: "ip:203.0.113.5"},
		{name: "no spaces", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.51.100.66,203.0.113.5,10.0.0.2"}, want: "ip:203.0.113.5"},
		{name: "empty entries skipped", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, ", 203.0.113.5,, 10.0.0.2,", xff, ""}, want: "ip:203.0.113.5"},
		{name: "only empty entries: peer", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, " , ,"}, want: "ip:10.0.0.1"},
		{name: "v4 with port", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5:4711, 10.0.0.2:80"}, want: "ip:203.0.113.5"},
		{name: "v6 with port", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "[2001:db8:1:2::1]:443, [fd00::2]:80"}, want: "ip:2001:db8:1:2::/64"},
		{name: "v6 in brackets", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "[2001:db8:1:2::1]"}, want: "ip:2001:db8:1:2::/64"},
		{name: "v6 zone dropped", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "fe80::1%eth0"}, want: "ip:fe80::/64"},
		{name: "v4-mapped entry", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "::ffff:192.0.2.7"}, want: "ip:192.0.2.7"},
		{name: "v4-mapped entry with port", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "[::ffff:192.0.2.7]:80"}, want: "ip:192.0.2.7"},
		{name: "v4-mapped proxy is trusted", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5, ::ffff:10.0.0.2"}, want: "ip:203.0.113.5"},
		{name: "v4-mapped peer is trusted", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "[::ffff:10.0.0.1]:1",
			headers: []string{xff, "203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "v4-mapped trusted prefix", opts: keyfuncs.IPOptions{Trusted: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			remote: "10.0.0.1:1", headers: []string{xff, "203.0.113.5"}, want: "ip:203.0.113.5"},

		// Entries left of the client are never read, whatever they hold:
		// the client wrote them, the trusted proxy appended the client's
		// address to their right.
		{name: "the attack: one bad entry sent by the client", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "x, 203.0.113.7"}, want: "ip:203.0.113.7"},
		{name: "unknown left", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "unknown, 203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "quoted left", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, `"198.51.100.1", 203.0.113.5`}, want: "ip:203.0.113.5"},
		{name: "leading zero left", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.051.100.1, 203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "v4 in brackets left", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "[198.51.100.1], 203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "NUL left", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "198.51.100.1\x00, 203.0.113.5"}, want: "ip:203.0.113.5"},
		{name: "garbage left of a chain of proxies", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "unknown, 203.0.113.5, 10.1.1.1", xff, "fd00::7"}, want: "ip:203.0.113.5"},
		{name: "trusted-looking entry left of the client", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "garbage, 10.9.9.9, 203.0.113.5"}, want: "ip:203.0.113.5"},

		// An unusable entry where the client's address should be: an
		// error, never the proxy's key.
		{name: "unknown", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "unknown"}, wantErr: keyfuncs.ErrBadForwardedFor,
			wantErrText: `ratewindow: the client's X-Forwarded-For entry is not an IP address: "unknown"`},
		{name: "garbage right", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5, garbage"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "garbage between proxies", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5, _hidden, 10.0.0.2"}, wantErr: keyfuncs.ErrBadForwardedFor,
			wantErrText: `ratewindow: the client's X-Forwarded-For entry is not an IP address: "_hidden"`},
		{name: "garbage left of trusted only", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "unknown, 10.1.1.1, 10.2.2.2"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "host name", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "client.example.com"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "bad port", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5:99999"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "v4 in brackets", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "[203.0.113.5]:80"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "v4 with zone", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5%eth0"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "quoted", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, `"203.0.113.5"`}, wantErr: keyfuncs.ErrBadForwardedFor,
			wantErrText: `ratewindow: the client's X-Forwarded-For entry is not an IP address: "\"203.0.113.5\""`},
		{name: "leading zero", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.05"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "NUL", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5\x00"}, wantErr: keyfuncs.ErrBadForwardedFor,
			wantErrText: `ratewindow: the client's X-Forwarded-For entry is not an IP address: "203.0.113.5\x00"`},
		{name: "space inside entry", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "203.0.113.5 198.51.100.1"}, wantErr: keyfuncs.ErrBadForwardedFor},
		{name: "long entry quoted in part", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, strings.Repeat("a", 1000)}, wantErr: keyfuncs.ErrBadForwardedFor,
			wantErrText: `ratewindow: the client's X-Forwarded-For entry is not an IP address: "` + strings.Repeat("a", 64) + `..."`},
		{name: "untrusted peer: garbage never read", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "203.0.113.5:1",
			headers: []string{xff, "unknown"}, want: "ip:203.0.113.5"},

		// NAT64: keyed by the embedded IPv4 address.
		{name: "NAT64 well-known prefix", remote: "[64:ff9b::192.0.2.33]:1", want: "ip:192.0.2.33"},
		{name: "NAT64 well-known prefix, hex", remote: "[64:ff9b::c633:6407]:1", want: "ip:198.51.100.7"},
		{name: "NAT64 two clients are two keys", remote: "[64:ff9b::198.51.100.8]:1", want: "ip:198.51.100.8"},
		{name: "NAT64 uses v4 bits", opts: keyfuncs.IPOptions{IPv4Bits: 24}, remote: "[64:ff9b::192.0.2.33]:1", want: "ip:192.0.2.0/24"},
		{name: "NAT64 in X-Forwarded-For", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "10.0.0.1:1",
			headers: []string{xff, "64:ff9b::203.0.113.5, 10.0.0.2"}, want: "ip:203.0.113.5"},
		{name: "NAT64 peer is not trusted by its IPv4 address", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "[64:ff9b::10.0.0.1]:1",
			headers: []string{xff, "203.0.113.5"}, want: "ip:10.0.0.1"},
		{name: "local-use prefix not decoded by default", remote: "[64:ff9b:1::192.0.2.33]:1", want: "ip:64:ff9b:1::/64"},
		{name: "local-use prefix listed", opts: keyfuncs.IPOptions{NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("64:ff9b:1::/96")}},
			remote: "[64:ff9b:1::192.0.2.33]:1", want: "ip:192.0.2.33"},
		{name: "outside the listed prefix", opts: keyfuncs.IPOptions{NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("64:ff9b:1::/96")}},
			remote: "[64:ff9b:1:1::192.0.2.33]:1", want: "ip:64:ff9b:1:1::/64"},
		// RFC 6052, section 2.4: 192.0.2.33 under every prefix length.
		{name: "RFC 6052 /32", opts: nat64("2001:db8::/32"), remote: "[2001:db8:c000:221::]:1", want: "ip:192.0.2.33"},
		{name: "RFC 6052 /40", opts: nat64("2001:db8:100::/40"), remote: "[2001:db8:1c0:2:21::]:1", want: "ip:192.0.2.33"},
		{name: "RFC 6052 /48", opts: nat64("2001:db8:122::/48"), remote: "[2001:db8:122:c000:2:2100::]:1", want: "ip:192.0.2.33"},
		{name: "RFC 6052 /56", opts: nat64("2001:db8:122:300::/56"), remote: "[2001:db8:122:3c0:0:221::]:1", want: "ip:192.0.2.33"},
		{name: "RFC 6052 /64", opts: nat64("2001:db8:122:344::/64"), remote: "[2001:db8:122:344:c0:2:2100:0]:1", want: "ip:192.0.2.33"},
		{name: "RFC 6052 /96", opts: nat64("2001:db8:122:344::/96"), remote: "[2001:db8:122:344::192.0.2.33]:1", want: "ip:192.0.2.33"},
		{name: "u octet set: not NAT64", opts: nat64("2001:db8:122:344::/64"), remote: "[2001:db8:122:344:ffc0:2:2100:0]:1", want: "ip:2001:db8:122:344::/64"},
		{name: "unmasked prefix", opts: nat64("2001:db8:122:344::1/96"), remote: "[2001:db8:122:344::192.0.2.33]:1", want: "ip:192.0.2.33"},

		// Bad RemoteAddr.
		{name: "empty RemoteAddr", remote: "", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "unix socket", remote: "@", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "host name RemoteAddr", remote: "localhost:8080", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "empty port", remote: "203.0.113.5:", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "port out of range", remote: "203.0.113.5:65536", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "unclosed bracket", remote: "[2001:db8::1:443", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "v4 in brackets RemoteAddr", remote: "[203.0.113.5]:443", wantErr: keyfuncs.ErrBadRemoteAddr},
		{name: "bad RemoteAddr with trusted and XFF", opts: keyfuncs.IPOptions{Trusted: proxies}, remote: "proxy:80",
			headers: []string{xff, "203.0.113.5"}, wantErr: keyfuncs.ErrBadRemoteAddr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := keyfuncs.IPWith(tt.opts)(req(tt.remote, tt.headers...))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || got != "" {
					t.Fatalf("got (%q, %v), want error %v", got, err, tt.wantErr)
				}
				if tt.wantErrText != "" && err.Error() != tt.wantErrText {
					t.Fatalf("error %q, want %q", err, tt.wantErrText)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tt.want)
			}
		})
	}
}

// nat64 returns IPOptions with the NAT64 prefix p.
func nat64(p string) keyfuncs.IPOptions {
	return keyfuncs.IPOptions{NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix(p)}}
}

func TestIPVariadicTrusted(t *testing.T) {
	key := keyfuncs.IP(proxies...)
	got, err := key(req("10.0.0.1:1", "X-Forwarded-For", "198.51.100.66, 203.0.113.5"))
	if err != nil || got != "ip:203.0.113.5" {
		t.Fatalf("got (%q, %v), want ip:203.0.113.5", got, err)
	}
	got, err = keyfuncs.IP()(req("10.0.0.1:1", "X-Forwarded-For", "203.0.113.5"))
	if err != nil || got != "ip:10.0.0.1" {
		t.Fatalf("no trusted: got (%q, %v), want ip:10.0.0.1", got, err)
	}
}

// TestIPTrustedIsCopied checks that changing the caller's slice afterwards
// does not change which proxies are trusted.
func TestIPTrustedIsCopied(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	key := keyfuncs.IP(trusted...)
	trusted[0] = netip.MustParsePrefix("0.0.0.0/0")
	got, _ := key(req("203.0.113.5:1", "X-Forwarded-For", "198.51.100.1"))
	if got != "ip:203.0.113.5" {
		t.Fatalf("got %q, want ip:203.0.113.5", got)
	}
}

// TestIPSpoofing sends rotating forged headers from one client: its key must
// never change.
func TestIPSpoofing(t *testing.T) {
	forged := [][]string{
		nil,
		{"X-Forwarded-For", "198.51.100.1"},
		{"X-Forwarded-For", "198.51.100.2, 198.51.100.3"},
		{"X-Forwarded-For", "10.0.0.1"},
		{"X-Forwarded-For", "garbage"},
		{"X-Forwarded-For", "2001:db8:9::1", "X-Forwarded-For", "198.51.100.4"},
		{"X-Real-IP", "198.51.100.5"},
		{"True-Client-IP", "198.51.100.6"},
		{"CF-Connecting-IP", "198.51.100.7"},
		{"Forwarded", "for=198.51.100.8;proto=https"},
		{"X-Forwarded-For", "198.51.100.9", "X-Real-IP", "198.51.100.10", "True-Client-IP", "198.51.100.11"},
	}
	clients := []struct{ remote, want string }{
		{"203.0.113.5:1000", "ip:203.0.113.5"},
		{"[2001:db8:1:2::1]:1000", "ip:2001:db8:1:2::/64"},
	}
	for _, key := range []keyfuncs.Func{keyfuncs.IP(), keyfuncs.IP(proxies...)} {
		for _, c := range clients {
			for i, h := range forged {
				got, err := key(req(c.remote, h...))
				if err != nil || got != c.want {
					t.Errorf("client %s, headers %d %q: got (%q, %v), want %q", c.remote, i, h, got, err, c.want)
				}
			}
		}
	}
	// The same client behind a trusted proxy, forging X-Forwarded-For entries
	// that the proxy then appends to: the key follows the proxy's entry,
	// also when a forged entry is not an address.
	key := keyfuncs.IP(proxies...)
	for i, h := range forged {
		kv := append([]string(nil), h...)
		var prior string
		for j := 0; j+1 < len(kv); j += 2 {
			if kv[j] == "X-Forwarded-For" {
				prior += kv[j+1] + ", "
				kv[j+1] = "" // replaced below by the proxy's merged line
			}
		}
		kv = append(kv, "X-Forwarded-For", prior+"203.0.113.5")
		got, err := key(req("10.0.0.1:1", kv...))
		if err != nil || got != "ip:203.0.113.5" {
			t.Errorf("behind proxy, headers %d %q: got (%q, %v), want ip:203.0.113.5", i, kv, got, err)
		}
	}
}

func TestIPWithPanics(t *testing.T) {
	tests := []struct {
		name string
		opts keyfuncs.IPOptions
	}{
		{"IPv6Bits negative", keyfuncs.IPOptions{IPv6Bits: -1}},
		{"IPv6Bits too large", keyfuncs.IPOptions{IPv6Bits: 129}},
		{"IPv4Bits negative", keyfuncs.IPOptions{IPv4Bits: -1}},
		{"IPv4Bits too large", keyfuncs.IPOptions{IPv4Bits: 33}},
		{"invalid prefix", keyfuncs.IPOptions{Trusted: []netip.Prefix{{}}}},
		{"invalid NAT64 prefix", keyfuncs.IPOptions{NAT64Prefixes: []netip.Prefix{{}}}},
		{"IPv4 NAT64 prefix", nat64("192.0.2.0/24")},
		{"IPv4-mapped NAT64 prefix", nat64("::ffff:0:0/96")},
		{"NAT64 prefix of 33 bits", nat64("2001:db8::/33")},
		{"NAT64 prefix of 128 bits", nat64("2001:db8::/128")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "ratewindow: ") {
					t.Fatalf("panic %q, want a message starting with ratewindow:", msg)
				}
			}()
			keyfuncs.IPWith(tt.opts)
		})
	}
}

func TestHeader(t *testing.T) {
	tests := []struct {
		name    string
		header  string
		headers []string
		want    string
		wantErr error
	}{
		{name: "present", header: "X-API-Key", headers: []string{"X-Api-Key", "abc"}, want: "h:x-api-key:abc"},
		{name: "name case", header: "x-api-key", headers: []string{"X-API-KEY", "abc"}, want: "h:x-api-key:abc"},
		{name: "first value", header: "X-API-Key", headers: []string{"X-Api-Key", "a", "X-Api-Key", "b"}, want: "h:x-api-key:a"},
		{name: "value kept as is", header: "Tenant", headers: []string{"Tenant", "Acme Corp"}, want: "h:tenant:Acme Corp"},
		{name: "missing", header: "X-API-Key", wantErr: keyfuncs.ErrNoHeader},
		{name: "empty", header: "X-API-Key", headers: []string{"X-Api-Key", ""}, wantErr: keyfuncs.ErrNoHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := keyfuncs.Header(tt.header)(req("203.0.113.5:1", tt.headers...))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
					t.Fatalf("got (%q, %v), want error %v", got, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), "X-Api-Key") {
					t.Fatalf("error %q does not name the header", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tt.want)
			}
		})
	}
}

type userKey struct{}

func userFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(userKey{}).(string)
	return id, ok
}

func TestUser(t *testing.T) {
	tests := []struct {
		name    string
		ctx     context.Context
		want    string
		wantErr error
	}{
		{name: "user", ctx: context.WithValue(context.Background(), userKey{}, "42"), want: "user:42"},
		{name: "no user", ctx: context.Background(), wantErr: keyfuncs.ErrNoUser},
		{name: "empty id", ctx: context.WithValue(context.Background(), userKey{}, ""), wantErr: keyfuncs.ErrNoUser},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := req("203.0.113.5:1").WithContext(tt.ctx)
			got, err := keyfuncs.User(userFrom)(r)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
					t.Fatalf("got (%q, %v), want error %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tt.want)
			}
		})
	}
}

// TestRouteServeMux routes real requests through an http.ServeMux.
func TestRouteServeMux(t *testing.T) {
	mux := http.NewServeMux()
	got := map[string]string{}
	record := func(w http.ResponseWriter, r *http.Request) {
		k, err := keyfuncs.Route()(r)
		if err != nil {
			k = "error: " + err.Error()
		}
		got[r.Method+" "+r.URL.Path] = k
	}
	mux.HandleFunc("GET /users/{id}", record)
	mux.HandleFunc("/files/", record)
	mux.HandleFunc("POST example.com/login", record)
	mux.HandleFunc("DELETE\t/items/{id...}", record)

	tests := []struct{ method, target, want string }{
		{"GET", "/users/1", "route:/users/{id}"},
		{"GET", "/users/2", "route:/users/{id}"},
		{"GET", "/files/a/b.txt", "route:/files/"},
		{"PUT", "/files/c", "route:/files/"},
		{"POST", "http://example.com/login", "route:example.com/login"},
		{"DELETE", "/items/a/b", "route:/items/{id...}"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.target, nil)
		mux.ServeHTTP(httptest.NewRecorder(), r)
		if k := got[tt.method+" "+r.URL.Path]; k != tt.want {
			t.Errorf("%s %s: got %q, want %q", tt.method, tt.target, k, tt.want)
		}
	}
}

func TestRoute(t *testing.T) {
	tests := []struct {
		name    string
		pattern string // r.Pattern
		ctx     []string
		path    string
		want    string
		wantErr error
	}{
		{name: "pattern", pattern: "/users/{id}", path: "/users/1", want: "route:/users/{id}"},
		{name: "method stripped", pattern: "GET /users/{id}", path: "/users/1", want: "route:/users/{id}"},
		{name: "context", ctx: []string{"/users/:id"}, path: "/users/1", want: "route:/users/:id"},
		{name: "context before pattern", ctx: []string{"/users/:id"}, pattern: "GET /users/{id}", path: "/users/1", want: "route:/users/:id"},
		{name: "last WithRoute wins", ctx: []string{"/a", "/b"}, path: "/b", want: "route:/b"},
		{name: "empty context falls back", ctx: []string{""}, pattern: "GET /users/{id}", path: "/users/1", want: "route:/users/{id}"},
		{name: "empty context hides earlier", ctx: []string{"/a", ""}, path: "/a", wantErr: keyfuncs.ErrNoRoute},
		{name: "none: never the path", path: "/users/1", wantErr: keyfuncs.ErrNoRoute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tt.path, nil)
			r.Pattern = tt.pattern
			ctx := r.Context()
			for _, p := range tt.ctx {
				ctx = keyfuncs.WithRoute(ctx, p)
			}
			got, err := keyfuncs.Route()(r.WithContext(ctx))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
					t.Fatalf("got (%q, %v), want error %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tt.want)
			}
		})
	}
}

func TestRouteFrom(t *testing.T) {
	if p, ok := keyfuncs.RouteFrom(context.Background()); ok || p != "" {
		t.Fatalf("empty context: got (%q, %v)", p, ok)
	}
	ctx := keyfuncs.WithRoute(context.Background(), "/users/{id}")
	if p, ok := keyfuncs.RouteFrom(ctx); !ok || p != "/users/{id}" {
		t.Fatalf("got (%q, %v), want (/users/{id}, true)", p, ok)
	}
	if p, ok := keyfuncs.RouteFrom(keyfuncs.WithRoute(ctx, "")); ok || p != "" {
		t.Fatalf("empty pattern: got (%q, %v), want (\"\", false)", p, ok)
	}
}

func TestMethod(t *testing.T) {
	for _, tt := range []struct{ method, want string }{
		{"GET", "method:GET"},
		{"POST", "method:POST"},
		{"", "method:GET"},
		{"PROPFIND", "method:PROPFIND"},
	} {
		r := req("203.0.113.5:1")
		r.Method = tt.method
		if got, err := keyfuncs.Method()(r); err != nil || got != tt.want {
			t.Errorf("method %q: got (%q, %v), want %q", tt.method, got, err, tt.want)
		}
	}
}

func TestJoin(t *testing.T) {
	errBoom := errors.New("boom")
	called := 0
	fixed := func(k string, err error) keyfuncs.Func {
		return func(*http.Request) (string, error) { called++; return k, err }
	}
	tests := []struct {
		name       string
		fs         []keyfuncs.Func
		want       string
		wantErr    error
		wantCalled int
	}{
		{name: "one", fs: []keyfuncs.Func{keyfuncs.Method()}, want: "method:GET"},
		{name: "order", fs: []keyfuncs.Func{keyfuncs.IP(), keyfuncs.Method()}, want: "ip:203.0.113.5|method:GET"},
		{name: "order reversed", fs: []keyfuncs.Func{keyfuncs.Method(), keyfuncs.IP()}, want: "method:GET|ip:203.0.113.5"},
		{name: "three", fs: []keyfuncs.Func{fixed("a", nil), fixed("b", nil), fixed("c", nil)}, want: "a|b|c", wantCalled: 3},
		{name: "long keys", fs: []keyfuncs.Func{fixed(strings.Repeat("x", 100), nil), fixed(strings.Repeat("y", 100), nil)},
			want: strings.Repeat("x", 100) + "|" + strings.Repeat("y", 100), wantCalled: 2},
		{name: "first error wins", fs: []keyfuncs.Func{fixed("a", nil), fixed("", errBoom), keyfuncs.Route(), fixed("c", nil)},
			wantErr: errBoom, wantCalled: 2},
		{name: "sentinel wrapped", fs: []keyfuncs.Func{keyfuncs.Method(), keyfuncs.Route(), fixed("", errBoom)},
			wantErr: keyfuncs.ErrNoRoute},
		{name: "empty key", fs: []keyfuncs.Func{fixed("a", nil), fixed("", nil)}, wantErr: keyfuncs.ErrNoKey, wantCalled: 2},
		{name: "no funcs", wantErr: keyfuncs.ErrNoKey},

		// "|" and "\" within a key are escaped, so keys never run together.
		{name: "separator escaped", fs: []keyfuncs.Func{fixed("a|b", nil), fixed("c", nil)}, want: `a\|b|c`, wantCalled: 2},
		{name: "separator escaped, other split", fs: []keyfuncs.Func{fixed("a", nil), fixed("b|c", nil)}, want: `a|b\|c`, wantCalled: 2},
		{name: "escape escaped", fs: []keyfuncs.Func{fixed(`a\`, nil), fixed("b", nil)}, want: `a\\|b`, wantCalled: 2},
		{name: "escape then separator", fs: []keyfuncs.Func{fixed("a", nil), fixed(`\|b`, nil)}, want: `a|\\\|b`, wantCalled: 2},
		{name: "only specials", fs: []keyfuncs.Func{fixed(`|\|`, nil), fixed(`\`, nil)}, want: `\|\\\||\\`, wantCalled: 2},
		{name: "long key with specials", fs: []keyfuncs.Func{fixed(strings.Repeat("x|", 100), nil), fixed("y", nil)},
			want: strings.Repeat(`x\|`, 100) + "|y", wantCalled: 2},
		{name: "nested Join", fs: []keyfuncs.Func{keyfuncs.Join(fixed("a|b", nil), fixed("c", nil)), fixed("d", nil)},
			want: `a\\\|b\|c|d`, wantCalled: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called = 0
			got, err := keyfuncs.Join(tt.fs...)(req("203.0.113.5:1"))
			if called != tt.wantCalled {
				t.Errorf("called %d key functions, want %d", called, tt.wantCalled)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || got != "" {
					t.Fatalf("got (%q, %v), want error %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tt.want)
			}
		})
	}
}

// TestJoinHeaders is the case of the issue: two header values that steer
// one client's key into another's when joined without escaping.
func TestJoinHeaders(t *testing.T) {
	key := keyfuncs.Join(keyfuncs.Header("A"), keyfuncs.Header("B"))
	tests := []struct{ a, b, want string }{
		{"x|h:b:y", "z", `h:a:x\|h:b:y|h:b:z`},
		{"x", "y|h:b:z", `h:a:x|h:b:y\|h:b:z`},
		{"x", "y", "h:a:x|h:b:y"},
		{`x\`, "y", `h:a:x\\|h:b:y`},
	}
	seen := map[string]int{}
	for i, tt := range tests {
		got, err := key(req("203.0.113.5:1", "A", tt.a, "B", tt.b))
		if err != nil || got != tt.want {
			t.Errorf("A=%q B=%q: got (%q, %v), want %q", tt.a, tt.b, got, err, tt.want)
		}
		if j, ok := seen[got]; ok {
			t.Errorf("A=%q B=%q: same key as case %d", tt.a, tt.b, j+1)
		}
		seen[got] = i
	}
}

// splitJoined undoes Join: it splits key at the unescaped separators and
// unescapes each part. ok is false if key is not an output of Join.
func splitJoined(key string) (parts []string, ok bool) {
	var cur []byte
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '\\':
			if i+1 == len(key) || (key[i+1] != '|' && key[i+1] != '\\') {
				return nil, false
			}
			i++
			cur = append(cur, key[i])
		case '|':
			parts = append(parts, string(cur))
			cur = cur[:0]
		default:
			cur = append(cur, c)
		}
	}
	return append(parts, string(cur)), true
}

// FuzzJoin checks that Join is injective: its key splits back into exactly
// the keys it joined, so two different lists of keys never give one key.
func FuzzJoin(f *testing.F) {
	f.Add("x|h:b:y", "z", "x", "y|h:b:z")
	f.Add(`a\`, "|b", `a\|`, "b")
	f.Add(`\`, `\\`, `\\`, `\`)
	f.Add("a", "b", "a", "b")
	fixed := func(k string) keyfuncs.Func {
		return func(*http.Request) (string, error) { return k, nil }
	}
	r := req("203.0.113.5:1")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		if a == "" || b == "" || c == "" || d == "" {
			return // an empty key is an error, tested in TestJoin
		}
		ab, err1 := keyfuncs.Join(fixed(a), fixed(b))(r)
		cd, err2 := keyfuncs.Join(fixed(c), fixed(d))(r)
		if err1 != nil || err2 != nil {
			t.Fatalf("errors %v, %v", err1, err2)
		}
		if parts, ok := splitJoined(ab); !ok || len(parts) != 2 || parts[0] != a || parts[1] != b {
			t.Fatalf("Join(%q, %q) = %q splits into %q (%v)", a, b, ab, parts, ok)
		}
		if (ab == cd) != (a == c && b == d) {
			t.Fatalf("Join(%q, %q) = %q, Join(%q, %q) = %q", a, b, ab, c, d, cd)
		}
		abc, err := keyfuncs.Join(fixed(a), fixed(b), fixed(c))(r)
		if parts, ok := splitJoined(abc); err != nil || !ok || len(parts) != 3 || parts[0] != a || parts[1] != b || parts[2] != c {
			t.Fatalf("Join(%q, %q, %q) = (%q, %v) splits into %q", a, b, c, abc, err, parts)
		}
	})
}

func TestOr(t *testing.T) {
	errBoom := errors.New("boom")
	called := 0
	fixed := func(k string, err error) keyfuncs.Func {
		return func(*http.Request) (string, error) { called++; return k, err }
	}
	signedIn := context.WithValue(context.Background(), userKey{}, "42")
	tests := []struct {
		name        string
		fs          []keyfuncs.Func
		ctx         context.Context
		remote      string // default 203.0.113.5:1
		want        string
		wantErrs    []error // every one must match
		wantErrText string
		wantCalled  int
	}{
		{name: "first gives the key", fs: []keyfuncs.Func{fixed("a", nil), fixed("b", nil)}, want: "a", wantCalled: 1},
		{name: "first fails", fs: []keyfuncs.Func{fixed("", errBoom), fixed("b", nil)}, want: "b", wantCalled: 2},
		{name: "first gives an empty key", fs: []keyfuncs.Func{fixed("", nil), fixed("b", nil)}, want: "b", wantCalled: 2},
		{name: "key with an error is no key", fs: []keyfuncs.Func{fixed("a", errBoom), fixed("b", nil)}, want: "b", wantCalled: 2},
		{name: "user signed in", fs: []keyfuncs.Func{keyfuncs.User(userFrom), keyfuncs.IP()}, ctx: signedIn, want: "user:42"},
		{name: "anonymous: address", fs: []keyfuncs.Func{keyfuncs.User(userFrom), keyfuncs.IP()}, want: "ip:203.0.113.5"},
		{name: "one", fs: []keyfuncs.Func{keyfuncs.Method()}, want: "method:GET"},
		{name: "all fail", fs: []keyfuncs.Func{keyfuncs.User(userFrom), fixed("", errBoom)},
			wantErrs:    []error{keyfuncs.ErrNoUser, keyfuncs.ErrNoKey, errBoom},
			wantErrText: "ratewindow: no user (Or key 1 of 2); boom (Or key 2 of 2)", wantCalled: 1},
		{name: "all empty", fs: []keyfuncs.Func{fixed("", nil), fixed("", nil)}, wantErrs: []error{keyfuncs.ErrNoKey},
			wantErrText: "ratewindow: no key (Or key 1 of 2); ratewindow: no key (Or key 2 of 2)", wantCalled: 2},
		{name: "many fail", fs: []keyfuncs.Func{fixed("", nil), fixed("", nil), fixed("", nil), fixed("", nil), fixed("", errBoom), fixed("", nil)},
			wantErrs: []error{keyfuncs.ErrNoKey, errBoom}, wantCalled: 6,
			wantErrText: "ratewindow: no key (Or key 1 of 6); ratewindow: no key (Or key 2 of 6); ratewindow: no key (Or key 3 of 6); " +
				"ratewindow: no key (Or key 4 of 6); boom (Or key 5 of 6); ratewindow: no key (Or key 6 of 6)"},
		{name: "bad RemoteAddr is kept", fs: []keyfuncs.Func{keyfuncs.IP()}, remote: "@", wantErrs: []error{keyfuncs.ErrBadRemoteAddr}},
		{name: "no funcs", wantErrs: []error{keyfuncs.ErrNoKey}, wantErrText: "ratewindow: no key (Or without key functions)"},
		{name: "in a Join", fs: []keyfuncs.Func{keyfuncs.Join(keyfuncs.Or(keyfuncs.User(userFrom), keyfuncs.IP()), keyfuncs.Method())},
			want: "ip:203.0.113.5|method:GET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called = 0
			remote := tt.remote
			if remote == "" {
				remote = "203.0.113.5:1"
			}
			r := req(remote)
			if tt.ctx != nil {
				r = r.WithContext(tt.ctx)
			}
			got, err := keyfuncs.Or(tt.fs...)(r)
			if called != tt.wantCalled {
				t.Errorf("called %d key functions, want %d", called, tt.wantCalled)
			}
			if tt.wantErrs != nil {
				for _, want := range tt.wantErrs {
					if !errors.Is(err, want) || got != "" {
						t.Errorf("got (%q, %v), want an error matching %v", got, err, want)
					}
				}
				if tt.wantErrText != "" && (err == nil || err.Error() != tt.wantErrText) {
					t.Errorf("error %q, want %q", err, tt.wantErrText)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tt.want)
			}
		})
	}
}

// TestOrAllocations checks that Or costs no allocation when a key function
// gives the key, also after others failed.
func TestOrAllocations(t *testing.T) {
	errStatic := errors.New("static")
	key := keyfuncs.Or(
		func(*http.Request) (string, error) { return "", errStatic },
		func(*http.Request) (string, error) { return "", nil },
		func(*http.Request) (string, error) { return "k", nil },
	)
	r := req("203.0.113.5:1")
	if n := testing.AllocsPerRun(100, func() { _, _ = key(r) }); n != 0 {
		t.Errorf("%v allocations per key, want 0", n)
	}
}

func TestJoinErrorWrapped(t *testing.T) {
	_, err := keyfuncs.Join(keyfuncs.Method(), keyfuncs.Route())(req("203.0.113.5:1"))
	if err == nil || err == keyfuncs.ErrNoRoute || !strings.HasPrefix(err.Error(), keyfuncs.ErrNoRoute.Error()) {
		t.Fatalf("got %v, want ErrNoRoute wrapped", err)
	}
}

func TestConstructorPanics(t *testing.T) {
	tests := map[string]func(){
		"Header empty": func() { keyfuncs.Header("") },
		"User nil":     func() { keyfuncs.User(nil) },
		"Join nil":     func() { keyfuncs.Join(keyfuncs.Method(), nil) },
		"Or nil":       func() { keyfuncs.Or(nil, keyfuncs.Method()) },
		"Value nil":    func() { keyfuncs.Value("tenant", nil) },
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "ratewindow: ") {
					t.Fatalf("panic %q, want a message starting with ratewindow:", msg)
				}
			}()
			fn()
		})
	}
}

func TestErrorText(t *testing.T) {
	for _, err := range []error{keyfuncs.ErrNoKey, keyfuncs.ErrNoHeader, keyfuncs.ErrNoUser, keyfuncs.ErrNoRoute, keyfuncs.ErrBadRemoteAddr, keyfuncs.ErrBadForwardedFor} {
		if !strings.HasPrefix(err.Error(), "ratewindow: ") {
			t.Errorf("%q does not start with ratewindow:", err)
		}
	}
	if errors.Is(keyfuncs.ErrBadRemoteAddr, keyfuncs.ErrNoKey) {
		t.Error("ErrBadRemoteAddr matches ErrNoKey")
	}
	if errors.Is(keyfuncs.ErrBadForwardedFor, keyfuncs.ErrNoKey) {
		t.Error("ErrBadForwardedFor matches ErrNoKey")
	}
}

// FuzzIP checks that IP never panics, keys by the peer or by one of the
// X-Forwarded-For entries, fails with ErrBadForwardedFor only behind a
// trusted proxy, and never reads the entries left of the client: entries
// put in front of the list change no key into another. A newline in xff
// separates header lines. Its seed corpus is in testdata/fuzz/FuzzIP.
func FuzzIP(f *testing.F) {
	key := keyfuncs.IP(append(proxies, netip.MustParsePrefix("::ffff:192.168.0.0/112"))...)
	plain := keyfuncs.IP()
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		if xff != "" {
			r.Header["X-Forwarded-For"] = strings.Split(xff, "\n")
		}
		got, err := key(r)
		peer, perr := plain(&http.Request{RemoteAddr: remote})
		if perr != nil {
			if !errors.Is(err, keyfuncs.ErrBadRemoteAddr) || got != "" {
				t.Fatalf("bad RemoteAddr %q: got (%q, %v)", remote, got, err)
			}
			return
		}
		if k, _ := plain(r); k != peer {
			t.Fatalf("IP() read a header: got %q, want %q", k, peer)
		}

		// Garbage in front of the list: the same key, or the error when
		// the walk reaches it (all entries trusted, or none).
		r2 := &http.Request{RemoteAddr: remote, Header: http.Header{
			"X-Forwarded-For": append([]string{`unknown, "198.51.100.1", 01.2.3.4, [192.0.2.1], a` + "\x00"}, r.Header["X-Forwarded-For"]...),
		}}
		got2, err2 := key(r2)
		switch {
		case errors.Is(err2, keyfuncs.ErrBadForwardedFor):
			if err == nil && got != peer && !trustedKey(key, keyAddr(got)) {
				t.Fatalf("RemoteAddr %q, XFF %q: key %q became an error %v with entries in front", remote, xff, got, err2)
			}
		case got2 != got || (err == nil) != (err2 == nil):
			t.Fatalf("RemoteAddr %q, XFF %q: got (%q, %v), with entries in front (%q, %v)", remote, xff, got, err, got2, err2)
		}

		if errors.Is(err, keyfuncs.ErrBadForwardedFor) {
			if got != "" || len(r.Header["X-Forwarded-For"]) == 0 || !trustedKey(key, remote) {
				t.Fatalf("RemoteAddr %q, XFF %q: got (%q, %v) without a trusted peer and a header", remote, xff, got, err)
			}
			return
		}
		if err != nil || !strings.HasPrefix(got, "ip:") {
			t.Fatalf("got (%q, %v)", got, err)
		}
		if _, err := netip.ParsePrefix(got[3:]); err != nil {
			if _, err := netip.ParseAddr(got[3:]); err != nil {
				t.Fatalf("key %q holds neither an address nor a prefix", got)
			}
		}
		if got == peer {
			return
		}
		for _, line := range r.Header["X-Forwarded-For"] {
			for _, e := range strings.Split(line, ",") {
				if k, err := plain(&http.Request{RemoteAddr: strings.Trim(e, " \t")}); err == nil && k == got {
					return
				}
			}
		}
		t.Fatalf("RemoteAddr %q, XFF %q: key %q is neither the peer %q nor an entry", remote, xff, got, peer)
	})
}

// keyAddr returns the address of an IP key: "ip:2001:db8::/64" gives
// "2001:db8::".
func keyAddr(key string) string {
	s := strings.TrimPrefix(key, "ip:")
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().String()
	}
	return s
}

// trustedKey reports whether key trusts the peer remote: whether it reads
// X-Forwarded-For.
func trustedKey(key keyfuncs.Func, remote string) bool {
	k, err := key(&http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {"203.0.113.99"}}})
	return err == nil && k == "ip:203.0.113.99"
}

func BenchmarkIP(b *testing.B) {
	benchmarks := []struct {
		name string
		key  keyfuncs.Func
		r    *http.Request
	}{
		{"peer v4", keyfuncs.IP(), req("203.0.113.5:4711", "X-Forwarded-For", "198.51.100.1")},
		{"peer v6", keyfuncs.IP(), req("[2001:db8:1:2::5]:4711")},
		{"untrusted peer", keyfuncs.IP(proxies...), req("203.0.113.5:4711", "X-Forwarded-For", "198.51.100.1")},
		{"trusted proxy", keyfuncs.IP(proxies...), req("10.0.0.1:4711", "X-Forwarded-For", "198.51.100.66, 203.0.113.5")},
		{"trusted chain", keyfuncs.IP(proxies...), req("10.0.0.1:4711", "X-Forwarded-For", "198.51.100.66, 203.0.113.5, 10.1.1.1", "X-Forwarded-For", "10.2.2.2")},
		{"trusted v6 client", keyfuncs.IP(proxies...), req("[fd00::1]:4711", "X-Forwarded-For", "2001:db8:1:2::5, fd00::2")},
		{"garbage left of the client", keyfuncs.IP(proxies...), req("10.0.0.1:4711", "X-Forwarded-For", "garbage, 203.0.113.5")},
		{"NAT64 client", keyfuncs.IP(), req("[64:ff9b::203.0.113.5]:4711")},
	}
	for _, bm := range benchmarks {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bm.key(bm.r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkJoin(b *testing.B) {
	key := keyfuncs.Join(keyfuncs.IP(), keyfuncs.Method())
	r := req("203.0.113.5:4711")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := key(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOr(b *testing.B) {
	key := keyfuncs.Or(keyfuncs.User(userFrom), keyfuncs.IP())
	r := req("203.0.113.5:4711")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := key(r); err != nil {
			b.Fatal(err)
		}
	}
}

type stringer struct{}

func (stringer) String() string { return "s" }

func TestValue(t *testing.T) {
	for _, c := range []struct {
		v    any
		ok   bool
		want string
	}{
		{"ann", true, "user:ann"}, {42, true, "user:42"}, {int64(-7), true, "user:-7"},
		{uint64(9), true, "user:9"}, {stringer{}, true, "user:s"}, {3.5, true, "user:3.5"},
		{nil, true, ""}, {"", true, ""}, {"x", false, ""},
	} {
		key := keyfuncs.Value("user", func(*http.Request) (any, bool) { return c.v, c.ok })
		got, err := key(httptest.NewRequest(http.MethodGet, "/", nil))
		if got != c.want || (c.want == "") != errors.Is(err, keyfuncs.ErrNoKey) {
			t.Errorf("Value(%v, %v) = %q, %v; want %q", c.v, c.ok, got, err, c.want)
		}
	}
}
