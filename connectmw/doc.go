// Package connectmw rate-limits Connect services (connect-go) with a
// ratewindow Limiter, answering each client in the protocol it spoke.
//
// Connect handlers are http.Handlers, so a core.Rule and the key functions
// of keyfuncs apply to them unchanged; what changes is the denial. Limit
// (or New, which returns the error of an invalid rule instead of
// panicking) wraps the handler of a service, or a mux of services and
// plain HTTP routes:
//
//	mux := http.NewServeMux()
//	mux.Handle(pingv1connect.NewPingServiceHandler(ping))
//	limit := connectmw.Limit(l, core.Rule{
//		Name:   "api",
//		Limits: []core.Limit{core.PerMinute(100)},
//	})
//	http.ListenAndServe(":8080", limit(mux))
//
// A Connect, gRPC or gRPC-Web call that a limit denies gets, before its
// request body is read, a connect.Error of code CodeResourceExhausted
// with a google.rpc.RetryInfo detail holding the exact time until the call
// would pass, written by connect's ErrorWriter; the rate-limit header
// fields of the rule (X-RateLimit-* or the IETF RateLimit and
// RateLimit-Policy) and Retry-After go out as response headers. A
// connect-go client reads them so:
//
//	_, err := client.Ping(ctx, req)
//	var cerr *connect.Error
//	if errors.As(err, &cerr) && cerr.Code() == connect.CodeResourceExhausted {
//		for _, d := range cerr.Details() {
//			if v, err := d.Value(); err == nil {
//				if ri, ok := v.(*errdetails.RetryInfo); ok {
//					wait = ri.GetRetryDelay().AsDuration() // exact, to the µs
//				}
//			}
//		}
//		retryAfter := cerr.Meta().Get("Retry-After") // whole seconds
//	}
//
// When the Limiter answers with the 503 of its failure mode (FailClosed,
// or a decision shed for overload, core.ErrShed), a call gets
// CodeUnavailable with a RetryInfo of one second. Plain HTTP callers of the
// same handler get what nethttp gives them, 429 with Retry-After, counted
// under the same keys as the calls.
//
// The middleware tells the calls from the other requests with the
// ErrorWriter's IsSupported: see WithErrorWriter.
//
// This module is apart from the root module so that connect-go and
// genproto enter only the builds of the applications that use it.
package connectmw
