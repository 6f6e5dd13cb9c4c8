package keyfuncs_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"github.com/ratewindow/ratewindow/keyfuncs"
)

func ExampleIP() {
	key := keyfuncs.IP()

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "203.0.113.5:4711"
	r.Header.Set("X-Forwarded-For", "198.51.100.1") // not trusted: ignored
	fmt.Println(key(r))

	r.RemoteAddr = "[2001:db8:1:2::5]:4711" // IPv6 is grouped by /64
	fmt.Println(key(r))
	// Output:
	// ip:203.0.113.5 <nil>
	// ip:2001:db8:1:2::/64 <nil>
}

func ExampleIP_trustedProxy() {
	// The two load balancers' own addresses: never a whole range such as
	// 10.0.0.0/8, whose every host could then choose its client address.
	key := keyfuncs.IP(netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.1.1.1/32"))

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:4711"
	// The client sent "198.51.100.66"; the proxies appended what they saw.
	r.Header.Set("X-Forwarded-For", "198.51.100.66, 203.0.113.5, 10.1.1.1")
	fmt.Println(key(r))

	// Whatever the client put left of its own address is never read.
	r.Header.Set("X-Forwarded-For", "unknown, 203.0.113.5")
	fmt.Println(key(r))

	// Where the client's address should be, an entry that is not one is an
	// error, never the proxy's key: every client behind it would share that.
	r.Header.Set("X-Forwarded-For", "203.0.113.5, unknown")
	_, err := key(r)
	fmt.Println(errors.Is(err, keyfuncs.ErrBadForwardedFor))

	// A health check of the load balancer itself carries no list.
	r.Header.Del("X-Forwarded-For")
	fmt.Println(key(r))

	// Another host of the network, not a listed proxy, reaching the
	// service directly: its X-Forwarded-For is not read.
	r.RemoteAddr = "10.0.0.99:4711"
	r.Header.Set("X-Forwarded-For", "198.51.100.23")
	fmt.Println(key(r))
	// Output:
	// ip:203.0.113.5 <nil>
	// ip:203.0.113.5 <nil>
	// true
	// ip:10.0.0.1 <nil>
	// ip:10.0.0.99 <nil>
}

func ExampleIPWith() {
	key := keyfuncs.IPWith(keyfuncs.IPOptions{
		IPv6Bits: 48,
		// The translator's network-specific prefix (RFC 8215 local use).
		NAT64Prefixes: []netip.Prefix{netip.MustParsePrefix("64:ff9b:1::/96")},
	})

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "[2001:db8:1:2::5]:4711"
	fmt.Println(key(r))

	// IPv4 clients behind NAT64 are keyed by their own IPv4 address.
	r.RemoteAddr = "[64:ff9b::198.51.100.7]:4711" // the Well-Known Prefix
	fmt.Println(key(r))
	r.RemoteAddr = "[64:ff9b:1::192.0.2.33]:4711"
	fmt.Println(key(r))
	// Output:
	// ip:2001:db8:1::/48 <nil>
	// ip:198.51.100.7 <nil>
	// ip:192.0.2.33 <nil>
}

func ExampleHeader() {
	key := keyfuncs.Header("X-API-Key")

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "k-123")
	fmt.Println(key(r))

	r.Header.Del("X-API-Key")
	_, err := key(r)
	fmt.Println(errors.Is(err, keyfuncs.ErrNoHeader))
	// Output:
	// h:x-api-key:k-123 <nil>
	// true
}

type accountKey struct{}

func ExampleUser() {
	key := keyfuncs.User(func(ctx context.Context) (string, bool) {
		id, ok := ctx.Value(accountKey{}).(string)
		return id, ok
	})

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r = r.WithContext(context.WithValue(r.Context(), accountKey{}, "42"))
	fmt.Println(key(r))
	// Output:
	// user:42 <nil>
}

