#!/usr/bin/env bash
# The prometheus module (its own go.mod, so that the main module does not
# depend on the Prometheus client): vet, and test under the race detector.
# Its tests need no Redis. Run from the repository root.
set -euo pipefail

cd "$(dirname "$0")/../../prometheus"
go vet ./...
go test -race -count=1 ./...
