# jazzmine worker. `make help` lists the targets.

GO          ?= go
PYTHON      ?= python3
BASE_IMAGE  ?= jazzmine-python-base:bookworm
# gVisor's runsc, built from the Go module proxy (gvisor.dev/gvisor, whose Go module is
# its repository's "go" branch) by make gvisor. One exact pseudo-version: a newer one is
# a change of the sandboxes' kernel, to be tested like one.
GVISOR_VERSION ?= v0.0.0-20260905035102-160fafc42237
GOTESTFLAGS ?=
# Fuzz budgets in executions, a few seconds to 20 s each here. Counts, not durations: a duration
# races Go 1.26's fuzz coordinator at its deadline (golang/go#75804) and fails spuriously.
FUZZ_FAST   ?= 200000x
FUZZ_SLOW   ?= 30000x
# Each input of FuzzChildPipe is an execution in a real harness (about 10 ms).
FUZZ_PIPE   ?= 2000x

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z0-9_-]+:.*?## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the worker binary into bin/worker
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/worker ./cmd/worker

.PHONY: base-image
base-image: ## Build the Python base image from Debian packages (mmdebstrap + docker import); no registry needed
	BASE_IMAGE=$(BASE_IMAGE) ./deploy/base-image/build.sh

.PHONY: ipython-reference
ipython-reference: base-image ## Record IPython's answers to the MCP comparison cells (cmd/worker/testdata/ipython) with Debian's ipython3 beside the datascience sandbox's apt_packages
	GO=$(GO) BASE_IMAGE=$(BASE_IMAGE) ./cmd/worker/testdata/ipython/record.sh

.PHONY: gvisor
gvisor: ## Build gVisor's runsc (GVISOR_VERSION) from the Go module proxy, install it and register it with Docker as runsc (as root; else print the steps)
	GO=$(GO) GVISOR_VERSION=$(GVISOR_VERSION) ./deploy/gvisor/install.sh

.PHONY: lint
lint: ## gofmt, go vet, and a syntax check of the harness
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(PYTHON) -m py_compile harness/jazzmine_harness/*.py

.PHONY: test-python
test-python: ## Python unit tests of the harness
	$(PYTHON) -m unittest discover -s harness/pytests -t harness/pytests -v

.PHONY: test-go
test-go: ## Go tests with the race detector (real harness, real Docker, in-process NATS); the isolation suites under runc and runsc
	$(GO) test -race -count=1 -timeout 20m $(GOTESTFLAGS) ./...

.PHONY: fuzz
fuzz: ## A short run of every fuzz target (FUZZ_FAST or FUZZ_SLOW executions each)
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeJob$$' -fuzztime $(FUZZ_FAST) ./wire/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $(FUZZ_FAST) ./wire/
	$(GO) test -run '^$$' -fuzz '^FuzzExecutorStream$$' -fuzztime $(FUZZ_SLOW) ./harness/
	$(GO) test -run '^$$' -fuzz '^FuzzChildPipe$$' -fuzztime $(FUZZ_PIPE) ./harness/
	$(GO) test -run '^$$' -fuzz '^FuzzDemux$$' -fuzztime $(FUZZ_FAST) ./sandboxpool/

.PHONY: test-deps
test-deps: ## Install docker-compose for the compose test when root with apt (one line says so); else print the command
	@command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "test-deps: docker-compose is not installed: installing it (apt-get install -y --no-install-recommends docker-compose)"; \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-compose; } >/dev/null; \
	  else \
	    echo "test-deps: the compose test needs docker-compose (skipped without it): sudo apt-get install -y docker-compose"; \
	  fi; }

.PHONY: test
test: test-deps lint base-image test-python test-go fuzz ## Everything CI runs: lint, the base image, Python and Go tests, a short fuzz run

.PHONY: run
run: base-image build ## Run the worker with the example config and the embedded NATS server (127.0.0.1:4222)
	./bin/worker serve --config examples/config.yaml

.PHONY: demo
demo: base-image build ## Build what is needed, start a worker, submit example jobs, show their events, stop
	./examples/demo.sh

BENCH_OUT   ?= bench-out
BENCH        = JAZZMINE_BENCH_OUT=$(abspath $(BENCH_OUT)) $(GO) test -run '^$$' -count 1

.PHONY: bench
bench: base-image ## Measure latency, throughput, pool, memory and isolation side by side; write docs/BENCHMARKS.md and its plots
	rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT)
	$(BENCH) -bench 'AttachFloor|Isolation|Checkout' -benchtime 1000x ./sandboxpool/
	$(BENCH) -bench 'Spawn' -benchtime 20x ./sandboxpool/
	$(BENCH) -bench 'OneAgent' -benchtime 2000x ./worker/
	$(BENCH) -bench 'SequentialAgent' -benchtime 500x ./worker/
	$(BENCH) -bench 'EndToEnd' -benchtime 2000x ./worker/
	$(BENCH) -bench 'AgentPace' -benchtime 1000x ./worker/
	$(BENCH) -bench 'Throughput' -benchtime 2000x ./worker/
	$(BENCH) -bench 'CPUByProcess' -benchtime 2000x ./worker/
	$(BENCH) -bench 'DockerExec' -benchtime 100x ./worker/
	$(BENCH) -bench 'DockerRun' -benchtime 30x ./worker/
	$(BENCH) -bench 'Memory' -benchtime 1x ./worker/
	$(MAKE) --no-print-directory bench-tiers-run
	$(GO) run ./internal/benchreport -in $(BENCH_OUT) -out docs -command "make bench"
	@echo "wrote docs/BENCHMARKS.md"

.PHONY: bench-tiers
bench-tiers: base-image ## runc and gVisor side by side: a trivial job's median and p99, jobs/s at 8 agents, CPU per job, spawn, memory (needs make gvisor)
	rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT)
	$(MAKE) --no-print-directory bench-tiers-run
	$(GO) run ./internal/benchreport -tiers -in $(BENCH_OUT)

.PHONY: bench-tiers-run
bench-tiers-run: ## The runs of bench-tiers, recording into BENCH_OUT (make bench-tiers prints them)
	$(BENCH) -bench 'Tiers/.*/(latency|agents=8)$$' -benchtime 1000x ./worker/
	$(BENCH) -bench 'Tiers/.*/spawn$$' -benchtime 20x ./worker/
	$(BENCH) -bench 'Tiers/.*/memory$$' -benchtime 1x ./worker/

