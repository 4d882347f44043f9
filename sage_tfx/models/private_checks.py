"""``make_private``'s argument checks: each refuses a bad value with a DpSgdConfigError naming it, before
anything is read (docs/models.md, "Your own Keras model: make_private")."""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING, Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.models.dpsgd_engine import _INVALID, ENGINES, ghost_applies
from sage_tfx.models.ghost_plans import GHOST_LAYERS
from sage_tfx.models.losses import per_example_loss
from sage_tfx.models.seeding import active as _seed_active
from sage_tfx.models.seeding import check_fit
from sage_tfx.models.unit_clip import unit_engine_name
from sage_tfx.privacy import adaptive_clip, checks, dpsgd, noise_schedules
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    from sage_tfx.privacy.adaptive_clip import AdaptiveClip

OPTIMIZERS = ("sgd", "adam", "debiased_momentum")  # the last: sage_tfx.models.momentum
PER_EXAMPLE = ("auto",) + ENGINES
GHOST_REFUSED = (
    "per_example='ghost' is invalid for this model: the ghost engine needs a Keras graph network "
    f"(Functional, or Sequential with a known input shape) with at least one {GHOST_LAYERS} "
    "layer; use per_example='auto' or 'vmap'"
)


def check_momentum(momentum: Any) -> float:
    """``momentum`` as a float in [0, 1), else a DpSgdConfigError naming it (a bool is refused)."""
    return checks.number(
        momentum, "momentum", low=0.0, high=1.0, high_open=True, error=DpSgdConfigError, message=_INVALID
    )


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


def check_optimizer(
    optimizer: str, learning_rate: float | None, momentum: float, weight_decay: float
) -> tuple[float, float]:
    """``make_private``'s optimizer settings checked: ``(learning_rate, momentum)``, the learning rate defaulted
    to 0.1 (sgd, debiased_momentum) / 0.001 (adam).

    Raises:
        DpSgdConfigError: an unknown optimizer, a bad learning rate or momentum, momentum with adam, or a weight
            decay outside [0, 1/learning_rate).
    """
    if optimizer not in OPTIMIZERS:
        raise DpSgdConfigError(f"optimizer={optimizer!r} is invalid: choose one of {OPTIMIZERS}")
    if learning_rate is None:
        learning_rate = 0.001 if optimizer == "adam" else 0.1
    learning_rate = check_positive("learning_rate", learning_rate)
    momentum = check_momentum(momentum)
    if optimizer == "adam" and momentum:
        raise DpSgdConfigError(f"momentum={momentum!r} is invalid with optimizer='adam': leave it at 0")
    checks.number(
        weight_decay,
        "weight_decay",
        low=0.0,
        high=1 / learning_rate,
        high_open=True,
        error=DpSgdConfigError,
        message="{what}={value!r} is invalid: pass a number in [0, 1/learning_rate) "
        f"(learning_rate {learning_rate}), e.g. 0.01",
    )
    return learning_rate, momentum


def check_engine(
    engine: str, keyword: str, choices: tuple[str, ...], clip_norm: Any, schedule: noise_schedules.NoiseSchedule
) -> None:
    """Refuse, before anything is read, an engine not in ``choices`` and tf_privacy with what it cannot do
    (a noise schedule, an adaptive clip). ``keyword``: the caller's argument name, for the message."""
    if engine not in choices:
        raise DpSgdConfigError(f"{keyword}={engine!r} is invalid: choose one of {choices}")
    if engine != "tf_privacy":
        return
    if not schedule.is_constant:
        raise DpSgdConfigError(
            f"noise_schedule={schedule.describe()} is invalid with {keyword}='tf_privacy' (a "
            "fixed sigma): use 'ghost' or 'vmap'"
        )
    if isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        raise DpSgdConfigError(
            f"clip_norm='adaptive' is invalid with {keyword}='tf_privacy' (a fixed clip norm): use 'ghost' or 'vmap'"
        )


def refuse_unseeded(engine: str, name: str, keyword: str) -> None:
    """Refuse the tf_privacy engine inside ``training_seed`` (DPTrainer): its noise comes from TensorFlow's
    global generator, which a module's ``tf.random.set_seed`` fixes, not from the grant's seed."""
    if engine == "tf_privacy" and _seed_active():
        raise DpSgdConfigError(
            f"{name}: {keyword}='tf_privacy' is refused under DPTrainer (training_seed): tensorflow-privacy draws "
            "its noise from TensorFlow's global generator, which tf.random.set_seed in a module fixes, not from "
            "the grant's seed; use 'ghost' (default) or 'vmap'"
        )


