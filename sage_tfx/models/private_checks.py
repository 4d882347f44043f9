"""``make_private``'s argument checks: each refuses a bad value with a DpSgdConfigError naming it, before
anything is read (docs/models.md, "Your own Keras model: make_private")."""
from typing import Any

from sage_tfx.models.dpsgd_engine import _INVALID
from sage_tfx.privacy import checks, dpsgd
from sage_tfx.privacy.dpsgd import DpSgdConfigError

OPTIMIZERS = ("sgd", "adam")


def check_momentum(momentum: Any) -> float:
    """``momentum`` as a float in [0, 1), else a DpSgdConfigError naming it (a bool is refused)."""
    return checks.number(momentum, "momentum", low=0.0, high=1.0, high_open=True, error=DpSgdConfigError,
                         message=_INVALID)


def check_positive(name: str, value: Any, integer: bool = False) -> Any:
    """``value`` as a positive number (an integer >= 1 with ``integer``), else a DpSgdConfigError naming it."""
    if integer:
        return checks.integer(value, name, low=1, error=DpSgdConfigError, message=_INVALID)
    return checks.positive(value, name, error=DpSgdConfigError, message=_INVALID)


def check_privacy_budget(privacy_budget: tuple[float, float]) -> tuple[float, float]:
    """``make_private``'s ``privacy_budget`` as a checked (epsilon, delta).

    Raises:
        DpSgdConfigError: not a pair, or a pair ``dpsgd.check_budget`` refuses.
    """
    try:
        epsilon, delta = privacy_budget
    except (TypeError, ValueError):
        raise DpSgdConfigError(f"privacy_budget={privacy_budget!r} is invalid: pass (epsilon, delta)") from None
    return dpsgd.check_budget(epsilon, delta)


def check_optimizer(optimizer: str, learning_rate: float | None, momentum: float,
                     weight_decay: float) -> tuple[float, float]:
    """``make_private``'s optimizer settings checked: ``(learning_rate, momentum)``, the learning rate defaulted
    to 0.1 (sgd) / 0.001 (adam).

    Raises:
        DpSgdConfigError: an unknown optimizer, a bad learning rate or momentum, momentum with adam, or a weight
            decay outside [0, 1/learning_rate).
    """
    if optimizer not in OPTIMIZERS:
        raise DpSgdConfigError(f"optimizer={optimizer!r} is invalid: choose one of {OPTIMIZERS}")
    if learning_rate is None:
        learning_rate = 0.1 if optimizer == "sgd" else 0.001
    learning_rate = check_positive("learning_rate", learning_rate)
    momentum = check_momentum(momentum)
    if optimizer == "adam" and momentum:
        raise DpSgdConfigError(f"momentum={momentum!r} is invalid with optimizer='adam': leave it at 0")
    checks.number(weight_decay, "weight_decay", low=0.0, high=1 / learning_rate, high_open=True,
                  error=DpSgdConfigError, message="{what}={value!r} is invalid: pass a number in [0, 1/learning_rate) "
                  f"(learning_rate {learning_rate}), e.g. 0.01")
    return learning_rate, momentum
