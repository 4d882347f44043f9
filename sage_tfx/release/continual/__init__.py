"""Continual and sliding-window release of regularised ERM models (Watson et al.); numpy only.

A model is released at EVERY block arrival, forever, and every record's total privacy loss stays under a constant:
each arriving block gets ONE grant charged the whole per-record bound before it is read. One module per concept:
``params``, ``erm`` (the solver), ``calibration``, ``base``, one per strategy (``cumulative``, ``sliding_window``,
``sliding_as_written`` with its chain in ``alg5``), ``sampling`` (the sampled variants),
``sla``, ``push``, ``stream``. The analysis: docs/release_strategies.md, "Continual and sliding-window release: the
proofs".
"""

from .base import Reader, Released, record_hash_fraction
from .calibration import participation_sum
from .cumulative import ContinualRelease
from .erm import clip_features, empirical_loss, predict, private_erm, record_losses, sensitivity, solve_erm
from .params import (
    MAX_ITERATIONS,
    STAGE,
    XI,
    ContinualReleaseError,
    Loss,
    ReleaseParams,
    Sampling,
    Strategy,
    lipschitz,
    smoothness,
)
from .push import Pushed, push_model
from .sampling import amplified, poisson_mask, sampling_rate, sampling_sum
from .sla import check_sla
from .sliding_as_written import SlidingWindowAsWritten
from .sliding_window import SlidingWindowRelease, dyadic_cover
from .stream import grant_reader, release_stream

__all__ = [
    "ContinualRelease",
    "ContinualReleaseError",
    "Loss",
    "MAX_ITERATIONS",
    "Pushed",
    "Reader",
    "ReleaseParams",
    "Released",
    "STAGE",
    "Sampling",
    "SlidingWindowAsWritten",
    "SlidingWindowRelease",
    "Strategy",
    "XI",
    "amplified",
    "check_sla",
    "clip_features",
    "dyadic_cover",
    "empirical_loss",
    "grant_reader",
    "lipschitz",
    "participation_sum",
    "poisson_mask",
    "predict",
    "private_erm",
    "push_model",
    "record_hash_fraction",
    "record_losses",
    "release_stream",
    "sampling_rate",
    "sampling_sum",
    "sensitivity",
    "smoothness",
    "solve_erm",
]
