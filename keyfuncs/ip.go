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

// wellKnownNAT64 is the Well-Known Prefix of RFC 6052, always decoded.
var wellKnownNAT64 = netip.MustParsePrefix("64:ff9b::/96")

// IPOptions configures [IPWith]. The zero value keys by RemoteAddr alone,
// groups IPv6 by /64, keys each IPv4 address on its own and decodes the
// NAT64 Well-Known Prefix 64:ff9b::/96.
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
	// 0 means 32 (the default): each address on its own. It also groups
	// the IPv4 addresses decoded from NAT64 addresses.
	IPv4Bits int

	// NAT64Prefixes lists the NAT64 prefixes of RFC 6052 whose addresses
	// embed an IPv4 address, in addition to the Well-Known Prefix
	// 64:ff9b::/96, which is always decoded. A client address inside one
	// of them is keyed by the IPv4 address it embeds, as that IPv4 client
	// would be ("ip:192.0.2.33"), instead of sharing one IPv6 group with
	// every other IPv4 client of the translator. List here the
	// network-specific prefix of your translator, such as one inside the
	// local-use range 64:ff9b:1::/48 of RFC 8215: its length, and so where
	// the IPv4 address sits, is the operator's choice, so no such prefix is
	// decoded by default. The length must be 32, 40, 48, 56, 64 or 96. An
	// address whose bits 64 to 71 are not zero is not a NAT64 address
	// (RFC 6052, section 2.2) and is grouped as IPv6.
	//
	// Only the key is decoded: a trusted proxy behind a translator is
	// listed in Trusted by its IPv6 address.
	NAT64Prefixes []netip.Prefix
}

// IP keys a request by the client's IP address: "ip:" + address for IPv4
// ("ip:203.0.113.5") and "ip:" + the /64 prefix for IPv6
// ("ip:2001:db8:1:2::/64"). It is IPWith(IPOptions{Trusted: trusted}).
//
// The peer address comes from RemoteAddr: "ip:port", "[ipv6]:port" or a bare
// IP address. A RemoteAddr in any other form is an error that matches
// [ErrBadRemoteAddr]. Every address, here and in X-Forwarded-For, is
// unmapped first (::ffff:192.0.2.7 is 192.0.2.7) and its zone is dropped
// (fe80::1%eth0 is fe80::1). A client address in the NAT64 prefix
// 64:ff9b::/96 is keyed by the IPv4 address it embeds (64:ff9b::192.0.2.33
// is "ip:192.0.2.33"); see [IPOptions.NAT64Prefixes].
//
// Unless the peer is inside one of the trusted prefixes, the peer is the
// client and no header is read. Behind a trusted proxy:
//
//   - Every X-Forwarded-For line is read, in order, as one comma-separated
//     list. Spaces and tabs around an entry are ignored, and so are empty
//     entries (",,", a trailing comma, an empty line).
//   - The list is walked from the right, skipping trusted addresses; the
//     first untrusted one is the client, and the entries to its left are
//     never read, whatever they hold: a client can put anything there,
//     but the proxies append the address they saw to its right. If all
//     entries are trusted, the leftmost one is the client. Without
//     entries (a health check of the load balancer), the peer is.
//   - An entry is an IP address, "ipv4:port", "[ipv6]:port" or "[ipv6]".
//     If the entry the walk stops at is not (e.g. "unknown", a host name,
//     a quoted address, an IPv4 address with a leading zero), the client
//     cannot be told: the key function returns an error that matches
//     [ErrBadForwardedFor], never the proxy's key, since every client
//     behind it would share that. As for every key error, the rule's
//     OnError is called and the request is counted under the rule's
//     FallbackKey (see core.Rule.Key). A trusted proxy writes that entry,
//     so a client cannot cause it; to count such requests under the
//     proxy's key anyway, use Or(IP(trusted...), IP()).
//
// Other headers such as X-Real-IP, True-Client-IP, Forwarded or
// CF-Connecting-IP are never read.
func IP(trusted ...netip.Prefix) Func {
	return IPWith(IPOptions{Trusted: trusted})
}

// IPWith is [IP] with options. It panics if a trusted prefix or a NAT64
// prefix is invalid or a prefix length is out of range.
func IPWith(opts IPOptions) Func {
	k := &ipKeyer{v6bits: 64, v4bits: 32, nat64: []netip.Prefix{wellKnownNAT64}}
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
	for i, p := range opts.NAT64Prefixes {
		switch {
		case !p.IsValid() || !p.Addr().Is6() || p.Addr().Is4In6():
			panic(fmt.Sprintf("ratewindow: keyfuncs.IPWith: NAT64 prefix %d (%s) is not an IPv6 prefix", i+1, p))
		case !validNAT64Bits(p.Bits()):
			panic(fmt.Sprintf("ratewindow: keyfuncs.IPWith: NAT64 prefix %d (%s) is not 32, 40, 48, 56, 64 or 96 bits long", i+1, p))
		}
		k.nat64 = append(k.nat64, p.Masked())
	}
	return k.key
}

// validNAT64Bits reports whether bits is a prefix length of RFC 6052.
func validNAT64Bits(bits int) bool {
	switch bits {
	case 32, 40, 48, 56, 64, 96:
		return true
	}
	return false
}

// ipKeyer holds the configuration of one IP key function.
type ipKeyer struct {
	trusted []netip.Prefix
	nat64   []netip.Prefix // the Well-Known Prefix first
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
		var err error
		if client, err = k.forwarded(r.Header[xffHeader], peer); err != nil {
			return "", err
		}
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

// maxQuotedEntry bounds the part of an X-Forwarded-For entry quoted in an
// error, since the client may have sent it.
const maxQuotedEntry = 64

// forwarded walks the X-Forwarded-For lines from the right, past the
// trusted addresses, and returns the first untrusted one without reading
// further; the leftmost entry if all are trusted; peer if there is none. An
// entry the walk reaches that is not an IP address is an error that matches
// ErrBadForwardedFor.
func (k *ipKeyer) forwarded(lines []string, peer netip.Addr) (netip.Addr, error) {
	leftmost := peer
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
				if len(entry) > maxQuotedEntry {
					entry = entry[:maxQuotedEntry] + "..."
				}
				return netip.Addr{}, fmt.Errorf("%w: %q", ErrBadForwardedFor, entry)
			}
			if !k.isTrusted(a) {
				return a, nil
			}
			leftmost = a
		}
	}
	return leftmost, nil
}

// format builds the key of a, grouped by the configured prefix length. An
// address in a NAT64 prefix is keyed by the IPv4 address it embeds.
func (k *ipKeyer) format(a netip.Addr) string {
	if a.Is6() {
		if v4, ok := k.embeddedIPv4(a); ok {
			a = v4
		}
	}
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

// embeddedIPv4 returns the IPv4 address embedded in a by the first NAT64
// prefix that contains a, following RFC 6052, section 2.2: the 32 bits
// start right after the prefix and skip bits 64 to 71, which must be zero.
func (k *ipKeyer) embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	for _, p := range k.nat64 {
		if !p.Contains(a) {
			continue
		}
		b := a.As16()
		if p.Bits() < 96 && b[8] != 0 {
			return netip.Addr{}, false
		}
		var v4 [4]byte
		for i, n := p.Bits()/8, 0; n < len(v4); i++ {
			if i == 8 {
				continue // the "u" octet
			}
			v4[n] = b[i]
			n++
		}
		return netip.AddrFrom4(v4), true
	}
	return netip.Addr{}, false
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
