# tfstackplan developer targets. `make test` is the README's (and CI's) test command.
GO ?= go
BIN ?= bin/tfstackplan

.PHONY: build test generate check-generated bench demo fuzz

# A static binary (no cgo: SQLite is pure Go): no libc to match, and no dynamic loader at start.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/tfstackplan

test:
	./scripts/test.sh

generate:
	$(GO) generate ./internal/api

check-generated:
	./scripts/check-generated.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

demo: build
	./scripts/demo.sh
