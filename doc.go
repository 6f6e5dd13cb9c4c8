// Package ratewindow is Redis-backed rate limiting for Go HTTP services
// that run as many replicas: every replica asks one Redis whether a request
// may pass, in one atomic script call over sliding windows.
//
// This root package holds no code. The parts:
//
//   - core: Limiter (Redis or memory), Limit, Result, and Rule, the one
//     description of "limit these requests" that every adapter shares.
//   - keyfuncs: the key of a request: client IP (with trusted proxies),
//     header, user, route pattern, method, or a combination.
//   - nethttp, chimw, ginmw, echomw: middleware for net/http, chi, gin and
//     echo. They answer identically, byte for byte: rate-limit header fields
//     (X-RateLimit-* or the IETF RateLimit and RateLimit-Policy fields), 429
//     Too Many Requests with Retry-After, and 503 when Redis fails and the
//     Limiter fails closed.
//   - grpcmw, connectmw: server interceptors for gRPC and a handler wrapper
//     for Connect (RESOURCE_EXHAUSTED with RetryInfo), and gRPC client
//     interceptors that throttle outbound calls.
//   - prometheus, otel: observers that turn decisions into metrics.
package ratewindow
