#!/usr/bin/env bash
# Runs test packages while CPU hogs keep every core busy, to find tests that assume timing
# (a test must pass on a loaded CI machine as on a quiet one).
#
#   scripts/load-check.sh [PACKAGE...]     (default: ./runner)
#
# HOGS sets the number of busy loops (default: three per core, a load of about 3 × cores more
# than the tests' own); COUNT runs each test that many times (default 1). It prints the load
# average at the end and exits with go test's status.
set -euo pipefail
cd "$(dirname "$0")/.."
hogs=${HOGS:-$(( $(nproc) * 3 ))}
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./runner)
# Compile first, without the hogs: the check is about the tests' timing, not the compiler's.
go test -count=1 -run '^$' "${pkgs[@]}" >/dev/null
pids=()
# shellcheck disable=SC2317 # called by the trap
cleanup() { [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$hogs"); do
  (while :; do :; done) &
  pids+=($!)
done
echo "load-check: $hogs busy loops on $(nproc) cores, go test ${pkgs[*]}"
start=$(date +%s)
rc=0
go test -count="${COUNT:-1}" "${pkgs[@]}" || rc=$?
echo "load-check: exit $rc after $(( $(date +%s) - start )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$rc"
