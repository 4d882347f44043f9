"""`training_seed`: the public hook through which trusted code seeds the DP models' noise and sampling (stdlib only).

Inside ``with training_seed(private_seed, share=..., public=...):`` (DPTrainer wraps ``run_fn`` in it) every DP
fit with ``seed=None`` draws its initialisation, sampling and noise from seeds derived from ``private_seed``, an
explicit ``seed=`` is refused, the fits together must fit the training share (a basic-composition filter,
``FitBudgetError``), and a DP-SGD fit's batch size and epochs must be public numbers. Outside it a model uses its
``seed=`` or fresh OS entropy.

Seed derivation, thread/task scope, the filter and public numbers: docs/models.md ("One training share, every
fit", "Public batch size and epochs", "Seeds of the DP fits").
"""

import contextlib
import contextvars
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from sage_tfx.privacy.checks import integer
from sage_tfx.privacy.errors import SageError

__all__ = [
    "training_seed",
    "fit_seeds",
    "check_fit",
    "FitSeeds",
    "derive_seed",
    "TrainingSeedError",
    "FitBudgetError",
    "PublicParameterError",
    "TrainingBlock",
    "candidate_budgets",
]

SLACK = 1e-9  # relative float round-off allowed when k candidate budgets add back up to the share


class TrainingSeedError(SageError, ValueError):
    """A training seed is not an integer >= 0, or ``seed=`` was given where the component supplies it."""


class FitBudgetError(TrainingSeedError):
    """A DP fit would take the fits under one training share past it, or runs outside the share's thread."""


class PublicParameterError(TrainingSeedError):
    """A DP fit's batch size or epochs is not one of the run's public numbers (it could come from the data)."""


@dataclass
class FitRecord:
    """One DP fit started in a block: the model class, the budget it declared, what it reported (None: not
    finished, then its declared budget counts)."""

    model: str
    epsilon: float
    delta: float
    spent: tuple[float, float] | None = None

    def charged(self) -> tuple[float, float]:
        return self.spent if self.spent is not None else (self.epsilon, self.delta)


class TrainingBlock:
    """The seed of one ``training_seed`` block, the share its fits may spend (None: no limit) and its fits."""

    def __init__(
        self, seed: int, share: tuple[float, float] | None = None, public: frozenset[float] | None = None
    ) -> None:
        self.seed = seed
        self.share = share
        self.public = public
        self.fits: list[FitRecord] = []
        self._lock = threading.Lock()

    def start_fit(
        self, model_name: str, budget: tuple[float, float] | None, params: dict[str, float] | None = None
    ) -> int:
        """Record a fit of ``model_name`` asking ``budget``; return its index k. FitBudgetError (nothing recorded)
        if the block has a share and the declared budgets would exceed it; PublicParameterError if it has
        public numbers and one of ``params`` (batch size, epochs) is not among them."""
        self._check_public(model_name, params or {})
        with self._lock:
            self._admit(model_name, budget)
            epsilon, delta = budget if budget is not None else (0.0, 0.0)
            self.fits.append(FitRecord(model_name, float(epsilon), float(delta)))
            return len(self.fits) - 1

    def _check_public(self, model_name, params):
        if self.public is None:
            return
        for name, value in sorted(params.items()):
            if float(value) not in self.public:  # the value itself is not named: it may come from the data
                raise PublicParameterError(
                    f"{model_name}: its {name} is not one of this run's public numbers (the constants of the module "
                    "file, the numbers of custom_config, the models' defaults, and trainer_utils.batch_size(fn_args, "
                    f"config) of the DP count): {name} shapes the published sampling rate and step count, so it "
                    "must not be computed from the data (e.g. len(x)); pass a constant or a custom_config value"
                )

    def check(
        self, model_name: str, budget: tuple[float, float] | None, params: dict[str, float] | None = None
    ) -> None:
        """What ``start_fit`` would refuse now (PublicParameterError, FitBudgetError), recording nothing."""
        self._check_public(model_name, params or {})
        with self._lock:
            self._admit(model_name, budget)

    def _admit(self, model_name, budget):
        if self.share is None:
            return
        if budget is None:
            raise FitBudgetError(f"{model_name}: a fit under a training share must declare its privacy_budget")
        used_eps = sum(f.epsilon for f in self.fits)
        used_delta = sum(f.delta for f in self.fits)
        share_eps, share_delta = self.share
        if used_eps + budget[0] > share_eps * (1 + SLACK) or used_delta + budget[1] > share_delta * (1 + SLACK):
            raise FitBudgetError(
                f"{model_name}: this fit asks (epsilon={budget[0]:.6g}, delta={budget[1]:.3g}) but the training share "
                f"(epsilon={share_eps:.6g}, delta={share_delta:.3g}) has (epsilon={max(0.0, share_eps - used_eps):.6g}, "
                f"delta={max(0.0, share_delta - used_delta):.3g}) left after {len(self.fits)} DP fit(s) in this run: "
                "every DP fit of run_fn spends from the one share. For a hyper-parameter search give candidate i "
                "the budget sage_tfx.models.candidate_budgets(fn_args.privacy_budget, k)[i]"
            )

    def composed(self) -> tuple[float, float]:
        """(epsilon, delta) of all fits of the block by basic composition (a finished fit counts what it
        reported, an unfinished one what it declared)."""
        with self._lock:
            charged = [f.charged() for f in self.fits]
        return sum(c[0] for c in charged), sum(c[1] for c in charged)


