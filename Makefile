# krfs build, test and benchmark entry points. `make test` is what CI runs.
#
# Variables (override on the command line, e.g. `make gobench BENCH=UDP`):
#   FUZZTIME       how much `make test` fuzzes each Fuzz target (300000x executions;
#                  counts, not durations: Go 1.26's -fuzztime deadline race,
#                  go.dev/issue/75804, fails duration runs on a busy machine)
#   FUZZ_PKGS      packages `make test` fuzzes (every package with a Fuzz target)
#   LONG_FUZZTIME  how much `make fuzz` fuzzes each Fuzz target (20000000x)
#   BENCH          regexp of benchmarks to run (.)
#   BENCHTIME      -benchtime of each benchmark (1s)
#   BENCHCOUNT     -count of each benchmark (1)
#   BENCH_PKGS     packages to benchmark (./...)
#   TEST_TIMEOUT   -timeout of go test (12m: a hang fails CI with its stacks inside CI's 15 minutes)
#   STATICCHECK    the staticcheck binary (GOPATH/bin/staticcheck; install it
#                  with `make tools`, the version .ci/run installs)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO ?= go
GOFMT ?= gofmt

FUZZTIME ?= 300000x
FUZZ_PKGS ?= $(ALL_FUZZ_PKGS)
LONG_FUZZTIME ?= 20000000x
BENCH ?= .
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
BENCH_PKGS ?= ./...
TEST_TIMEOUT ?= 12m
STATICCHECK_VERSION := v0.8.2
STATICCHECK ?= $(shell $(GO) env GOPATH)/bin/staticcheck

# Every package directory holding a Fuzz function, for `make fuzz`.
ALL_FUZZ_PKGS = $(shell grep -rl --include='*_test.go' -E '^func Fuzz[A-Z0-9_]' . 2>/dev/null \
	| grep -v '/testdata/' | xargs -r -n1 dirname | sort -u)

.PHONY: man build test lint vet fmtcheck staticcheck tools fuzz-short fuzz bench gobench clean demo install rdma-check

# What `krfs version` prints: git describe, the commit and its date.
KRFS_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
KRFS_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
KRFS_DATE ?= $(shell git log -1 --format=%cI 2>/dev/null)
KRFS_LDFLAGS = -X main.Version=$(KRFS_VERSION) -X main.Commit=$(KRFS_COMMIT) -X main.BuildDate=$(KRFS_DATE)

build:
	$(GO) build ./...
	@if [ -d cmd/krfs ]; then \
		mkdir -p bin && echo "$(GO) build -o bin/krfs ./cmd/krfs" && \
		$(GO) build -ldflags '$(KRFS_LDFLAGS)' -o bin/krfs ./cmd/krfs; \
	fi

# Man pages of krfs and every subcommand into man/ (krfs man DIR).
man: build
	bin/krfs man man
	@echo "man pages in man/: man -l man/krfs.8"

# go test prints a package's line only when it is done, and building
# everything with -race comes first: a heartbeat says it is still working.
test: lint
	@echo "make test: go test -race ./... (the -race build comes first; a line per package as each finishes, a heartbeat every 30 s)"
	@( while sleep 30; do echo "make test: still testing ($$(date +%T); go test runs the packages in parallel)"; done ) & hb=$$!; \
	if $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...; then rc=0; else rc=$$?; fi; \
	kill $$hb 2>/dev/null || true; \
	if [ $$rc != 0 ]; then echo "make test: go test FAILED (exit $$rc)"; exit $$rc; fi
	@echo "make test: go test passed; now the 10,000-node start storm (meta, without -race), rdma-check and fuzz-short"
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '^TestStartStorm' ./meta
	@$(MAKE) --no-print-directory rdma-check
	@$(MAKE) --no-print-directory fuzz-short
	@echo "make test: all passed"

