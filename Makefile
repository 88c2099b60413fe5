# Airlock build. Every target that touches the host prepares it first (packages, dockerd,
# bpffs) through deploy/host/prepare.sh, which says what it does and skips what is done.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
VERSION ?= 0.1.0
LDFLAGS := -s -w -X github.com/airlockdev/airlock/internal/buildinfo.Version=$(VERSION)
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: all build prepare doctor image up check test sdk-test bench generate check-generate check-tidy fmt vet clean help kube-testenv

all: build ## the default: build

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

build: ## build bin/airlock, bin/execd and bin/airlock-gokernel (static)
	@echo "==> building bin/airlock bin/execd bin/airlock-gokernel ($(VERSION))"
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/execd ./cmd/execd
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/airlock-gokernel ./cmd/airlock-gokernel
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/airlock ./cmd/airlock

prepare: ## install missing packages, start dockerd (gVisor runsc registered), mount bpffs
	@deploy/host/prepare.sh

image: prepare build ## build the sandbox, code-interpreter, browser, desktop and execd images (cached by recipe)
	$(BIN)/airlock image build all

doctor: build ## check this host: one row per prerequisite, with the fix
	@$(BIN)/airlock doctor

up: prepare build image doctor ## build everything, check the host, start the whole stack on this host
	$(BIN)/airlock up $(UP_FLAGS)

vet: ## go vet ./...
	@echo "==> go vet"
	$(GO) vet ./...

# The inner loop: no host preparation, no images, no Kubernetes test environment. Tests
# that need root, Docker, eBPF, nftables, a kube-apiserver or network namespaces skip
# under -short (internal/testenv: NotShort and the Need helpers); `make test` runs them.
check: ## the inner loop, under 2 minutes warm: vet, go.mod tidy and every test that needs no root, Docker or network (go test -short)
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory vet check-tidy && \
	echo "==> go test -short (no root, Docker, eBPF, nftables, kube-apiserver or network)" && \
	$(GO) test -short -count=1 -timeout 10m ./... && \
	echo "==> make check passed in $$(( $$(date +%s) - start ))s"

kube-testenv: ## build the pinned Kubernetes binaries the tests run: API server, etcd and the one-node cluster (cached by version; cold about 15 min)
	@deploy/kubernetes/testenv/build.sh --node >/dev/null

test: prepare build image kube-testenv vet check-tidy check-generate ## everything: vet, go.mod tidy, unit, integration, SDK tests
	@echo "==> go test (unit and integration against real sandboxes)"
	$(GO) test -count=1 -timeout 40m $$($(GO) list ./... | grep -v '/internal/kubenode$$')
	@echo "==> go test (the one-node Kubernetes cluster, alone: its kube-proxy and NetworkPolicy rules share the host's network with the other tests)"
	$(GO) test -count=1 -timeout 30m ./internal/kubenode/
	@echo "==> go test -race (concurrent route table, route parsing, watch stream)"
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 10m ./gateway/routetable/ ./gateway/route/ ./lifecycle/watch/
	@$(MAKE) --no-print-directory sdk-test

sdk-test: ## the OpenSandbox JavaScript SDK against a real airlock server
	@if [ -d tests/sdk ]; then \
	  echo "==> OpenSandbox SDK tests (tests/sdk)"; \
	  cd tests/sdk && npm ci --no-audit --no-fund --loglevel=error && AIRLOCK_BIN=$(BIN)/airlock npm test; \
	fi

bench: prepare build image ## side-by-side benchmarks, printed as ratios
	@echo "==> benchmarks (each figure measured side by side in this run)"
	AIRLOCK_BENCH=1 $(GO) test -p 1 -count=1 -timeout 90m -run '^TestBench' -v ./... 2>&1 \
	  | tee $(BIN)/bench.log | grep -E '^(BENCH|RATIO|--- FAIL|FAIL|ok )' || true
	@! grep -qE '^(--- FAIL|FAIL)' $(BIN)/bench.log

check-tidy: ## fail when go.mod or go.sum is not tidy
	@echo "==> checking go.mod is tidy"
	@$(GO) mod tidy -diff || { echo "go.mod is not tidy: run go mod tidy and commit" >&2; exit 1; }

# controller-gen is pinned in go.mod as a tool, as bpf2go is.
CONTROLLER_GEN := $(GO) tool controller-gen

generate: ## regenerate eBPF objects and bindings (needs clang) and the CRDs
	$(GO) generate ./ebpf/...
	$(CONTROLLER_GEN) crd paths=./lifecycle/kubestore/v1alpha1/... output:crd:dir=./deploy/kubernetes/base/crds

check-generate: ## fail when committed generated files are stale
	@if [ -d ebpf ]; then \
	  echo "==> checking generated eBPF files are current"; \
	  $(GO) generate ./ebpf/... && git diff --exit-code -- ebpf/ || { echo "generated eBPF files are stale: run make generate and commit" >&2; exit 1; }; \
	fi
	@echo "==> checking generated CRDs are current"
	@$(CONTROLLER_GEN) crd paths=./lifecycle/kubestore/v1alpha1/... output:crd:dir=./deploy/kubernetes/base/crds && \
	  git diff --exit-code -- deploy/kubernetes/base/crds/ || { echo "generated CRDs are stale: run make generate and commit" >&2; exit 1; }

fmt: ## gofmt every Go file
	gofmt -w $$(git ls-files '*.go')

clean: ## remove bin/
	rm -rf $(BIN)

# A one-node Kubernetes cluster on this host (deploy/kubernetes/testenv/README.md). Hold
# /tmp/airlock-test.lock while it runs when tests share this host.
.PHONY: kube-up kube-down
kube-up: image ## start a one-node cluster here (kubelet, private containerd, CNI, NetworkPolicy, DNS) and deploy Airlock on it from its manifests; prints the lifecycle API, the gateway and the API key
	@deploy/kubernetes/testenv/up.sh
	@deploy/kubernetes/testenv/airlock-up.sh
kube-down: ## stop the one-node cluster and leave the host as it was before kube-up
	@deploy/kubernetes/testenv/down.sh

.PHONY: console-xterm console-xterm-check
console-xterm: ## vendor the pinned xterm.js packages from npm into console/assets/xterm (console/thirdparty/xterm.sh)
	console/thirdparty/xterm.sh

console-xterm-check: ## fetch the pinned xterm.js packages again and fail when console/assets/xterm differs
	console/thirdparty/xterm.sh --check
