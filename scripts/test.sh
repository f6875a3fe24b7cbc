#!/usr/bin/env bash
# The project's test command (README; .ci/run calls it through `make test`).
#
# On a fresh machine it installs what the real-service tests need from Debian packages
# (PostgreSQL, chromium, and shellcheck for the action's scripts) when missing and when it may (root with apt-get), starts a throwaway
# PostgreSQL on a loopback port for this run only, checks that generated code is fresh, and runs
# every Go test. Without the packages (not root, no apt) those tests skip and say how to enable
# them.
set -euo pipefail
cd "$(dirname "$0")/.."

# Nothing in the tests may reach the network: Google auth libraries must never probe the
# metadata server, so point them at a closed loopback port.
export GCE_METADATA_HOST=127.0.0.1:1
export GCE_METADATA_IP=127.0.0.1:1

need_pkgs=()
pg_bin=""
find_pg() { pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true); }
find_pg
[ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ] || need_pkgs+=(postgresql)
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
command -v shellcheck >/dev/null 2>&1 || need_pkgs+=(shellcheck)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need_pkgs[*]} from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
    find_pg
  else
    echo "note: ${need_pkgs[*]} missing and cannot be installed here (need root and apt-get); those tests will skip"
  fi
fi

pg_dir=""
cleanup() {
  if [ -n "$pg_dir" ] && [ -d "$pg_dir" ]; then
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$pg_dir"
  fi
}
trap cleanup EXIT

if [ -z "${TFSTACKPLAN_TEST_POSTGRES:-}" ] && [ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ] && [ "$(id -u)" = 0 ]; then
  pg_dir=$(mktemp -d /tmp/tfstackplan-pg.XXXXXX)
  chown postgres "$pg_dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 55432)
  runuser -u postgres -- "$pg_bin/initdb" -D "$pg_dir/data" -A trust -U postgres >/dev/null
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $pg_dir -c fsync=off -c max_connections=200" start >/dev/null
  runuser -u postgres -- "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U postgres tfstackplan
  export TFSTACKPLAN_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/tfstackplan?sslmode=disable"
  echo "throwaway PostgreSQL on 127.0.0.1:$port"
fi
if command -v chromium >/dev/null 2>&1; then
  export TFSTACKPLAN_TEST_CHROMIUM="${TFSTACKPLAN_TEST_CHROMIUM:-$(command -v chromium)}"
fi

./scripts/check-generated.sh
./scripts/actionlint.sh
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change these files (run gofmt -w):" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
go test -count=1 -timeout 40m ./... 2>&1 | tee /tmp/tfstackplan-test.log
