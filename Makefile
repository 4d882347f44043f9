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

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow and not postgres and not tf"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean-venv:
	rm -rf $(VENV)
