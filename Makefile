# The README's quick start: `make demo` and `make test`; `make test-fast` (the non-slow tests) and
# `make lint` (ruff and mypy, configured in ruff.toml and mypy.ini) for the edit-test loop.
# Both create .venv from the fully pinned lock on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sage-installed
PYTEST_ARGS ?= -n 2 --dist worksteal

.PHONY: demo test test-fast lint venv clean-venv

venv: $(STAMP)

# uv installs the lock exactly, without resolving (pip's resolver refuses this set:
# tfx 1.21 pins ml-metadata 1.21, whose only wheel needs a newer glibc).
$(STAMP): requirements.lock setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==0.13.8
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	$(PY) -c "import sage_tfx.privacy, sage_tfx.components, sage_tfx.pipelines"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sage demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The core edit-test loop: the privacy core, validation and the architecture tests, without the slow,
# PostgreSQL and TensorFlow ones (docs/testing.md).
FAST_TESTS ?= tests/privacy/test_ledger*.py tests/privacy/test_allocation.py tests/simulate/test_allocation_policies.py tests/privacy/test_audit_anywhere.py tests/privacy/test_checks.py \
	tests/privacy/test_draw_replay.py tests/architecture/test_errors.py tests/privacy/test_grant_split.py tests/privacy/test_head_*.py tests/privacy/test_keys.py \
	tests/privacy/test_tamper*.py tests/architecture/test_store_sql.py tests/privacy/test_samplers.py tests/privacy/test_adassp.py \
	tests/privacy/test_noise_schedules.py tests/validation/test_validation*.py tests/architecture/test_import_graph.py tests/transform/test_public_vocabulary.py \
	tests/architecture/test_type_hints.py

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow and not postgres and not tf" $(FAST_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean-venv:
	rm -rf $(VENV)
