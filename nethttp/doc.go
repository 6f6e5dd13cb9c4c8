// Package nethttp rate-limits net/http servers and clients with a
// ratewindow Limiter.
//
// Limit (or New, which returns the error of an invalid rule instead of
// panicking) turns a core.Rule into middleware of the standard form
// func(http.Handler) http.Handler:
//
//	l, _ := core.New(redisClient)
//	limit := nethttp.Limit(l, core.Rule{
//		Name:   "api",
//		Limits: []core.Limit{core.PerMinute(100)},
//	})
//	http.ListenAndServe(":8080", limit(mux))
//
// Every request passes through the rule's key function (the client IP by
// default), is counted under every limit of the rule in one round trip, and
// gets the rate-limit header fields; a denied request is answered with 429
// Too Many Requests and Retry-After. The answers are the same, byte for
// byte, in the chi, gin and echo adapters (chimw, ginmw, echomw).
//
// # Route patterns
//
// keyfuncs.Route keys a request by its route pattern, which http.ServeMux
// sets in Request.Pattern on the request it passes to the handler it
// matched. A middleware that wraps a handler registered on the mux sees
// it; a middleware that wraps the whole mux runs before the mux has
// matched anything, so give it the mux with WithMux.
//
// The package also holds the outbound side, Transport: an
// http.RoundTripper that waits for the Limiter instead of failing.
package nethttp
