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

# Every package is tested with the race detector but e2e and chaos, whose tests start real
# binaries and skip under it: they run without it, after. The data-path integration
# scenarios shrink under it (10k items), so they run a second time without it at the full
# 100k; the browser test allows the page 8 s under it, and runs again without it at 2 s.
# The timeouts only catch hangs: the distributor's package takes ~1.5 min under the race
# detector on an idle 2-core machine, and more than 5 on a busy one.
TEST_TIMEOUT ?= 30m
TEST_FLAGS   ?= -race -timeout $(TEST_TIMEOUT)
BENCH_FLAGS ?= -run '^$$' -bench . -benchmem -timeout 30m

# Every fuzz target runs FUZZTIME under `make fuzz`, FUZZTIME_SHORT under `make fuzz-short`.
# make test replays every target's seed corpus (and testdata/fuzz/) as the tests it runs:
# building the targets with the fuzzing instrumentation took over 3 minutes of a cold,
# busy machine, for 13 s of fuzzing.
FUZZTIME       ?= 60s
FUZZTIME_SHORT ?= 1s

# The binaries of the demo and the end-to-end tests.
DEMO_BINARIES := ./cmd/assigner ./cmd/distributor ./cmd/slicectl ./examples/kvstore/cmd/kvnode ./examples/kvstore/cmd/kvdemo
COUNTER_BINARIES := ./cmd/assigner ./cmd/slicectl ./examples/counter/cmd/countermember ./examples/counter/cmd/counterdemo
TARGETS_BINARIES := ./cmd/assigner ./cmd/distributor ./cmd/slicectl ./examples/kvstore/cmd/kvnode \
	./examples/counter/cmd/countermember ./examples/targets/cmd/targetsdemo

# The chaos suite (chaos/): make test runs a short seeded run of a few quick faults, on etcd
# and on PostgreSQL (one restart, one outage), and the example counter under a stopped and
# a killed primary (TestChaosCounter); make chaos runs every fault, CHAOS_ROUNDS times with
# plain binaries, then once with race-built ones, on PostgreSQL 10 fast restarts and 3
# outages of twice the lease a round (CHAOS_PG_FAULTS), and every fault of the counter
# (CHAOS_COUNTER_FAULTS: primaries killed, stopped and cut off, assigner and etcd leaders
# killed and stopped, a rolling restart).
CHAOS_FLAGS          ?= -count=1 -v -timeout 60m
CHAOS_FAULTS         ?= all
CHAOS_PG_FAULTS      ?= all
CHAOS_COUNTER_FAULTS ?= all
CHAOS_ROUNDS         ?= 3
CHAOS_SEED           ?= 1

.PHONY: test unit fuzz fuzz-short lint proto proto-check bench demo e2e-compose e2e-postgres e2e-counter e2e-fleet e2e-members build tools clean chaos

## test: proto and lint checks, every test with the race detector (every fuzz target's seed
## corpus among them; the simulator, which starts no goroutine, without it), the data path at
## full size, end to end, the short chaos runs
test: proto-check lint unit

unit:
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v -e '/e2e$$' -e '/chaos$$' -e '/internal/sim$$')
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./internal/sim
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^(TestDataPath.*|TestThePageInABrowser)$$' ./internal/distributor ./internal/webview
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./e2e
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./chaos

## fuzz: every fuzz target for FUZZTIME (60s) each; a failing input lands in testdata/fuzz/
fuzz:
	GO=$(GO) tools/fuzz.sh $(FUZZTIME)

## fuzz-short: every fuzz target for FUZZTIME_SHORT (1s) each
fuzz-short:
	GO=$(GO) tools/fuzz.sh $(FUZZTIME_SHORT)

## lint: gofmt, go vet, staticcheck
lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

# The buf modules (buf.yaml), each generated beside its .proto files (buf.gen.yaml).
PROTO_DIRS := api examples/ratelimit/proto

## proto: regenerate the Go code of the .proto files in PROTO_DIRS (api/, the examples' APIs)
proto: $(BUF)
	$(BUF) lint
	$(BUF) generate

## proto-check: fail if the committed generated code differs from what `make proto` makes
proto-check: $(BUF)
	$(BUF) lint
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BUF) generate -o "$$tmp"; \
	for dir in $(PROTO_DIRS); do \
		if ! diff -r --exclude='*.proto' "$$tmp/$$dir" "$$dir" >/dev/null; then \
			diff -r --exclude='*.proto' "$$tmp/$$dir" "$$dir" || true; \
			echo "$$dir/: generated code is stale; run 'make proto' and commit the result"; exit 1; \
		fi; \
	done

## bench: every benchmark (results go into docs/BENCHMARKS.md by hand, with the command)
bench:
	$(GO) test $(BENCH_FLAGS) ./...

## build: the binaries, into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/... ./examples/kvstore/cmd/... ./examples/ratelimit/cmd/...

