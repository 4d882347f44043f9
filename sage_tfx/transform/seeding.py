"""`noise_seed`: the public hook through which trusted code seeds the DP analyzers' noise (stdlib only).

Inside ``with noise_seed(grant_seed):`` every DP analyzer traced derives its seed from the grant's, and one given
an explicit ``seed=`` is refused; outside it, analyzers draw fresh OS entropy. The seed is read while the analyzer
is traced, per thread and per asyncio task: docs/dp_preprocessing.md, "Seeding from trusted code".
"""

import contextlib
import contextvars
import hashlib

import numpy as np

from .errors import DPTransformError, NonPrivateAnalyzer

_GRANT_SEED = contextvars.ContextVar("sage_tfx.transform.grant_seed", default=None)


def analyzer_seed(grant_seed, scope):
    """A 128-bit seed for one analyzer: sha256 of "grant_seed|scope", first 16 bytes.

    Distinct analyzers (distinct graph scopes) get unrelated seeds, so their noise
    stays independent as the composition argument needs.

    Args:
        grant_seed: the grant's private seed.
        scope: the analyzer's graph scope.

    Returns:
        The seed, an integer in [0, 2**128).
    """
    return int.from_bytes(hashlib.sha256(f"{grant_seed}|{scope}".encode()).digest()[:16], "big")


@contextlib.contextmanager
def noise_seed(grant_seed):
    """While active (in this thread or task), the DP analyzers traced derive their noise seed from `grant_seed`.

    For trusted code only (DPTransform passes the ledger's private seed of the grant);
    the user's preprocessing_fn must never learn `grant_seed`. Re-running the same
    preprocessing_fn under the same `grant_seed` reproduces the same noisy tables.

    Args:
        grant_seed: the grant's private seed, an integer >= 0.

    Raises:
        DPTransformError: grant_seed not an integer >= 0.
    """
    if isinstance(grant_seed, bool) or not isinstance(grant_seed, (int, np.integer)) or grant_seed < 0:
        raise DPTransformError(f"noise_seed: grant_seed must be an integer >= 0, got {grant_seed!r}")
    token = _GRANT_SEED.set(int(grant_seed))
    try:
        yield
    finally:
        _GRANT_SEED.reset(token)


def resolve_seed(seed, scope):
    """The seed of the analyzer at graph `scope`, given its (checked) test-only `seed` argument.

    No active `noise_seed`: `seed` unchanged (None = fresh OS entropy). Inside one: the
    derived seed, or NonPrivateAnalyzer, naming the analyzer, if `seed` was given.
    """
    grant_seed = _GRANT_SEED.get()
    if grant_seed is None:
        return seed
    if seed is not None:
        raise NonPrivateAnalyzer(
            f"{scope.rstrip('/')}: seed={seed!r} was given, but under DPTransform (noise_seed) the noise comes "
            "from the grant; a seed known to the pipeline lets it subtract the noise"
        )
    return analyzer_seed(grant_seed, scope)
