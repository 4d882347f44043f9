"""A continual release's checked parameters, its losses and strategies (checked before anything is charged)."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass

import numpy as np

from sage_tfx.privacy import checks
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.vocabulary import Stage

XI = 1e-6  # solver tolerance, relative to L/N (docs/release_strategies.md, the proofs)


STAGE = Stage.TRAINING


MAX_ITERATIONS = 200_000


class ContinualReleaseError(SageError, ValueError):
    """Bad parameters or input for a continual release; raised before anything is charged or read."""


class Loss(enum.StrEnum):
    LOGISTIC = "logistic"
    SQUARED = "squared"
    SOFTMAX = "softmax"


class Sampling(enum.StrEnum):
    """How a release reads its blocks: all records, or a Poisson sample of rate p_j on 2^j blocks (App. B)."""

    NONE = "none"
    POISSON = "poisson"


class Strategy(enum.StrEnum):
    CUMULATIVE = "continual-cumulative"
    SLIDING = "continual-sliding-window"
    SLIDING_AS_WRITTEN = "continual-sliding-window-alg5"


def lipschitz(loss: Loss, radius: float) -> float:
    """L of the loss on ||w|| <= radius with ||x|| <= 1, |y| <= 1 (softmax: the flattened d x k weights).

    Args:
        loss: the model's loss.
        radius: the parameter ball's radius R.
    """
    loss = Loss(loss)
    if loss is Loss.SOFTMAX:
        return math.sqrt(2.0)  # ||x (p - e_y)^T||_F = ||x|| ||p - e_y|| <= sqrt(2)
    return 1.0 if loss is Loss.LOGISTIC else radius + 1.0


def smoothness(loss: Loss) -> float:
    """beta of the loss with ||x|| <= 1 (softmax: ||diag(p) - p p^T|| <= 1/2).

    Args:
        loss: the model's loss.
    """
    return {Loss.LOGISTIC: 0.25, Loss.SQUARED: 1.0, Loss.SOFTMAX: 0.5}[Loss(loss)]


def _positive(name: str, value, fix: str) -> float:
    fix = fix.replace("{", "{{").replace("}", "}}")  # a literal in the message template
    return checks.positive(
        value,
        name,
        error=ContinualReleaseError,
        message="{what} {value!r} is invalid: " + fix,
        not_number="{what} {value!r} is not a number: " + fix,
    )


@dataclass(frozen=True)
class ReleaseParams:
    """What a continual release needs; every field is checked here, before anything is charged.

    Args:
        epsilon: the per-record epsilon charged on each block (its whole lifetime's loss).
        delta: the per-record delta charged on each block.
        records_per_block: m0, the declared normaliser (public, never the data's own count).
        lam: the ridge weight (lam/2 ||w - w_ref||^2).
        radius: R, the parameter ball (the flattened d x k weights for softmax).
        loss: logistic, squared or softmax (multiclass: labels 0..classes-1).
        window: blocks, for the sliding window (None: cumulative).
        classes: k >= 2 for the softmax loss (its weights are d x k, flattened row-major); None otherwise.
        sampling: "none" (every record) or "poisson": a release on 2^j blocks reads a Poisson sample of rate
            p_j with the noise of its full size (amplification by sampling, the paper's App. B; ``sampling``).
    """

    epsilon: float
    delta: float
    records_per_block: int
    lam: float = 0.05
    radius: float = 10.0
    loss: Loss = Loss.LOGISTIC
    window: int | None = None
    classes: int | None = None
    sampling: Sampling = Sampling.NONE

    def __post_init__(self):
        _positive("epsilon", self.epsilon, "give a finite epsilon > 0")
        d = self.delta
        if not isinstance(d, (int, float)) or not 0 < float(d) < 1:
            raise ContinualReleaseError(f"delta {d!r} is invalid: give 0 < delta < 1 (the Gaussian needs delta > 0)")
        m0 = self.records_per_block
        if isinstance(m0, bool) or not isinstance(m0, (int, np.integer)) or m0 < 1:
            raise ContinualReleaseError(
                f"records_per_block {m0!r} is invalid: give an integer >= 1 (the declared number of records per block)"
            )
        _positive("lam", self.lam, "give a ridge weight lam > 0 (the strong convexity the sensitivity needs)")
        _positive("radius", self.radius, "give a parameter-ball radius R > 0")
        self._set_member("loss", Loss)
        self._check_classes()
        self._set_member("sampling", Sampling)
        if self.window is not None:
            w = self.window
            if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
                raise ContinualReleaseError(f"window {w!r} is invalid: give a window of >= 1 blocks")

    def _set_member(self, name: str, kind: type[enum.StrEnum]) -> None:
        value = getattr(self, name)
        try:
            object.__setattr__(self, name, kind(value))
        except ValueError:
            raise ContinualReleaseError(
                f"{name} {value!r} is unknown: use one of {', '.join(m.value for m in kind)}"
            ) from None

    def _check_classes(self):
        k = self.classes
        if self.loss is not Loss.SOFTMAX:
            if k is not None:
                raise ContinualReleaseError(
                    f"classes {k!r} is for the softmax loss: give loss='softmax' or classes=None"
                )
            return
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise ContinualReleaseError(
                f"classes {k!r} is invalid: the softmax loss needs the number of classes "
                "(an integer >= 2), declared before any block is read"
            )

    @property
    def lipschitz(self) -> float:
        return lipschitz(self.loss, self.radius)

    @property
    def outputs(self) -> int:
        """Columns of the weight matrix: the classes for softmax, else 1."""
        return 1 if self.classes is None else int(self.classes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["loss"] = self.loss.value
        if self.classes is None:
            del d["classes"]  # binary releases keep the fingerprints they always had
        if self.sampling is Sampling.NONE:
            del d["sampling"]  # so do unsampled ones
        else:
            d["sampling"] = self.sampling.value
        return d
