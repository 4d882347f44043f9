"""`noise_seed`: the public hook through which trusted code seeds the DP analyzers' noise (stdlib only).

Outside any `noise_seed` context an analyzer draws fresh OS entropy (or uses its
test-only ``seed=``). Inside ``with noise_seed(grant_seed):`` every DP analyzer BUILT
(traced) there gets ``analyzer_seed(grant_seed, its graph scope)``, and one given an
explicit ``seed=`` is refused: a seed the pipeline knows lets it subtract the noise.

When the seed is read: while the analyzer builds its Beam analysis, i.e. while
tf.Transform traces the preprocessing_fn (``AnalyzeDataset`` at pipeline
construction), in the thread that traces it. The derived seed is stored in that
analyzer's Beam PTransform (`analyzers._NoiseOnce`), which draws the noise when the
pipeline runs, even after the context has exited; Beam's worker threads never read
the context. Nothing of the seed enters the TensorFlow graph: tf.Transform bakes
only the noisy tables into the transform graph.

The active seed lives in a `contextvars.ContextVar`: threads do not share it (a new
thread starts without one), asyncio tasks get their own copy, and nested contexts
restore the outer seed on exit.
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
    """
    return int.from_bytes(hashlib.sha256(f"{grant_seed}|{scope}".encode()).digest()[:16], "big")


@contextlib.contextmanager
def noise_seed(grant_seed):
    """While active (in this thread or task), the DP analyzers traced derive their noise seed from `grant_seed`.

    For trusted code only (DPTransform passes the ledger's private seed of the grant);
    the user's preprocessing_fn must never learn `grant_seed`. Re-running the same
    preprocessing_fn under the same `grant_seed` reproduces the same noisy tables.
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
            "from the grant; a seed known to the pipeline lets it subtract the noise")
    return analyzer_seed(grant_seed, scope)
