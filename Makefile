# Relay: see README.md. `make run` serves on :8080 with the embedded store;
# `make test` runs everything, starting its own throwaway PostgreSQL.
GO       ?= go
BIN      := bin/relay
PKGS     := ./...
GOFILES   = $(shell git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')

.PHONY: build run test test-race test-tool load-tool-bench bench-once bench bench-cluster lint vet fmt-check fuzz clean soak worstcase proto test-cluster test-upgrade image

build:
	@test -x $(BIN) || echo "building $(BIN): the first build fetches and compiles the dependencies, a few minutes"
	$(GO) build -o $(BIN) ./cmd/relay

run: build
	mkdir -p data
	./$(BIN) serve

# The whole suite: format and vet checks, tsc on the browser client's types;
# then three lanes at once, each printed when it ends: every test with the
# race detector on SQLite and a throwaway PostgreSQL (test-race); the
# cluster tests (test-cluster); and a 40-second soak, the worst-case memory
# checks in short form, the load tool's own tests and every benchmark once
# (load-tool-bench); the soak and the worst-case checks count losses,
# drops, leaks and memory bounds, not speed, so they share the machine too.
# Most tests wait on real time (ticks, timeouts, other processes) rather
# than on the CPU, and most are marked t.Parallel: -parallel 4 lets more of
# them overlap than there are cores.
test: lint
	sh api/web/typecheck/check.sh
	$(MAKE) -j3 --output-sync=target test-race test-cluster load-tool-bench

# Every package but the load tool's (test-tool, in its own lane in make test),
# the longest, cmd/relay, listed first so that it starts early (go test runs
# two packages at a time).
RACE_PKGS = ./cmd/relay $(filter-out %/cmd/relay-bench %/cmd/relay,$(shell $(GO) list -e $(PKGS)))

# The race detector is for our code and how it calls libraries. Two
# libraries are compiled without it: SQLite's Go translation from C and
# x/crypto (argon2), whose instrumented inner loops were most of the CPU of
# cmd/relay's tests (go test -cpuprofile: 164 s of CPU, 48 s without them).
# GOFLAGS, so that the relays the tests build with -race get them too.
RACE_GOFLAGS := -gcflags=modernc.org/...=-race=false -gcflags=golang.org/x/crypto/...=-race=false

test-race:
	GOFLAGS="$(GOFLAGS) $(RACE_GOFLAGS)" $(GO) test -race -count=1 -parallel 4 -timeout 15m $(RACE_PKGS)

# The load tool's tests: each scenario at toy sizes against a real relay,
# the suite, and relay-bench cluster with its own etcd and PostgreSQL.
test-tool:
	GOFLAGS="$(GOFLAGS) $(RACE_GOFLAGS)" $(GO) test -race -count=1 -timeout 10m ./cmd/relay-bench/

load-tool-bench:
	SOAK_DURATION=40s $(MAKE) soak
	$(GO) test -short -tags worstcase -run WorstCase -count=1 -v -timeout 5m ./cmd/relay/e2e/load/
	$(MAKE) test-tool
	$(MAKE) bench-once

# -short: a benchmark may size itself down (it still runs every path).
bench-once:
	$(GO) test -short -run '^$$' -bench . -benchtime 1x -count=1 $(PKGS)

# Several nodes as one relay (cmd/relay/CLUSTER.md): the tests start
# their own etcd (Debian's etcd-server) and PostgreSQL and three real bin/relay
# processes on loopback. Without -race: protoactor's cluster has a data race of
# its own in its member list (see the test file).
test-cluster:
	$(GO) test -tags cluster -run '^TestCluster' -count=1 -v -parallel 4 -timeout 10m ./cmd/relay/e2e/cluster/

# A rolling upgrade half done: one node of the relay at git revision
# UPGRADE_FROM (built in a temporary worktree), two of this tree, one
# cluster. Not part of make test: it builds a second relay.
UPGRADE_FROM ?= 0baf891
test-upgrade:
	@tmp=$$(mktemp -d) && trap 'git worktree remove --force "$$tmp/src" 2>/dev/null; rm -rf "$$tmp"' EXIT && \
	git worktree add --detach "$$tmp/src" $(UPGRADE_FROM) >/dev/null && \
	(cd "$$tmp/src" && $(GO) build -o "$$tmp/relay-old" ./cmd/relay) && \
	RELAY_OLD_BINARY="$$tmp/relay-old" $(GO) test -tags cluster -run '^TestUpgrade' -count=1 -v -timeout 5m ./cmd/relay/e2e/cluster/

# Regenerates proto/clusterpb from proto/cluster.proto with Debian's protoc
# (protobuf-compiler) and protoc-gen-go at the version go.mod pins for
# google.golang.org/protobuf, installed into a temporary directory.
PROTOC_GEN_GO_VERSION := v1.36.12
proto:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	GOBIN="$$tmp" $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION) && \
	echo "protoc $$(protoc --version | cut -d' ' -f2), protoc-gen-go $(PROTOC_GEN_GO_VERSION)" && \
	protoc --plugin=protoc-gen-go="$$tmp/protoc-gen-go" --go_out=. --go_opt=module=github.com/relayhq/relay proto/cluster.proto

