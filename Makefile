# egress-proxies — the two set-up commands are `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The test tools add libvirt-python, which compiles against libvirt's headers: the demo doesn't
# need them, so it installs only the runtime.
DEV_STAMP := $(VENV)/.installed-dev-stamp

.PHONY: demo test lint dists bench chaos clean peers

## setuptools warns, in a box, on every editable install that a folder named like a package may
## shadow it: here they are the package. Only that warning is silenced.
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e .
	touch $(STAMP)

## The client library (clients/python) is a distribution of its own; the tests and lint cover it.
$(DEV_STAMP): $(STAMP) clients/python/pyproject.toml
	$(PIP_INSTALL) -e '.[dev]'
	$(PIP_INSTALL) -e 'clients/python[scrapy]'
	touch $(DEV_STAMP)

## Run the whole system on this machine: embedded nats-server, every service, local provider.
## Flags for `up` go in ARGS, e.g. make demo ARGS="--api-port 9090".
demo: $(STAMP)
	$(BIN)/egress-proxies up $(ARGS)

## Run the test suite (unit, integration against real servers, reliability, end to end) on one
## pytest-xdist worker per core and one more (the suite waits on servers more than it computes),
## the kvm tests on one worker (docs/decisions/0145-parallel-tests.md); the 15 slowest are listed
## at the end. TEST_WORKERS=N sets the workers; PYTEST_ARGS="-p no:xdist" runs one process.
TEST_WORKERS ?= $(shell expr $$(nproc) + 1)
PYTEST_ARGS ?= -n $(TEST_WORKERS) --dist loadgroup --durations=15
## pytest exits 5 when it collected nothing: that is a broken suite, reported as a failure.
## The peers (kube-apiserver, kubectl, etcd, the nats CLI, helm) are built first, or found built.
test: $(DEV_STAMP)
	@peers=$$(sh deploy/peers.sh) || exit 1; \
	EGRESS_PEERS_BIN=$$peers $(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose" >&2; exit 1; fi; \
	exit $$rc

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## Build both distributions (product and client library), twine-check them, install the wheels
## into a clean venv and run them from there (deploy/check-dists.sh; about a minute).
dists: $(DEV_STAMP)
	TOOLS_PYTHON=$(BIN)/python PYTHON=$(PYTHON) bash deploy/check-dists.sh

bench: $(DEV_STAMP)
	$(BIN)/python -m bench.eventlog

## One minute of faults under a lease load; fails when an invariant does (docs/benchmarks.md).
chaos: $(DEV_STAMP)
	$(BIN)/python -m bench.chaos --minutes 1 --proxies 20

## Build kube-apiserver, kubectl, etcd, the nats CLI and helm at pinned versions into a cache outside the
## work tree (deploy/peers.sh; a second run builds nothing). The last line is their directory.
peers:
	sh deploy/peers.sh

## Local proxies outlive `up` (the next `up` adopts them): stop those of the data dir before removing
## it, or they would run on as orphans nobody manages. DATA_DIR names the one `up --data-dir` used.
DATA_DIR ?= .data
clean:
	@if [ -x $(BIN)/egress-proxies ]; then $(BIN)/egress-proxies local stop --data-dir "$(DATA_DIR)"; \
	else for dir in "$(DATA_DIR)"/local/instances/*/; do \
	  pid=$$(cat "$$dir/proxy.pid" 2>/dev/null) || continue; \
	  if tr '\0' ' ' <"/proc/$$pid/cmdline" 2>/dev/null | grep -qF "$$(realpath "$$dir")"; then \
	    kill -- "-$$pid" && echo "stopped the local proxy in $$dir (pid $$pid)"; \
	  fi; \
	done; fi
	rm -rf $(VENV) "$(DATA_DIR)" .mypy_cache .ruff_cache .pytest_cache
