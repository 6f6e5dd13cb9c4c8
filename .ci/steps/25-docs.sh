#!/usr/bin/env bash
# Documented commands: runs the shell blocks of README.md and docs/*.md that
# talk to an example server, as written, and compares what they print with
# the output block the page shows under them.
#
# A page marks such a pair with an HTML comment (not rendered) before it:
#
#	<!-- ci: against SERVER -->
#	```sh
#	curl ... http://127.0.0.1:8080/...
#	```
#	```
#	what it prints
#	```
#
# SERVER is a directory of _examples (quickstart, nethttp, chi, gin, echo),
# or "examples" for each of nethttp, chi, gin and echo in turn. The step
# starts a fresh server (embedded Redis, a free port of 127.0.0.1), runs the
# block with bash from the repository root, its http://127.0.0.1:8080 turned
# into the server's address, and stops the server. Before the comparison,
# trailing blanks are dropped and a Retry-After one second short of the one
# shown (59 for 60, 899 for 900: a slow machine) counts as the one shown.
# Run from the repository root.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."

start_timeout=60 # seconds until a server prints its address (a loaded machine)

tmp="$(mktemp -d)"
pid=""
cleanup() {
	if [ -n "$pid" ]; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# blocks FILE writes, for each marked pair of FILE, three files under
# $tmp/blocks: N.server, N.sh and N.want (N counts from 1 over all files).
n=0
blocks() {
	awk -v dir="$tmp/blocks" -v start="$n" -v file="$1" '
		function out(ext) { return dir "/" (start + count) "." ext }
		/^````/ { quoted = !quoted; next } # a page showing the markup itself
		quoted { next }
		/^<!-- ci: against [a-z]+ -->$/ { count++; server = $4; state = "want-sh"; print server > out("server"); print file > out("file"); next }
		state == "want-sh" && /^```sh$/ { state = "sh"; next }
		state == "sh" && /^```$/ { state = "want-out"; next }
		state == "sh" { print > out("sh"); next }
		state == "want-out" && /^```$/ { state = "out"; printf "" > out("want"); next }
		state == "out" && /^```$/ { state = ""; next }
		state == "out" { print > out("want"); next }
		END { print count + 0 > (dir "/count") }
	' "$1"
	n=$((n + $(cat "$tmp/blocks/count")))
}

mkdir "$tmp/blocks"
for page in README.md docs/*.md; do
	[ -e "$page" ] || continue
	blocks "$page"
done
[ "$n" -gt 0 ] || fail "no marked command blocks in README.md or docs/"

declare -A built=()
build() {
	if [ -z "${built[$1]:-}" ]; then
		go build -o "$tmp/$1" "./_examples/$1"
		built[$1]=1
	fi
}

# run SERVER N starts SERVER, runs block N against it, compares, stops it.
run() {
	local name=$1 i=$2 out="$tmp/$1.$2.out" url="" j
	build "$name"
	: >"$out"
	env -u REDIS_URL ADDR=127.0.0.1:0 "$tmp/$name" >"$out" 2>&1 &
	pid=$!
	for ((j = 0; j < start_timeout * 10; j++)); do
		url="$(sed -n 's|^listening on \(http://127\.0\.0\.1:[0-9][0-9]*\)$|\1|p' "$out")"
		[ -n "$url" ] && break
		kill -0 "$pid" 2>/dev/null || {
			cat "$out"
			fail "$name exited before it listened"
		}
		sleep 0.1
	done
	[ -n "$url" ] || fail "$name printed no address within ${start_timeout}s"

	sed "s|http://127\.0\.0\.1:8080|$url|g" "$tmp/blocks/$i.sh" >"$tmp/run.sh"
	bash "$tmp/run.sh" 2>&1 | sed -E -e 's/[[:space:]]+$//' -e 's/\b59\b/60/g' -e 's/\b899\b/900/g' >"$tmp/got" || true
	sed -E 's/[[:space:]]+$//' "$tmp/blocks/$i.want" >"$tmp/want"

	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	pid=""

	if ! diff -u "$tmp/want" "$tmp/got" >"$tmp/diff"; then
		echo "---- $(cat "$tmp/blocks/$i.file"), block $i against $name: the output differs from the page (-page +got) ----"
		cat "$tmp/diff"
		echo "---- the commands ----"
		cat "$tmp/blocks/$i.sh"
		fail "$(cat "$tmp/blocks/$i.file"): block $i against $name"
	fi
	echo "ok   $(cat "$tmp/blocks/$i.file"): block $i against $name ($(wc -l <"$tmp/want") lines as shown)"
}

printf '\n==== %s ====\n' "docs: documented commands against the example servers"
for ((i = 1; i <= n; i++)); do
	server="$(cat "$tmp/blocks/$i.server")"
	[ -s "$tmp/blocks/$i.sh" ] || fail "$(cat "$tmp/blocks/$i.file"): block $i has no commands"
	[ -e "$tmp/blocks/$i.want" ] || fail "$(cat "$tmp/blocks/$i.file"): block $i has no output block"
	if [ "$server" = examples ]; then
		for name in nethttp chi gin echo; do
			run "$name" "$i"
		done
	else
		[ -d "_examples/$server" ] || fail "$(cat "$tmp/blocks/$i.file"): no example server $server"
		run "$server" "$i"
	fi
done
