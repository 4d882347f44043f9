"""`training_seed`: the public hook through which trusted code seeds the DP models' noise and sampling (stdlib only).

The pattern of ``sage_tfx.transform.noise_seed``. Outside any ``training_seed`` context a DP model draws
fresh OS entropy (``seed=None``) or uses its ``seed=`` (tests, benchmarks, notebooks). Inside
``with training_seed(private_seed):`` (DPTrainer wraps the user's ``run_fn`` in it, with the ledger's
private seed of the grant):

* every DP model fitted with ``seed=None`` (DPDNNRegressor, DPDNNClassifier, DPLogisticRegressor, and
  DPLinearRegressor, the AdaSSP model) draws its weight initialisation, its Poisson sampling and its noise
  from seeds derived from ``private_seed`` (``fit_seeds``);
* a model given an explicit ``seed=`` is refused (ValueError naming the model): a seed the user's code
  knows (``seed=0``, or a seed handed to it) makes the training noise predictable, so it can be subtracted.

Derivation: the k-th fit started inside one ``with training_seed(s):`` block (k = 0, 1, ...) of model class
M uses ``sha256("s|fit k|M|<purpose>")`` for purpose "init" (31 bits: Keras initialisers take small
seeds; the initial weights need no secrecy), "sampling" (128 bits, numpy's PCG64) and "noise" (192 bits:
all three words of TensorFlow's Philox state, key included). So re-running the same ``run_fn`` under the
same seed (a new block) reproduces every fit bit for bit (CPU; and the tf_privacy engine excepted, which
draws from TensorFlow's global generator), while two fits in one block get unrelated, independent noise,
as the composition of their releases assumes.

The active seed lives in a ``contextvars.ContextVar``: threads do not share it (a new thread starts
without one), asyncio tasks get their own copy, and nested blocks restore the outer one (and its fit
count) on exit.
"""
import contextlib
import contextvars
import hashlib
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from sage_tfx.privacy.checks import integer
from sage_tfx.privacy.errors import SageError

__all__ = ["training_seed", "fit_seeds", "FitSeeds", "derive_seed", "TrainingSeedError"]


class TrainingSeedError(SageError, ValueError):
    """A training seed is not an integer >= 0, or ``seed=`` was given where the component supplies it."""


class _Active:
    """The seed of one ``training_seed`` block and how many fits have started in it."""

    def __init__(self, seed: int):
        self.seed = seed
        self._fits = 0
        self._lock = threading.Lock()

    def next_fit(self) -> int:
        with self._lock:
            k, self._fits = self._fits, self._fits + 1
        return k


_TRAINING_SEED = contextvars.ContextVar("sage_tfx.models.training_seed", default=None)


@dataclass(frozen=True)
class FitSeeds:
    """The seeds of one fit: weight ``init``, Poisson ``sampling``, Gaussian ``noise``. None = fresh OS entropy."""

    init: Optional[int]
    sampling: Optional[int]
    noise: Optional[int]


def derive_seed(*parts: object, bits: int = 128) -> int:
    """The first ``bits`` bits of sha256("part0|part1|..."), as a non-negative int (bits <= 256)."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest, "big") >> (256 - bits)


@contextlib.contextmanager
def training_seed(seed: int) -> Iterator[None]:
    """While active (in this thread or task), DP models fitted with ``seed=None`` derive their randomness from
    ``seed``, and models given ``seed=`` are refused.

    For trusted code only (DPTrainer passes the ledger's private seed of the grant); the user's ``run_fn``
    must never learn ``seed``. Re-running the same fits in a new block with the same ``seed`` reproduces them.
    """
    if not isinstance(seed, (int, np.integer)):  # a float seed (3.0) is a caller's bug: refused, not rounded
        raise TrainingSeedError(f"training_seed: seed must be an integer >= 0, got {seed!r}")
    seed = integer(seed, "training_seed: seed", low=0, error=TrainingSeedError,
                   message="{what} must be {rule}, got {value!r}")
    token = _TRAINING_SEED.set(_Active(seed))
    try:
        yield
    finally:
        _TRAINING_SEED.reset(token)


def active() -> bool:
    """True inside a ``training_seed`` block (in this thread or task)."""
    return _TRAINING_SEED.get() is not None


def fit_seeds(seed: Optional[int], model_name: str) -> FitSeeds:
    """The seeds for one fit of ``model_name`` given its ``seed=`` argument.

    Outside ``training_seed``: ``seed`` for all three (None: fresh OS entropy), as before the hook existed.
    Inside: seeds derived from the block's seed (module docstring), or ValueError if ``seed`` was given.
    """
    current = _TRAINING_SEED.get()
    if current is None:
        return FitSeeds(seed, seed, seed)
    if seed is not None:
        raise TrainingSeedError(
            f"{model_name}: seed={seed!r} was given inside sage_tfx.models.training_seed: the component "
            "(DPTrainer) supplies the training seed from the grant; a seed known to the module file makes the "
            "noise predictable. Drop the seed= argument")
    base = (current.seed, f"fit {current.next_fit()}", model_name)
    return FitSeeds(init=derive_seed(*base, "init", bits=31), sampling=derive_seed(*base, "sampling", bits=128),
                    noise=derive_seed(*base, "noise", bits=192))
