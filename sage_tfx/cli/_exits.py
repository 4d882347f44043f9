"""The exit codes of every `sage` command, defined once.

The module's name starts with ``_`` so that ``build_parser`` does not take it for a command. Plain ints
(``sys.exit`` and the tests compare them as such), importing nothing.

====  ==================  ================================================================================
code  name                meaning
====  ==================  ================================================================================
0     EXIT_OK             success; ``sage run``: the model was ACCEPTed
1     EXIT_FAILED         ``sage run``: an iteration raised after its charge (its grant stays spent);
                          ``sage serve``: the audit failed or a pipeline's run raised
1     EXIT_VIOLATION      ``sage ledger audit``: the ledger violates a guarantee (same code as EXIT_FAILED)
2     EXIT_BAD_INPUT      bad input, every command: nothing was charged (argparse's own code for bad flags)
3     EXIT_REFUSED        ``sage ledger``: a well-formed charge the budget cannot cover; nothing charged
4     EXIT_REJECT         ``sage run``: the iterator stopped on REJECT
5     EXIT_TIMEOUT        ``sage run``: the iterator stopped on TIMEOUT (no ACCEPT within its iterations)
130   EXIT_INTERRUPTED    interrupted (Ctrl-C): 128 + SIGINT
141   EXIT_BROKEN_PIPE    the reader of stdout went away (``sage ledger status | head``): 128 + SIGPIPE
====  ==================  ================================================================================
"""

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_VIOLATION: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_REFUSED: Final = 3
EXIT_REJECT: Final = 4
EXIT_TIMEOUT: Final = 5
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141

# `sage run`: the exit code of each outcome of the iterator
OUTCOME_EXIT_CODES: Final = {"ACCEPT": EXIT_OK, "REJECT": EXIT_REJECT, "TIMEOUT": EXIT_TIMEOUT}
