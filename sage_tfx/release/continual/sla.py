"""The SLA check of a released model under its newest block's grant's ``validation`` release (parallel split).
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.vocabulary import Stage

from .base import Released, _Base
from .params import ContinualReleaseError, Loss


def check_sla(release: _Base, model: Released, validator) -> object:
    """The SLA check of Sage's iterator on a released model: ``validator`` (a ``sage_tfx.validation``
    DPLossValidator, its epsilon == the strategy's validation_epsilon) on the test part of the NEWEST block,
    under that block's grant's ``validation`` release (parallel split: each test record is used by this one
    check, so it loses validation_epsilon once). Losses are the model's log / squared losses."""
    if release.validation_epsilon is None:
        raise ContinualReleaseError("validation_epsilon None: build the release with validation_epsilon=... to "
                                    "run an SLA check (its grants then carry a parallel train/test split)")
    if not math.isclose(float(validator.epsilon), release.validation_epsilon, rel_tol=1e-12):
        raise ContinualReleaseError(f"validator epsilon {validator.epsilon!r} differs from validation_epsilon "
                                    f"{release.validation_epsilon!r}: give the validator that epsilon")
    block = release.order[model.t - 1]
    grant = release.grants[block]
    bound = bound_to_data(release.fingerprint, release.ledger, grant)
    fingerprint = hashlib.sha256((bound + "/sla/" + model.weights.tobytes().hex() +
                                  json.dumps(getattr(validator, "target", None))).encode()).hexdigest()
    release.ledger.release(grant, Stage.VALIDATION, fingerprint, release.validation_epsilon, 0.0)
    x, y = release.tests[block]  # none at all is validated too (noise only): no count of 0 in the result
    z = x @ model.weights
    losses = (np.logaddexp(0.0, -y * z) if release.params.loss is Loss.LOGISTIC else 0.5 * (z - y) ** 2)
    rng = as_secure_rng(release.ledger.private_seed(grant.id, f"sla/{model.t}"))
    return validator.validate(losses, rng=rng)
