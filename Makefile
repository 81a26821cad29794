# make run   builds ./caddy with tally (xcaddy) and serves Caddyfile.example
# make test  everything CI runs: installs redis-server if missing, checks
#            formatting, vet, staticcheck and the import arrows, unit tests,
#            then integration tests against a real Caddy and real redis-server
#            processes, all under -race
# make bench prints the benchmark table of docs/performance.md

GO ?= go
TEST_TIMEOUT ?= 25m

.PHONY: run build test deps lint cross unit integration bench

run: build
	./caddy run --config Caddyfile.example --adapter caddyfile

build:
	./xcaddy-build.sh

# Tests start redis-server (and redis-cli for the cluster), prometheus and a
# headless chromium themselves, on loopback ports; they only need the
# binaries (promtool checks alerts/). Installing needs root, as on CI.
deps:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
		echo "installing redis-server and redis-tools (Debian packages)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; }
	@redis-server --version
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
		echo "installing prometheus and promtool (Debian package); the tests run their own, so its service is stopped"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		systemctl disable --now prometheus >/dev/null 2>&1 || true; }
	@promtool --version | head -1
	@command -v chromium >/dev/null || { \
		echo "installing chromium (Debian package), which the challenge's browser test drives headless"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	@chromium --version
	@command -v node >/dev/null && command -v npm >/dev/null || { \
		echo "installing nodejs and npm (Debian packages), for the official OpenAI and Anthropic clients in tests/sdk"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	@[ -d tests/sdk/node_modules ] || npm ci --prefix tests/sdk --no-audit --no-fund
	@node --version

# staticcheck runs pinned through `go run`, as xcaddy does in xcaddy-build.sh:
# nothing to install, the same version everywhere.
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

# TREE_CHECKS read the tree, not a running Caddy: the import arrows between
# packages (go list; the rules are in tests/arrows_test.go, the map in the
# README's Layout table), the root files' uses of each other (one way, off
# the hub: tests/rootfiles_test.go), that table, the tests/ file names, the
# links of the README and docs/*.md, and the shipped lines' budget.
TREE_CHECKS = TestImportArrows|TestImportArrowsCatchEachBreach|TestRootFilesHangFromTheHub|TestFileLoopsFindsEachLoop|TestReadmeLayoutNamesEveryPackageAndRootFile|TestFileNamesSayWhichTestsStartCaddy|TestDocsLinksResolve|TestDocsACLLineIsTheTestedOne|TestStoreContractIsSmall|TestNoStoreTypeAssertionAfterProvision|TestShippedCodeStaysWithinItsBudget

lint: cross
	@bad=$$(gofmt -l . ); if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi
	$(GO) vet ./...
	cd tests && $(GO) vet ./...
	$(STATICCHECK) ./...
	cd tests && $(STATICCHECK) ./...
	cd tests && $(GO) test -count=1 -run '^($(TREE_CHECKS))$$' .

# Every platform Caddy ships: the shipped module type-checks for each
# (tests/cmd/crosscheck lists them), and its unit tests build and pass where
# int is 32 bits (386 binaries run on amd64 Linux). A kernel built without
# 32-bit emulation (ia32_emulation off, as on some VMs) cannot run them: the
# tests are then built for 386, not run, and the output says so.
cross:
	cd tests && $(GO) run ./cmd/crosscheck
	@if GOARCH=386 $(GO) test -count=1 -run '^$$' ./internal/monotime >/dev/null 2>&1; then \
		echo "GOARCH=386 $(GO) test -count=1 ./..."; GOARCH=386 $(GO) test -count=1 ./...; \
	else \
		echo "this kernel cannot run 32-bit binaries (ia32 emulation off): building the unit tests for 386 without running them"; \
		out=$$(mktemp -d) && GOARCH=386 $(GO) test -count=1 -c -o $$out/ ./... && rm -rf $$out && echo "386 unit tests built"; \
	fi

unit:
	$(GO) test -race -count=1 ./...

# The Caddy under test is built first (with -race), so that no test shares
# the machine with the build. The parallel tests mostly wait on their own
# clocks (leases, syncs, failovers), so four run at once even on two cores.
integration: deps
	cd tests && $(GO) build -race -o bin/caddy ./cmd/tally-caddy
	cd tests && TALLY_CADDY_BIN=$(CURDIR)/tests/bin/caddy $(GO) test -race -count=1 -parallel 4 -timeout $(TEST_TIMEOUT) ./...

test: deps lint unit integration

bench: deps
	cd tests && $(GO) run ./cmd/benchtable