# The libibverbs backend (verbs/rdma, build tag rdma): build and vet every
# package with the tag, then run the tests that use it. Without an RNIC
# the device tests skip and say so; the translation, pre-check and
# connection-manager tests run. Needs libibverbs-dev (rdma-core >= 44).
RDMA_PKGS ?= ./verbs/rdma ./nic
rdma-check:
	@[ -f /usr/include/infiniband/verbs.h ] || { \
		echo "rdma-check: /usr/include/infiniband/verbs.h missing: apt-get install libibverbs-dev"; exit 1; }
	$(GO) build -tags rdma ./...
	$(GO) vet -tags rdma ./...
	$(GO) test -tags rdma -race -count=1 -timeout $(TEST_TIMEOUT) $(RDMA_PKGS)
	$(GO) test -tags rdma -race -count=1 -run '^TestDevices' ./cmd/krfs

lint: vet fmtcheck staticcheck

vet:
	$(GO) vet ./...

# staticcheck with its default checks; `make tools` installs the pinned
# version.
staticcheck:
	@if ! [ -x "$(STATICCHECK)" ]; then \
		echo "staticcheck is not installed: run make tools"; \
		exit 1; \
	fi
	$(STATICCHECK) ./...

# Installs the linters `make lint` runs, at pinned versions.
tools:
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Fails listing every Go file gofmt would change (testdata and .git excluded).
fmtcheck:
	@files=$$(find . -name '*.go' -not -path './.git/*' -not -path '*/testdata/*' -print0 \
		| xargs -0 -r $(GOFMT) -l); \
	if [ -n "$$files" ]; then \
		echo "gofmt: these files are not formatted (run gofmt -w):"; \
		echo "$$files"; \
		exit 1; \
	fi

# run_fuzz PKGS, TIME: runs every Fuzz target of each package in PKGS for
# TIME, one at a time (go test -fuzz takes one target per run). Packages that
# do not exist or have no Fuzz targets are skipped silently.
define run_fuzz
for pkg in $(1); do \
	dir=$${pkg#./}; \
	[ -d "$$dir" ] || continue; \
	list=$$($(GO) test -list '^Fuzz' "./$$dir"); \
	for f in $$(printf '%s\n' "$$list" | grep -E '^Fuzz' || true); do \
		echo "fuzz ./$$dir $$f for $(2)"; \
		$(GO) test -run='^$$' -fuzz="^$$f\$$" -fuzztime=$(2) "./$$dir"; \
	done; \
done
endef

# A short fuzz of FUZZ_PKGS, part of `make test`.
fuzz-short:
	@$(call run_fuzz,$(FUZZ_PKGS),$(FUZZTIME))

# Longer fuzzing of every package that has Fuzz targets.
fuzz:
	@$(call run_fuzz,$(ALL_FUZZ_PKGS),$(LONG_FUZZTIME))

# The main job end to end on one node with the embedded meta service;
# prints each command and its output and ends with OK or FAILED. Uses
# bin/krfs (make build; make clean removes it).
demo: build
	scripts/demo.sh

# The comparison suite: krfs against same-run baselines, tables, JSON and
# plots in bench-results/ (see BENCHMARKS.md). Needs root for the FUSE rows.
bench: build
	scripts/bench.sh

# The Go benchmarks alone (BENCH, BENCHTIME, BENCHCOUNT, BENCH_PKGS).
gobench:
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) $(BENCH_PKGS)

# Installs bin/krfs as $(DESTDIR)$(PREFIX)/bin/krfs, the mount(8) helper
# $(DESTDIR)$(SBINDIR)/mount.fuse.krfs (a symlink to it: `mount -t fuse.krfs`
# and fstab entries), and the systemd unit template krfs@.service.
PREFIX ?= /usr/local
SBINDIR ?= /sbin
UNITDIR ?= $(PREFIX)/lib/systemd/system
DESTDIR ?=
INSTALL_BIN ?= bin/krfs

install: build
	install -D -m 0755 $(INSTALL_BIN) $(DESTDIR)$(PREFIX)/bin/krfs
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR)
	ln -sfn $(PREFIX)/bin/krfs $(DESTDIR)$(SBINDIR)/mount.fuse.krfs
	sed 's|/usr/local/bin/krfs|$(PREFIX)/bin/krfs|g' contrib/systemd/krfs@.service \
		> $(DESTDIR)$(UNITDIR)/krfs@.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/krfs@.service

clean:
	rm -rf bin
