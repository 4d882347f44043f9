"""Noise schedules for DP-SGD: a noise multiplier sigma_t that changes over the run, at a fixed budget.

Hong et al., "Dynamic Policies on Differentially Private Learning" (seed 002): the shapes (constant, step,
exponential, polynomial, bound-optimal) of sigma_t = s * f_t, their exact accounting and the calibration of
the scale s. Contract: the schedule is fixed before training, so the run is the composition of Poisson-
sampled Gaussian mechanisms of multipliers sigma_t (sensitivity the clip norm), its DpEvent is exactly that
composition, and the calibrated scale gives epsilon <= the target; a shape below its floor is refused.
Numpy only (and dp_accounting, imported lazily): no TensorFlow. Details and proof: docs/models.md,
"Noise schedules" and "Noise schedules: shapes, the floor and privacy in detail".
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from . import dpsgd
from .dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    import dp_accounting

MIN_FINAL_RATIO = 0.01  # the default floor of f_{T-1} (docs/models.md: why)
LOWEST_FLOOR = 1e-8  # below it the first sigma is > 1e8 x the last: a floor that low is a typo
DEFAULT_STAGES = 10

__all__ = [
    "ScheduleKind",
    "NoiseSchedule",
    "ConstantSchedule",
    "StepSchedule",
    "ExponentialSchedule",
    "PolynomialSchedule",
    "BoundOptimalSchedule",
    "NoiseScheduleError",
    "make_schedule",
    "as_schedule",
    "schedule_event",
    "schedule_epsilon",
    "calibrate_schedule",
    "ScheduledRun",
    "scheduled_spend",
    "MIN_FINAL_RATIO",
    "LOWEST_FLOOR",
]


class NoiseScheduleError(DpSgdConfigError):
    """A noise schedule is invalid (its message names the value and the fix)."""


class ScheduleKind(str, enum.Enum):
    CONSTANT = "constant"
    STEP = "step"
    EXPONENTIAL = "exponential"
    POLYNOMIAL = "polynomial"
    BOUND_OPTIMAL = "bound_optimal"


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise NoiseScheduleError(f"{name}={value!r} is invalid: must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise NoiseScheduleError(f"{name}={value!r} is invalid: must be finite")
    return value


def _whole(value, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise NoiseScheduleError(f"{name}={value!r} is invalid: must be a whole number >= {minimum}")
    return int(value)


def _floor(value):
    value = _number(value, "floor")
    if not LOWEST_FLOOR <= value <= 1:
        raise NoiseScheduleError(
            f"floor={value!r} is invalid: must be in [{LOWEST_FLOOR}, 1] (the smallest last sigma / first "
            f"sigma a schedule may reach); e.g. {MIN_FINAL_RATIO} (the default) or 1e-4 for a full-batch run"
        )
    return value


def _ratio(value, name, floor):
    value = _number(value, name)
    if not floor <= value <= 1:
        raise NoiseScheduleError(
            f"{name}={value!r} is invalid: must be in [floor={floor}, 1] (a decay to below the floor "
            "spends the budget on the last steps); e.g. 0.5, or lower the schedule's floor"
        )
    return value


def _stage_positions(steps: int, stages: int) -> np.ndarray:
    """x in [0, 1] of each step's stage (stage = floor(t S / T), S = min(stages, T))."""
    stages = min(stages, steps)
    stage = (np.arange(steps) * stages) // steps
    return stage / (stages - 1) if stages > 1 else np.zeros(steps)


