package keyfuncs

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/ratewindow/ratewindow/internal/httpx"
)

// xffHeader is the canonical name of the X-Forwarded-For header.
const xffHeader = "X-Forwarded-For"

// IPOptions configures [IPWith]. The zero value keys by RemoteAddr alone,
// groups IPv6 by /64 and keys each IPv4 address on its own.
type IPOptions struct {
	// Trusted lists the proxies whose X-Forwarded-For is read. Empty (the
	// default): X-Forwarded-For is never read. A prefix written as an
	// IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104) is the same as the
	// IPv4 prefix (10.0.0.0/8), since addresses are unmapped before the
	// trust check.
	Trusted []netip.Prefix

	// IPv6Bits is the prefix length IPv6 clients are grouped by, 1 to 128.
	// 0 means 64 (the default), the size of one subnet: a client usually
	// owns at least that many addresses.
	IPv6Bits int

	// IPv4Bits is the prefix length IPv4 clients are grouped by, 1 to 32.
	// 0 means 32 (the default): each address on its own.
	IPv4Bits int
}

// IP keys a request by the client's IP address: "ip:" + address for IPv4
// ("ip:203.0.113.5") and "ip:" + the /64 prefix for IPv6
// ("ip:2001:db8:1:2::/64"). It is IPWith(IPOptions{Trusted: trusted}).
//
// The peer address comes from RemoteAddr: "ip:port", "[ipv6]:port" or a bare
// IP address. A RemoteAddr in any other form is an error that matches
// [ErrBadRemoteAddr]. Every address, here and in X-Forwarded-For, is
// unmapped first (::ffff:192.0.2.7 is 192.0.2.7) and its zone is dropped
// (fe80::1%eth0 is fe80::1).
//
// Unless the peer is inside one of the trusted prefixes, the peer is the
// client and no header is read. Behind a trusted proxy:
//
//   - Every X-Forwarded-For line is read, in order, as one comma-separated
//     list. Spaces and tabs around an entry are ignored, and so are empty
//     entries (",,", a trailing comma, an empty line).
//   - An entry is an IP address, "ipv4:port", "[ipv6]:port" or "[ipv6]".
//     If any entry is not (e.g. "unknown" or a host name), the list cannot
//     be trusted and the key is the peer's, whatever the position of that
//     entry.
//   - The list is walked from the right, skipping trusted addresses; the
//     first untrusted one is the client. If all are trusted, the leftmost
//     one is the client. Without entries, the peer is.
//
// Other headers such as X-Real-IP, True-Client-IP, Forwarded or
// CF-Connecting-IP are never read.
func IP(trusted ...netip.Prefix) Func {
	return IPWith(IPOptions{Trusted: trusted})
}

// IPWith is [IP] with options. It panics if a trusted prefix is invalid or a
// prefix length is out of range.
func IPWith(opts IPOptions) Func {
	k := &ipKeyer{v6bits: 64, v4bits: 32}
	switch {
	case opts.IPv6Bits < 0 || opts.IPv6Bits > 128:
		panic(fmt.Sprintf("ratewindow: keyfuncs.IPWith: IPv6Bits %d out of range [1, 128]", opts.IPv6Bits))
	case opts.IPv6Bits > 0:
		k.v6bits = opts.IPv6Bits
	}
	switch {
	case opts.IPv4Bits < 0 || opts.IPv4Bits > 32:
		panic(fmt.Sprintf("ratewindow: keyfuncs.IPWith: IPv4Bits %d out of range [1, 32]", opts.IPv4Bits))
	case opts.IPv4Bits > 0:
		k.v4bits = opts.IPv4Bits
	}
	for i, p := range opts.Trusted {
		if !p.IsValid() {
			panic(fmt.Sprintf("ratewindow: keyfuncs.IP: trusted prefix %d is invalid", i+1))
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		k.trusted = append(k.trusted, p.Masked())
	}
	return k.key
}

// ipKeyer holds the configuration of one IP key function.
type ipKeyer struct {
	trusted []netip.Prefix
	v6bits  int
	v4bits  int
}

func (k *ipKeyer) key(r *http.Request) (string, error) {
	peer, ok := parseIP(r.RemoteAddr)
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrBadRemoteAddr, r.RemoteAddr)
	}
	client := peer
	if k.isTrusted(peer) {
		client = k.forwarded(r.Header[xffHeader], peer)
	}
	return k.format(client), nil
}

func (k *ipKeyer) isTrusted(a netip.Addr) bool {
	for _, p := range k.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwarded walks the X-Forwarded-For lines from the right and returns the
// client address, or peer if an entry is not an IP address or there is none.
func (k *ipKeyer) forwarded(lines []string, peer netip.Addr) netip.Addr {
	var client, leftmost netip.Addr
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for end := len(line); end >= 0; {
			start := strings.LastIndexByte(line[:end], ',') + 1
			entry := httpx.TrimOWS(line[start:end])
			end = start - 1
			if entry == "" {
				continue
			}
			a, ok := parseIP(entry)
			if !ok {
				return peer
			}
			leftmost = a
			if !client.IsValid() && !k.isTrusted(a) {
				client = a // keep going: every entry must parse
			}
		}
	}
	switch {
	case client.IsValid():
		return client
	case leftmost.IsValid():
		return leftmost
	default:
		return peer
	}
}

// format builds the key of a, grouped by the configured prefix length.
func (k *ipKeyer) format(a netip.Addr) string {
	var buf [64]byte // "ip:" + the longest IPv6 prefix is 46 bytes
	b := append(buf[:0], "ip:"...)
	bits := k.v4bits
	if a.Is6() {
		bits = k.v6bits
	}
	if bits == a.BitLen() {
		b = a.AppendTo(b)
	} else {
		p, _ := a.Prefix(bits) // bits is within [1, BitLen]
		b = p.AppendTo(b)
	}
	return string(b)
}

// parseIP parses "ip", "ipv4:port", "[ipv6]:port" or "[ipv6]", drops the zone
// and unmaps IPv4-mapped IPv6 addresses. It avoids trying a form that cannot
// match, since a failed netip parse allocates its error.
func parseIP(s string) (netip.Addr, bool) {
	var (
		a   netip.Addr
		err error
	)
	switch {
	case s == "":
		return netip.Addr{}, false
	case s[0] == '[':
		if s[len(s)-1] == ']' {
			a, err = netip.ParseAddr(s[1 : len(s)-1])
			if err == nil && !a.Is6() {
				return netip.Addr{}, false // "[192.0.2.1]"
			}
		} else {
			var ap netip.AddrPort
			ap, err = netip.ParseAddrPort(s)
			a = ap.Addr()
		}
	case strings.IndexByte(s, ':') >= 0 && strings.IndexByte(s, ':') == strings.LastIndexByte(s, ':'):
		// One colon: "ipv4:port". An IPv6 address has at least two.
		var ap netip.AddrPort
		ap, err = netip.ParseAddrPort(s)
		a = ap.Addr()
	default:
		a, err = netip.ParseAddr(s)
	}
	if err != nil {
		return netip.Addr{}, false
	}
	a = a.WithZone("").Unmap()
	return a, a.IsValid()
}
