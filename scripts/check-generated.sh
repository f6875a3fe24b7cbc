#!/usr/bin/env bash
# Fails when internal/api/api.gen.go is not what api/openapi.yaml generates, or docs/cli.md is
# not what the command tree renders (cmd/tfstackplan-docgen).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go tool oapi-codegen -config api/oapi-codegen.yaml -o "$tmp/api.gen.go" api/openapi.yaml
if ! cmp -s "$tmp/api.gen.go" internal/api/api.gen.go; then
  echo "internal/api/api.gen.go is stale: run 'make generate' and commit the result" >&2
  diff -u internal/api/api.gen.go "$tmp/api.gen.go" | head -40 >&2 || true
  exit 1
fi
go run ./cmd/tfstackplan-docgen -o "$tmp/cli.md"
if ! cmp -s "$tmp/cli.md" docs/cli.md; then
  echo "docs/cli.md is stale: run 'go run ./cmd/tfstackplan-docgen' and commit the result" >&2
  diff -u docs/cli.md "$tmp/cli.md" | head -40 >&2 || true
  exit 1
fi
echo "generated code is up to date"
