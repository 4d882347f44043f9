"""One-run canary audits of the DP-SGD estimators through their public API (``DPLogisticRegressor``,
``DPDNNRegressor``, ``DPDNNClassifier``): ``audit_estimator(name, CanaryAudit(...))``, ``sage audit-privacy
dp-logistic-regressor`` and the others.

The experiment is ``dpsgd.audit_dpsgd``'s (m Dirac-gradient canaries, each in with probability 1/2, ONE training
inside ``training_seed(seed, share=(epsilon, delta))`` as DPTrainer runs ``run_fn``, fixed guesses turned into the
one-run bound), with the training done by the estimator's own ``fit``: its network (``build_mlp``, no hidden layer
here, with a bias and weights initialised from the fit's seed), its loss, its label handling and its
``make_private`` call. The classifiers take label 1 for the canaries and 0 for the ordinary records; each canary's
score is its own output (the logit, or class 1's logit minus class 0's): higher when it was trained on. The
learning rate is ``ESTIMATOR_LEARNING_RATE`` (not part of the claim): a canary's step then dwarfs the spread of
the random initial weights. Contract: ``audit_dpsgd``'s.

Set-up, figures and limits: docs/privacy_auditing.md ("The DP estimators").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .core import AuditConfigError
from .dpsgd import CANARY_LABEL, CanaryAudit, OneRunResult, audit_dpsgd, loss_scores

__all__ = ["ESTIMATORS", "ESTIMATOR_LEARNING_RATE", "audit_estimator"]

ESTIMATORS = {
    "dp-logistic-regressor": "DPLogisticRegressor",
    "dp-dnn-regressor": "DPDNNRegressor",
    "dp-dnn-classifier": "DPDNNClassifier",
}
ESTIMATOR_LEARNING_RATE = 20.0


def _fit(kind: str, audit: CanaryAudit, x: np.ndarray, y: np.ndarray):
    """The estimator ``kind`` fitted once on (x, y) through its public ``fit``, inside the training block."""
    from sage_tfx import models
    from sage_tfx.models.seeding import derive_seed, training_seed

    common: dict[str, Any] = dict(
        num_examples=audit.num_examples,
        learning_rate=audit.learning_rate,
        epochs=audit.epochs,
        batch_size=audit.batch_size,
        clip_norm=audit.clip_norm,
        momentum=0.0,
        implementation=audit.engine,
    )
    budget = (audit.epsilon, audit.delta)
    labels = y[:, 0]
    if kind != "DPDNNRegressor":  # classifiers: canaries class 1, ordinary records class 0
        labels = (labels > CANARY_LABEL / 2).astype(np.float32)
    if kind == "DPDNNClassifier":
        common.update(hidden_units=(), n_classes=2)
    elif kind == "DPDNNRegressor":
        common.update(hidden_units=())
    estimator = getattr(models, kind)(budget, **common)
    with training_seed(derive_seed("one-run audit", audit.seed, bits=63), share=budget):
        estimator.fit(x, labels)
    return estimator


def _output_scores(model, canary_x: np.ndarray, canary_y: np.ndarray) -> np.ndarray:
    """Each canary's logit (two classes: class 1's minus class 0's): its score as a member."""
    out = np.asarray(model(canary_x, training=False), np.float64)
    return out[:, 1] - out[:, 0] if out.shape[1] == 2 else out[:, 0]


def audit_estimator(name: str, audit: CanaryAudit | None = None) -> OneRunResult:
    """The one-run audit of the estimator ``name`` (one of ``ESTIMATORS``), fitted through its public API.

    Args:
        name: ``dp-logistic-regressor``, ``dp-dnn-regressor`` or ``dp-dnn-classifier``.
        audit: the parameters (default ``CanaryAudit()`` at ``ESTIMATOR_LEARNING_RATE``); its ``engine`` is the
            estimator's ``implementation``.
    """
    if name not in ESTIMATORS:
        raise AuditConfigError(f"unknown estimator {name!r}: one of {', '.join(sorted(ESTIMATORS))}")
    audit = audit or CanaryAudit(learning_rate=ESTIMATOR_LEARNING_RATE)
    kind = ESTIMATORS[name]
    result = audit_dpsgd(
        audit,
        model=lambda audit: None,  # the estimator builds its own network in fit
        train=lambda audit, model, x, y: _fit(kind, audit, x, y),
        score=loss_scores if kind == "DPDNNRegressor" else _output_scores,
    )
    return replace(result, mechanism=name)
