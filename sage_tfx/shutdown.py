"""End a process that ran TensorFlow / Beam work without the interpreter's own shutdown (stdlib only).

After a tf.Transform or TFX pipeline on Beam has finished, the interpreter's shutdown still has to destroy
TensorFlow's and gRPC's C++ state (static destructors, thread pools, absl/gRPC threads). That teardown is not
ordered against those threads and can crash the process after its work is done: a segmentation fault, exit
139, which a CI reads as a failure. ``exit_now`` does every Python-level clean-up the interpreter would
(flush stdio, atexit handlers: Beam's, tempfile's; logging.shutdown) and then ends the process with
``os._exit``, skipping the C++ teardown. The `sage` command ends this way; a script of your own can too::

    import sage_tfx

    def main() -> int:
        ...  # your pipeline
        return 0

    if __name__ == "__main__":
        sage_tfx.exit_now(main())
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
