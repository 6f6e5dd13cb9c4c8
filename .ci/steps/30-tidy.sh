#!/usr/bin/env bash
# Tidy: every module's go.mod and go.sum are as "go mod tidy" leaves them,
# each checked on its own (GOWORK=off), as a contributor or a dependent
# builds it outside the workspace: a missing go.sum line fails there, not
# in the workspace. Run from the repository root. Seconds with a warm
# module cache.
set -Eeuo pipefail
trap 'echo "FAIL: $0 line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "$0")/../.."

printf '\n==== %s ====\n' "go mod tidy -diff, every module"
mapfile -t modules < <(go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
modules+=(benchmarks)
untidy=0
for m in "${modules[@]}"; do
	if ! (cd "$m" && GOWORK=off go mod tidy -diff); then
		echo "untidy: $m (run: cd $m && GOWORK=off go mod tidy)"
		untidy=1
	fi
done
[ "$untidy" = 0 ]
echo "ok: ${#modules[@]} modules"
