"""End a process that ran TensorFlow / Beam work without the interpreter's own shutdown (stdlib only).

The interpreter's teardown of TensorFlow's and gRPC's C++ state can crash a finished process (exit 139);
``exit_now`` does the Python-level clean-up and skips it. Why, and how a script of your own ends with it:
docs/dp_preprocessing.md, "Running a pipeline from your own script".
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn


def flush_stdio() -> None:
    """Flush stdout and stderr, ignoring a closed or broken stream."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def exit_now(code: int = 0) -> NoReturn:
    """Flush stdio, run the atexit handlers and ``logging.shutdown``, then ``os._exit(code)``: the exit code of
    a finished run, without the interpreter's C++ teardown (module docstring). Call it last: nothing after it
    runs, and ``finally`` blocks and context managers still open are not exited.

    Args:
      code: The process's exit code.
    """
    flush_stdio()
    atexit._run_exitfuncs()
    logging.shutdown()
    flush_stdio()
    os._exit(code)
