#!/usr/bin/env bash
# gRPC and Connect: the module graph check, then the smoke tests of the
# gRPC and Connect examples.
#
# 1. An application that uses only nethttp builds nothing of grpc-go,
#    genproto or connect-go: a fresh module requiring the root module alone
#    (no go.work) lists its packages' dependencies with go list -deps.
# 2. _examples/grpc is built and started on a free port of 127.0.0.1 with
#    the embedded Redis (REDIS_URL unset); its own client (-call) checks the
#    health service and calls the limited method until RESOURCE_EXHAUSTED,
#    which must carry RetryInfo, QuotaFailure, ErrorInfo and the pushback
#    and retry-after trailers; SIGTERM must stop the server cleanly.
# 3. _examples/connect likewise: its own connect-go clients (-call) call
#    the limited method in each protocol until resource_exhausted (Connect
#    and gRPC-Web over HTTP/1.1, gRPC over h2c); each protocol's 6th call
#    must be refused with a RetryInfo detail and Retry-After, /healthz must
#    stay unlimited, and SIGTERM must stop the server cleanly.
# (20-examples.sh vets and builds every package under _examples, these
# included; the main test command runs grpcmw's and connectmw's tests with
# -race on real Redis.) Run from the repository root.
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

# fail NAME MESSAGE prints the server's and the client's output and exits.
fail() {
	echo "FAIL $1: $2"
	echo "---- server output ----"
	cat "$tmp/$1.out" || true
	echo "---- client output ----"
	cat "$tmp/$1.call" 2>/dev/null || true
	exit 1
}

# start NAME PATTERN builds and starts _examples/NAME with the embedded
# Redis on a free port, and sets addr to the host:port its output's
# "listening on" line gives (PATTERN: a sed expression that prints it).
start() {
	local name=$1 pattern=$2 i
	go build -o "$tmp/$name" "./_examples/$name"
	: >"$tmp/$name.out"
	env -u REDIS_URL ADDR=127.0.0.1:0 "$tmp/$name" >"$tmp/$name.out" 2>&1 &
	pid=$!
	addr=""
	for ((i = 0; i < start_timeout * 10; i++)); do
		addr="$(sed -n "$pattern" "$tmp/$name.out")"
		[ -n "$addr" ] && break
		kill -0 "$pid" 2>/dev/null || fail "$name" "exited before it listened"
		sleep 0.1
	done
	[ -n "$addr" ] || fail "$name" "printed no address within ${start_timeout}s"
	grep -q '^redis: *embedded miniredis' "$tmp/$name.out" || fail "$name" "did not say it uses the embedded Redis"
}

# stop NAME sends the server SIGTERM and checks that it exits cleanly.
stop() {
	local i rc=0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < stop_timeout * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$pid" 2>/dev/null && fail "$1" "still running ${stop_timeout}s after SIGTERM"
	wait "$pid" || rc=$?
	pid=""
	[ "$rc" = 0 ] || fail "$1" "exited with status $rc after SIGTERM"
}

section "grpc: example smoke test (embedded Redis, 127.0.0.1, free port)"
start grpc 's|^listening on grpc://\(127\.0\.0\.1:[0-9][0-9]*\)$|\1|p'
"$tmp/grpc" -call "$addr" >"$tmp/grpc.call" 2>&1 || fail grpc "the client failed"
cat "$tmp/grpc.call"
for want in \
	'^health: SERVING$' \
	'^call 5: hello, smoke (ratelimit: "5-per-1m";r=0;t=60)$' \
	'^call 6: code 8 ResourceExhausted: rate limit exceeded$' \
	'^  RetryInfo: retry_delay [1-9][0-9.]*s$' \
	'^  QuotaFailure: subject "rule:greeter" quota_id "5-per-1m" quota_value 5$' \
	'^  ErrorInfo: reason RATE_LIMIT_EXCEEDED domain ratewindow metadata map\[policy:5-per-1m rule:greeter\]$' \
	'^  trailer grpc-retry-pushback-ms: [1-9][0-9]*$' \
	'^  trailer retry-after: [1-9][0-9]*$'; do
	grep -q -- "$want" "$tmp/grpc.call" || fail grpc "the client's output has no line matching $want"
done
if grep -q 'example-key' "$tmp/grpc.call"; then
	fail grpc "the refusal shows the client's key"
fi
stop grpc
echo "ok   grpc: 5 calls passed, the 6th RESOURCE_EXHAUSTED with RetryInfo, QuotaFailure, ErrorInfo and the pushback; clean exit on SIGTERM"

section "connect: example smoke test (embedded Redis, 127.0.0.1, free port)"
start connect 's|^listening on http://\(127\.0\.0\.1:[0-9][0-9]*\) (HTTP/1\.1 and h2c)$|\1|p'
"$tmp/connect" -call "$addr" >"$tmp/connect.call" 2>&1 || fail connect "the client failed"
cat "$tmp/connect.call"
for p in 'connect HTTP/1\.1' 'grpc HTTP/2\.0' 'grpcweb HTTP/1\.1'; do
	proto="${p% *}" version="${p#* }"
	for want in \
		"^$proto call 5: hello, smoke ($proto over $version) (RateLimit: \"5-per-1m\";r=0;t=60)\$" \
		"^$proto call 6: resource_exhausted: rate limit exceeded\$" \
		"^  $proto RetryInfo: retry_delay [1-9][0-9.]*s\$" \
		"^  $proto Retry-After: [1-9][0-9]*\$"; do
		grep -q -- "$want" "$tmp/connect.call" || fail connect "the client's output has no line matching $want"
	done
done
for ((i = 1; i <= 10; i++)); do
	code="$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://$addr/healthz")" || fail connect "curl failed on /healthz"
	[ "$code" = 200 ] || fail connect "/healthz answered $code on request $i"
done
stop connect
echo "ok   connect: in each protocol (Connect and gRPC-Web over HTTP/1.1, gRPC over h2c) 5 calls passed, the 6th resource_exhausted with RetryInfo and Retry-After; /healthz unlimited; clean exit on SIGTERM"
