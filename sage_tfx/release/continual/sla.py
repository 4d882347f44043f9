"""The SLA check of a released model under its newest block's grant's ``validation`` release (parallel split)."""

from __future__ import annotations

import hashlib
import json
import math

from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.vocabulary import Stage

from .base import Released, _Base
from .erm import record_losses
from .params import ContinualReleaseError


def check_sla(release: _Base, model: Released, validator) -> object:
    """The SLA check of Sage's iterator on a released model: ``validator`` (a ``sage_tfx.validation``
    DPLossValidator, its epsilon == the strategy's validation_epsilon) on the test part of the NEWEST block,
    under that block's grant's ``validation`` release (parallel split: each test record is used by this one
    check, so it loses validation_epsilon once). Losses are the model's per-record losses (``record_losses``:
    log, squared or softmax cross-entropy).

    Args:
        release: the ContinualRelease / SlidingWindowRelease built with ``validation_epsilon``.
        model: a model it released.
        validator: the DPLossValidator (epsilon == the release's validation_epsilon).
    """
    if release.validation_epsilon is None:
        raise ContinualReleaseError(
            "validation_epsilon None: build the release with validation_epsilon=... to "
            "run an SLA check (its grants then carry a parallel train/test split)"
        )
    if not math.isclose(float(validator.epsilon), release.validation_epsilon, rel_tol=1e-12):
        raise ContinualReleaseError(
            f"validator epsilon {validator.epsilon!r} differs from validation_epsilon "
            f"{release.validation_epsilon!r}: give the validator that epsilon"
        )
    block = release.order[model.t - 1]
    grant = release.grants[block]
    bound = bound_to_data(release.fingerprint, release.ledger, grant)
    fingerprint = hashlib.sha256(
        (bound + "/sla/" + model.weights.tobytes().hex() + json.dumps(getattr(validator, "target", None))).encode()
    ).hexdigest()
    release.ledger.release(grant, Stage.VALIDATION, fingerprint, release.validation_epsilon, 0.0)
    x, y = release.tests[block]  # none at all is validated too (noise only): no count of 0 in the result
    losses = record_losses(model.weights, x, y, release.params.loss, release.params.classes)
    rng = as_secure_rng(release.ledger.private_seed(grant.id, f"sla/{model.t}"))
    return validator.validate(losses, rng=rng)
