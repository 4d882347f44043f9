"""The `sage` command line.

Each module in this package is one top-level command: it defines
``add_parser(subparsers)``, which registers its parser and sets
``func(args) -> int`` as the default. Modules import nothing heavy at module
level (no TensorFlow, Beam or dp-accounting), so `sage ledger ...` starts fast.

Exit codes shared by all commands: 0 success, 2 bad input; commands document
their own extra codes (e.g. 3 for a refused charge); ``sage_tfx.cli._exits`` defines
every code once, with a table of what each means. When the reader of the output
goes away (``sage ledger status | head``) a command stops quietly with 141, as a
Unix tool killed by SIGPIPE does.

Library log chatter is off by default (``sage_tfx.cli._quiet``): TensorFlow's C++
logs, including the lines its core prints while it loads (in this process and in
child processes such as Beam's workers), absl's and TFX's logs below CRITICAL
(``ERROR:absl:Execution N failed.``: the command reports the failure itself), Beam's
below ERROR; Python exceptions always show. ``--verbose`` anywhere on the command
line turns it back on. After a command that loaded TensorFlow or Beam finishes, the
process ends with ``os._exit`` (after the atexit handlers): the interpreter's own
shutdown can crash there (SIGSEGV, exit 139), which a CI would read as a failure.
"""

import argparse
import importlib
import os
import pkgutil
import sys

from sage_tfx.phases import start_launcher

from ._exits import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401  (re-exported)
from ._quiet import exit_process, filter_stderr, quiet_libraries


def build_parser(command=None):
    """The `sage` parser; with ``command``, only that command's module is imported (fast start)."""
    parser = argparse.ArgumentParser(
        prog="sage",
        description="Sage: block-level differential privacy for TFX pipelines. Add --verbose to any command to "
        "see TensorFlow's, absl's and Beam's logs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    if command in names:
        names = [command]
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        module.add_parser(sub)
    return parser


def main(argv=None):
    """Run one `sage` command; return its exit code.

    ``argv=None`` is the process's own command line (the `sage` script, ``python -m sage_tfx``): then, unless
    ``--verbose``, descriptor 2 goes through the chatter filter, and after the command the process ends by
    ``_quiet.exit_process``. With an explicit ``argv`` (a caller in Python) only the log levels change."""
    own_process = argv is None
    if own_process:
        start_launcher()  # $SAGE_PROFILE only: `sage bench iteration`'s split of this process's CPU
    argv = sys.argv[1:] if own_process else list(argv)
    extra = []
    if "--" in argv:  # everything after a bare -- passes through (e.g. Beam pipeline options)
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    stop_filter = None
    if "--verbose" in argv:
        argv.remove("--verbose")
    else:
        quiet_libraries()
        if own_process:
            stop_filter = filter_stderr()
    try:
        code = _command(argv, extra)
    except SystemExit as exc:  # argparse's usage errors and --help, a command's sys.exit
        if not own_process:
            raise
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
        code = 1 if not isinstance(exc.code, int) and exc.code is not None else (exc.code or 0)
    except BaseException:  # the traceback goes to the real stderr
        if stop_filter is not None:
            stop_filter()
        raise
    if own_process:
        exit_process(code, stop_filter)
    return code


def _command(argv, extra):
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    args.extra_args = extra
    from ._keys import key_file_env

    try:
        with key_file_env(getattr(args, "key_file", None)):
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe():
    """The reader of stdout went away (`sage ledger status | head`): stop quietly, as Unix tools do.

    stdout is pointed at /dev/null so the interpreter's final flush does not raise again.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
