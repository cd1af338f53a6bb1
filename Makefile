# Relay: see README.md. `make run` serves on :8080 with the embedded store;
# `make test` runs everything, starting its own throwaway PostgreSQL.
GO       ?= go
BIN      := bin/relay
PKGS     := ./...
GOFILES   = $(shell git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')

.PHONY: build run test bench lint vet fmt-check fuzz clean soak

build:
	$(GO) build -o $(BIN) ./cmd/relay

run: build
	mkdir -p data
	./$(BIN) serve

# The whole suite: format and vet checks, every test with the race detector on
# SQLite and a throwaway PostgreSQL, then every benchmark once.
test: lint
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
	$(GO) test -run '^$$' -bench . -benchtime 1x -count=1 $(PKGS)

# The Go micro-benchmarks once, then the standard load run: relay-bench
# starts bin/relay itself on a throwaway SQLite store, runs every scenario on
# loopback and ends with the table of performance targets (a few minutes).
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)
	$(GO) build -o bin/relay-bench ./cmd/relay-bench
	./bin/relay-bench suite -relay $(BIN)

lint: fmt-check vet

fmt-check:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

clean:
	rm -rf bin

# Bounded soak on loopback (not part of make test): the real binary on a
# throwaway PostgreSQL, 5 000 connections, the database restarted once.
soak:
	$(GO) test -tags soak -run '^TestSoak$$' -count=1 -v -timeout 30m ./cmd/relay/

# Coverage-guided fuzzing of every parser that sees outside bytes, one target
# after another for FUZZTIME each (go test allows one -fuzz target per run).
# Seed corpora live in <pkg>/testdata/fuzz/<Target>/ and run as ordinary
# tests in make test; new inputs found here go to Go's cache, a failing one
# to testdata (commit it as a regression case once fixed).
FUZZTIME ?= 60s

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzConsume$$' -fuzztime $(FUZZTIME) ./transport/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeClientMessage$$' -fuzztime $(FUZZTIME) ./proto/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEmitRequest$$' -fuzztime $(FUZZTIME) ./proto/
	$(GO) test -run '^$$' -fuzz '^FuzzValidChannel$$' -fuzztime $(FUZZTIME) ./proto/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRevokeRequest$$' -fuzztime $(FUZZTIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzSessionVerify$$' -fuzztime $(FUZZTIME) ./api/
	$(GO) test -run '^$$' -fuzz '^FuzzVerifyEmitToken$$' -fuzztime $(FUZZTIME) ./actors/