.PHONY: profile
profile: base-image ## CPU profile of the worker side (NATS, worker, client) at 8 agents; prints the top and keeps bench-out/cpu.prof
	mkdir -p $(BENCH_OUT)
	$(GO) test -run '^$$' -count 1 -bench 'Throughput/agents=8$$' -benchtime 3000x -cpuprofile $(BENCH_OUT)/cpu.prof -o $(BENCH_OUT)/worker.test ./worker/
	$(GO) tool pprof -top -cum -nodecount 40 $(BENCH_OUT)/worker.test $(BENCH_OUT)/cpu.prof

.PHONY: nats-image
nats-image: ## Build nats:<version> (FROM scratch, the nats-server Go module) unless it exists; for hosts that cannot pull it
	GO=$(GO) ./deploy/nats/images.sh nats

.PHONY: worker-image
worker-image: build ## Build jazzmine-worker:latest, FROM scratch around bin/worker
	GO=$(GO) ./deploy/nats/images.sh worker

.PHONY: compose-up
compose-up: base-image nats-image worker-image ## Run deploy/nats/docker-compose.yml: a 3-node JetStream cluster with roles and a tenant (keys in deploy/nats/run) and 2 workers in containers
	./deploy/nats/compose.sh up

.PHONY: compose-down
compose-down: ## Stop what compose-up started (JetStream data is kept; WIPE=1 removes it)
	./deploy/nats/compose.sh down

.PHONY: fault-test
fault-test: base-image ## 1,000 jobs on 3 NATS servers and 2 workers (processes) while a worker and a server are killed
	$(GO) test -race -count=1 -v -run '^TestAClusterLosesNoJob' ./deploy/nats/

.PHONY: bench-scale
bench-scale: ## The control plane at scale by simulation: workers on an engine in memory, 3 NATS servers, backlogs of 1,000 to 100,000 (no Docker)
	$(GO) test -run '^$$' -bench 'Scale' -benchtime 1x -timeout 60m ./deploy/nats/

.PHONY: bench-harness
bench-harness: ## Benchmark one trivial execution through the executor and a local harness
	$(GO) test -run '^$$' -bench . -benchtime 2000x -count 3 ./harness/

.PHONY: bench-e2e
bench-e2e: base-image ## Benchmark publish-to-script_done through a worker, beside docker run --rm and docker exec
	$(GO) test -run '^$$' -bench 'EndToEnd|Throughput' -benchtime 1000x -count 1 ./worker/
	$(GO) test -run '^$$' -bench 'DockerRun|DockerExec' -benchtime 30x -count 1 ./worker/

.PHONY: bench-pool
bench-pool: base-image ## Benchmark checkout, cold spawn and trivial executions through containers
	$(GO) test -run '^$$' -bench 'Checkout|RunInContainer|WarmExecution' -benchtime 1000x -count 1 ./sandboxpool/
	$(GO) test -run '^$$' -bench 'Spawn' -benchtime 20x -count 1 ./sandboxpool/
