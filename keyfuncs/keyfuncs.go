package keyfuncs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/ratewindow/ratewindow/internal/httpx"
)

// Func extracts a rate-limit key from a request.
//
// It returns a non-empty key, or an empty key and an error. It must be safe
// for concurrent use.
type Func func(*http.Request) (string, error)

var (
	// ErrNoKey means that a key function produced no key. [ErrNoHeader],
	// [ErrNoUser] and [ErrNoRoute] match it too; [Join] returns it when it
	// has no key functions or one of them returned an empty key.
	ErrNoKey = errors.New("ratewindow: no key")

	// ErrNoHeader means that the header read by [Header] is missing or empty.
	ErrNoHeader error = &noKeyError{"ratewindow: header missing or empty"}

	// ErrNoUser means that the function given to [User] found no user.
	ErrNoUser error = &noKeyError{"ratewindow: no user"}

	// ErrNoRoute means that [Route] found no route pattern, neither in the
	// request context ([WithRoute]) nor in [http.Request.Pattern].
	ErrNoRoute error = &noKeyError{"ratewindow: no route pattern"}

	// ErrBadRemoteAddr means that [http.Request.RemoteAddr] is not an IP
	// address, with or without a port (for example on a Unix socket).
	ErrBadRemoteAddr = errors.New("ratewindow: RemoteAddr is not an IP address")

	// ErrBadForwardedFor means that [IP], behind a trusted proxy, found an
	// X-Forwarded-For entry that is not an IP address where the client's
	// address should be: the first entry from the right that is not a
	// trusted proxy. Like [ErrBadRemoteAddr], it does not match
	// [ErrNoKey]: the proxies handed over something that is not an
	// address.
	ErrBadForwardedFor = errors.New("ratewindow: the client's X-Forwarded-For entry is not an IP address")
)

// noKeyError is an error that also matches ErrNoKey.
type noKeyError struct{ msg string }

func (e *noKeyError) Error() string        { return e.msg }
func (e *noKeyError) Is(target error) bool { return target == ErrNoKey }

// Header keys a request by the first value of the named header:
// "h:" + lower-case name + ":" + value, e.g. "h:x-api-key:abc".
//
// A missing or empty header is an error that matches [ErrNoHeader]. The
// value is sent by the client: combine it with [IP] or validate it (e.g. an
// API key) unless each value stands for a client you know.
//
// Header panics if name is empty.
func Header(name string) Func {
	if name == "" {
		panic("ratewindow: keyfuncs.Header: empty header name")
	}
	canonical := http.CanonicalHeaderKey(name)
	prefix := "h:" + strings.ToLower(canonical) + ":"
	missing := fmt.Errorf("%w: %s", ErrNoHeader, canonical)
	return func(r *http.Request) (string, error) {
		vs := r.Header[canonical]
		if len(vs) == 0 || vs[0] == "" {
			return "", missing
		}
		return prefix + vs[0], nil
	}
}

// User keys a request by the user that fn finds in the request context:
// "user:" + id. If fn reports false or an empty id, the error is [ErrNoUser].
//
// User panics if fn is nil.
func User(fn func(context.Context) (string, bool)) Func {
	if fn == nil {
		panic("ratewindow: keyfuncs.User: nil function")
	}
	return func(r *http.Request) (string, error) {
		id, ok := fn(r.Context())
		if !ok || id == "" {
			return "", ErrNoUser
		}
		return "user:" + id, nil
	}
}

// routeKey is the context key under which WithRoute stores a pattern.
type routeKey struct{}

// WithRoute returns a copy of ctx that carries the route pattern that
// matched the request, for [Route]. Framework adapters call it with the
// framework's pattern (chi's RoutePattern, gin's FullPath, echo's Path)
// before the key function runs. The pattern is stored as given. An empty
// pattern means no route and hides any pattern stored earlier.
func WithRoute(ctx context.Context, pattern string) context.Context {
	return context.WithValue(ctx, routeKey{}, pattern)
}

// RouteFrom returns the route pattern stored by [WithRoute], and whether
// there is a non-empty one.
func RouteFrom(ctx context.Context) (string, bool) {
	p, _ := ctx.Value(routeKey{}).(string)
	return p, p != ""
}

// Route keys a request by its route pattern, never by its raw path:
// "route:" + pattern, e.g. "route:/users/{id}".
//
// The pattern stored in the request context by [WithRoute] comes first.
// Otherwise Route uses [http.Request.Pattern], set by [http.ServeMux] on the
// request it passes to the matched handler, without its method: the pattern
// "GET /users/{id}" gives "route:/users/{id}" (a host stays:
// "example.com/users/{id}"). With neither, the error is [ErrNoRoute].
//
// Two traps, both ending in [ErrNoRoute], which is a key error: the rule's
// OnError is called and such requests are counted under the rule's
// FallbackKey (by default per client IP, see core.Rule.Key), not per
// route:
//
//   - A request that matches no route has no pattern. With chi this is
//     every unmatched path (a 404) reaching a rule installed router-wide
//     with Use, where the middleware runs before chi's 404.
//   - With net/http, r.Pattern is empty in a middleware that wraps the
//     whole mux, since the mux has not routed the request yet: every
//     request fails. Wrap the handlers registered on the mux instead, pass
//     the mux to the middleware (nethttp.WithMux), or store the pattern
//     found by [http.ServeMux.Handler] with [WithRoute].
//
// To give unmatched requests a key of their own, wrap Route in [Or]:
// Or(Join(IP(), Route()), IP()) keys by address and route, and by address
// alone where there is no route.
func Route() Func {
	return func(r *http.Request) (string, error) {
		if p, ok := RouteFrom(r.Context()); ok {
			return "route:" + p, nil
		}
		if p := httpx.StripMethod(r.Pattern); p != "" {
			return "route:" + p, nil
		}
		return "", ErrNoRoute
	}
}

