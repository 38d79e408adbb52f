# agentrun — `make help` lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PROTOS := $(wildcard proto/agentrun/v1/*.proto)

.DEFAULT_GOAL := help
.PHONY: help venv run test test-unit gen lint fmt bench chaos clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' >$(VENV)/pip.log 2>&1 \
	  || { cat $(VENV)/pip.log; exit 1; }
	rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP) ## create .venv and install pinned dependencies

run: $(STAMP) ## the demo: embedded Postgres/Redis, control plane, executor, sandboxes, one agent run
	$(VENV)/bin/agentrun dev --demo

test: $(STAMP) ## the whole suite against real Postgres, Redis and sandbox servers (not chaos)
	$(PY) -m pytest -q -p no:cacheprovider -m "not chaos" $(PYTEST_ARGS)

test-unit: $(STAMP) ## pure-logic tests only
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

gen: $(STAMP) ## regenerate generated/ from proto/ (committed)
	rm -rf generated/agentrun && mkdir -p generated
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m grpc_tools.protoc -I proto \
	  --python_out=generated --grpc_python_out=generated \
	  --mypy_out=generated --mypy_grpc_out=generated $(PROTOS)
	touch generated/agentrun/__init__.py generated/agentrun/v1/__init__.py
	# The HTTP/JSON API's document follows the messages (control_plane/http/openapi.py).
	PYTHONPATH=generated:. $(PY) -m control_plane.http.openapi > docs/openapi.json

lint: $(STAMP) ## ruff (lint + format check), mypy and buf lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy control_plane executor faults ground sandbox agentrun_cli telemetry
	$(VENV)/bin/buf lint

fmt: $(STAMP) ## apply ruff format and fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP) ## benchmarks: printed figures and ratios (BENCH_ARGS="--quick" or "commit claim")
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,bench]' >$(VENV)/pip-bench.log 2>&1 \
	  || { cat $(VENV)/pip-bench.log; exit 1; }
	$(PY) -m bench $(BENCH_ARGS)

chaos: $(STAMP) ## the chaos test: 200 runs, 4 providers, kill -9 and dropped responses
	$(PY) -m pytest -q -s -p no:cacheprovider -m chaos tests

clean: ## remove the virtualenv and local data
	rm -rf $(VENV) .data
