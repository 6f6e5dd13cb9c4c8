#!/usr/bin/env bash
# gRPC: the module graph check, then the gRPC example's smoke test.
#
# 1. An application that uses only nethttp builds nothing of grpc-go,
#    genproto or connect-go: a fresh module requiring the root module alone
#    (no go.work) lists its packages' dependencies with go list -deps.
# 2. _examples/grpc is built and started on a free port of 127.0.0.1 with
#    the embedded Redis (REDIS_URL unset); its own client (-call) checks the
#    health service and calls the limited method until RESOURCE_EXHAUSTED,
#    which must carry RetryInfo, QuotaFailure, ErrorInfo and the pushback
#    and retry-after trailers; SIGTERM must stop the server cleanly.
# (20-examples.sh vets and builds every package under _examples, this one
# included; the main test command runs grpcmw's tests with -race on real
# Redis.) Run from the repository root.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."
root="$(pwd)"
start_timeout=20 # seconds until the server prints its address
stop_timeout=10  # seconds until it exits after SIGTERM

section() {
	printf '\n==== %s ====\n' "$*"
}

tmp="$(mktemp -d)"
pid=""
cleanup() {
	if [ -n "$pid" ]; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

section "grpc: a nethttp-only application builds no grpc or connect package"
mkdir -p "$tmp/app"
cat >"$tmp/app/go.mod" <<MOD
module example.com/httponly

go 1.26.0

require github.com/ratewindow/ratewindow v0.0.0

replace github.com/ratewindow/ratewindow => $root
MOD
cat >"$tmp/app/main.go" <<'GO'
package main

import (
	"net/http"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/nethttp"
)

func main() {
	h := nethttp.LimitByIP(core.NewMemory(), 10, 60e9)(http.NotFoundHandler())
	_ = http.ListenAndServe("127.0.0.1:0", h)
}
GO
(cd "$tmp/app" && GOWORK=off GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 && GOWORK=off go list -deps . >"$tmp/deps")
if grep -E '^(google\.golang\.org/grpc|google\.golang\.org/genproto|connectrpc\.com)' "$tmp/deps"; then
	echo "FAIL: a nethttp-only application builds the packages above"
	exit 1
fi
if (cd "$tmp/app" && GOWORK=off go list -m all) | grep -E '^(google\.golang\.org/grpc|connectrpc\.com) '; then
	echo "FAIL: a nethttp-only application's module graph holds the modules above"
	exit 1
fi
echo "ok   $(wc -l <"$tmp/deps") packages, none of grpc, genproto or connect"

section "grpc: example smoke test (embedded Redis, 127.0.0.1, free port)"
go build -o "$tmp/grpc" ./_examples/grpc
out="$tmp/grpc.out"
: >"$out"
env -u REDIS_URL ADDR=127.0.0.1:0 "$tmp/grpc" >"$out" 2>&1 &
pid=$!
fail() {
	echo "FAIL grpc: $1"
	echo "---- server output ----"
	cat "$out" || true
	echo "---- client output ----"
	cat "$tmp/call.out" 2>/dev/null || true
	exit 1
}
addr=""
for ((i = 0; i < start_timeout * 10; i++)); do
	addr="$(sed -n 's|^listening on grpc://\(127\.0\.0\.1:[0-9][0-9]*\)$|\1|p' "$out")"
	[ -n "$addr" ] && break
	kill -0 "$pid" 2>/dev/null || fail "exited before it listened"
	sleep 0.1
done
[ -n "$addr" ] || fail "printed no address within ${start_timeout}s"
grep -q '^redis: *embedded miniredis' "$out" || fail "did not say it uses the embedded Redis"

"$tmp/grpc" -call "$addr" >"$tmp/call.out" 2>&1 || fail "the client failed"
cat "$tmp/call.out"
for want in \
	'^health: SERVING$' \
	'^call 5: hello, smoke (ratelimit: "5-per-1m";r=0;t=60)$' \
	'^call 6: code 8 ResourceExhausted: rate limit exceeded$' \
	'^  RetryInfo: retry_delay [1-9][0-9.]*s$' \
	'^  QuotaFailure: subject "rule:greeter" quota_id "5-per-1m" quota_value 5$' \
	'^  ErrorInfo: reason RATE_LIMIT_EXCEEDED domain ratewindow metadata map\[policy:5-per-1m rule:greeter\]$' \
	'^  trailer grpc-retry-pushback-ms: [1-9][0-9]*$' \
	'^  trailer retry-after: [1-9][0-9]*$'; do
	grep -q -- "$want" "$tmp/call.out" || fail "the client's output has no line matching $want"
done
if grep -q 'example-key' "$tmp/call.out"; then
	fail "the refusal shows the client's key"
fi

kill -TERM "$pid" 2>/dev/null || true
for ((i = 0; i < stop_timeout * 10; i++)); do
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.1
done
kill -0 "$pid" 2>/dev/null && fail "still running ${stop_timeout}s after SIGTERM"
rc=0
wait "$pid" || rc=$?
pid=""
[ "$rc" = 0 ] || fail "exited with status $rc after SIGTERM"
echo "ok   grpc: 5 calls passed, the 6th RESOURCE_EXHAUSTED with RetryInfo, QuotaFailure, ErrorInfo and the pushback; clean exit on SIGTERM"
