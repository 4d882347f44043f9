"""``--key-file`` and ``--db``'s check: the arguments of every command that opens a ledger (docs/security.md).

The path is exported as ``SAGE_KEY_FILE`` while the command runs, so every ``Ledger.open`` on the way gets it:
the CLI's own, ingest's, and the pipeline components' (BlockExampleGen, DPTransform, DPTrainer, DPModelValidator
open the ledger by its location, in this process or in Beam workers that inherit the environment). Only the
PATH travels, never the key, and nothing of it goes into a pipeline definition or an artifact.
"""

import argparse
import contextlib
import os

from sage_tfx.privacy.errors import LedgerError
from sage_tfx.privacy.keys import ENV_KEY_FILE
from sage_tfx.privacy.store.location import check_location


def ledger_location(text):
    """``--db``'s type: a ledger location without a password in it (``store.location.check_location``), refused
    by argparse (exit 2) before the command does anything."""
    try:
        return check_location(text)
    except LedgerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_key_file(parser):
    parser.add_argument(
        "--key-file",
        default=None,
        metavar="PATH",
        help=f"the ledger's key file (default: ${ENV_KEY_FILE}, else LEDGER.key beside an SQLite ledger; a "
        "postgresql:// ledger needs one). Created 0600 by `sage ledger init`; back it up: without it no grant "
        "of the ledger can be verified",
    )
    return parser


@contextlib.contextmanager
def key_file_env(path):
    """``SAGE_KEY_FILE=abspath(path)`` while the block runs (nothing if ``path`` is None), then as before."""
    if not path:
        yield
        return
    before = os.environ.get(ENV_KEY_FILE)
    os.environ[ENV_KEY_FILE] = os.path.abspath(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_KEY_FILE, None)
        else:
            os.environ[ENV_KEY_FILE] = before