_TRAINING_SEED: contextvars.ContextVar[TrainingBlock | None] = contextvars.ContextVar(
    "sage_tfx.models.training_seed", default=None
)
_SHARED_BLOCKS = [0]  # blocks with a share open in this process (any thread)
_SHARED_LOCK = threading.Lock()


def candidate_budgets(privacy_budget: tuple[float, float], k: int) -> list[tuple[float, float]]:
    """``k`` equal budgets (epsilon/k, delta/k) that compose (basic composition) to ``privacy_budget``: one per
    candidate of a hyper-parameter search, declared before any of them trains.

    Args:
      privacy_budget: (epsilon, delta) of the whole search (``fn_args.privacy_budget``).
      k: The number of candidates (an integer >= 1).

    Returns:
      ``k`` copies of (epsilon / k, delta / k).

    Raises:
      TrainingSeedError: ``k`` is not an integer >= 1.
    """
    epsilon, delta = privacy_budget
    k = integer(
        k, "candidate_budgets: k", low=1, error=TrainingSeedError, message="{what} must be {rule}, got {value!r}"
    )
    return [(float(epsilon) / k, float(delta) / k)] * k


@dataclass(frozen=True)
class FitSeeds:
    """The seeds of one fit: weight ``init``, Poisson ``sampling``, Gaussian ``noise``. None = fresh OS entropy.

    ``record``: the fit's entry in its ``training_seed`` block (None outside one); ``report_spent`` fills it.
    """

    init: int | None
    sampling: int | None
    noise: int | None
    record: FitRecord | None = field(default=None, compare=False, repr=False)

    def report_spent(self, privacy_spent: dict) -> None:
        """Record what the fit reported (its ``privacy_spent``) in its block, for the block's composition."""
        if self.record is not None:
            self.record.spent = (float(privacy_spent["epsilon"]), float(privacy_spent["delta"]))