# The Go micro-benchmarks once, then the standard load run: relay-bench
# starts bin/relay itself on a throwaway SQLite store, runs every scenario on
# loopback and ends with the table of performance targets (a few minutes).
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)
	$(GO) build -o bin/relay-bench ./cmd/relay-bench
	./bin/relay-bench suite -relay $(BIN)

# Several nodes against one (cmd/relay/CLUSTER.md): relay-bench
# starts its own etcd (Debian's etcd-server), a throwaway PostgreSQL and the
# relays on loopback, alternates one node and three for three rounds and ends
# with the table of the multi-node targets (about 7 minutes).
bench-cluster: build
	$(GO) build -o bin/relay-bench ./cmd/relay-bench
	./bin/relay-bench cluster -relay $(BIN)

# The container image (cmd/relay/deploy/Containerfile): a static bin/relay-static built here,
# then copied into a FROM scratch image with podman, or docker when podman is absent. By default
# for this machine's architecture; PLATFORMS="linux/amd64 linux/arm64" builds one image per
# platform (GOARCH set, no emulation: nothing runs in the build; --no-cache, since podman 4.3 would
# reuse one platform's layers for the next) and gathers them in the manifest list $(IMAGE)
# (podman only; push it with `podman manifest push --all $(IMAGE) docker://…`).
# VERSION and REVISION become the image's OCI labels.
IMAGE  ?= relay:latest
ENGINE ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
PLATFORMS ?=
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_ARGS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION)
# podman writes OCI images by default, which drop HEALTHCHECK; the Docker format keeps it.
IMAGE_FORMAT = $(if $(findstring podman,$(ENGINE)),--format docker)
image:
	@if [ -z "$(ENGINE)" ]; then echo "make image: neither podman nor docker is installed (apt-get install podman)"; exit 1; fi
	@if [ ! -r "$(CA_BUNDLE)" ]; then echo "make image: no CA bundle at $(CA_BUNDLE) (apt-get install ca-certificates, or set CA_BUNDLE)"; exit 1; fi
ifeq ($(strip $(PLATFORMS)),)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/relay-static ./cmd/relay
	@ctx=$$(mktemp -d) && trap 'rm -rf "$$ctx"' EXIT && \
	cp bin/relay-static "$$ctx/relay" && mkdir "$$ctx/data" && cp "$(CA_BUNDLE)" "$$ctx/ca-certificates.crt" && \
	echo "$(ENGINE) build $(IMAGE_FORMAT) $(IMAGE_ARGS) -f cmd/relay/deploy/Containerfile -t $(IMAGE)" && \
	$(ENGINE) build $(IMAGE_FORMAT) $(IMAGE_ARGS) -f cmd/relay/deploy/Containerfile -t $(IMAGE) "$$ctx"
