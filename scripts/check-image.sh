#!/usr/bin/env bash
# Builds the image of `tfstackplan serve` (the Dockerfile) and runs it as docs/deploy.md does:
# a read-only root filesystem, a volume for /data, the tokens file mounted read-only. Checks
# that it runs as a non-root user, answers /readyz, reports the version it was built with,
# authenticates API calls, and stops cleanly on SIGTERM.
#
# Needs docker (the CI workflow's image job runs it). Without docker, `go test
# ./internal/release` checks the Dockerfile and runs its entrypoint the same way, as root.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "check-image.sh: $*" >&2
  exit 1
}
version="${VERSION:-v0.0.0-image.check}"
tag="tfstackplan:check"
name="tfstackplan-check-$$"
tmp="$(mktemp -d)"
cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  docker volume rm "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

docker build --build-arg VERSION="$version" -t "$tag" .
user="$(docker image inspect -f '{{.Config.User}}' "$tag")"
case "$user" in "" | 0 | 0:* | root | root:*) fail "the image runs as '$user', not as a non-root user" ;; esac

secret="check-image-$(date +%s)-$$-secret"
printf 'token "ops" {\n  secret = "%s"\n  roles  = ["viewer"]\n}\n' "$secret" >"$tmp/tokens.hcl"
chmod 0644 "$tmp/tokens.hcl"
docker volume create "$name" >/dev/null
docker run -d --name "$name" --read-only -v "$name:/data" \
  -v "$tmp/tokens.hcl:/etc/tfstackplan/tokens.hcl:ro" -p 127.0.0.1::8080 \
  "$tag" --tokens /etc/tfstackplan/tokens.hcl >/dev/null
port="$(docker port "$name" 8080/tcp | head -n 1)"
url="http://127.0.0.1:${port##*:}"
for _ in $(seq 60); do
  if curl -fsS "$url/readyz" >/dev/null 2>&1; then break; fi
  [ "$(docker inspect -f '{{.State.Running}}' "$name")" = true ] || { docker logs "$name"; fail "the container exited"; }
  sleep 1
done
curl -fsS "$url/readyz" >/dev/null || { docker logs "$name"; fail "/readyz does not answer"; }
health="$(curl -fsS "$url/api/v1/health")"
grep -qF "\"version\":\"$version\"" <<<"$health" || fail "/api/v1/health says $health, not version $version"
curl -fsS -H "Authorization: Bearer $secret" "$url/api/v1/executions" >/dev/null || fail "an authenticated API call failed"
code="$(curl -sS -o /dev/null -w '%{http_code}' "$url/api/v1/executions")"
[ "$code" = 401 ] || fail "an API call without a token got $code, not 401"
docker stop "$name" >/dev/null
[ "$(docker inspect -f '{{.State.ExitCode}}' "$name")" = 0 ] || { docker logs "$name"; fail "serve did not stop cleanly on SIGTERM"; }
echo "image $tag ($version): user $user, read-only root, /data a volume: ok"