// Method keys a request by its method: "method:" + r.Method, e.g.
// "method:GET". An empty method is GET, as in net/http. Clients may send
// methods of their own: combine Method with another key.
func Method() Func {
	return func(r *http.Request) (string, error) {
		if r.Method == "" {
			return "method:GET", nil
		}
		return "method:" + r.Method, nil
	}
}

// errJoinEmpty is returned by the Func of a Join without key functions.
var errJoinEmpty = fmt.Errorf("%w (Join without key functions)", ErrNoKey)

// Join keys a request by several keys joined with "|" in order, e.g.
// Join(User(fn), Route()) gives "user:42|route:/login".
//
// Within each key, "|" and "\" are escaped with a "\" ("a|b" is written
// "a\|b"), so that different keys never join to the same string: a client
// that controls one of them (a header value) cannot make its joined key
// equal to another client's. Keys without those characters are written as
// they are.
//
// The first error wins and is returned wrapped (errors.Is sees through it);
// the keys after it are not computed. A key function that returns an empty
// key without an error is an error that matches [ErrNoKey]. Join with no
// key functions returns a Func that always fails with [ErrNoKey].
//
// Join panics if one of fs is nil.
func Join(fs ...Func) Func {
	if len(fs) == 0 {
		return func(*http.Request) (string, error) { return "", errJoinEmpty }
	}
	for i, f := range fs {
		if f == nil {
			panic(fmt.Sprintf("ratewindow: keyfuncs.Join: key function %d is nil", i+1))
		}
	}
	fs = append([]Func(nil), fs...)
	return func(r *http.Request) (string, error) {
		var buf [128]byte
		b := buf[:0]
		for i, f := range fs {
			k, err := f(r)
			if err == nil && k == "" {
				err = ErrNoKey
			}
			if err != nil {
				return "", fmt.Errorf("%w (Join key %d of %d)", err, i+1, len(fs))
			}
			if i > 0 {
				b = append(b, joinSeparator)
			}
			b = appendEscaped(b, k)
		}
		return string(b), nil
	}
}

// joinSeparator separates the keys of Join; joinEscape escapes it, and
// itself, within a key.
const (
	joinSeparator = '|'
	joinEscape    = '\\'
)

// appendEscaped appends k to b with every joinSeparator and joinEscape
// preceded by a joinEscape.
func appendEscaped(b []byte, k string) []byte {
	for {
		i := strings.IndexAny(k, "|\\")
		if i < 0 {
			return append(b, k...)
		}
		b = append(b, k[:i]...)
		b = append(b, joinEscape, k[i])
		k = k[i+1:]
	}
}

// errOrEmpty is returned by the Func of an Or without key functions.
var errOrEmpty = fmt.Errorf("%w (Or without key functions)", ErrNoKey)

// Or keys a request by the first of fs that gives a key: a non-empty key
// and a nil error. Or(User(fn), IP()) keys signed-in users by their id and
// everyone else by address. The key functions after the one that gives the
// key are not called.
//
// The keys of fs should have distinct prefixes, as the ready ones have, so
// that a key of one kind never stands for a key of another.
//
// When none gives a key, the error wraps the error of every one of fs, in
// order (errors.Is and errors.As see through it to each); a key function
// that returns an empty key without an error counts as [ErrNoKey]. Or with
// no key functions returns a Func that always fails with [ErrNoKey].
//
// Or panics if one of fs is nil.
func Or(fs ...Func) Func {
	if len(fs) == 0 {
		return func(*http.Request) (string, error) { return "", errOrEmpty }
	}
	for i, f := range fs {
		if f == nil {
			panic(fmt.Sprintf("ratewindow: keyfuncs.Or: key function %d is nil", i+1))
		}
	}
	fs = append([]Func(nil), fs...)
	return func(r *http.Request) (string, error) {
		var buf [4]error
		errs := buf[:0]
		for _, f := range fs {
			k, err := f(r)
			if err == nil && k != "" {
				return k, nil
			}
			if err == nil {
				err = ErrNoKey
			}
			errs = append(errs, err)
		}
		wrapped := make([]error, len(errs))
		for i, err := range errs {
			wrapped[i] = fmt.Errorf("%w (Or key %d of %d)", err, i+1, len(fs))
		}
		return "", &orError{errs: wrapped}
	}
}

// orError is the error of an Or whose key functions all failed.
type orError struct{ errs []error }

func (e *orError) Error() string {
	var b strings.Builder
	for i, err := range e.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap returns the error of every key function, in order.
func (e *orError) Unwrap() []error { return e.errs }

// Value keys a request by a value that get finds for it, such as one that
// earlier middleware stored in a framework's context: name + ":" + the
// value (strings as they are, integers in decimal, a fmt.Stringer by its
// String, anything else as fmt.Sprint prints it). When get finds nothing,
// nil, or a value that prints empty, the error matches ErrNoKey.
// ginmw.Key and echomw.Key are built on it.
//
// Value panics if get is nil.
func Value(name string, get func(*http.Request) (any, bool)) Func {
	if get == nil {
		panic("ratewindow: keyfuncs.Value: nil function")
	}
	prefix := name + ":"
	missing := fmt.Errorf("%w: no value %q", ErrNoKey, name)
	return func(r *http.Request) (string, error) {
		v, ok := get(r)
		if !ok || v == nil {
			return "", missing
		}
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		case uint64:
			s = strconv.FormatUint(v, 10)
		case fmt.Stringer:
			s = v.String()
		default:
			s = fmt.Sprint(v)
		}
		if s == "" {
			return "", missing
		}
		return prefix + s, nil
	}
}
