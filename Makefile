# tfstackplan developer targets. `make test` is the README's (and CI's) test command.
GO ?= go
BIN ?= bin/tfstackplan

.PHONY: build test generate check-generated bench demo fuzz release-snapshot

# A static binary (no cgo: SQLite is pure Go): no libc to match, and no dynamic loader at start.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/tfstackplan

test:
	./scripts/test.sh

generate:
	$(GO) generate ./internal/api ./internal/cli

check-generated:
	./scripts/check-generated.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

demo: build
	./scripts/demo.sh

# The release archives and checksums for linux and darwin, amd64 and arm64, as the release
# workflow builds them from a tag, in dist/v0.0.0-snapshot.REV/ (git-ignored).
release-snapshot:
	./scripts/release.sh --snapshot
