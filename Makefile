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
FAST_TESTS ?= tests/test_ledger*.py tests/test_allocation*.py tests/test_audit_anywhere.py tests/test_checks.py \
	tests/test_draw_replay.py tests/test_errors.py tests/test_grant_split.py tests/test_head_*.py tests/test_keys.py \
	tests/test_tamper*.py tests/test_store_sql.py tests/test_samplers.py tests/test_adassp.py \
	tests/test_noise_schedules.py tests/test_validation*.py tests/test_import_graph.py tests/test_public_vocabulary.py \
	tests/test_type_hints.py

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow and not postgres and not tf" $(FAST_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean-venv:
	rm -rf $(VENV)