## demo: a balancing cluster on loopback with a live view; DEMO_SECONDS=N stops it after N s,
## DEMO_ROLL=1 restarts every node in turn, SOURCE=postgres keeps the items in a throwaway
## PostgreSQL table (when PostgreSQL is installed)
## DEMO_APP=counter runs the example sharded counter instead (examples/counter; needs PostgreSQL)
## DEMO_APP=both runs both on one control plane (etcd, 2 assigners) as two targets: the
## key-value store the default one, the counter target "counter" (examples/targets; needs PostgreSQL)
demo:
ifeq ($(DEMO_APP),counter)
	$(GO) build -o $(BIN)/ $(COUNTER_BINARIES)
	$(BIN)/counterdemo --bin $(BIN)
else ifeq ($(DEMO_APP),both)
	$(GO) build -o $(BIN)/ $(TARGETS_BINARIES)
	$(BIN)/targetsdemo --bin $(BIN)
else
	$(GO) build -o $(BIN)/ $(DEMO_BINARIES)
	$(BIN)/kvdemo --bin $(BIN) $(if $(SOURCE),--source $(SOURCE))
endif

## e2e-counter: the counter demo's long run: 60 s of increments through a rolling restart of
## every member, then the counter check (duplicates=0 skipped=0 failed=0 or it fails)
e2e-counter:
	$(GO) build -o $(BIN)/ $(COUNTER_BINARIES)
	$(BIN)/counterdemo --bin $(BIN) --duration 60s --roll

## chaos: every fault of the chaos suite on plain binaries, then on race-built ones, on etcd,
## on PostgreSQL (restarts and outages of the database) and on the example counter (at most
## one primary under faults); every run reports, and the target fails if any did
chaos:
	@rc=0; \
	CHAOS_FAULTS=$(CHAOS_FAULTS) CHAOS_PG_FAULTS=$(CHAOS_PG_FAULTS) CHAOS_COUNTER_FAULTS=$(CHAOS_COUNTER_FAULTS) \
	CHAOS_ROUNDS=$(CHAOS_ROUNDS) CHAOS_SEED=$(CHAOS_SEED) \
		$(GO) test $(CHAOS_FLAGS) -run '^TestChaos(Postgres|Counter)?$$' ./chaos || rc=1; \
	CHAOS_FAULTS=$(CHAOS_FAULTS) CHAOS_PG_FAULTS=$(CHAOS_PG_FAULTS) CHAOS_COUNTER_FAULTS=$(CHAOS_COUNTER_FAULTS) \
	CHAOS_ROUNDS=1 CHAOS_SEED=$(CHAOS_SEED) CHAOS_RACE=1 \
		$(GO) test $(CHAOS_FLAGS) -run '^TestChaos(Postgres|Counter)?$$' ./chaos || rc=1; \
	exit $$rc

## e2e-postgres: the real binaries on a throwaway PostgreSQL (1 assigner, 2 distributors, 4
## nodes): a fill by COPY timed against the COPY, writes while slices move and a distributor is
## killed and restarted, then the convergence check. Its last line reads
## "postgres e2e: items=N copy=... fill=... (X× the COPY) lost=0". make test runs it too (in
## ./e2e); it skips where no PostgreSQL server is installed.
e2e-postgres:
	@out=$$(mktemp); trap 'rm -f "$$out"' EXIT; rc=0; \
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^TestPostgresEndToEnd$$$$' -v ./e2e >"$$out" 2>&1 || rc=$$?; \
	grep -E '^(--- |ok|FAIL|PASS)|postgres_test.go' "$$out" | grep -v 'postgres e2e:' || true; \
	if [ $$rc -ne 0 ]; then tail -50 "$$out"; exit $$rc; fi; \
	grep -o 'postgres e2e: .*' "$$out" || { echo "e2e-postgres: skipped (no PostgreSQL server?)"; grep -- '--- SKIP' -A2 "$$out"; }

## e2e-members: members of the example rate limiter (examples/ratelimit) as processes under a
## load, under every fault of TestMembersUnderFaults (kill -9, SIGSTOP past the lease, warm
## secondaries, 10 members, a rolling restart): how soon each key is served again and how
## many requests fail. make test runs two of them with a 2 s lease
e2e-members:
	SLICEPLANE_MEMBERS=$(or $(MEMBERS),all) $(GO) test -count=1 -timeout 40m -run '^TestMembersUnderFaults$$' -v ./e2e

## e2e-fleet: a relay killed (kill -9) under FLEET_ROUTERS routers (default 10,000) in processes
## of their own beside the real binaries; it reports when every router had the change made
## right after the kill. make test runs 150 routers in one process (client's relay tests)
FLEET_ROUTERS ?= 10000
e2e-fleet:
	SLICEPLANE_FLEET_ROUTERS=$(FLEET_ROUTERS) $(GO) test -count=1 -timeout 30m -run '^TestARelayKilledUnderItsRouters$$' -v ./e2e

## e2e-compose: the docker-compose deployment, built, broken and checked (skips without Docker)
e2e-compose:
	deploy/compose/e2e.sh

tools: $(BUF) $(STATICCHECK)

$(BUF):
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(STATICCHECK):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

clean:
	rm -rf $(BIN)