@dataclass(frozen=True, kw_only=True)
class NoiseSchedule:
    """Base of the schedule shapes: ``factors(steps)`` (f_0 = 1, non-increasing, >= ``floor``).

    Args:
        stages: contiguous blocks of steps of equal sigma (the shape is piecewise constant over them).
        floor: the smallest f_{T-1} (last sigma / first sigma) allowed, in [LOWEST_FLOOR, 1]; default
            MIN_FINAL_RATIO (docs/models.md: when a lower floor helps).
    """

    stages: int = DEFAULT_STAGES
    floor: float = MIN_FINAL_RATIO

    kind: ClassVar[ScheduleKind]  # set by subclasses

    def __post_init__(self):
        _whole(self.stages, "stages")
        _floor(self.floor)

    def _raw(self, steps: int) -> np.ndarray:
        raise NotImplementedError

    def factors(self, steps: int) -> np.ndarray:
        """The relative noise multipliers f_t of the ``steps`` steps of a run (f_0 = 1)."""
        steps = _whole(steps, "steps")
        f = np.asarray(self._raw(steps), dtype=np.float64)
        if f.shape != (steps,) or not np.all(np.isfinite(f)) or f.min() < self.floor * (1 - 1e-12):
            raise NoiseScheduleError(
                f"{self.describe()} over steps={steps} decays to {f.min():.3g} of the first sigma, below "
                f"floor={self.floor}: it would spend the budget on the last steps; use a gentler decay "
                "(a larger gamma / factor, fewer drops) or, in a full-batch strongly convex run, a lower floor"
            )
        return f

    def check_for_run(self, steps: int) -> None:
        """Refuse (NoiseScheduleError) a schedule that is invalid for a run of ``steps`` steps."""
        self.factors(steps)

    def noise_multipliers(self, scale: float, steps: int) -> np.ndarray:
        """sigma_t = scale * f_t."""
        scale = _number(scale, "scale")
        if scale <= 0:
            raise NoiseScheduleError(f"scale={scale!r} is invalid: must be > 0")
        return scale * self.factors(steps)

    @property
    def is_constant(self) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind.value}
        out.update(asdict(self))
        return out

    def describe(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in asdict(self).items())
        return f"{self.kind.value}({params})"


@dataclass(frozen=True, kw_only=True)
class ConstantSchedule(NoiseSchedule):
    """sigma_t = sigma for every step: plain DP-SGD (the default)."""

    kind = ScheduleKind.CONSTANT

    def _raw(self, steps):
        return np.ones(steps)

    @property
    def is_constant(self) -> bool:
        return True


@dataclass(frozen=True, kw_only=True)
class StepSchedule(NoiseSchedule):
    """sigma multiplied by ``factor`` in (0, 1) at ``drops`` evenly spaced points; factor**drops >= floor."""

    factor: float = 0.5
    drops: int = 2

    kind = ScheduleKind.STEP

    def __post_init__(self):
        super().__post_init__()
        factor = _number(self.factor, "factor")
        if not 0 < factor < 1:
            raise NoiseScheduleError(f"factor={self.factor!r} is invalid: must be in (0, 1), e.g. 0.5")
        drops = _whole(self.drops, "drops")
        if factor**drops < self.floor:
            raise NoiseScheduleError(
                f"factor={self.factor!r} with drops={drops} decays to {factor**drops:.3g} of the first "
                f"sigma, below floor={self.floor}: it would spend the budget on the last steps; use fewer "
                "drops or a factor closer to 1"
            )

    def _raw(self, steps):
        level = (np.arange(steps) * (self.drops + 1)) // steps
        return float(self.factor) ** level


@dataclass(frozen=True, kw_only=True)
class ExponentialSchedule(NoiseSchedule):
    """f = final_ratio ** x over the stages (x from 0 to 1); final_ratio in [floor, 1]."""

    final_ratio: float = 0.5

    kind = ScheduleKind.EXPONENTIAL

    def __post_init__(self):
        super().__post_init__()
        _ratio(self.final_ratio, "final_ratio", self.floor)

    def _raw(self, steps):
        return float(self.final_ratio) ** _stage_positions(steps, self.stages)


@dataclass(frozen=True, kw_only=True)
class PolynomialSchedule(NoiseSchedule):
    """f = final_ratio + (1 - final_ratio)(1 - x) ** power; final_ratio in [floor, 1], power > 0."""

    final_ratio: float = 0.5
    power: float = 2.0

    kind = ScheduleKind.POLYNOMIAL

    def __post_init__(self):
        super().__post_init__()
        _ratio(self.final_ratio, "final_ratio", self.floor)
        power = _number(self.power, "power")
        if not 0 < power <= 100:
            raise NoiseScheduleError(f"power={self.power!r} is invalid: must be in (0, 100], e.g. 2")

    def _raw(self, steps):
        x = _stage_positions(steps, self.stages)
        r = float(self.final_ratio)
        return r + (1 - r) * (1 - x) ** float(self.power)


