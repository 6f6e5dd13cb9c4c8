#!/usr/bin/env bash
# Release: runs scripts/release on a clone of this checkout, then checks
# what a dependent would get from the tags, with no network and nothing
# pushed:
#  - the release refuses a bad version, a dirty work tree and a tag that
#    exists;
#  - every module's go.mod requires our modules at the new version, and
#    every published module has its tag on the release commit;
#  - a new module outside the repository requires core, nethttp and every
#    adapter at the new version through the go command alone (no replace):
#    the go command fetches our modules from the clone's tags as it would
#    from GitHub (git's url.insteadOf points github.com/ratewindow/ratewindow
#    at the clone) and every other module from the local module cache used
#    as a module proxy (GOPROXY=file://...). The program builds, and
#    "go list -m" shows the main module at the new version, and every
#    published package loads.
# Run from the repository root. Under a minute.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."
root="$PWD"
version=v0.99.0
modcache="$(go env GOMODCACHE)"

section() {
	printf '\n==== %s ====\n' "$*"
}
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

tmp="$(mktemp -d)"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

section "release: scripts/release $version on a clone"
# The clone holds the committed tree; the script under test is the one in
# this work tree.
git clone -q --no-local "$root" "$tmp/repo"
git -C "$tmp/repo" config user.name "ratewindow CI"
git -C "$tmp/repo" config user.email "ci@ratewindow.invalid"
release=("$root/scripts/release")

# Refusals, each with its message.
refuses() { # WANT ARGS...: the release fails and says WANT
	local want=$1 out
	shift
	if out="$(cd "$tmp/repo" && "${release[@]}" "$@" 2>&1)"; then
		fail "scripts/release $* succeeded, want an error containing '$want'"
	fi
	[[ "$out" == *"$want"* ]] || fail "scripts/release $*: '$out', want '$want'"
	echo "ok   refused $*: $out"
}
refuses "want vMAJOR.MINOR.PATCH" 1.0.0
refuses "want vMAJOR.MINOR.PATCH" v2.0.0
touch "$tmp/repo/stray"
refuses "the work tree has changes" "$version"
rm "$tmp/repo/stray"

(cd "$tmp/repo" && GOPROXY=off "${release[@]}" "$version")
refuses "tag $version exists already" "$version"

# Every tag on the release commit; every requirement on our modules at the version.
head="$(git -C "$tmp/repo" rev-parse HEAD)"
for t in "$version" chimw/"$version" ginmw/"$version" echomw/"$version" connectmw/"$version" grpcmw/"$version" prometheus/"$version" otel/"$version" admin/"$version" cmd/ratewindow/"$version"; do
	[ "$(git -C "$tmp/repo" rev-list -n 1 "$t")" = "$head" ] || fail "tag $t is not on the release commit"
done
stale="$(cd "$tmp/repo" && git grep -nE '^[[:space:]]*(require[[:space:]]+)?github\.com/ratewindow/ratewindow(/[a-z]+)? v' -- '*go.mod' | grep -v " $version\$" || true)"
[ -z "$stale" ] || fail "requirements not at $version: $stale"
echo "ok   tags on $(git -C "$tmp/repo" rev-parse --short HEAD), every requirement at $version (${SECONDS}s)"

section "release: a dependent builds from the tags alone"
mkdir -p "$tmp/app/all"
# The program, built and run: core, nethttp and chi.
cat >"$tmp/app/main.go" <<'EOF'
package main

import (
	"fmt"
	"time"

	"github.com/ratewindow/ratewindow/chimw"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/nethttp"
)

func main() {
	l := core.NewMemory()
	_ = nethttp.LimitByIP(l, 5, time.Minute)
	_ = chimw.LimitByIP(l, 5, time.Minute)
	fmt.Println("ok")
}
EOF
# Every published package, resolved and loaded, not compiled (gin, echo,
# Prometheus and OpenTelemetry from a fresh module cache take a minute).
cat >"$tmp/app/all/all.go" <<'EOF'
package all

import (
	_ "github.com/ratewindow/ratewindow/chimw"
	_ "github.com/ratewindow/ratewindow/core"
	_ "github.com/ratewindow/ratewindow/echomw"
	_ "github.com/ratewindow/ratewindow/ginmw"
	_ "github.com/ratewindow/ratewindow/keyfuncs"
	_ "github.com/ratewindow/ratewindow/nethttp"
	_ "github.com/ratewindow/ratewindow/otel"
	_ "github.com/ratewindow/ratewindow/prometheus"
)
EOF
(
	cd "$tmp/app"
	export GOWORK=off GOFLAGS=-mod=mod GOSUMDB=off GOTOOLCHAIN=local
	export GOPRIVATE=github.com/ratewindow/ratewindow GOPROXY="file://$modcache/cache/download"
	export GOMODCACHE="$tmp/modcache"
	export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0="url.file://$tmp/repo.insteadOf" \
		GIT_CONFIG_VALUE_0=https://github.com/ratewindow/ratewindow
	go mod init example.com/app >/dev/null 2>&1
	go get github.com/ratewindow/ratewindow/chimw@"$version" github.com/ratewindow/ratewindow/ginmw@"$version" \
		github.com/ratewindow/ratewindow/echomw@"$version" github.com/ratewindow/ratewindow/prometheus@"$version" \
		github.com/ratewindow/ratewindow/otel@"$version" 2>&1 | grep -v "^go: \(downloading\|added\)" || true
	echo "     go get: ${SECONDS}s"
	if grep -q '^replace' go.mod; then fail "the dependent's go.mod has a replace"; fi
	got="$(go list -m github.com/ratewindow/ratewindow)"
	[ "$got" = "github.com/ratewindow/ratewindow $version" ] || fail "the main module resolved to '$got'"
	broken="$(go list -deps -f '{{with .Error}}{{.}}{{end}}' ./all)"
	[ -z "$broken" ] || fail "the published packages do not load: $broken"
	go build -o app . && [ "$(./app)" = ok ] || fail "the dependent does not build or run"
	echo "ok   a new module requires the adapters at $version; go list -m: $got; it builds and runs (${SECONDS}s)"
)