def check_adaptive_clip(
    clip_norm: float | adaptive_clip.AdaptiveClip,
    schedule: noise_schedules.NoiseSchedule | None,
    epsilon: float,
    delta: float,
    num_examples: int,
    batch_size: int,
    epochs: float,
    accountant: str,
) -> None:
    """Refuse an adaptive clip whose count noise sigma_b is too small for the run's calibrated noise multiplier
    (2 sigma_b must exceed it), from public numbers, before anything is read or drawn."""
    if isinstance(clip_norm, adaptive_clip.AdaptiveClip):
        run = noise_schedules.scheduled_spend(schedule, epsilon, delta, num_examples, batch_size, epochs, accountant)
        adaptive_clip.check_run(clip_norm, run.noise_multipliers, batch_size)


def check_per_unit(per_unit: Any, per_example: str) -> None:
    """Refuse a non-bool ``per_unit`` and, with ``per_unit``, an engine that cannot sum a unit's rows (ghost,
    tf_privacy: ``unit_clip.unit_engine_name``), before anything is read."""
    if not isinstance(per_unit, bool):
        raise DpSgdConfigError(f"per_unit={per_unit!r} is invalid: pass True (clip per privacy unit) or False")
    if per_unit:
        unit_engine_name(per_example)


def check_run_numbers(num_examples: Any, batch_size: Any, epochs: Any) -> tuple[int, int, float]:
    """(num_examples, batch_size, epochs) checked: positive integers (epochs a positive number); a None
    ``num_examples`` is refused naming what to pass (the ledger's DP or a public count, never the exact one)."""
    if num_examples is None:
        raise DpSgdConfigError(
            "num_examples=None is invalid: pass the ledger's DP (or a public) row count "
            "(fn_args.num_examples), never the exact private count"
        )
    return (
        check_positive("num_examples", num_examples, integer=True),
        check_positive("batch_size", batch_size, integer=True),
        check_positive("epochs", epochs),
    )


def check_make_private(
    model: Any,
    *,
    privacy_budget: tuple[float, float],
    num_examples: Any,
    clip_norm: Any,
    batch_size: Any,
    epochs: Any,
    optimizer: str,
    learning_rate: float | None,
    momentum: float,
    weight_decay: float,
    loss: Any,
    accountant: str,
    per_example: str,
    seed: int | None,
    noise_schedule: Any,
    name: str,
    per_unit: bool,
) -> dict[str, Any]:
    """``make_private``'s arguments checked, in this order, before anything is read: the ``PrivateModel``
    keyword arguments (budget split into epsilon and delta, numbers and schedule normalised).

    Raises:
        DpSgdConfigError: the first invalid or refused argument, named with the fix.
    """
    if not isinstance(model, (tf.keras.Model, types.FunctionType, types.MethodType, functools.partial)):
        raise DpSgdConfigError(
            f"model={type(model).__name__} is invalid: pass a tf.keras Sequential or Functional "
            "model (tf.keras is Keras 2 here: import sage_tfx before TensorFlow)"
        )
    epsilon, delta = check_privacy_budget(privacy_budget)
    num_examples, batch_size, epochs = check_run_numbers(num_examples, batch_size, epochs)
    clip_norm = adaptive_clip.as_clip_norm(clip_norm)
    dpsgd.num_steps(num_examples, batch_size, epochs)  # batch_size <= num_examples, named in the error
    learning_rate, momentum = check_optimizer(optimizer, learning_rate, momentum, weight_decay)
    dpsgd.check_accountant(accountant)
    schedule = noise_schedules.as_schedule(noise_schedule)  # a bad schedule is refused here
    check_engine(per_example, "per_example", PER_EXAMPLE, clip_norm, schedule)
    check_per_unit(per_unit, per_example)
    refuse_unseeded(per_example, name, "per_example")
    if per_example == "ghost" and isinstance(model, tf.keras.Model) and model.built and not ghost_applies(model):
        raise DpSgdConfigError(GHOST_REFUSED)
    # what the fit would refuse when it starts (seed= inside DPTrainer, the share, the public numbers): now
    check_fit(seed, name, (epsilon, delta), public_params(batch_size, epochs, clip_norm))
    if loss is not None:
        per_example_loss(loss, model)  # names a bad loss now, not after the data is read
    schedule.check_for_run(dpsgd.num_steps(num_examples, batch_size, epochs))
    check_adaptive_clip(clip_norm, schedule, epsilon, delta, num_examples, batch_size, epochs, accountant)
    return dict(
        epsilon=epsilon,
        delta=delta,
        num_examples=num_examples,
        clip_norm=clip_norm,
        batch_size=batch_size,
        epochs=epochs,
        optimizer=optimizer,
        learning_rate=learning_rate,
        momentum=float(momentum),
        weight_decay=float(weight_decay),
        accountant=accountant,
        loss=loss,
        per_example=per_example,
        seed=seed,
        name=name,
        noise_schedule=schedule,
        per_unit=per_unit,
    )


def public_params(batch_size: int, epochs: float, clip_norm: float | AdaptiveClip) -> dict[str, float]:
    """The fit's numbers that must be public under DPTrainer (``training_seed(public=...)``)."""
    return {"batch_size": batch_size, "epochs": epochs, **adaptive_clip.public_numbers(clip_norm)}
