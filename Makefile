# durq: `make demo` and `make test` work on a fresh machine (they create .venv when missing).
# `make demo PORT=8080` serves the demo on another port.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-django lint typecheck chaos model bench bench-check bench-baseline \
	loadtest install clean

# Django 6 (its Tasks framework) needs Python >= 3.12 while the project supports 3.11: the
# Django integration is tested in a venv of its own, so 3.11 stays tested by everything else.
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $(HOME)/.pyenv)
# Each candidate is run: a pyenv shim of a version that is not active exists but fails.
ifndef PY_DJANGO
PY_DJANGO := $(firstword $(foreach py,$(wildcard $(PYENV_ROOT)/versions/3.1[2-9]*/bin/python3) \
	$(shell command -v python3.12 python3.13 python3.14 python3 2>/dev/null), \
	$(if $(shell $(py) -c 'import sys; print(sys.version_info >= (3, 12) or "")' 2>/dev/null),$(py))))
endif
DJ_VENV ?= .venv-django
DJ_BIN := $(DJ_VENV)/bin
DJ_STAMP := $(DJ_VENV)/.installed
# Django's own tests of its Tasks framework, from Django's source distribution. pytest-xdist is
# there too: `make test` hands its PYTEST_ARGS (such as -n0) to `make test-django`.
DJANGO_TESTS := $(DJ_VENV)/django-tests

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	# Bytecode now, as pip writes it for a regular install: an editable one has none, and
	# where Python may not write it (PYTHONDONTWRITEBYTECODE) every start compiles durq again.
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

$(DJ_STAMP): pyproject.toml
	@test -n "$(PY_DJANGO)" || { echo "Django 6 needs Python >= 3.12: set PY_DJANGO=/path/to/python3.12"; exit 2; }
	test -x $(DJ_BIN)/python || $(PY_DJANGO) -m venv $(DJ_VENV)
	$(DJ_BIN)/python -m pip install --quiet --upgrade pip
	$(DJ_BIN)/python -m pip install --quiet -e '.[postgres,redis,web,django]' \
		pytest pytest-timeout pytest-asyncio pytest-xdist
	rm -rf $(DJ_VENV)/sdist $(DJANGO_TESTS) && mkdir -p $(DJ_VENV)/sdist $(DJANGO_TESTS)
	$(DJ_BIN)/python -m pip download --quiet --no-deps --no-binary :all: -d $(DJ_VENV)/sdist \
		"django==$$($(DJ_BIN)/python -c 'import django; print(django.__version__)')"
	tar -xzf $(DJ_VENV)/sdist/django-*.tar.gz -C $(DJANGO_TESTS) --strip-components=2 \
		--wildcards '*/tests/tasks'
	touch $(DJ_STAMP)

# Without a Python >= 3.12 the main venv is still made; `make test-django` then says what is missing.
install: $(STAMP) $(if $(PY_DJANGO),$(DJ_STAMP))
	@$(if $(PY_DJANGO),:,echo "no Python >= 3.12 found: the Django venv is not made (set PY_DJANGO=/path/to/python3.12)")

demo: $(STAMP)
	$(BIN)/durq demo $(if $(PORT),--port $(PORT))

# The suite runs in TEST_WORKERS pytest-xdist processes (`--dist loadgroup` keeps the tests
# tests/conftest.py groups on one process). Most tests wait on servers and subprocesses, so
# more workers than cores pay, while too many starve one another on a loaded machine: 4 on
# 2 cores. PYTEST_ARGS comes last and wins:
# `make test PYTEST_ARGS="-n0 tests/unit/test_urls.py"` runs one file serially.
TEST_WORKERS ?= 4

# The Django venv first: the Django admin's browser test in the main run drives it.
test: $(STAMP) $(if $(PY_DJANGO),$(DJ_STAMP))
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m "not chaos" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
	$(MAKE) test-django

test-django: $(DJ_STAMP)
	DURQ_DJANGO_TESTS=$(abspath $(DJANGO_TESTS)) $(DJ_BIN)/python -m pytest -q -m "not chaos" \
		tests/django_backend $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

chaos: $(STAMP)
	$(BIN)/python -m pytest -q -m chaos tests/chaos

# Every broker against the scheduling model, 2,000 random sequences each (minutes per broker).
model: $(STAMP)
	DURQ_MODEL_EXAMPLES=$${DURQ_MODEL_EXAMPLES:-2000} $(BIN)/python -m pytest -q -p no:randomly \
		tests/conformance/test_model.py $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# Instructions per enqueue, claim and completed task (valgrind's callgrind) against
# benchmarks/baseline.json: fails on a rise over 5 %. Needs valgrind, and PostgreSQL and Redis
# for those brokers' figures (BENCH_CHECK_ARGS="--brokers memory,sqlite" without them).
bench-check: $(STAMP)
	$(BIN)/python benchmarks/check.py $(BENCH_CHECK_ARGS)

# Measure and write benchmarks/baseline.json again (after a change whose cost is wanted).
bench-baseline: $(STAMP)
	$(BIN)/python benchmarks/check.py --record $(BENCH_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(DJ_VENV) .pytest_cache .mypy_cache .ruff_cache

# The main job under a burst of orders, every broker, split and monolith (slow: minutes).
# The burst client is Debian's wrk (installed when missing, as .ci/run installs chromium);
# without it the load test falls back to httpx and says so.
loadtest: $(STAMP)
	@command -v wrk >/dev/null || { echo "installing wrk"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; } || \
		echo "wrk could not be installed: the burst falls back to httpx"
	$(BIN)/python benchmarks/loadtest.py $(LOADTEST_ARGS)
