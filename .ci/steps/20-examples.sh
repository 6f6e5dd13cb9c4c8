#!/usr/bin/env bash
# Examples: vet, test and build every package under _examples (the ./...
# patterns of the main CI step skip directories that start with "_"), then
# smoke-test each example server: start it on a free port of 127.0.0.1 with
# the embedded Redis (REDIS_URL unset); log in successfully a few times (not
# counted), then with a wrong password until the login limit answers 429
# with Retry-After, and on until the client is banned (Retry-After of the
# 15-minute ban, even for a right password); check that the API's limits
# follow the plan of the API key, that an export costs 5 units, and stop
# the server with SIGTERM. Run from the repository root.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."

examples=(nethttp chi gin echo)
# quickstart, the README's first program, is built here and run by
# 25-docs.sh with the README's own commands.
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

# post_login URL NAME PASSWORD sends one login attempt and prints the
# status code.
post_login() {
	curl -sS --max-time 5 -o /dev/null -D "$tmp/$2.headers" -w '%{http_code}' \
		-d user=smoke -d "password=$3" "$1/login"
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

	# Successful logins give their unit back: never a 429.
	for ((n = 1; n <= 3; n++)); do
		code="$(post_login "$url" "$name" letmein)" || fail "$name" "curl failed on login $n"
		[ "$code" = 200 ] || fail "$name" "successful login $n answered $code"
	done
	# Failed ones are counted: 401 until the limit, then 429.
	for ((n = 1; n <= max_requests; n++)); do
		code="$(post_login "$url" "$name" wrong)" || fail "$name" "curl failed on login attempt $n"
		case "$code" in
		401) ;;
		429) break ;;
		*) fail "$name" "login attempt $n answered $code" ;;
		esac
	done
	[ "$code" = 429 ] || fail "$name" "no 429 after $max_requests login attempts"
	retry="$(header Retry-After "$tmp/$name.headers")"
	[[ "$retry" =~ ^[1-9][0-9]*$ ]] || fail "$name" "the 429 has no valid Retry-After (got '$retry')"
	# The third denial within a minute bans the client for 15 minutes,
	# whatever its password.
	for pw in wrong wrong letmein; do
		code="$(post_login "$url" "$name" "$pw")" || fail "$name" "curl failed after the 429"
		[ "$code" = 429 ] || fail "$name" "a login after the 429 answered $code"
	done
	ban="$(header Retry-After "$tmp/$name.headers")"
	[[ "$ban" =~ ^[0-9]+$ ]] && [ "$ban" -ge 840 ] && [ "$ban" -le 900 ] ||
		fail "$name" "the ban's Retry-After is '$ban', want about 900"

	# The global limit (20 a second per IP) counts every request above:
	# the rest starts in the next second.
	sleep 1.1

	# The API's limits follow the plan of the API key.
	local policy
	curl -sS --max-time 5 -o /dev/null -D "$tmp/$name.api" -H 'X-Api-Key: free-key' "$url/api/orders" ||
		fail "$name" "curl failed on the API"
	policy="$(header RateLimit-Policy "$tmp/$name.api")"
	[ "$policy" = '"free";q=10;w=60' ] || fail "$name" "the free plan's RateLimit-Policy is '$policy'"
	curl -sS --max-time 5 -o /dev/null -D "$tmp/$name.api" "$url/api/orders" || fail "$name" "curl failed on the API"
	policy="$(header RateLimit-Policy "$tmp/$name.api")"
	[ "$policy" = '"anonymous";q=5;w=60' ] || fail "$name" "without a key, RateLimit-Policy is '$policy'"

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

	echo "ok   $name: failed logins answered 429 (Retry-After: $retry) on attempt $n, then a ban (Retry-After: $ban); plans; export cost 5; clean exit on SIGTERM"
}

section "examples: smoke test (embedded Redis, 127.0.0.1, free port)"
for name in "${examples[@]}"; do
	smoke "$name"
done
