#!/usr/bin/env bash
# Builds tfstackplan's release archives and their checksums file, laid out exactly as
# action.yml's install step downloads them from its release-url:
#
#   OUT/VERSION/tfstackplan_N_OS_ARCH.tar.gz  tfstackplan (static, no cgo) and README.md
#   OUT/VERSION/tfstackplan_N_checksums.txt   "SHA256  FILE" lines, one per archive
#
# N is VERSION without its v; OS/ARCH are linux and darwin, amd64 and arm64. The binary is
# stamped with VERSION (internal/buildinfo), so `tfstackplan version` prints it.
#
#   scripts/release.sh [--out OUT] VERSION   a release (the release workflow, from a tag):
#                                            VERSION must be action.yml's default version
#   scripts/release.sh [--out OUT] --snapshot  `make release-snapshot`: VERSION is
#                                            v0.0.0-snapshot.REV (REV: the commit, .dirty
#                                            when the tree has changes)
#
# OUT is dist (git-ignored) unless given. PLATFORMS="linux/amd64 ..." builds fewer platforms.
# The archives are reproducible: the same tree and Go give the same bytes (no build paths,
# owners or times but the commit's). Needs go, git, GNU tar (gtar) and gzip.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "release.sh: $*" >&2
  exit 1
}
out=dist
version=""
snapshot=false
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --snapshot) snapshot=true; shift ;;
    -*) fail "unknown option $1" ;;
    *) [ -z "$version" ] || fail "one VERSION, not '$version' and '$1'"; version="$1"; shift ;;
  esac
done
platforms="${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}"

if $snapshot; then
  [ -z "$version" ] || fail "--snapshot takes no VERSION"
  rev="$(git rev-parse --short=12 HEAD)" || fail "--snapshot needs a git checkout"
  version="v0.0.0-snapshot.$rev"
  if [ -n "$(git status --porcelain)" ]; then version="$version.dirty"; fi
else
  [ -n "$version" ] || fail "usage: scripts/release.sh [--out OUT] VERSION | --snapshot"
  # The action at this tag installs its default version: it must be this release.
  default="$(awk '/^  version:$/ { v = 1; next } v && /^  [^ ]/ { exit } v && /^    default:/ { print $2; exit }' action.yml)"
  [ "$default" = "$version" ] || fail "action.yml's version input defaults to '$default', not $version: set it to $version first"
fi
# The same pattern as action.yml's install step: what it accepts, and nothing else.
[[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] || fail "VERSION must be vMAJOR.MINOR.PATCH[-PRERELEASE], not '$version'"
n="${version#v}"

tar=tar
if ! tar --version 2>/dev/null | grep -q 'GNU tar'; then
  tar=gtar
  command -v gtar >/dev/null 2>&1 || fail "GNU tar is needed (as tar or gtar) for reproducible archives"
fi
sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }
# Archive entries carry the commit's time, so a rebuild of one commit is byte for byte the same.
mtime="$(git log -1 --format=%ct 2>/dev/null || echo 0)"

for p in $platforms; do
  case "$p" in
    linux/amd64 | linux/arm64 | darwin/amd64 | darwin/arm64) ;;
    *) fail "platform '$p' is not one action.yml installs (linux or darwin, amd64 or arm64)" ;;
  esac
done

dir="$out/$version"
rm -rf "$dir"
mkdir -p "$dir"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
for p in $platforms; do
  os="${p%/*}" arch="${p#*/}"
  echo "building tfstackplan $version for $os/$arch"
  rm -rf "${stage:?}"/*
  CGO_ENABLED=0 GOOS="$os" GOARCH="$arch" go build -trimpath \
    -ldflags="-s -w -X github.com/tfstackplan/tfstackplan/internal/buildinfo.version=$version" \
    -o "$stage/tfstackplan" ./cmd/tfstackplan
  if [ "$os/$arch" = "$(go env GOHOSTOS)/$(go env GOHOSTARCH)" ]; then
    got="$("$stage/tfstackplan" version)"
    [ "$got" = "tfstackplan $version" ] || fail "the $os/$arch binary prints '$got', not 'tfstackplan $version'"
  fi
  cp README.md "$stage/README.md"
  chmod 0755 "$stage/tfstackplan"
  chmod 0644 "$stage/README.md"
  "$tar" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" --format=ustar \
    -C "$stage" -cf - tfstackplan README.md | gzip -n -9 >"$dir/tfstackplan_${n}_${os}_${arch}.tar.gz"
done
(cd "$dir" && sha256 tfstackplan_"${n}"_*.tar.gz >"tfstackplan_${n}_checksums.txt")
echo "release $version in $dir:"
cat "$dir/tfstackplan_${n}_checksums.txt"
