# Sliceplane. `make test` is what CI runs; `make demo` starts a cluster on loopback.
# Tools are installed at pinned versions into ./bin on first use, so a fresh machine needs
# only Go (and network access to the Go module proxy once).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO          ?= go
BIN         := $(CURDIR)/bin
BUF         := $(BIN)/buf
STATICCHECK := $(BIN)/staticcheck

BUF_VERSION         := v1.75.0
STATICCHECK_VERSION := v0.8.2

# Every package is tested with the race detector. The data-path integration scenarios shrink
# under it (20k items), so they run a second time without it at the full 100k.
TEST_FLAGS  ?= -race -timeout 10m
BENCH_FLAGS ?= -run '^$$' -bench . -benchmem -timeout 30m

.PHONY: test unit lint proto proto-check bench demo build tools clean

## test: proto and lint checks, every test with the race detector, the data path at full size
test: proto-check lint unit

unit:
	$(GO) test $(TEST_FLAGS) ./...
	$(GO) test -count=1 -timeout 10m -run '^TestDataPath' ./internal/distributor

## lint: gofmt, go vet, staticcheck
lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

## proto: regenerate the Go code in api/ from the .proto files
proto: $(BUF)
	$(BUF) lint
	$(BUF) generate

## proto-check: fail if the committed generated code differs from what `make proto` makes
proto-check: $(BUF)
	$(BUF) lint
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BUF) generate -o "$$tmp"; \
	if ! diff -r --exclude='*.proto' "$$tmp/api" api >/dev/null; then \
		diff -r --exclude='*.proto' "$$tmp/api" api || true; \
		echo "api/: generated code is stale; run 'make proto' and commit the result"; exit 1; \
	fi

## bench: every benchmark (results go into docs/BENCHMARKS.md by hand, with the command)
bench:
	$(GO) test $(BENCH_FLAGS) ./...

## build: the binaries, into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## demo: a running cluster on loopback (arrives with the demo issue)
demo:
	@echo "make demo: not yet. The one-command demo (assigner, distributors, nodes, load generator)"
	@echo "is the next step. Meanwhile, try the simulator, or the data path (README, 'The data path'):"
	@echo "  go run ./cmd/slicectl sim --algorithm all --workload zipf:1.1 --plot out.svg"

tools: $(BUF) $(STATICCHECK)

$(BUF):
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(STATICCHECK):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

clean:
	rm -rf $(BIN)
