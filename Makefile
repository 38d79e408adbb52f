# agentrun — `make help` lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
# Two stamps, both named by pyproject.toml's hash: the runtime (`pip install -e .`, all that
# `make run` needs) and the dev extra on top (test, lint and codegen tools: `make test`,
# `make lint`, `make gen`). A demo never waits for pytest, mypy or Playwright (issue 47).
HASH   := $(shell sha1sum pyproject.toml | cut -c1-12)
RUNTIME := $(VENV)/.runtime-$(HASH)
DEV    := $(VENV)/.dev-$(HASH)
PROTOS := $(wildcard proto/agentrun/v1/*.proto)
# protoc writes the stubs where the client package ships them; the server imports them too.
STUBS  := clients/python

.DEFAULT_GOAL := help
.PHONY: help venv run test test-unit gen lint fmt bench chaos clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# --no-compile: byte-compiling every installed module cost 8-13 s of the first `make run` and
# 48 MB; Python compiles (and caches) the modules a process imports when it first imports them.
$(RUNTIME): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --no-compile -e . >$(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	rm -f $(VENV)/.runtime-* $(VENV)/.dev-* $(VENV)/.installed-* && touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(PIP) -e '.[dev]' >$(VENV)/pip-dev.log 2>&1 || { cat $(VENV)/pip-dev.log; exit 1; }
	touch $(DEV)

venv: $(DEV) ## create .venv and install pinned dependencies, dev tools included

run: $(RUNTIME) ## the demo: embedded Postgres/Redis, control plane, executor, sandboxes, one agent run
	$(VENV)/bin/agentrun dev --demo

# Test files run on two workers at once, a file's tests on one worker in order (each worker
# has its own embedded Postgres, Redis and sandboxes): about 21 minutes on 2 cores instead of
# 40. TEST_WORKERS=0 runs them one after another in this process.
TEST_WORKERS ?= 2
test: $(DEV) ## the whole suite against real Postgres, Redis and sandbox servers (not chaos)
	$(PY) -m pytest -q -p no:cacheprovider -m "not chaos" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-unit: $(DEV) ## pure-logic tests only
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

gen: $(DEV) ## regenerate the stubs (clients/python/agentrun), the OpenAPI document and the TS types (committed)
	rm -rf $(STUBS)/agentrun
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m grpc_tools.protoc -I proto \
	  --python_out=$(STUBS) --grpc_python_out=$(STUBS) \
	  --mypy_out=$(STUBS) --mypy_grpc_out=$(STUBS) $(PROTOS)
	touch $(STUBS)/agentrun/__init__.py $(STUBS)/agentrun/v1/__init__.py
	# The HTTP/JSON API's document follows the messages (control_plane/http/openapi.py).
	PYTHONPATH=$(STUBS):. $(PY) -m control_plane.http.openapi > docs/openapi.json
	# The TypeScript client's types follow that document (clients/typescript/src/schema.d.ts).
	test -d clients/typescript/node_modules || npm --prefix clients/typescript ci --no-audit --no-fund
	npm --prefix clients/typescript run gen

lint: $(DEV) ## ruff (lint + format check), mypy and buf lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy control_plane executor faults ground sandbox agentrun_cli telemetry clients/python/agentrun_client
	$(VENV)/bin/buf lint

fmt: $(DEV) ## apply ruff format and fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(DEV) ## benchmarks: printed figures and ratios (BENCH_ARGS="--quick" or "commit claim")
	$(PIP) -e '.[dev,bench]' >$(VENV)/pip-bench.log 2>&1 \
	  || { cat $(VENV)/pip-bench.log; exit 1; }
	$(PY) -m bench $(BENCH_ARGS)

chaos: $(DEV) ## the chaos test: 200 runs, 4 providers, kill -9 and dropped responses
	$(PY) -m pytest -q -s -p no:cacheprovider -m chaos tests

clean: ## remove the virtualenv and local data
	rm -rf $(VENV) .data
