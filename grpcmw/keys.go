package grpcmw

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratewindow/ratewindow/keyfuncs"
)

var (
	// ErrNoPeer means that the call's context holds no peer address.
	ErrNoPeer = errors.New("ratewindow: grpcmw: the call has no peer address")
	// ErrNoMetadata means that the metadata read by Metadata is missing or
	// empty. It matches keyfuncs.ErrNoKey.
	ErrNoMetadata error = noKeyError("ratewindow: grpcmw: metadata missing or empty")
	// ErrMetadataTooLong means that the metadata value read by Metadata is
	// longer than MaxMetadataValue.
	ErrMetadataTooLong = errors.New("ratewindow: grpcmw: metadata value too long")
	// ErrNoIdentity means that the function given to Identity found none.
	// It matches keyfuncs.ErrNoKey.
	ErrNoIdentity error = noKeyError("ratewindow: grpcmw: no identity")
)

// noKeyError is an error that also matches keyfuncs.ErrNoKey.
type noKeyError string

func (e noKeyError) Error() string        { return string(e) }
func (e noKeyError) Is(target error) bool { return target == keyfuncs.ErrNoKey }

// MaxMetadataValue is the longest metadata value Metadata keys a call by.
const MaxMetadataValue = 256

// Peer keys a call by the peer's IP address, as keyfuncs.IP keys an HTTP
// request by RemoteAddr: "ip:203.0.113.5", IPv6 grouped by /64. It is
// PeerWith(keyfuncs.IPOptions{Trusted: trusted}).
func Peer(trusted ...netip.Prefix) KeyFunc {
	return PeerWith(keyfuncs.IPOptions{Trusted: trusted})
}

// PeerWith keys a call by its client's IP address with keyfuncs.IPWith's
// options and rules, which it uses: the peer address; when the peer is a
// trusted proxy, the x-forwarded-for metadata, walked from the right past
// the trusted addresses (entries left of the client are never read). A peer
// that is not an IP address (a Unix socket) is an error matching
// keyfuncs.ErrBadRemoteAddr, a forwarded entry that is not one an error
// matching keyfuncs.ErrBadForwardedFor: the call is then counted under the
// rule's FallbackKey. It panics on invalid options, as IPWith does.
func PeerWith(opts keyfuncs.IPOptions) KeyFunc {
	ip := keyfuncs.IPWith(opts)
	trusting := len(opts.Trusted) > 0
	return func(c Call) (string, error) {
		p, ok := peer.FromContext(c.Context)
		if !ok || p.Addr == nil {
			return "", ErrNoPeer
		}
		r := &http.Request{}
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			r.RemoteAddr = tcp.AddrPort().String() // one allocation, not two
		} else {
			r.RemoteAddr = p.Addr.String()
		}
		if trusting {
			if md, ok := metadata.FromIncomingContext(c.Context); ok {
				if xff := md["x-forwarded-for"]; len(xff) > 0 {
					r.Header = http.Header{"X-Forwarded-For": xff}
				}
			}
		}
		return ip(r)
	}
}

// Metadata keys a call by the first value of the named request metadata:
// "md:" + lower-case name + ":" + value ("md:x-api-key:abc"). A missing or
// empty value is an error matching ErrNoMetadata, a value longer than
// MaxMetadataValue one matching ErrMetadataTooLong: the call is counted
// under the rule's FallbackKey. The value is sent by the client: validate
// it (an API key) unless each value stands for a client you know. Metadata
// panics on an empty name or a binary one ("-bin").
func Metadata(name string) KeyFunc {
	name = strings.ToLower(name)
	if name == "" || strings.HasSuffix(name, "-bin") {
		panic(fmt.Sprintf("ratewindow: grpcmw.Metadata: invalid metadata name %q", name))
	}
	prefix := "md:" + name + ":"
	missing := fmt.Errorf("%w: %s", ErrNoMetadata, name)
	tooLong := fmt.Errorf("%w: %s is longer than %d bytes", ErrMetadataTooLong, name, MaxMetadataValue)
	return func(c Call) (string, error) {
		md, _ := metadata.FromIncomingContext(c.Context)
		vs := md[name]
		switch {
		case len(vs) == 0 || vs[0] == "":
			return "", missing
		case len(vs[0]) > MaxMetadataValue:
			return "", tooLong
		}
		return prefix + vs[0], nil
	}
}

// Method keys a call by its full method: "method:/pkg.Service/Method".
func Method() KeyFunc {
	return func(c Call) (string, error) { return "method:" + c.Method, nil }
}

// Identity keys a call by the identity fn finds in its context (stored by
// an authentication interceptor that runs first): "user:" + id. When fn
// reports false or an empty id, the error is ErrNoIdentity. It panics if fn
// is nil.
func Identity(fn func(context.Context) (string, bool)) KeyFunc {
	if fn == nil {
		panic("ratewindow: grpcmw.Identity: nil function")
	}
	return func(c Call) (string, error) {
		id, ok := fn(c.Context)
		if !ok || id == "" {
			return "", ErrNoIdentity
		}
		return "user:" + id, nil
	}
}

// Join keys a call by the keys of all fs, in order, as keyfuncs.Join does:
// joined by '|', with '|' and '\' inside a key escaped by '\', so that
// distinct tuples never share a key. The first error is returned, wrapped.
// It panics if one of fs is nil.
func Join(fs ...KeyFunc) KeyFunc {
	for i, f := range fs {
		if f == nil {
			panic(fmt.Sprintf("ratewindow: grpcmw.Join: key function %d is nil", i+1))
		}
	}
	fs = append([]KeyFunc(nil), fs...)
	return func(c Call) (string, error) {
		if len(fs) == 0 {
			return "", fmt.Errorf("%w (Join without key functions)", keyfuncs.ErrNoKey)
		}
		var b strings.Builder
		for i, f := range fs {
			k, err := f(c)
			if err == nil && k == "" {
				err = keyfuncs.ErrNoKey
			}
			if err != nil {
				return "", fmt.Errorf("%w (Join key %d of %d)", err, i+1, len(fs))
			}
			if i > 0 {
				b.WriteByte('|')
			}
			for j := 0; j < len(k); j++ {
				if k[j] == '|' || k[j] == '\\' {
					b.WriteByte('\\')
				}
				b.WriteByte(k[j])
			}
		}
		return b.String(), nil
	}
}
