"""What the Sage iterator returns: one iteration's outcome (``IterationResult``, from ``run_iteration``), each
charged iteration (``Iteration``) and the run's result (``RunResult``). Semantics: docs/your_pipeline.md
("SageIterator: what sage run drives").
"""

from dataclasses import dataclass, field

from sage_tfx.privacy import LedgerError
from sage_tfx.privacy.vocabulary import VALIDATION_OUTCOMES, Outcome

OUTCOMES = VALIDATION_OUTCOMES  # what one iteration may conclude


@dataclass
class IterationResult:
    """What ``run_iteration`` returns: the validator's outcome and what it computed.

    Args:
        outcome: one of ``OUTCOMES`` (ACCEPT, REJECT, RETRY, ...).
        bound: the validator's bound (None if it computed none).
        details: what the iteration reports besides (kept with the outcome in the ledger).

    Raises:
        LedgerError: an outcome not in ``OUTCOMES``.
    """

    outcome: str
    bound: float | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise LedgerError(f"iteration outcome {self.outcome!r} must be one of {', '.join(OUTCOMES)}")


@dataclass
class Iteration:
    """One charged iteration of a run, as ``RunResult.iterations`` lists it.

    Args:
        number: its number in the pipeline, 1, 2, ...
        grant_id: the ledger grant it ran under.
        blocks: the granted blocks, oldest first.
        epsilon: the per-block epsilon charged.
        eta: the eta its test ran at.
        outcome: its outcome (None: none recorded yet).
        bound: the validator's bound (None if it computed none).
        resumed: whether it re-ran under a grant charged by an earlier process.
    """

    number: int
    grant_id: str
    blocks: tuple
    epsilon: float
    eta: float
    outcome: str | None
    bound: float | None = None
    resumed: bool = False


@dataclass
class RunResult:
    """What ``SageIterator.run`` returns.

    Args:
        outcome: ACCEPT, REJECT or TIMEOUT.
        iterations: the run's ``Iteration``s, in order.
        final_grant_id: the grant of the deciding iteration (None after TIMEOUT).
        target: what was asked (None: the caller gave no request).
        ledger_spent: {block: the ledger's epsilon spent on it, by every pipeline and run}, for the blocks
            this run charged.
        confidence: asked: 1 - eta; iteration i tested at eta_i = eta / (i (i+1)).
    """

    outcome: str  # ACCEPT, REJECT or TIMEOUT
    iterations: list
    final_grant_id: str | None = None
    target: float | None = None  # what was asked (None: the caller gave no request)
    # {block: the ledger's epsilon spent on it, by every pipeline and run} for the blocks this run charged
    ledger_spent: dict = field(default_factory=dict)
    confidence: float | None = None  # asked: 1 - eta; iteration i tested at eta_i = eta / (i (i+1))

    def epsilon_per_block(self) -> dict:
        """{block: the epsilon this run's iterations charged it}: iterations on other windows add up per block
        only where they overlap (a sum over iterations would overstate what any block paid)."""
        spent: dict[str, float] = {}
        for it in self.iterations:
            for block in it.blocks:
                spent[block] = spent.get(block, 0.0) + it.epsilon
        return spent

    @property
    def max_block_epsilon(self) -> float:
        """The most epsilon this run charged any one block (0 if it charged none)."""
        return max(self.epsilon_per_block().values(), default=0.0)

    @property
    def final_blocks(self) -> tuple:
        """The blocks the ACCEPTed (or REJECTed) model was trained on; () after TIMEOUT."""
        if self.outcome == Outcome.TIMEOUT or not self.iterations:
            return ()
        return tuple(self.iterations[-1].blocks)

    @property
    def bound(self) -> float | None:
        """The validator's bound of the last iteration (None if none ran or it computed none)."""
        return self.iterations[-1].bound if self.iterations else None

    def describe(self) -> str:
        """One line: the outcome, iterations, the largest per-block spend of this run and the ledger's total spend
        on those blocks (every pipeline and run), the final model's blocks, and (with a ``target``) the asked
        confidence, the target and the last bound."""
        spent = self.epsilon_per_block()
        text = (
            f"{self.outcome} after {len(self.iterations)} iteration(s); this run charged at most epsilon "
            f"{self.max_block_epsilon:.4g} on a block ({len(spent)} block(s) charged)"
        )
        if self.ledger_spent:
            low, high = min(self.ledger_spent.values()), max(self.ledger_spent.values())
            stand = f"{high:.4g}" if high - low < 1e-9 else f"{low:.4g} to {high:.4g}"
            text += f", which now stand at epsilon {stand} spent in the ledger (every run)"
        if self.final_blocks:
            blocks = self.final_blocks
            text += f"; the model trained on blocks {blocks[0]}..{blocks[-1]} ({len(blocks)})"
        if self.target is not None:
            if self.confidence is not None and self.iterations:
                text += (
                    f"; confidence {self.confidence:g} over all iterations (iteration i tested at eta_i = "
                    f"{1 - self.confidence:.3g}/(i(i+1)))"
                )
            text += f"; target {self.target:g}, bound {bound_text(self.bound)}"
        return text


def bound_text(bound):
    return "none" if bound is None else f"{bound:.6g}"
