#!/usr/bin/env bash
# Connect: the Connect example's smoke test. _examples/connect is built and
# started on a free port of 127.0.0.1 with the embedded Redis (REDIS_URL
# unset); its own connect-go clients (-call) call the limited method in
# each protocol until resource_exhausted: Connect and gRPC-Web over
# HTTP/1.1, gRPC over h2c. Each protocol's 6th call must be refused with a
# RetryInfo detail and Retry-After; /healthz must stay unlimited; SIGTERM
# must stop the server cleanly. (20-examples.sh vets and builds every
# package under _examples, this one included; the main test command runs
# connectmw's tests with -race.) Run from the repository root.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."
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

section "connect: example smoke test (embedded Redis, 127.0.0.1, free port)"
go build -o "$tmp/connect" ./_examples/connect
out="$tmp/connect.out"
: >"$out"
env -u REDIS_URL ADDR=127.0.0.1:0 "$tmp/connect" >"$out" 2>&1 &
pid=$!
fail() {
	echo "FAIL connect: $1"
	echo "---- server output ----"
	cat "$out" || true
	echo "---- client output ----"
	cat "$tmp/call.out" 2>/dev/null || true
	exit 1
}
addr=""
for ((i = 0; i < start_timeout * 10; i++)); do
	addr="$(sed -n 's|^listening on http://\(127\.0\.0\.1:[0-9][0-9]*\) (HTTP/1\.1 and h2c)$|\1|p' "$out")"
	[ -n "$addr" ] && break
	kill -0 "$pid" 2>/dev/null || fail "exited before it listened"
	sleep 0.1
done
[ -n "$addr" ] || fail "printed no address within ${start_timeout}s"
grep -q '^redis: *embedded miniredis' "$out" || fail "did not say it uses the embedded Redis"

"$tmp/connect" -call "$addr" >"$tmp/call.out" 2>&1 || fail "the client failed"
cat "$tmp/call.out"
for p in 'connect HTTP/1\.1' 'grpc HTTP/2\.0' 'grpcweb HTTP/1\.1'; do
	proto="${p% *}" version="${p#* }"
	for want in \
		"^$proto call 5: hello, smoke ($proto over $version) (RateLimit: \"5-per-1m\";r=0;t=60)\$" \
		"^$proto call 6: resource_exhausted: rate limit exceeded\$" \
		"^  $proto RetryInfo: retry_delay [1-9][0-9.]*s\$" \
		"^  $proto Retry-After: [1-9][0-9]*\$"; do
		grep -q -- "$want" "$tmp/call.out" || fail "the client's output has no line matching $want"
	done
done
for ((i = 1; i <= 10; i++)); do
	code="$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "http://$addr/healthz")" || fail "curl failed on /healthz"
	[ "$code" = 200 ] || fail "/healthz answered $code on request $i"
done

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
echo "ok   connect: in each protocol (Connect and gRPC-Web over HTTP/1.1, gRPC over h2c) 5 calls passed, the 6th resource_exhausted with RetryInfo and Retry-After; /healthz unlimited; clean exit on SIGTERM"