else
	@case "$(ENGINE)" in *podman*) ;; *) echo "make image: PLATFORMS needs podman (its manifest lists); with docker use buildx"; exit 1;; esac
	-@$(ENGINE) manifest rm $(IMAGE) >/dev/null 2>&1; $(ENGINE) rmi $(IMAGE) >/dev/null 2>&1; true
	$(ENGINE) manifest create $(IMAGE)
	@for p in $(PLATFORMS); do \
		os=$${p%%/*}; arch=$${p#*/}; bin=bin/relay-static-$$os-$$arch; \
		echo "GOOS=$$os GOARCH=$$arch CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $$bin ./cmd/relay"; \
		GOOS=$$os GOARCH=$$arch CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $$bin ./cmd/relay || exit 1; \
		ctx=$$(mktemp -d) && cp $$bin "$$ctx/relay" && mkdir "$$ctx/data" && cp "$(CA_BUNDLE)" "$$ctx/ca-certificates.crt" && \
		echo "$(ENGINE) build --no-cache --platform $$p $(IMAGE_FORMAT) $(IMAGE_ARGS) -f cmd/relay/deploy/Containerfile --manifest $(IMAGE)" && \
		$(ENGINE) build --no-cache --platform $$p $(IMAGE_FORMAT) $(IMAGE_ARGS) -f cmd/relay/deploy/Containerfile --manifest $(IMAGE) "$$ctx"; \
		rc=$$?; rm -rf "$$ctx"; [ $$rc -eq 0 ] || exit $$rc; \
	done
	$(ENGINE) manifest inspect $(IMAGE) | grep -E '"(architecture|os)"'
endif

lint: fmt-check vet

fmt-check:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# The build-tagged tests too (cluster, soak, worstcase): go vet skips them otherwise.
vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags cluster,soak,worstcase ./cmd/relay/...

clean:
	rm -rf bin

# Worst-case memory one key holder can add, every limit at its default, and
# the bounds it must stay under (cmd/relay/OPERATING.md › Abuse limits);
# make test runs it in short form.
worstcase:
	$(GO) test -tags worstcase -run WorstCase -count=1 -v -timeout 10m ./cmd/relay/e2e/load/

# Bounded soak on loopback (make test runs it for 40 s): the real binary on a
# throwaway PostgreSQL, 5 000 connections, the database restarted once.
soak:
	$(GO) test -tags soak -run '^TestSoak$$' -count=1 -v -timeout 30m ./cmd/relay/e2e/load/

# Coverage-guided fuzzing of every parser that sees outside bytes, one target
# after another for FUZZTIME each (go test allows one -fuzz target per run).
# Seed corpora live in <pkg>/testdata/fuzz/<Target>/ and run as ordinary
# tests in make test; new inputs found here go to Go's cache, a failing one
# to testdata (commit it as a regression case once fixed).
FUZZTIME ?= 60s

FUZZ_TARGETS := transport:FuzzConsume proto:FuzzDecodeClientMessage proto:FuzzDecodeEmitRequest \
	proto:FuzzValidChannel api:FuzzDecodeRevokeRequest api:FuzzSessionVerify actors:FuzzVerifyEmitToken \
	actors:FuzzRemoteReceive

# A duration -fuzztime can end with a bare "context deadline exceeded" and no
# failing input: a race in Go's fuzz coordinator (golang/go#75804, fixed in
# Go 1.27). Such a run is reported and passed over; a run that wrote a failing
# input to testdata, or failed any other way, fails make fuzz. A count
# (FUZZTIME=20000x) avoids the race altogether.
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t#*:}; dir=$$pkg/testdata/fuzz/$$name; \
		before=$$(ls $$dir 2>/dev/null | wc -l); log=$$(mktemp); \
		echo "$(GO) test -run '^$$' -fuzz '^$$name\$$' -fuzztime $(FUZZTIME) ./$$pkg/"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) ./$$pkg/ > $$log 2>&1; rc=$$?; cat $$log; \
		after=$$(ls $$dir 2>/dev/null | wc -l); \
		if [ $$rc -ne 0 ]; then \
			if [ $$after -eq $$before ] && grep -q '^    context deadline exceeded$$' $$log && ! grep -q 'Failing input written' $$log; then \
				echo "fuzz: $$name: Go's fuzztime deadline race (golang/go#75804), no failing input: passed over"; \
			else rm -f $$log; exit 1; fi; \
		fi; \
		rm -f $$log; \
	done
