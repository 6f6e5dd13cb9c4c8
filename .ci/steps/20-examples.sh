#!/usr/bin/env bash
# Examples: vet, test and build every package under _examples (the ./...
# patterns of the main CI step skip directories that start with "_"), then
# smoke-test each example server: start it on a free port of 127.0.0.1 with
# the embedded Redis (REDIS_URL unset), log in as one user until the login
# limit answers 429 with Retry-After, check that an export costs 5 units,
# and stop the server with SIGTERM. Run from the repository root.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."

examples=(nethttp chi gin echo)
start_timeout=20 # seconds until a server prints its address
stop_timeout=10  # seconds until a server exits after SIGTERM
max_requests=50  # login attempts before giving up on a 429

section() {
	printf '\n==== %s ====\n' "$*"
}

# Every directory under _examples that holds Go files is a package.
mapfile -t pkgs < <(find _examples -name '*.go' -printf './%h\n' | sort -u)
mapfile -t test_pkgs < <(find _examples -name '*_test.go' -printf './%h\n' | sort -u)

section "examples: gofmt, vet, test"
unformatted="$(gofmt -l _examples)"
if [ -n "$unformatted" ]; then
	echo "gofmt would change these files:"
	echo "$unformatted"
	exit 1
fi
go vet "${pkgs[@]}"
if [ "${#test_pkgs[@]}" -gt 0 ]; then
	go test -race -count=1 "${test_pkgs[@]}"
fi

tmp="$(mktemp -d)"
pid=""
cleanup() {
	if [ -n "$pid" ]; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

section "examples: build"
for name in "${examples[@]}"; do
	go build -o "$tmp/$name" "./_examples/$name"
	echo "built ./_examples/$name"
done

# fail NAME MESSAGE prints the server's output and exits.
fail() {
	echo "FAIL $1: $2"
	echo "---- output of $1 ----"
	cat "$tmp/$1.out" || true
	echo "----"
	exit 1
}

# header NAME FILE prints the value of one response header.
header() {
	sed -n "s/^$1: *//Ip" "$2" | tr -d '\r' | head -n 1
}

# post_login URL NAME sends one login attempt and prints the status code.
post_login() {
	curl -sS --max-time 5 -o /dev/null -D "$tmp/$2.headers" -w '%{http_code}' \
		-X POST -H 'X-User: smoke' "$1/login"
}

smoke() {
	local name=$1 out="$tmp/$1.out" url="" code="" n i retry rc
	: >"$out" # exists before the server's shell opens it: sed below reads it at once
	env -u REDIS_URL ADDR=127.0.0.1:0 "$tmp/$name" >"$out" 2>&1 &
	pid=$!

	for ((i = 0; i < start_timeout * 10; i++)); do
		url="$(sed -n 's|^listening on \(http://127\.0\.0\.1:[0-9][0-9]*\)$|\1|p' "$out")"
		[ -n "$url" ] && break
		kill -0 "$pid" 2>/dev/null || fail "$name" "exited before it listened"
		sleep 0.1
	done
	[ -n "$url" ] || fail "$name" "printed no address within ${start_timeout}s"
	grep -q '^redis: *embedded miniredis' "$out" || fail "$name" "did not say it uses the embedded Redis"

	for ((n = 1; n <= max_requests; n++)); do
		code="$(post_login "$url" "$name")" || fail "$name" "curl failed on login attempt $n"
		case "$code" in
		200) ;;
		429) break ;;
		*) fail "$name" "login attempt $n answered $code" ;;
		esac
	done
	[ "$code" = 429 ] || fail "$name" "no 429 after $max_requests login attempts"
	retry="$(header Retry-After "$tmp/$name.headers")"
	[[ "$retry" =~ ^[1-9][0-9]*$ ]] || fail "$name" "the 429 has no valid Retry-After (got '$retry')"

	# The export costs 5 of 20 units a minute: 4 pass, the 5th is denied.
	local codes=""
	for ((i = 1; i <= 5; i++)); do
		codes+="$(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$url/export") " ||
			fail "$name" "curl failed on export $i"
	done
	[ "$codes" = "200 200 200 200 429 " ] || fail "$name" "5 exports answered $codes, want 200 200 200 200 429"

	kill -TERM "$pid" 2>/dev/null || true # an exit before it is caught below
	for ((i = 0; i < stop_timeout * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		fail "$name" "still running ${stop_timeout}s after SIGTERM"
	fi
	rc=0
	wait "$pid" || rc=$?
	pid=""
	[ "$rc" = 0 ] || fail "$name" "exited with status $rc after SIGTERM"

	echo "ok   $name: $url/login answered 429 (Retry-After: $retry) on attempt $n, export cost 5, clean exit on SIGTERM"
}

section "examples: smoke test (embedded Redis, 127.0.0.1, free port)"
for name in "${examples[@]}"; do
	smoke "$name"
done
