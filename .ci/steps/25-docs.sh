#!/usr/bin/env bash
# Documented commands and programs, in four parts:
#
#   - README.md's first program is _examples/quickstart/main.go, byte for
#     byte from "package main" on (the README shows it whole), and the test
#     command the pages show (go test ... work) is the one .ci/run runs.
#   - Every `go doc ...` command that README.md and docs/*.md write (in
#     inline code, or on a line of a code block) runs, and prints the
#     documentation of what it names: for a package, the package's
#     documentation; for a name, every comment that go doc -all shows with
#     it (such as each constant of a type), which plain go doc leaves out.
#   - The README's first program and each example server, given a Redis
#     that refuses their password, exit at start-up with Check's message
#     ("redis: ratewindow: check: ... WRONGPASS ...") and never listen.
#   - The shell blocks of README.md and docs/*.md that talk to an example
#     server run as written, and print the output block the page shows
#     under them.
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
redis_pid=""
cleanup() {
	if [ -n "$pid" ]; then
		kill -KILL "$pid" 2>/dev/null || true
	fi
	if [ -n "$redis_pid" ]; then
		kill -KILL "$redis_pid" 2>/dev/null || true
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

declare -A built=()
build() {
	if [ -z "${built[$1]:-}" ]; then
		go build -o "$tmp/$1" "./_examples/$1"
		built[$1]=1
	fi
}

printf '\n==== %s ====\n' "docs: README's first program is _examples/quickstart/main.go"
# The README's Go block that starts with "package main", without its fences.
awk '/^```go$/ { inside = 1; n = 0; next } inside && /^```$/ { if (first == "package main") exit; inside = 0; next } inside { if (++n == 1) first = $0; if (first == "package main") print }' README.md >"$tmp/readme.go"
sed -n '/^package main$/,$p' _examples/quickstart/main.go >"$tmp/quickstart.go"
[ -s "$tmp/readme.go" ] || fail "README.md has no Go block that starts with \"package main\""
if ! diff -u "$tmp/quickstart.go" "$tmp/readme.go"; then
	fail "README.md's first program differs from _examples/quickstart/main.go (-file +README): change the two together"
fi
echo "ok   README.md shows _examples/quickstart/main.go ($(wc -l <"$tmp/readme.go") lines)"

test_cmd="$(sed -n 's/^TEST_CMD=(\(.*\))$/\1/p' .ci/run)"
[ -n "$test_cmd" ] || fail ".ci/run has no TEST_CMD=(...) line"
shown="$(grep -hE '^go test .* work( |$)' README.md docs/*.md | sed -E 's/[[:space:]]*#.*$//' | sort -u)"
[ -n "$shown" ] || fail "README.md and docs/ show no go test ... work command"
[ "$shown" = "$test_cmd" ] || fail "the pages show the test command '$shown', .ci/run runs '$test_cmd'"
echo "ok   README.md and docs/ show .ci/run's test command: $test_cmd"

printf '\n==== %s ====\n' "docs: every go doc command of the pages prints what it names"
# Inline code spans (which may break across lines) outside code blocks, and
# lines of code blocks, that start with "go doc".
perl -0777 -ne '
	my $text = $_;
	while ($text =~ /^```[^\n]*\n(.*?)^```[ \t]*$/gms) {
		for my $line (split /\n/, $1) { print "$1\n" if $line =~ /^\s*(go doc\b[^#]*?)\s*(#.*)?$/ }
	}
	$text =~ s/^````.*?^````[ \t]*$//gms;
	$text =~ s/^```.*?^```[ \t]*$//gms;
	while ($text =~ /`(go doc\b[^`]*)`/g) { (my $c = $1) =~ s/\s+/ /g; print "$c\n" }
' README.md docs/*.md | sort -u >"$tmp/godoc"
[ -s "$tmp/godoc" ] || fail "no go doc command in README.md or docs/"
while IFS= read -r cmd; do
	read -ra words <<<"$cmd"
	args=()
	for w in "${words[@]:2}"; do
		case "$w" in
		-all | -short | -u | -src | -c) ;;
		-*) fail "\`$cmd\`: the check does not know go doc's flag $w" ;;
		*) args+=("$w") ;;
		esac
	done
	[ "${#args[@]}" -ge 1 ] && [ "${#args[@]}" -le 2 ] || fail "\`$cmd\`: want go doc [flags] PACKAGE [NAME]"
	"${words[@]}" >"$tmp/godoc.out" 2>&1 || {
		cat "$tmp/godoc.out"
		fail "\`$cmd\` failed"
	}
	go doc -all "${args[@]}" >"$tmp/godoc.all" 2>&1 || {
		cat "$tmp/godoc.all"
		fail "go doc -all ${args[*]} failed"
	}
	if [ "${#args[@]}" -eq 1 ]; then
		# A package: its documentation, the text before go doc -all's first
		# heading.
		awk 'NR > 1 && /^(CONSTANTS|VARIABLES|FUNCTIONS|TYPES)$/ { exit } NR > 1 && NF' "$tmp/godoc.all" >"$tmp/godoc.want"
	else
		# A name: its doc (the first indented line) and every comment
		# shown with it (struct fields, the constants of a type).
		{
			grep -m1 -E '^    [^ ]' "$tmp/godoc.all" || true
			grep -E '^[[:space:]]+//' "$tmp/godoc.all" || true
		} >"$tmp/godoc.want"
	fi
	[ -s "$tmp/godoc.want" ] || fail "\`$cmd\`: go doc -all ${args[*]} shows no documentation"
	missing="$(grep -vxF -f "$tmp/godoc.out" "$tmp/godoc.want" || true)"
	if [ -n "$missing" ]; then
		echo "---- \`$cmd\` does not print these lines of go doc -all ${args[*]} ----"
		echo "$missing"
		fail "\`$cmd\` leaves out the documentation of what it names (write go doc -all?) in $(grep -lF -- "$cmd" README.md docs/*.md | tr '\n' ' ')"
	fi
	echo "ok   $cmd (documentation lines found: $(wc -l <"$tmp/godoc.want"))"
done <"$tmp/godoc"

printf '\n==== %s ====\n' "docs: with a wrong Redis password, the programs exit with Check's message"
command -v redis-server >/dev/null || fail "redis-server is not on PATH (apt-get install redis-server)"
# A Redis on a Unix socket (no TCP port) that wants a password.
redis-server --port 0 --unixsocket "$tmp/redis.sock" --requirepass right --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
redis_pid=$!
for ((j = 0; j < start_timeout * 10; j++)); do
	[ -S "$tmp/redis.sock" ] && break
	kill -0 "$redis_pid" 2>/dev/null || {
		cat "$tmp/redis.log"
		fail "redis-server exited"
	}
	sleep 0.1
done
[ -S "$tmp/redis.sock" ] || fail "redis-server made no socket within ${start_timeout}s"
for name in quickstart nethttp chi gin echo grpc connect; do
	build "$name"
	out="$tmp/$name.wrongpass"
	: >"$out"
	REDIS_URL="unix://:wrong@$tmp/redis.sock" ADDR=127.0.0.1:0 "$tmp/$name" >"$out" 2>&1 &
	pid=$!
	for ((j = 0; j < start_timeout * 10; j++)); do
		kill -0 "$pid" 2>/dev/null || break
		grep -q '^listening on' "$out" && break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		pid=""
		cat "$out"
		fail "$name, given a wrong Redis password, did not exit (it listened, or was still starting after ${start_timeout}s): want an exit at start-up with Check's message"
	fi
	rc=0
	wait "$pid" || rc=$?
	pid=""
	if [ "$rc" = 0 ] || grep -q '^listening on' "$out" || ! grep -qE 'redis: ratewindow: check: .*WRONGPASS' "$out"; then
		cat "$out"
		fail "$name, given a wrong Redis password: exit status $rc, want an exit at start-up with Check's message"
	fi
	echo "ok   $name: exit status $rc, $(grep -oE 'redis: ratewindow: check: .*' "$out")"
done
kill -TERM "$redis_pid" 2>/dev/null || true
wait "$redis_pid" 2>/dev/null || true
redis_pid=""

mkdir "$tmp/blocks"
for page in README.md docs/*.md; do
	[ -e "$page" ] || continue
	blocks "$page"
done
[ "$n" -gt 0 ] || fail "no marked command blocks in README.md or docs/"

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
