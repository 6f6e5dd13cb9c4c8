#!/usr/bin/env bash
# Benchmarks smoke test: vets and tests the benchmarks module (its own
# go.mod), then runs the side-by-side program once in -quick mode against a
# redis-server it starts itself. It asserts nothing about speed; it fails
# only when the program cannot run every measurement. Under a minute.
set -euo pipefail

# benchmarks/ is a module of its own, outside the repository's go.work (its
# peers would enter every module's build list): build it on its own.
export GOWORK=off

cd benchmarks
go vet ./...
go test -count=1 ./...
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# REDIS_ADDR is unset on purpose: the program's own server may be flushed.
env -u REDIS_ADDR timeout 300 go run ./cmd/rwbench -quick -out "$out" >/dev/null
test -s "$out/results.md"
test -s "$out/results.svg"
echo "benchmarks smoke: ok ($(grep -c '^| ' "$out/results.md") table rows)"
