"""What a component may learn about its grant, and the one release each stage opens under it.

``check_grant`` is the one door: every data-reading component (BlockExampleGen,
DPTransform, DPTrainer, DPModelValidator) calls it BEFORE reading a record.
``open_release`` is the second step, shared by every component that releases
something: it opens the stage's one release under the grant with the ledger
(``Ledger.release``: refused for a second computation, or beyond the stage's
share) and only then hands out the stage's noise seed, so nothing is drawn
before the ledger has recorded what is drawn. Neither needs TensorFlow, TFX
or Beam.

The rule for data size (docs/growing_database.md): a pipeline never sees an
exact row count. It may see the public number of blocks in its grant, or a
Laplace count released under the ``count`` stage of the grant's split, which
the grant paid for as part of its charge.
"""
import hashlib
import json
import math

from sage_tfx.privacy import GrantError, Ledger, grant_split

# The noise seed's purpose for each stage (Ledger.private_seed): one seed per grant and stage.
SEED_PURPOSES = {"preprocessing": "preprocessing", "count": "record_count", "training": "training",
                 "rejection": "validation", "validation": "validation"}


def computation_digest(*parts) -> str:
    """A SHA-256 fingerprint of a computation from its parts (bytes as they are, anything else as canonical JSON)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def open_release(ledger_location, grant, stage, computation, epsilon, delta=0.0) -> int:
    """Open ``stage``'s release of ``computation`` under ``grant`` with the ledger; return the stage's noise seed.

    Raises GrantError before anything is drawn if the grant already released this stage for another
    computation, if the stage asks more than its share, or if a single-stage grant was spent by
    another stage. Re-opening the same computation returns the same seed (a re-run draws the same
    noise: no new release).
    """
    with Ledger.open(ledger_location) as ledger:
        ledger.release(grant, stage, computation, epsilon, delta)
        return ledger.private_seed(grant.id, SEED_PURPOSES[stage])


def check_grant(ledger_location, grant_json, stream=None, epsilon=None, delta=None):
    """Verify a grant against the ledger and return the ledger's copy (a ``Grant``).

    Raises ``GrantError`` (a ValueError) for a missing, malformed, forged (bad
    signature), unknown (never charged by this ledger), altered, other-stream or
    too-small grant, if any granted block is not registered, and if its split composes to more than
    its charge (re-checked here, at every component's door, whoever signed it).
    """
    if grant_json is None or (isinstance(grant_json, str) and not grant_json.strip()):
        raise GrantError("no grant given: this component reads data only under a grant from the ledger "
                         "(pass the JSON of Ledger.request(...) as its `grant`)")
    if not ledger_location:
        raise GrantError("no ledger location given: a grant can only be checked against its ledger")
    with Ledger.open(ledger_location) as ledger:
        grant = ledger.verify(grant_json, stream=stream, epsilon=epsilon, delta=delta)
        registered = {b.id for b in ledger.blocks(grant.stream)}
    missing = [b for b in grant.blocks if b not in registered]
    if missing:
        raise GrantError(f"grant {grant.id!r} names block(s) not registered in stream {grant.stream!r}: "
                         f"{', '.join(missing)}")
    grant_split(grant)  # its split composes to at most its charge (GrantError otherwise)
    return grant


def laplace_count(exact, epsilon, rng):
    """``exact + Laplace(0, 1/epsilon)`` drawn floating-point safe: an epsilon-DP count.

    Mechanism: ``sage_tfx.privacy.samplers.grid_laplace(exact, 1, epsilon, rng)``: the count (an
    integer, on the grid) plus gamma times exact discrete Laplace noise, gamma = 2^-20 for
    epsilon <= 1, integer scale t = ceil((2^20 + 1)/epsilon) (noise scale within 2^-20 of 1/epsilon).
    ``rng``: a ``samplers.SecureRNG`` (or anything ``as_secure_rng`` takes).
    Sensitivity: adding or removing one record changes a count by at most 1 (one cell), so the
    release is (epsilon, 0)-DP, exactly (proof in ``grid_laplace``; Dwork et al. 2006 for the
    continuous analogue). The granted blocks are disjoint parts of the stream, so one count over
    their union is one query charged to every block of the grant.
    """
    from sage_tfx.privacy.samplers import grid_laplace

    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"count epsilon {epsilon!r} must be finite and > 0")
    return float(grid_laplace([float(exact)], 1.0, epsilon, rng, cells=1)[0])


RECORD_COUNT_COMPUTATION = "record_count/v1"  # one Laplace count over all granted blocks


def released_record_count(ledger_location, grant):
    """The DP record count of a verified grant, or None if its split has no ``count`` stage.

    The release is opened with the ledger (stage ``count``, one computation for every caller), and
    the noise comes from a seed only the ledger can derive for (grant, "record_count"), so
    BlockExampleGen and DPTrainer, and any re-run, release the same value: no extra privacy loss.
    """
    from sage_tfx.privacy.samplers import secure_rng

    split = grant_split(grant)
    if split is None or split.count <= 0:
        return None
    eps = split.count
    rng = secure_rng(open_release(ledger_location, grant, "count",
                                  computation_digest(RECORD_COUNT_COMPUTATION, list(grant.blocks)), eps),
                     "record_count")
    with Ledger.open(ledger_location) as ledger:
        exact = sum(ledger.private_row_count(grant.stream, b) or 0 for b in grant.blocks)
    return laplace_count(exact, eps, rng), eps
