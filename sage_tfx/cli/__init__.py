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

Library log chatter is off by default: TensorFlow's C++ logs, and everything
below ERROR from absl, Beam and TFX (Python exceptions always show; the few
lines TensorFlow's C++ core prints while it loads, before its logging starts,
cannot be turned off); ``--verbose`` anywhere on the command line turns it back on.
"""
import argparse
import importlib
import os
import pkgutil
import sys

from ._exits import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401  (re-exported)


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


def quiet_libraries():
    """No log chatter from TensorFlow's C++ core, and only errors from absl, Beam and TFX (set before they load;
    ``--verbose`` skips it)."""
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ logs; Python exceptions always show
    for name in ("absl", "apache_beam", "tensorflow", "tfx"):
        # A filter, not a level: absl resets its logger's level when TFX sets its verbosity.
        logging.getLogger(name).addFilter(_errors_only)


def _errors_only(record):
    import logging

    return record.levelno >= logging.ERROR


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = []
    if "--" in argv:  # everything after a bare -- passes through (e.g. Beam pipeline options)
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    if "--verbose" in argv:
        argv.remove("--verbose")
    else:
        quiet_libraries()
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
