"""Library log chatter off for the `sage` command (``--verbose`` keeps it), and a clean process exit.

Three sources, three switches (all set before TensorFlow, absl or Beam load):

* TensorFlow's C++ logs: ``TF_CPP_MIN_LOG_LEVEL=3`` in the environment (inherited by child processes such as
  Beam's workers). It does not reach the lines TensorFlow's C++ core writes while its shared libraries load,
  before its logging starts (``WARNING: All log messages before absl::InitializeLog() ...``, then
  ``I0000 00:00:... port.cc:153] oneDNN custom operations are on ...``, ``cudart_stub.cc``,
  ``cpu_feature_guard.cc``): those go straight to file descriptor 2, so ``filter_stderr`` points descriptor 2
  at a pipe read by a small forked filter that drops exactly those lines (``is_chatter``) and copies every
  other byte to the real stderr. Child processes inherit the pipe, so their start-up lines go too.
* absl's and TFX's Python logs: only CRITICAL (TFX's ``ERROR:absl:Execution N failed.`` comes with the
  exception it logs, which the command reports itself).
* Beam's and TensorFlow's Python logs: only ERROR and above.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable

from sage_tfx.shutdown import exit_now, flush_stdio

# The lines TensorFlow's (and gRPC's) C++ core writes before its logging starts: absl's pre-init notice, a log
# line in absl's format (severity I/W/E, MMDD hh:mm:ss.micros, thread id, file:line]), and the second line of
# cpu_feature_guard's message. F (fatal) lines are kept.
_CHATTER = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.+-]+:\d+\] .*"
    rb"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\."
)
_PY_LEVELS = {
    "absl": logging.CRITICAL,
    "tfx": logging.CRITICAL,
    "apache_beam": logging.ERROR,
    "tensorflow": logging.ERROR,
}


def is_chatter(line: bytes) -> bool:
    """True for one line (without its newline) of C++ start-up chatter that ``filter_stderr`` drops."""
    return _CHATTER.fullmatch(line.rstrip(b"\r")) is not None


def quiet_libraries() -> None:
    """TensorFlow's C++ logs off (set before it loads; child processes inherit it), and absl/TFX below CRITICAL,
    Beam/TensorFlow below ERROR dropped from Python logging (a filter, not a level: absl resets its logger's level
    when TFX sets its verbosity)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name, level in _PY_LEVELS.items():
        logging.getLogger(name).addFilter(_AtLeast(level))


class _AtLeast(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


def _pump(read_fd: int, write_fd: int) -> None:
    """Copy read_fd to write_fd until EOF, dropping chatter lines; a partial line that cannot be chatter goes at
    once (a prompt without a newline is not held back)."""
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        out = b"".join(line + b"\n" for line in lines if not is_chatter(line))
        if pending and pending[:1] not in (b"I", b"W", b"E", b"T"):
            out, pending = out + pending, b""
        if out:
            os.write(write_fd, out)
    if pending and not is_chatter(pending):
        os.write(write_fd, pending)


def filter_stderr() -> Callable[[], None]:
    """Point file descriptor 2 (this process's and its future children's) at a forked filter dropping the C++
    start-up chatter; return ``stop()``, which restores descriptor 2 and waits (at most 5 s) until the filter
    has written everything. Call it before any thread starts (it forks)."""
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter: ends at EOF, i.e. when every writer (this process, its children) has closed
        try:
            os.close(write_fd)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the command, which then closes the pipe
            _pump(read_fd, 2)
        finally:
            os._exit(0)
    os.close(read_fd)
    saved = os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def stop() -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved, 2)
        os.close(saved)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            time.sleep(0.01)

    return stop


def exit_process(code: int, stop_filter: Callable[[], None] | None = None) -> None:
    """End the `sage` process with ``code`` after a finished command: stop the stderr filter, then, when
    TensorFlow or Beam is loaded, ``sage_tfx.shutdown.exit_now`` (atexit handlers, then ``os._exit``: no C++
    teardown at interpreter shutdown, where a crash would turn a finished run into exit 139). Otherwise it
    returns and the interpreter exits as usual."""
    heavy = any(name in sys.modules for name in ("tensorflow", "apache_beam"))
    if heavy:
        flush_stdio()
        atexit._run_exitfuncs()  # Beam's and tempfile's clean-up still write to the filtered stderr
    if stop_filter is not None:
        stop_filter()
    if heavy:
        exit_now(code)