func ExampleRoute() {
	key := keyfuncs.Route()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Println(key(r)) // the pattern, not the path
	})
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/users/1", nil))
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/users/2", nil))

	// Outside the mux there is no pattern, and the path is never used.
	_, err := key(httptest.NewRequest(http.MethodGet, "/users/3", nil))
	fmt.Println(err)
	// Output:
	// route:/users/{id} <nil>
	// route:/users/{id} <nil>
	// ratewindow: no route pattern
}

func ExampleWithRoute() {
	// What a framework adapter does with the framework's pattern
	// (gin's c.FullPath(), echo's c.Path(), chi's RoutePattern()).
	r := httptest.NewRequest(http.MethodGet, "/users/1", nil)
	r = r.WithContext(keyfuncs.WithRoute(r.Context(), "/users/:id"))

	fmt.Println(keyfuncs.Route()(r))
	// Output:
	// route:/users/:id <nil>
}

func ExampleJoin() {
	key := keyfuncs.Join(keyfuncs.IP(), keyfuncs.Method(), keyfuncs.Route())

	r := httptest.NewRequest(http.MethodPost, "/login", nil)
	r.RemoteAddr = "203.0.113.5:4711"
	r.Pattern = "POST /login" // as set by http.ServeMux
	fmt.Println(key(r))

	r.Pattern = ""
	_, err := key(r)
	fmt.Println(errors.Is(err, keyfuncs.ErrNoRoute))
	// Output:
	// ip:203.0.113.5|method:POST|route:/login <nil>
	// true
}

func ExampleJoin_escaping() {
	// A client sends both headers: "|" inside a value is escaped, so no
	// choice of values gives another client's key.
	key := keyfuncs.Join(keyfuncs.Header("X-Tenant"), keyfuncs.Header("X-Team"))

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Tenant", "acme|h:x-team:red")
	r.Header.Set("X-Team", "blue")
	fmt.Println(key(r))

	r.Header.Set("X-Tenant", "acme")
	r.Header.Set("X-Team", "red|h:x-team:blue")
	fmt.Println(key(r))
	// Output:
	// h:x-tenant:acme\|h:x-team:red|h:x-team:blue <nil>
	// h:x-tenant:acme|h:x-team:red\|h:x-team:blue <nil>
}

func ExampleOr() {
	// Signed-in users by their id, everyone else by address.
	key := keyfuncs.Or(
		keyfuncs.User(func(ctx context.Context) (string, bool) {
			id, ok := ctx.Value(accountKey{}).(string)
			return id, ok
		}),
		keyfuncs.IP(),
	)

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "203.0.113.5:4711"
	fmt.Println(key(r))

	r = r.WithContext(context.WithValue(r.Context(), accountKey{}, "42"))
	fmt.Println(key(r))

	// When none gives a key, the error wraps every error.
	r.RemoteAddr = "@"
	_, err := keyfuncs.Or(keyfuncs.Header("X-API-Key"), keyfuncs.IP())(r)
	fmt.Println(errors.Is(err, keyfuncs.ErrNoHeader), errors.Is(err, keyfuncs.ErrBadRemoteAddr))
	// Output:
	// ip:203.0.113.5 <nil>
	// user:42 <nil>
	// true true
}

func ExampleRoute_unmatched() {
	// An unmatched request has no route: keyed by address alone instead.
	key := keyfuncs.Or(keyfuncs.Join(keyfuncs.IP(), keyfuncs.Route()), keyfuncs.IP())

	r := httptest.NewRequest(http.MethodGet, "/users/1", nil)
	r.RemoteAddr = "203.0.113.5:4711"
	r.Pattern = "GET /users/{id}" // as set by http.ServeMux
	fmt.Println(key(r))

	r.Pattern = ""
	fmt.Println(key(r))
	// Output:
	// ip:203.0.113.5|route:/users/{id} <nil>
	// ip:203.0.113.5 <nil>
}
