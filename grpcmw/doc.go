// Package grpcmw rate-limits gRPC calls with a core.Limiter: unary and
// stream server interceptors that decide each call as the HTTP middleware
// decides a request (the same core.Decider: limits, keys with a fallback,
// costs, limits per call, Skip, DryRun, Penalty, CountIf, failure modes,
// the deny cache, observers), and client interceptors that throttle
// outbound calls to a quota shared by every replica.
//
// A denied call ends with codes.ResourceExhausted and the details a client
// can act on: google.rpc.RetryInfo (the exact delay), QuotaFailure (the
// rule and the policy that denied, never the key) and ErrorInfo; the
// rate-limit fields and retry-after go out as trailer metadata (the
// denial is trailers-only), and with Rule.Pushback the grpc-retry-pushback-ms trailer tells a
// grpc-go retry policy when to retry. A Limiter that fails closed, or a
// decision shed for overload, answers codes.Unavailable with a RetryInfo
// of a second.
//
//	rl, err := grpcmw.New(limiter, grpcmw.Rule{
//		Name:   "api",
//		Limits: []core.Limit{core.PerSecond(10)},
//		Key:    grpcmw.Metadata("x-api-key"),
//	})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(auth, rl.Unary()),
//		grpc.ChainStreamInterceptor(auth, rl.Stream()),
//	)
//
// See docs/grpc.md for the interceptor chain's order, keys behind a proxy,
// streams, and what a client sees.
package grpcmw
