"""The simulated workload of paper Fig. 8 (§5.4): a data stream and arriving ML pipelines.

Every number is a documented, overridable parameter of `SimConfig`; the model and its sources:
docs/simulation.md, "The model".
"""

import math
from dataclasses import asdict, dataclass, fields

import numpy as np


@dataclass(frozen=True)
class SimConfig:
    """The simulation's parameters; each a finite number > 0, checked when built.

    Args:
        rows_per_hour: records per step (one hour of data; paper §5.4, Taxi).
        epsilon: the global eps_g.
        delta: the global delta_g.
        query_delta: the delta charged per attempt (< delta).
        gamma_shape: the inter-arrival Gamma shape (1 = Poisson arrivals).
        n_min: the power law's minimum NP-SLA sample complexity (records).
        n_max: its truncation (>= n_min).
        power_law_exponent: P(n_np > x) ~ x^-power_law_exponent.
        dp_overhead: n_required = n_np * (1 + dp_overhead / eps**dp_power).
        dp_power: the exponent of eps in n_required.
        epsilon_start: privacy-adaptive training's first eps (<= epsilon).
        min_window: the first attempt's blocks (hours).
        min_epsilon: a block with less left is retired (<= epsilon_start).
        preprocessing_share: the per-attempt preprocessing share (< 1).
        dpsgd_batch: the RDP variant's DP-SGD batch size.
        dpsgd_epochs: the RDP variant's DP-SGD epochs.

    Raises:
        ValueError: a parameter out of range, naming it.
    """

    rows_per_hour: int = 16_000  # paper §5.4, Taxi
    epsilon: float = 1.0  # global eps_g (paper §5.4)
    delta: float = 1e-6  # global delta_g (paper's 1e-6 class)
    query_delta: float = 1e-9  # delta charged per attempt (leaves room for 1000 attempts per block)
    gamma_shape: float = 2.0  # inter-arrival Gamma shape (paper: Gamma, shape not given)
    n_min: float = 2_500.0  # power-law sample complexity (NP SLA records), minimum (calibrated)
    n_max: float = 1_000_000.0  # ... truncation (about 2.6 days of data)
    power_law_exponent: float = 1.5  # P(n_np > x) ~ x^-1.5
    dp_overhead: float = 0.5  # n_required = n_np * (1 + dp_overhead / eps**dp_power)
    dp_power: float = 1.0
    epsilon_start: float = 1 / 32  # privacy-adaptive training's first eps (the Sage paper §3.3: "small")
    min_window: int = 1  # blocks (hours) of the first attempt
    min_epsilon: float = 0.005  # a block with less left is retired (ledger default: eps_g/100)
    preprocessing_share: float = 0.2  # per-attempt split (adaptive.BudgetSplit defaults)
    dpsgd_batch: int = 1024  # RDP variant: DP-SGD config of the Taxi NN (the Sage paper §3.1, Tab. 1)
    dpsgd_epochs: int = 3

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"simulation parameter {f.name}={value!r} must be a finite number > 0")
        if self.n_max < self.n_min:
            raise ValueError(f"n_max={self.n_max!r} must be >= n_min={self.n_min!r}")
        if self.epsilon_start > self.epsilon:
            raise ValueError(f"epsilon_start={self.epsilon_start!r} must be <= epsilon={self.epsilon!r}")
        if self.min_epsilon > self.epsilon_start:
            raise ValueError(f"min_epsilon={self.min_epsilon!r} must be <= epsilon_start={self.epsilon_start!r}")
        if self.query_delta >= self.delta:
            raise ValueError(f"query_delta={self.query_delta!r} must be < delta={self.delta!r}")
        if not self.preprocessing_share < 1:
            raise ValueError(f"preprocessing_share={self.preprocessing_share!r} must be < 1")

    def to_dict(self):
        return asdict(self)

    def n_required(self, n_np, epsilon):
        """Records (train + test) a pipeline needs to ACCEPT at a per-block budget.

        Args:
            n_np: the pipeline's NP-SLA sample complexity (records).
            epsilon: the per-block budget of its attempts.

        Returns:
            ``n_np * (1 + dp_overhead / epsilon**dp_power)``.
        """
        return n_np * (1.0 + self.dp_overhead / epsilon**self.dp_power)


@dataclass(frozen=True)
class PipelineSpec:
    index: int
    arrival: float  # hours since the stream started
    n_np: float  # NP SLA sample complexity (records)

    @property
    def name(self):
        return f"p{self.index:05d}"


def power_law(rng, size, n_min, n_max, exponent):
    """Inverse-CDF draws from a Pareto(exponent) law on [n_min, n_max] (truncated)."""
    u = rng.random(size)
    tail = (n_max / n_min) ** -exponent  # P(n > n_max) of the untruncated law
    return n_min * (1.0 - u * (1.0 - tail)) ** (-1.0 / exponent)


def make_workload(rate, hours, seed, config=SimConfig()):
    """Pipelines arriving over [0, hours) at ``rate`` per hour; deterministic per (rate, hours, seed, config).

    Args:
        rate: the mean arrivals per hour, > 0.
        hours: the length of the arrival period, > 0.
        seed: the random generator's seed.
        config: the simulation's parameters.

    Returns:
        The list of ``PipelineSpec``, by arrival time.

    Raises:
        ValueError: a rate or hours that is not a finite number > 0.
    """
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"arrival rate {rate!r} must be a finite number > 0 (pipelines per hour)")
    if not (isinstance(hours, (int, float)) and math.isfinite(hours) and hours > 0):
        raise ValueError(f"hours {hours!r} must be a finite number > 0")
    rng = np.random.default_rng(seed)
    expected = int(rate * hours * 1.5 + 50)
    gaps = rng.gamma(config.gamma_shape, 1.0 / (rate * config.gamma_shape), size=expected)
    times = np.cumsum(gaps)
    while times[-1] < hours:  # rare: draw more
        more = rng.gamma(config.gamma_shape, 1.0 / (rate * config.gamma_shape), size=expected)
        times = np.concatenate([times, times[-1] + np.cumsum(more)])
    times = times[times < hours]
    n_np = power_law(rng, len(times), config.n_min, config.n_max, config.power_law_exponent)
    return [PipelineSpec(i, float(t), float(n)) for i, (t, n) in enumerate(zip(times, n_np))]