@dataclass(frozen=True, kw_only=True)
class BoundOptimalSchedule(NoiseSchedule):
    """Hong et al.'s bound-optimal shape sigma_t ~ gamma^(t/4) (Lemma 3.1); gamma = 1 - 1/kappa in (0, 1)."""

    gamma: float = 0.999

    kind = ScheduleKind.BOUND_OPTIMAL

    def __post_init__(self):
        super().__post_init__()
        gamma = _number(self.gamma, "gamma")
        if not 0 < gamma < 1:
            raise NoiseScheduleError(f"gamma={self.gamma!r} is invalid: must be in (0, 1) (1 - 1/kappa), e.g. 0.999")

    def _raw(self, steps):
        stages = min(self.stages, steps)
        stage = (np.arange(steps) * stages) // steps
        first_step = np.ceil(stage * steps / stages)  # first step t of each stage
        return float(self.gamma) ** (first_step / 4.0)


_KINDS = {
    cls.kind: cls
    for cls in (ConstantSchedule, StepSchedule, ExponentialSchedule, PolynomialSchedule, BoundOptimalSchedule)
}


def make_schedule(kind: Any, **params: Any) -> NoiseSchedule:
    """A schedule from its kind (a ``ScheduleKind`` or its value) and parameters; bad ones refused."""
    try:
        kind = ScheduleKind(kind)
    except ValueError:
        raise NoiseScheduleError(
            f"noise_schedule kind={kind!r} is invalid: choose one of {[k.value for k in ScheduleKind]}"
        ) from None
    try:
        return _KINDS[kind](**params)
    except TypeError as err:
        raise NoiseScheduleError(f"noise_schedule {kind.value}: bad parameters {params!r} ({err})") from None


def as_schedule(value: Any) -> NoiseSchedule:
    """None -> constant; a NoiseSchedule as is; a kind name; a dict {"kind": ..., params}."""
    if value is None:
        return ConstantSchedule()
    if isinstance(value, NoiseSchedule):
        return value
    if isinstance(value, (str, ScheduleKind)):
        return make_schedule(value)
    if isinstance(value, dict) and "kind" in value:
        params = dict(value)
        return make_schedule(params.pop("kind"), **params)
    raise NoiseScheduleError(
        f"noise_schedule={value!r} is invalid: pass a NoiseSchedule (e.g. ExponentialSchedule(final_ratio=0.5)), "
        f"a kind name of {[k.value for k in ScheduleKind]} or a dict with a 'kind'"
    )


# --------------------------------------------------------------------------------------------- accounting


def _runs(sigmas: Sequence[float]) -> list[tuple[float, int]]:
    out: list[tuple[float, int]] = []
    for s in sigmas:
        if out and out[-1][0] == s:
            out[-1] = (s, out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out


def schedule_event(noise_multipliers: Iterable[float], sampling_rate: float) -> dp_accounting.DpEvent:
    """The DpEvent of DP-SGD steps with noise multipliers sigma_t (in order) at Poisson rate q.

    Each step is ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma_t))``; consecutive equal ones are
    grouped as ``SelfComposedDpEvent`` (the same composition). A constant schedule gives exactly
    ``dpsgd.dpsgd_event``'s event. Every sigma_t must be finite and > 0 (refused naming the step).
    """
    import dp_accounting

    sigmas = list(noise_multipliers)
    if not sigmas:
        raise NoiseScheduleError("noise_multipliers=[] is invalid: a run has at least one step")
    for t, s in enumerate(sigmas):
        if (
            isinstance(s, bool)
            or not isinstance(s, (int, float, np.integer, np.floating))
            or not math.isfinite(s)
            or s <= 0
        ):
            raise NoiseScheduleError(f"noise multiplier {s!r} of step {t} is invalid: must be finite and > 0")
    q = _number(sampling_rate, "sampling_rate")
    if not 0 < q <= 1:
        raise NoiseScheduleError(f"sampling_rate={sampling_rate!r} is invalid: must be in (0, 1]")
    events = [
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                sampling_probability=q, event=dp_accounting.GaussianDpEvent(noise_multiplier=float(s))
            ),
            n,
        )
        for s, n in _runs(sigmas)
    ]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def schedule_epsilon(
    noise_multipliers: Sequence[float], sampling_rate: float, delta: float, accountant: str = "rdp"
) -> float:
    """Epsilon at ``delta`` of the steps' composition on dp_accounting's RDP or PLD accountant."""
    _, delta = dpsgd.check_budget(1.0, delta)
    return dpsgd.event_epsilon(schedule_event(noise_multipliers, sampling_rate), delta, accountant)


