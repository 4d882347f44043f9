"""The `sage` command as the tests run it: a fresh ``python -m sage_tfx`` process of this interpreter."""

import subprocess
import sys

PY = sys.executable


def sage(*args, timeout=900, **kwargs):
    """Run ``sage ARGS`` (each argument through ``str``); returns the CompletedProcess, output captured as text.

    Args:
        *args: the command line after ``sage`` (paths and numbers allowed).
        timeout: seconds before ``subprocess.TimeoutExpired``.
        **kwargs: passed to ``subprocess.run`` (``cwd``, ``env``, ...).
    """
    return subprocess.run(
        [PY, "-m", "sage_tfx", *map(str, args)], capture_output=True, text=True, timeout=timeout, **kwargs
    )
