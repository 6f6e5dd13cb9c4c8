#!/usr/bin/env bash
# Benchmarks smoke test: vets and tests the benchmarks module, then runs
# the side-by-side program once in -quick mode, as docs/performance.md and
# benchmarks/README.md write it (from the repository root, through
# benchmarks/go.work), against a redis-server it starts itself and a Redis
# Cluster of three masters it starts itself (redis-server only). It asserts
# nothing about speed; it fails only when the program cannot run every
# measurement of the quick mode (all but memory), or the Cluster's rows are
# missing. About a minute.
set -euo pipefail

cd "$(dirname "$0")/../.."

# benchmarks/ is a module outside the repository's go.work, with a go.work
# of its own: every command below runs in it as documented, without GOWORK.
cd benchmarks
go vet ./...
go test -count=1 ./...
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# REDIS_ADDR is unset on purpose: the program's own server may be flushed.
env -u REDIS_ADDR timeout 300 go run ./cmd/rwbench -quick -out "$out" >"$out/stdout"
test -s "$out/results.md"
test -s "$out/results.svg"
grep -q 'Cluster of 3' "$out/results.md"
echo "benchmarks smoke: ok ($(grep -c '^| ' "$out/results.md") table rows)"
