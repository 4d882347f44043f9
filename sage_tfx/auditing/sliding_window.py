"""An audit of the sliding-window release's dyadic buckets (``sliding-window``), through the real
``release.continual.SlidingWindowRelease`` on a throwaway ledger.

Each trial runs a fresh window release (window ``WINDOW`` = 2 blocks, so buckets of 1 and 2 blocks) over
``BLOCKS`` = 4 blocks of ``ROWS`` records, every block charged by its own grant and every bucket's noise drawn from
that grant's private seed, exactly as a pipeline's arrivals do. The neighbour D' adds one record to block 1; it
enters the buckets [1] and [1, 2], which the releases after blocks 1 and 2 expose whole (their window's cover is
that one bucket). ``window_releases`` returns the four released models; the default statistic is the Gaussian
log-likelihood ratio of the two releases holding block 1 (their residuals from D's exact ERM solutions, projected
on the record's exact shift). Claim: the release's per-record (epsilon, 1e-5) over all its releases.

Set-up, figures and limits: docs/privacy_auditing.md ("What is covered", "Planted bugs", "Limits").
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable

import numpy as np

from .core import Mechanism
from .mechanisms import GAUSSIAN_DELTA, register_mechanism

__all__ = ["WINDOW", "BLOCKS", "window_params", "exact_bucket", "window_releases", "sliding_window_mechanism"]

WINDOW = 2
BLOCKS = 4
ROWS = 20  # records per block (the declared m0)
DIM = 2
RECORD = (np.array([[1.0, 0.0]]), np.array([-1.0]))  # D' adds it to block 1: a unit-norm feature, the wrong label


def window_params(epsilon: float):
    """The ``ReleaseParams`` every trial runs with (logistic loss, m0 = ``ROWS``, window ``WINDOW``).

    Args:
        epsilon: the per-record epsilon (delta 1e-5).
    """
    from sage_tfx.release.continual import ReleaseParams

    return ReleaseParams(epsilon=epsilon, delta=GAUSSIAN_DELTA, records_per_block=ROWS, window=WINDOW)


@functools.cache
def _blocks(neighbour: bool) -> tuple:
    rng = np.random.default_rng(0)
    blocks = []
    for t in range(BLOCKS):
        x = rng.normal(0.0, 0.5, (ROWS - 1, DIM))
        y = np.where(x[:, 0] + rng.normal(0.0, 0.3, ROWS - 1) > 0, 1.0, -1.0)
        if neighbour and t == 0:
            x, y = np.vstack([x, RECORD[0]]), np.append(y, RECORD[1])
        blocks.append((x, y))
    return tuple(blocks)


@functools.cache
def exact_bucket(epsilon: float, first: int, last: int, neighbour: bool) -> np.ndarray:
    """The exact (noise-free) ERM solution of the bucket of blocks ``first``..``last`` (1-based) pulled toward 0,
    as ``private_erm`` solves it before its noise (the buckets [1], [1, 2] and [3, 4] have no reference).

    Args:
        epsilon: the per-record epsilon (fixes the parameters; the solution does not depend on it).
        first: the bucket's first block.
        last: its last block.
        neighbour: on D' instead of D.
    """
    from sage_tfx.release.continual.erm import clip_features, solve_erm

    params = window_params(epsilon)
    chosen = _blocks(neighbour)[first - 1 : last]
    x, y = clip_features(np.vstack([b[0] for b in chosen]), np.concatenate([b[1] for b in chosen]), params.loss)
    return solve_erm(
        x,
        y,
        normaliser=(last - first + 1) * ROWS,
        lam=params.lam,
        radius=params.radius,
        loss=params.loss,
    )


def _ledger(directory: str, epsilon: float):
    from sage_tfx.privacy import Ledger

    ledger = Ledger.open(os.path.join(directory, "window.db"), create=True)
    ledger.create_stream("audit", epsilon, GAUSSIAN_DELTA, max_epsilon=max(epsilon, 10.0))
    return ledger


def window_releases(ledger, trial: int, params, neighbour: bool, release_class: Callable | None = None) -> list:
    """The four models a fresh window release publishes after blocks 1..4 (its blocks and grants new on
    ``ledger``).

    Args:
        ledger: the throwaway ledger (stream ``audit``, a budget of the params' (epsilon, delta) per block).
        trial: a number naming this trial's blocks and pipeline (one per call).
        params: ``window_params(epsilon)``.
        neighbour: run on D' (``RECORD`` added to block 1).
        release_class: the class run (default ``SlidingWindowRelease``; a planted variant's subclass in the tests).
    """
    from sage_tfx.release.continual import SlidingWindowRelease

    blocks = _blocks(neighbour)
    names = [f"t{trial}b{t}" for t in range(BLOCKS)]
    for t, name in enumerate(names):
        ledger.add_block("audit", name, start=float(trial * BLOCKS + t), end=trial * BLOCKS + t + 1.0, rows=ROWS)
    by_block = dict(zip(names, blocks))
    reader = lambda grant: by_block[grant.blocks[0]]  # noqa: E731
    release = (release_class or SlidingWindowRelease)(
        ledger, "audit", f"audit-{trial}", params, reader, dim=DIM, horizon=BLOCKS
    )
    return [release.observe(name).weights for name in names]


def sliding_window_mechanism(
    epsilon: float,
    release_class: Callable | None = None,
    statistic: Callable[[list, float], float] | None = None,
    name: str = "sliding-window",
) -> Mechanism:
    """The window release at (``epsilon``, 1e-5) per record (module docstring). The ledger lives in a temporary
    folder (on /dev/shm when there is one) for the mechanism's lifetime.

    Args:
        epsilon: the claimed per-record epsilon.
        release_class: the class run (default ``SlidingWindowRelease``).
        statistic: ``statistic(releases, epsilon)`` maps the four released models to the scalar tested;
            default the Gaussian log-likelihood ratio of the releases after blocks 1 and 2.
        name: the mechanism's name in the result.
    """
    params = window_params(epsilon)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = tempfile.TemporaryDirectory(prefix="sage-audit-window-", dir=shm)
    ledger = _ledger(folder.name, epsilon)
    trials = iter(range(1 << 62))
    chosen = statistic or likelihood_ratio

    def release(neighbour, seed):
        return float(chosen(window_releases(ledger, next(trials), params, neighbour, release_class), epsilon))

    release.folder = folder  # type: ignore[attr-defined]  # keeps the ledger's folder as long as the mechanism
    return Mechanism(name, release, epsilon, GAUSSIAN_DELTA)


def likelihood_ratio(releases: list, epsilon: float) -> float:
    """sum over the buckets [1] and [1, 2] (the releases after blocks 1 and 2) of <r - w_D, w_D' - w_D>: the
    Gaussian log-likelihood ratio of D' to D times sigma^2 (every release has the same sigma), up to a constant.

    Args:
        releases: ``window_releases``' four models.
        epsilon: the per-record epsilon they were released at.
    """
    total = 0.0
    for t, (first, last) in ((1, (1, 1)), (2, (1, 2))):
        exact = exact_bucket(epsilon, first, last, False)
        shift = exact_bucket(epsilon, first, last, True) - exact
        total += float((releases[t - 1] - exact) @ shift)
    return total


register_mechanism(
    "sliding-window",
    "the sliding-window release (release.continual.SlidingWindowRelease, window 2, 4 "
    "blocks, throwaway ledger, each block's grant and seed); D' adds a record to block 1 "
    "(buckets [1], [1, 2]); delta = 1e-5",
    slow=True,
)(sliding_window_mechanism)