def derive_seed(*parts: object, bits: int = 128) -> int:
    """The first ``bits`` bits of sha256("part0|part1|..."), as a non-negative int (bits <= 256)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest, "big") >> (256 - bits)


@contextlib.contextmanager
def training_seed(
    seed: int, share: tuple[float, float] | None = None, public: frozenset[float] | None = None
) -> Iterator[TrainingBlock]:
    """While active (in this thread or task), DP models fitted with ``seed=None`` derive their randomness from
    ``seed``, and models given ``seed=`` are refused. Yields the ``TrainingBlock`` (its fits).

    For trusted code only (DPTrainer passes the ledger's private seed of the grant); the user's ``run_fn``
    must never learn ``seed``. Re-running the same fits in a new block with the same ``seed`` reproduces them.

    Args:
      seed: The grant's private seed (an integer >= 0).
      share: (epsilon, delta) the fits of the block may spend together (None: no limit; module docstring).
      public: The numbers a fit's batch size and epochs must be among (None: any).

    Yields:
      The ``TrainingBlock`` (its fits).

    Raises:
      TrainingSeedError: ``seed`` is not an integer >= 0.
    """
    if not isinstance(seed, (int, np.integer)):  # a float seed (3.0) is a caller's bug: refused, not rounded
        raise TrainingSeedError(f"training_seed: seed must be an integer >= 0, got {seed!r}")
    seed = integer(
        seed, "training_seed: seed", low=0, error=TrainingSeedError, message="{what} must be {rule}, got {value!r}"
    )
    block = TrainingBlock(seed, None if share is None else (float(share[0]), float(share[1])), public)
    token = _TRAINING_SEED.set(block)
    _count_shared(block, +1)
    try:
        yield block
    finally:
        _count_shared(block, -1)
        _TRAINING_SEED.reset(token)


def _count_shared(block, step):
    if block.share is not None:
        with _SHARED_LOCK:
            _SHARED_BLOCKS[0] += step


def active() -> bool:
    """True inside a ``training_seed`` block (in this thread or task)."""
    return _TRAINING_SEED.get() is not None


def fit_seeds(
    seed: int | None, model_name: str, budget: tuple[float, float] | None = None, params: dict[str, float] | None = None
) -> FitSeeds:
    """The seeds for one fit of ``model_name`` given its ``seed=`` argument; call it when the fit starts, before
    it reads data, with the fit's ``budget`` (epsilon, delta).

    Outside ``training_seed``: ``seed`` for all three (None: fresh OS entropy) (FitBudgetError while a block
    with a share is open in another thread). Inside: seeds derived from the block's seed (docs/models.md, "Seeds
    of the DP fits"), TrainingSeedError if ``seed`` was given, FitBudgetError if the fit would take the block
    past its share, PublicParameterError if one of ``params`` (its batch size and
    epochs) is not among the block's public numbers.
    """
    current = _checked_block(seed, model_name)
    if current is None:
        return FitSeeds(seed, seed, seed)
    k = current.start_fit(model_name, budget, params)
    base = (current.seed, f"fit {k}", model_name)
    return FitSeeds(
        init=derive_seed(*base, "init", bits=31),
        sampling=derive_seed(*base, "sampling", bits=128),
        noise=derive_seed(*base, "noise", bits=192),
        record=current.fits[k],
    )


def check_fit(
    seed: int | None, model_name: str, budget: tuple[float, float] | None = None, params: dict[str, float] | None = None
) -> None:
    """Refuse now, before the data is read, what ``fit_seeds`` would refuse when the fit starts (the same
    errors), recording nothing: for a fit configured before it runs (``make_private``)."""
    current = _checked_block(seed, model_name)
    if current is not None:
        current.check(model_name, budget, params)


def _checked_block(seed, model_name):
    """The active block (None outside one), after the refusals that need no block state: a fit outside the
    thread of a block with a share (FitBudgetError), an explicit seed inside a block (TrainingSeedError)."""
    current = _TRAINING_SEED.get()
    if current is None:
        with _SHARED_LOCK:
            open_elsewhere = _SHARED_BLOCKS[0] > 0
        if open_elsewhere:
            raise FitBudgetError(
                f"{model_name}: a DP fit outside the thread of the DPTrainer run open in this "
                "process: fit DP models in run_fn's own thread (it carries the grant's seed and "
                "training share)"
            )
        return None
    if seed is not None:
        raise TrainingSeedError(
            f"{model_name}: seed={seed!r} was given inside sage_tfx.models.training_seed: the component "
            "(DPTrainer) supplies the training seed from the grant; a seed known to the module file makes the "
            "noise predictable. Drop the seed= argument"
        )
    return current
