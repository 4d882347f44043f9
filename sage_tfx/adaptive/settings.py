"""The settings of a Sage iterator: where its search starts, when it stops, and how each grant's budget splits
between the stages (docs/your_pipeline.md, "SageIterator: what sage run drives")."""

from dataclasses import dataclass, fields

from sage_tfx.privacy.checks import INVALID, integer, number
from sage_tfx.privacy.split import eval_share_split
from sage_tfx.validation import eta_for_attempt


@dataclass(frozen=True, kw_only=True)
class IteratorSettings:
    """What one ``SageIterator`` run may do. Everything is checked when built, before anything is charged, except
    what only the stream decides: ``epsilon_start`` (at most the stream's global epsilon, its first grant at least
    the stream's minimum grant epsilon), ``delta`` (below the stream's global delta) and the shares (one
    ``BudgetSplit``), which the iterator checks against the stream before it registers or charges anything.

    Args:
        epsilon_start: the first attempt's per-block epsilon, all stages together (> 0).
        min_window: the first attempt's window, in blocks (an integer >= 1).
        eta: 1 - the confidence; attempt i is validated at eta / (i (i+1)).
        max_iterations: the charged attempts of one run (an integer >= 1).
        max_seconds: TIMEOUT after this wall time, or None for no time limit.
        max_refusals: refused requests (another pipeline spent first) before TIMEOUT (an integer >= 1).
        max_idle_waits: waits in a row with nothing new before TIMEOUT (an integer >= 1).
        delta: the training delta of an iteration (None: the stream's global delta / 100). This and the
            settings below make the split each grant signs (``sage_tfx.privacy.BudgetSplit``).
        preprocessing_share: the share of the epsilon paid to preprocessing.
        preprocessing_delta: preprocessing's delta (>= 0), added to ``delta`` in each grant.
        count_share: the share paid to the DP record count.
        rejection_share: the share paid to the REJECT test (the rest: training and the ACCEPT test).
        disjoint_split: whether training and the ACCEPT test read disjoint records (``ChargeRule.PARALLEL``).
        eval_share: the test side's share of the records, or None for the platform's default split.

    Raises:
        LedgerError: naming the setting, its value and the rule, when built (``eta``: ValidationInputError, the
            validators' own check).
    """

    epsilon_start: float = 0.125
    min_window: int = 1
    eta: float = 0.05
    max_iterations: int = 10
    max_seconds: float | None = None
    max_refusals: int = 10
    max_idle_waits: int = 100
    delta: float | None = None
    preprocessing_share: float = 0.2
    preprocessing_delta: float = 0.0
    count_share: float = 0.05
    rejection_share: float = 0.0
    disjoint_split: bool = True
    eval_share: float | None = None

    def __post_init__(self):
        checked = {
            "min_window": integer(self.min_window, "min_window", low=1, message=INVALID + " (blocks)"),
            "max_iterations": integer(self.max_iterations, "max_iterations", low=1),
            # the two bounds that make every run end (SageIterator); there is no "unbounded"
            "max_refusals": integer(
                self.max_refusals,
                "max_refusals",
                low=1,
                message=INVALID
                + (" (refused requests before TIMEOUT; raise it if concurrent pipelines often take the budget first)"),
            ),
            "max_idle_waits": integer(
                self.max_idle_waits,
                "max_idle_waits",
                low=1,
                message=INVALID
                + (
                    " (waits in a row with nothing new before TIMEOUT; raise it if wait_for_blocks returns before "
                    "blocks arrive)"
                ),
            ),
            "preprocessing_delta": number(self.preprocessing_delta, "preprocessing_delta", low=0.0),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        eta_for_attempt(self.eta, 1)
        if self.eval_share is not None:
            eval_share_split(self.eval_share)

    @classmethod
    def names(cls) -> frozenset:
        """The names of every setting."""
        return frozenset(f.name for f in fields(cls))
