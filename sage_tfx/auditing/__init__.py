"""Empirical privacy auditing: run a shipped mechanism on neighbouring inputs many times and report a
high-confidence LOWER bound on its epsilon beside the claim (docs/privacy_auditing.md).

``audit_privacy(name, trials=..., epsilon=..., confidence=...)`` audits a registered mechanism
(``mechanism_names()``); ``audit(Mechanism(...), AuditConfig(...))`` any release. numpy and scipy only.
"""
from .core import (
                   AuditConfig,
                   AuditConfigError,
                   AuditResult,
                   Mechanism,
                   audit,
                   clopper_pearson_upper,
                   epsilon_lower_bound,
                   trial_seeds,
)
from .mechanisms import (
                   DEFAULT_EPSILON,
                   describe_mechanisms,
                   gaussian_sigma,
                   mechanism,
                   mechanism_names,
                   register_mechanism,
)
from .one_run import guesses_from_scores, one_run_epsilon_lower_bound
from .report import audit_privacy, write_plot

__all__ = ["AuditConfig", "AuditConfigError", "AuditResult", "Mechanism", "audit", "audit_privacy",
           "clopper_pearson_upper", "epsilon_lower_bound", "trial_seeds", "DEFAULT_EPSILON",
           "describe_mechanisms", "gaussian_sigma", "guesses_from_scores", "mechanism", "mechanism_names",
           "one_run_epsilon_lower_bound", "register_mechanism", "write_plot"]
