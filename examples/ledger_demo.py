"""Block composition on real taxi data, through the Python API. Same as `sage demo` (ledger part)."""

import sys

from sage_tfx.demos.ledger import run

if __name__ == "__main__":
    sys.exit(run(sys.argv[1] if len(sys.argv) > 1 else "demo_out"))
