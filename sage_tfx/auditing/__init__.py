"""Empirical privacy auditing: run a shipped mechanism on neighbouring inputs many times and report a
high-confidence LOWER bound on its epsilon beside the claim (docs/privacy_auditing.md).

``audit_privacy(name, trials=..., epsilon=..., confidence=...)`` audits a registered mechanism
(``mechanism_names()``); ``audit(Mechanism(...), AuditConfig(...))`` any release; ``audit_dpsgd(CanaryAudit(...))`` one-run canary auditing of
a ``make_private`` training (``dpsgd-ghost`` / ``dpsgd-vmap`` / ``dpsgd-loop``); ``audit_dpsgd_coordinates(CoordinateAudit(...))``
the many-run audit of ONE ``make_private`` fit whose coordinates are independent runs (``dpsgd-coordinates``);
``audit_transform_beam`` a
tf.Transform analyzer on Beam seeded through a grant (``transform-dp-mean-beam``); ``releases`` registers the Tree
Mechanism, PMWG, the custom validator and AdaSSP through DPTrainer's path; ``sparse_vector`` PMWG's sparse vector
over a crafted query stream; ``sliding_window`` the sliding-window release's buckets; ``audit_estimator`` the
DP-SGD estimators through their public API in one run; ``audit_vocabulary_beam`` the DP vocabulary on Beam
(``transform-vocabulary-beam``); ``audit_z_score_beam`` and ``audit_quantiles_beam`` the z-score and the quantiles
on Beam over many features (``transform-z-score-beam``, ``transform-quantiles-beam``). numpy and scipy only at import
(TensorFlow is imported by the DP-SGD audit when it runs).
"""

from . import (
    releases,  # noqa: F401  (registers the release strategies' entries)
    sliding_window,  # noqa: F401  (registers sliding-window)
    sparse_vector,  # noqa: F401  (registers pmwg-sparse-vector)
)
from .coordinates import CoordinateAudit, CoordinateResult, audit_dpsgd_coordinates
from .core import (
    AuditConfig,
    AuditConfigError,
    AuditResult,
    Mechanism,
    audit,
    audit_outputs,
    clopper_pearson_upper,
    epsilon_lower_bound,
    trial_seeds,
)
from .dpsgd import DPSGD_ENGINES, CanaryAudit, OneRunResult, audit_dpsgd
from .estimators import ESTIMATORS, audit_estimator
from .mechanisms import (
    DEFAULT_EPSILON,
    describe_mechanisms,
    gaussian_sigma,
    mechanism,
    mechanism_names,
    register_mechanism,
)
from .one_run import guesses_from_scores, one_run_epsilon_lower_bound, one_run_p_value
from .quantiles_beam import audit_quantiles_beam
from .report import audit_names, audit_privacy, describe_audits, write_plot
from .transform_beam import audit_transform_beam
from .vocabulary_beam import audit_vocabulary_beam
from .z_score_beam import audit_z_score_beam

__all__ = [
    "AuditConfig",
    "AuditConfigError",
    "AuditResult",
    "Mechanism",
    "audit",
    "audit_privacy",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "trial_seeds",
    "DEFAULT_EPSILON",
    "describe_mechanisms",
    "gaussian_sigma",
    "guesses_from_scores",
    "mechanism",
    "mechanism_names",
    "one_run_epsilon_lower_bound",
    "register_mechanism",
    "write_plot",
    "DPSGD_ENGINES",
    "CanaryAudit",
    "OneRunResult",
    "audit_dpsgd",
    "audit_names",
    "describe_audits",
    "one_run_p_value",
    "audit_outputs",
    "audit_transform_beam",
    "CoordinateAudit",
    "CoordinateResult",
    "audit_dpsgd_coordinates",
    "ESTIMATORS",
    "audit_estimator",
    "audit_vocabulary_beam",
    "audit_z_score_beam",
    "audit_quantiles_beam",
]
