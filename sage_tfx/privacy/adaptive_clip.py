"""Adaptive clipping for DP-SGD: the clip norm estimated privately as a quantile of per-example gradient norms.

Andrew, Thakkar, McMahan, Ramaswamy (NeurIPS 2021). Contract: each step releases the clipped sum and the
centred unclipped count on the same Poisson sample; with ``z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2`` on the
sum (needs 2 sigma_b > z) the pair is exactly the Poisson-sampled Gaussian(z) event of the fixed-clip run
(same DpEvent, epsilon and grant spend), and C_{t+1} is post-processing. Numpy-free (the TensorFlow side
is sage_tfx.models.dpsgd_engine). Proof: docs/models.md, "Adaptive clipping".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from . import checks
from .dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "AdaptiveClip",
    "IMBALANCED",
    "ADAPTIVE",
    "as_clip_norm",
    "sum_noise_multiplier",
    "next_clip",
    "check_run",
    "initial_clip",
    "public_numbers",
    "COUNT_STDDEV_PER_BATCH",
]

ADAPTIVE = "adaptive"
COUNT_STDDEV_PER_BATCH = 1 / 20  # sigma_b = m / 20 (the paper's choice: b's std is 1/20)

_INVALID = "{what}={value!r} is invalid: must be {rule}"


@dataclass(frozen=True, kw_only=True)
class AdaptiveClip:
    """The clip norm of DP-SGD estimated privately as the ``target_quantile`` of per-example gradient norms.

    Args:
        target_quantile: gamma in (0, 1), the fraction of records left unclipped that C tracks (0.5: the
            median norm). For an imbalanced label use ``IMBALANCED`` (0.9): the minority's larger gradients
            sit in the top tail of the norms, and a median clip would scale them down more than the majority's.
        learning_rate: eta > 0 of the geometric update C <- C exp(-eta (b - gamma)) (0.2: the paper's).
        initial: C_0 > 0, the clip norm of the first step.
        count_stddev: sigma_b > 0, the std of the noise on the unclipped count; None: expected batch size / 20.
    """

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    initial: float = 1.0
    count_stddev: float | None = None

    def __post_init__(self):
        checks.number(
            self.target_quantile,
            "target_quantile",
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
            error=DpSgdConfigError,
            message=_INVALID + ", e.g. 0.5 (0.9 for an imbalanced label)",
        )
        checks.positive(self.learning_rate, "learning_rate", error=DpSgdConfigError, message=_INVALID + ", e.g. 0.2")
        checks.positive(self.initial, "initial", error=DpSgdConfigError, message=_INVALID + ", e.g. 1.0")
        checks.positive(
            self.count_stddev,
            "count_stddev",
            allow_none=True,
            error=DpSgdConfigError,
            message=_INVALID + " (None: batch_size / 20)",
        )

    def count_stddev_for(self, batch_size: int) -> float:
        """sigma_b of a run of expected batch size ``batch_size``."""
        if self.count_stddev is not None:
            return float(self.count_stddev)
        return float(batch_size) * COUNT_STDDEV_PER_BATCH

    def sum_multiplier(self, noise_multiplier: float, batch_size: int) -> float:
        """z_Delta of the gradient sum for the accounted noise multiplier z (docs/models.md)."""
        return sum_noise_multiplier(noise_multiplier, self.count_stddev_for(batch_size))

    def public_numbers(self) -> dict[str, float]:
        """The numbers a training share checks are public (as batch size and epochs): they shape the release."""
        numbers = {
            "clip_target_quantile": self.target_quantile,
            "clip_learning_rate": self.learning_rate,
            "initial_clip_norm": self.initial,
        }
        if self.count_stddev is not None:
            numbers["clip_count_stddev"] = self.count_stddev
        return {k: float(v) for k, v in numbers.items()}

    def report(self, noise_multiplier: float, batch_size: int) -> dict[str, Any]:
        """What ``privacy_spent["adaptive_clip"]`` records (JSON-friendly)."""
        out = {k: (None if v is None else float(v)) for k, v in asdict(self).items()}
        out["count_stddev"] = self.count_stddev_for(batch_size)
        out["sum_noise_multiplier"] = self.sum_multiplier(noise_multiplier, batch_size)
        return out


IMBALANCED = AdaptiveClip(target_quantile=0.9)


def sum_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2: the sum's noise multiplier that, with the count's noise sigma_b,
    makes one step the Gaussian mechanism of multiplier z. DpSgdConfigError (naming both) if 2 sigma_b <= z."""
    z = checks.positive(noise_multiplier, "noise_multiplier", error=DpSgdConfigError, message=_INVALID)
    sigma_b = checks.positive(count_stddev, "count_stddev", error=DpSgdConfigError, message=_INVALID)
    rest = z**-2 - (2.0 * sigma_b) ** -2
    if not rest > 0:
        raise DpSgdConfigError(
            f"count_stddev={sigma_b:g} is invalid for noise multiplier {z:.4g}: adaptive clipping needs "
            f"count_stddev > noise multiplier / 2 = {z / 2:.4g}; raise count_stddev (e.g. {z:.3g}) or batch_size "
            "(the default count_stddev is batch_size / 20)"
        )
    return 1.0 / math.sqrt(rest)


def check_run(
    clip_norm: float | AdaptiveClip, noise_multipliers: Sequence[float] | np.ndarray, batch_size: int
) -> None:
    """Refuse (DpSgdConfigError) an adaptive clip whose count noise is too small for the run's largest noise
    multiplier (all public numbers: call before the fit reads or draws anything); a fixed clip passes."""
    if isinstance(clip_norm, AdaptiveClip):
        clip_norm.sum_multiplier(max(float(z) for z in noise_multipliers), batch_size)


def initial_clip(clip_norm: float | AdaptiveClip) -> float:
    """The clip norm of the first step."""
    return float(clip_norm.initial) if isinstance(clip_norm, AdaptiveClip) else float(clip_norm)


def public_numbers(clip_norm: float | AdaptiveClip) -> dict[str, float]:
    """The adaptive clip's numbers a training share checks are public ({} for a fixed clip)."""
    return clip_norm.public_numbers() if isinstance(clip_norm, AdaptiveClip) else {}


def next_clip(clip: float, noisy_count: float, batch_size: int, adaptive: AdaptiveClip) -> float:
    """C_{t+1} from C_t and the noisy centred count s (docs/models.md); the reference of the TF update."""
    fraction = min(1.0, max(0.0, noisy_count / float(batch_size) + 0.5))
    return clip * math.exp(-adaptive.learning_rate * (fraction - adaptive.target_quantile))


def as_clip_norm(clip_norm: float | str | AdaptiveClip) -> float | AdaptiveClip:
    """A fixed clip norm (a float > 0) or an ``AdaptiveClip`` ("adaptive": the defaults); else DpSgdConfigError."""
    if isinstance(clip_norm, AdaptiveClip):
        return clip_norm
    if isinstance(clip_norm, str):
        if clip_norm.lower() == ADAPTIVE:
            return AdaptiveClip()
        raise DpSgdConfigError(
            f"clip_norm={clip_norm!r} is invalid: pass a number > 0, 'adaptive', or "
            "sage_tfx.privacy.adaptive_clip.AdaptiveClip(...)"
        )
    return checks.positive(
        clip_norm,
        "clip_norm",
        error=DpSgdConfigError,
        message=_INVALID + ", or 'adaptive' (a private quantile of the gradient norms)",
    )
