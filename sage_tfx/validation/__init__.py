"""SLAed validation (paper §3.3, List. 2, App. B): ACCEPT / REJECT / RETRY with a stated
confidence despite DP noise. numpy/scipy only.

    v = DPLossValidator(target=0.02, epsilon=0.5, confidence=0.95, loss_bound=1.0)
    result = v.validate(test_losses, train_losses, rng=np.random.default_rng(), attempt=i)
    result.outcome  # Outcome.ACCEPT / REJECT / RETRY; result.to_dict() for JSON

``mode=`` selects the paper's ablations: "sage" (default), "uncorrected" (UC DP SLA), "non_private"
(NP SLA), "no_sla" (plain comparison of the DP metric with the target).
"""

from .accuracy import DPAccuracyValidator
from .bounds import bernstein_upper, clopper_pearson_lower, clopper_pearson_upper, hoeffding_lower, hoeffding_width
from .core import Mode, Outcome, ValidationInputError, ValidationResult, eta_for_attempt, laplace_tail
from .loss import DPLossValidator
from .metrics import absolute_errors, correctness, log_losses, squared_errors
from .statistic import DPAbsoluteErrorValidator, mean_error_bound

VALIDATORS = {"loss": DPLossValidator, "accuracy": DPAccuracyValidator, "absolute_error": DPAbsoluteErrorValidator}

__all__ = [
    "Outcome",
    "Mode",
    "ValidationResult",
    "ValidationInputError",
    "eta_for_attempt",
    "DPLossValidator",
    "DPAccuracyValidator",
    "DPAbsoluteErrorValidator",
    "VALIDATORS",
    "squared_errors",
    "absolute_errors",
    "log_losses",
    "correctness",
    "bernstein_upper",
    "hoeffding_lower",
    "hoeffding_width",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "laplace_tail",
    "mean_error_bound",
]
