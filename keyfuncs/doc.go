// Package keyfuncs turns an HTTP request into a rate-limit key.
//
// A key function has the type [Func]. The ready ones build keys with a fixed
// prefix, so keys of different kinds never collide:
//
//	IP       ip:203.0.113.5, ip:2001:db8:1:2::/64
//	Header   h:x-api-key:<value>
//	User     user:<id>
//	Route    route:/users/{id}
//	Method   method:GET
//	Join     user:42|route:/login  ("|" and "\" within a key escaped with "\")
//	Or       the key of the first function that gives one
//
// # Client address
//
// [IP] keys a request by the peer address in RemoteAddr. X-Forwarded-For is
// read only when the peer is inside one of the trusted proxy prefixes; then
// the list is walked from the right, past the trusted proxies, and the first
// untrusted address is the client. The entries to its left are never read:
// a client can add whatever it likes there without changing its key. If the
// entry the walk stops at is not an IP address, the key function fails with
// [ErrBadForwardedFor] rather than keying every client behind the proxy
// under the proxy's address. Other headers (X-Real-IP, True-Client-IP,
// Forwarded, CF-Connecting-IP) are never read. IPv6 clients are grouped by
// /64 by default, so a client cannot rotate addresses inside its own
// allocation to escape a limit; an IPv4 client seen through NAT64
// (64:ff9b::/96) is keyed by its IPv4 address. See [IP] for the exact
// rules.
//
// # Behind proxies
//
// List the proxies' own addresses, each as a /32 (or /128) prefix, or the
// smallest prefix that holds only them:
//
//	byClient := keyfuncs.IP(netip.MustParsePrefix("10.1.0.7/32"), netip.MustParsePrefix("10.1.0.8/32"))
//
// not a whole range such as 10.0.0.0/8 because the proxies live somewhere in
// it. Every host of a trusted prefix is believed about the client's address:
// any of them that reaches the service directly (another workload of the
// same network) can send "X-Forwarded-For: 198.51.100.23" and be counted as
// that client. It escapes its own limit, and under a rule with a Penalty it
// gets 198.51.100.23 banned. Give the rule's FallbackKey the same function,
// so that requests whose key fails are counted per client too, not under
// the proxy's address.
//
// # Route
//
// [Route] keys a request by its route pattern, never by its raw path, so one
// limit covers /users/1 and /users/2 and a client cannot mint new keys by
// changing the path. The pattern comes from the request context, where a
// framework adapter puts it with [WithRoute], or else from
// [http.Request.Pattern], which [http.ServeMux] sets on the request it hands
// to the matched handler.
//
// # Errors
//
// A key function that cannot produce a key returns an error and an empty key;
// it never panics on request input. Callers test errors with [errors.Is]:
// [ErrNoHeader], [ErrNoUser] and [ErrNoRoute] also match [ErrNoKey] (the
// request carries no key of that kind), while [ErrBadRemoteAddr] means the
// server handed over a RemoteAddr that is not an IP address and
// [ErrBadForwardedFor] that a trusted proxy handed over a client address
// that is not one. [Or] tries key functions in turn and fails only when
// all do.
//
// Constructors panic on invalid configuration (a nil function, an empty
// header name, an invalid prefix), so mistakes show at start-up, never at
// request time.
package keyfuncs