def calibrate_schedule(
    schedule: NoiseSchedule,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    sampling_rate: float,
    accountant: str = "rdp",
    rtol: float = 1e-4,
    max_sigma: float = 1e4,
) -> float:
    """The scale s whose schedule ``s * f_t`` spends (epsilon, delta) over ``steps`` steps at rate q.

    dp_accounting's ``calibrate_dp_mechanism`` via ``dpsgd.calibrate_scale``: the smallest s (to
    ``rtol`` relative) whose composed event (``schedule_event``) has epsilon <= the target; never
    above it. Bad input is refused before any accounting. Memoized on the validated public numbers (a model's
    checks and its fit ask twice); a schedule class defined outside this module is searched every time.
    """
    schedule = as_schedule(schedule)
    epsilon, delta = dpsgd.check_budget(epsilon, delta)
    dpsgd.check_accountant(accountant)
    steps = _whole(steps, "steps")
    schedule.check_for_run(steps)
    q = _number(sampling_rate, "sampling_rate")
    if not 0 < q <= 1:
        raise NoiseScheduleError(f"sampling_rate={sampling_rate!r} is invalid: must be in (0, 1]")
    search = _calibrated_scale if type(schedule).__module__ == __name__ else _calibrated_scale.__wrapped__
    return search(schedule, epsilon, delta, steps, q, accountant, rtol, max_sigma)  # a user's subclass: uncached


@functools.lru_cache(maxsize=256)
def _calibrated_scale(
    schedule: NoiseSchedule,
    epsilon: float,
    delta: float,
    steps: int,
    q: float,
    accountant: str,
    rtol: float,
    max_sigma: float,
) -> float:
    """``calibrate_schedule``'s search: a deterministic function of public numbers (the schedule is frozen)."""
    factors = schedule.factors(steps)
    return dpsgd.calibrate_scale(
        lambda s: schedule_event(s * factors, q),
        epsilon,
        delta,
        accountant,
        rtol=rtol,
        max_sigma=max_sigma,
        context=f"(schedule {schedule.describe()}, steps={steps}, sampling_rate={q:.6g})",
    )


@dataclass(frozen=True, kw_only=True)
class ScheduledRun:
    """A calibrated DP-SGD run: per-step sigmas, the DpEvent of the whole schedule and its epsilon."""

    schedule: NoiseSchedule
    scale: float
    noise_multipliers: np.ndarray
    dp_event: Any
    epsilon: float
    delta: float
    steps: int
    sampling_rate: float

    def report(self) -> dict[str, Any]:
        """What a model's ``privacy_spent["noise_schedule"]`` records (JSON-friendly)."""
        sig = self.noise_multipliers
        return {
            **self.schedule.to_dict(),
            "scale": float(self.scale),
            "first_sigma": float(sig[0]),
            "last_sigma": float(sig[-1]),
            "stages": [[float(s), int(n)] for s, n in _runs(sig.tolist())],
        }


def scheduled_spend(
    schedule: Any,
    epsilon: float,
    delta: float,
    num_examples: int,
    batch_size: int,
    epochs: float,
    accountant: str = "rdp",
) -> ScheduledRun:
    """Calibrate a DP-SGD run with a noise schedule to (epsilon, delta) (what the DP models call).

    The constant schedule takes ``dpsgd.dpsgd_spend`` (the event and sigma of the models before
    schedules existed, unchanged).
    """
    schedule = as_schedule(schedule)
    q = dpsgd.sampling_rate(num_examples, batch_size)
    steps = dpsgd.num_steps(num_examples, batch_size, epochs)
    if schedule.is_constant:
        sigma, event, realised, steps = dpsgd.dpsgd_spend(epsilon, delta, num_examples, batch_size, epochs, accountant)
        _, delta = dpsgd.check_budget(epsilon, delta)
        return ScheduledRun(
            schedule=schedule,
            scale=sigma,
            noise_multipliers=np.full(steps, sigma),
            dp_event=event,
            epsilon=realised,
            delta=delta,
            steps=steps,
            sampling_rate=q,
        )
    epsilon, delta = dpsgd.check_budget(epsilon, delta)
    scale = calibrate_schedule(
        schedule, epsilon=epsilon, delta=delta, steps=steps, sampling_rate=q, accountant=accountant
    )
    sigmas = schedule.noise_multipliers(scale, steps)
    event = schedule_event(sigmas, q)
    realised = dpsgd.event_epsilon(event, delta, accountant)
    return ScheduledRun(
        schedule=schedule,
        scale=scale,
        noise_multipliers=sigmas,
        dp_event=event,
        epsilon=realised,
        delta=delta,
        steps=steps,
        sampling_rate=q,
    )
