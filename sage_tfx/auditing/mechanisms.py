"""The registry of auditable mechanisms, each driven through the function the pipeline itself calls.

Every entry is a factory ``factory(epsilon) -> Mechanism`` registered under a name (``register_mechanism``). Its
``release(neighbour, seed)`` runs the shipped release once on D, or on D' = D plus one worst-case record, with
the generator the executor builds (``randomness.secure_rng(seed, stream)``) but a FRESH seed per trial. Contract:
the statistic returned is a post-processing of the release, and the claimed (epsilon, delta) is the budget the
release is called with (its stage's share of the grant). The numpy cores are registered here; DP-SGD
(``dpsgd``), the Beam analyzer (``transform_beam``) and the release strategies (``releases``) elsewhere.

Each entry's code, neighbour, statistic and claim: docs/privacy_auditing.md ("What is covered").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_gaussian, grid_laplace_sum
from sage_tfx.privacy.vocabulary import Stage

from .core import AuditConfigError, Mechanism

__all__ = [
    "register_mechanism",
    "mechanism",
    "mechanism_names",
    "describe_mechanisms",
    "DEFAULT_EPSILON",
    "gaussian_sigma",
]

DEFAULT_EPSILON = 1.0
GAUSSIAN_DELTA = 1e-5
RECORDS = 200  # the records of D (a fixed, public data set); D' adds one worst-case record

_REGISTRY: dict[str, tuple] = {}


def register_mechanism(name: str, about: str, slow: bool = False) -> Callable:
    """Decorator: register ``factory(epsilon) -> Mechanism`` under ``name``.

    Args:
        name: the name ``mechanism`` and ``sage audit-privacy`` take (registered once).
        about: one line for ``--list``.
        slow: seconds per hundred runs: the CI-sized tests leave it out.
    """

    def wrap(factory):
        if name in _REGISTRY:
            raise AuditConfigError(f"mechanism {name!r} is registered twice")
        _REGISTRY[name] = (factory, about, slow)
        return factory

    return wrap


def mechanism_names(include_slow: bool = True) -> list[str]:
    """The registered names, sorted.

    Args:
        include_slow: also the slow entries.
    """
    return sorted(n for n, (_, _, slow) in _REGISTRY.items() if include_slow or not slow)


def describe_mechanisms() -> dict[str, str]:
    """Each registered name with its one line (slow entries marked)."""
    return {n: _REGISTRY[n][1] + (" (slow)" if _REGISTRY[n][2] else "") for n in mechanism_names()}


def mechanism(name: str, epsilon: float = DEFAULT_EPSILON) -> Mechanism:
    """The registered mechanism ``name`` at claimed ``epsilon``.

    Args:
        name: one of ``mechanism_names()``.
        epsilon: the claim to run it at, in (0, 20].
    """
    if name not in _REGISTRY:
        raise AuditConfigError(
            f"unknown mechanism {name!r}: one of {', '.join(mechanism_names())} (`sage audit-privacy --list`)"
        )
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 < epsilon <= 20.0:
        raise AuditConfigError(f"epsilon {epsilon!r} must be a number in (0, 20], e.g. 1.0")
    return _REGISTRY[name][0](float(epsilon))


def gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float = 1.0) -> float:
    """The sigma at which the Gaussian mechanism's zCDP rho = Delta^2 / (2 sigma^2) converts to exactly
    (epsilon, delta) by rho + 2 sqrt(rho ln(1/delta)) = epsilon (Bun, Steinke 2016, Prop. 1.3: the conversion
    ``samplers.grid_gaussian`` states).

    Args:
        epsilon: the target epsilon.
        delta: the target delta, in (0, 1).
        l2_sensitivity: Delta.
    """
    log_term = math.log(1.0 / delta)
    root = -math.sqrt(log_term) + math.sqrt(log_term + epsilon)  # sqrt(rho)
    return l2_sensitivity / (math.sqrt(2.0) * root)


@register_mechanism("record-count", "BlockExampleGen's DP record count (components._grant.laplace_count)")
def _record_count(epsilon):
    from sage_tfx.components._grant import laplace_count

    def release(neighbour, seed):
        return laplace_count(1000 + int(neighbour), epsilon, secure_rng(seed, "record_count"))

    return Mechanism("record-count", release, epsilon)


@register_mechanism("grid-laplace-sum", "privacy.samplers.grid_laplace_sum: a sum of values in [0, 1]")
def _grid_laplace_sum(epsilon):
    base = np.full(RECORDS, 0.5)

    def release(neighbour, seed):
        records = np.append(base, 1.0) if neighbour else base
        return float(grid_laplace_sum(records, 1.0, epsilon, secure_rng(seed, "audit"))[0])

    return Mechanism("grid-laplace-sum", release, epsilon)


@register_mechanism("grid-gaussian", "privacy.samplers.grid_gaussian: one value of L2 sensitivity 1, delta = 1e-5")
def _grid_gaussian(epsilon):
    sigma = gaussian_sigma(epsilon, GAUSSIAN_DELTA)

    def release(neighbour, seed):
        return float(grid_gaussian([float(neighbour)], 1.0, sigma, secure_rng(seed, "audit"), cells=1)[0])

    return Mechanism("grid-gaussian", release, epsilon, GAUSSIAN_DELTA)


def _validator_pair(name, base, worst, bound, epsilon):
    """The validators' release (``release_pair``, what ``joint_decision`` draws) of ``base`` or ``base`` plus a
    record of value ``worst`` = B; statistic: the noisy sum S~ (the coordinate that record moves, by B; the
    complement S'~ does not move)."""
    from sage_tfx.validation.core import Mode
    from sage_tfx.validation.noisy import release_pair

    mode = Mode.parse("sage")

    def release(neighbour, seed):
        values = np.append(base, worst) if neighbour else base
        total, _ = release_pair(values, bound, epsilon, secure_rng(seed, Stage.VALIDATION.value), mode)
        return total.value

    return Mechanism(name, release, epsilon)


@register_mechanism(
    "validator-loss", "DPLossValidator's noisy loss sums (validation.noisy.release_pair), losses in [0, 1]"
)
def _validator_loss(epsilon):
    return _validator_pair("validator-loss", np.full(RECORDS, 0.3), 1.0, 1.0, epsilon)


@register_mechanism("validator-accuracy", "DPAccuracyValidator's noisy error counts (release_pair on 0/1 errors)")
def _validator_accuracy(epsilon):
    errors = (np.arange(RECORDS) % 4 == 0).astype(np.float64)
    return _validator_pair("validator-accuracy", errors, 1.0, 1.0, epsilon)


@register_mechanism(
    "validator-log-loss",
    "the log-loss validator: validation.metrics.log_losses (floor 1e-7, B = ln(1e7)) then release_pair",
)
def _validator_log_loss(epsilon):
    from sage_tfx.validation.metrics import log_losses

    floor = 1e-7  # DPModelValidator's LOG_LOSS_FLOOR
    bound = math.log(1.0 / floor)
    labels = (np.arange(RECORDS) % 2).astype(np.float64)
    losses = log_losses(labels, np.full(RECORDS, 0.7), floor=floor)
    worst = log_losses(np.array([1.0]), np.array([0.0]), floor=floor)[0]  # a confident wrong prediction: B
    return _validator_pair("validator-log-loss", losses, worst, bound, epsilon)


def _laplace_llr(x, mu, shift, scale):
    """log p(x | mu + shift) - log p(x | mu) for Laplace(scale) noise."""
    return (abs(x - mu) - abs(x - mu - shift)) / scale


def _transform_mean(name, epsilon, mean_form):
    """dp_mean_per_key's release (``transform.noise.mean_release``'s scales and sensitivities, drawn by
    ``add_laplace`` as the analyzer's Beam step draws them) of a count and a sum of v - shift for two keys; D' adds
    one record of value R to key 0, the value whose centred contribution R/2 (raw: R) is the sensitivity."""
    from sage_tfx.transform.noise import add_laplace, mean_release

    value_range = 10.0
    release = mean_release(epsilon, value_range, mean_form)
    worst = value_range - release.shift  # the record's contribution to its key's sum
    counts = np.array([RECORDS, 50.0])
    sums = np.array([RECORDS * 4.0, 200.0]) - release.shift * counts

    def release_once(neighbour, seed):
        c, s = counts.copy(), sums.copy()
        if neighbour:
            c[0] += 1.0
            s[0] += worst
        noisy_c, noisy_s = add_laplace(
            [c, s], release.scales, seed=seed, stream="dp_mean", sensitivities=release.sensitivities, cells=[1, 1]
        )
        # the log-likelihood ratio of D' to D for the two Laplace cells (the Neyman-Pearson statistic): each is
        # (|x - mu| - |x - mu - shift|) / b with mu the cell on D (public here) and the shift one record's
        return float(
            _laplace_llr(noisy_c[0], counts[0], 1.0, release.scales[0])
            + _laplace_llr(noisy_s[0], sums[0], worst, release.scales[1])
        )

    return Mechanism(name, release_once, epsilon)


@register_mechanism(
    "transform-dp-mean",
    "the dp_mean_per_key analyzer's noise, mean_form='sage' "
    "(transform.noise.add_laplace: count and raw sum, eps/2 each, "
    "value_range 10)",
)
def _transform_mean_sage(epsilon):
    from sage_tfx.transform.noise import SAGE_MEAN

    return _transform_mean("transform-dp-mean", epsilon, SAGE_MEAN)


@register_mechanism(
    "transform-dp-mean-centred",
    "the dp_mean_per_key analyzer's default noise (transform.noise."
    "add_laplace: count and sum of v - R/2, split by expected error, "
    "value_range 10)",
)
def _transform_mean_centred(epsilon):
    from sage_tfx.transform.noise import CENTRED_MEAN

    return _transform_mean("transform-dp-mean-centred", epsilon, CENTRED_MEAN)


@register_mechanism("adassp", "AdaSSP linear regression (privacy.adassp.adassp), one feature, delta = 1e-5", slow=True)
def _adassp(epsilon):
    from sage_tfx.privacy.adassp import adassp

    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, (50, 1))
    y = np.clip(0.5 * x[:, 0] + rng.normal(0.0, 0.1, 50), -1.0, 1.0)

    def release(neighbour, seed):
        xs, ys = (np.vstack([x, [[1.0]]]), np.append(y, -1.0)) if neighbour else (x, y)
        return float(adassp(xs, ys, epsilon, GAUSSIAN_DELTA, 1.0, 1.0, rng=secure_rng(seed, "adassp")).theta[0])

    return Mechanism("adassp", release, epsilon, GAUSSIAN_DELTA)


@register_mechanism(
    "transform-vocabulary",
    "the DP vocabulary (transform.vocabulary.select_vocabulary), "
    "delta = 1e-5; statistic: is a value at the threshold kept",
)
def _transform_vocabulary(epsilon):
    from sage_tfx.transform.vocabulary import select_vocabulary, threshold

    at_threshold = int(math.ceil(threshold(epsilon, GAUSSIAN_DELTA)))  # kept about half the time on D
    counts = {"common": 500, "edge": at_threshold, "other": 40}

    def release(neighbour, seed):
        exact = dict(counts, edge=at_threshold + int(neighbour))
        kept = select_vocabulary(exact, epsilon=epsilon, delta=GAUSSIAN_DELTA, seed=seed, stream="vocabulary")
        return float("edge" in kept)

    return Mechanism("transform-vocabulary", release, epsilon, GAUSSIAN_DELTA)


@register_mechanism(
    "continual-release",
    "the continual release's base learner (release.continual.private_erm) "
    "at the cumulative strategy's sigma for (epsilon, 1e-5), one block",
    slow=True,
)
def _continual_release(epsilon):
    from sage_tfx.privacy.gaussian import rdp_multiplier
    from sage_tfx.release.continual import (
        ReleaseParams,
        Strategy,
        participation_sum,
        private_erm,
        sensitivity,
    )

    params = ReleaseParams(epsilon=epsilon, delta=GAUSSIAN_DELTA, records_per_block=20)
    # the strategy's one sigma (continual._Base): z = z_eff sqrt(c), sigma = z Delta_1
    z = rdp_multiplier(epsilon, GAUSSIAN_DELTA) * math.sqrt(participation_sum(Strategy.CUMULATIVE))
    sigma = z * sensitivity(params, 1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(19, 2))
    y = (rng.uniform(size=19) < 0.5).astype(np.float64)

    def release(neighbour, seed):
        xs, ys = (np.vstack([x, [[10.0, 0.0]]]), np.append(y, 1.0)) if neighbour else (x, y)
        return float(private_erm(xs, ys, params=params, blocks=1, sigma=sigma, rng=secure_rng(seed, "continual"))[0])

    return Mechanism("continual-release", release, epsilon, GAUSSIAN_DELTA)


@register_mechanism(
    "growth-clipped-mean",
    "the growth schedules' black box (release.growth.clipped_mean): a mean "
    "of values in [0, 10] over 2 blocks of 100 declared rows",
)
def _growth_clipped_mean(epsilon):
    from sage_tfx.privacy.randomness import as_secure_rng
    from sage_tfx.release.growth import clipped_mean

    release_mean = clipped_mean(10.0, 100)
    blocks = [np.full(100, 3.0), np.full(100, 6.0)]

    def release(neighbour, seed):
        data = [np.append(blocks[0], 10.0), blocks[1]] if neighbour else blocks
        return release_mean(data, epsilon, as_secure_rng(seed))  # ScheduledRelease: as_secure_rng(its seed)

    return Mechanism("growth-clipped-mean", release, epsilon)


def _laplace_cells_llr(noisy, exact, shifts, scales):
    """The Neyman-Pearson statistic of a release of Laplace cells: sum of log p(x | exact + shift) - log p(x | exact)
    over the cells that D' moves (D's exact cells public here)."""
    return float(sum(_laplace_llr(x, mu, shift, b) for x, mu, shift, b in zip(noisy, exact, shifts, scales)))


@register_mechanism(
    "transform-quantiles",
    "the noisy grid histogram dp_quantiles / dp_bucketize draw "
    "(transform.noise.add_laplace, scale 1/eps, one draw per cell; 40 "
    "cells here; the positions are post-processing of it)",
)
def _transform_quantiles(epsilon):
    from sage_tfx.transform.noise import add_laplace

    grid = 40  # scaling.DEFAULT_GRID_SIZE is 1000: each cell is its own draw, so fewer cells change no cell's law
    counts = np.zeros(grid)
    counts[::2] = 10.0  # 200 records spread over the public range; D' adds one in cell 3 (empty on D)
    scale = 1.0 / epsilon

    def release(neighbour, seed):
        table = counts.copy()
        table[3] += float(neighbour)
        (noisy,) = add_laplace([table], [scale], seed=seed, stream="dp_quantiles", sensitivities=[1.0], cells=[1])
        return _laplace_cells_llr([noisy[3]], [counts[3]], [1.0], [scale])

    return Mechanism("transform-quantiles", release, epsilon)


@register_mechanism(
    "transform-z-score",
    "dp_scale_to_z_score's release (transform.noise.add_laplace: count, "
    "centred sum and sum of squares, eps/3 each, range [0, 10])",
)
def _transform_z_score(epsilon):
    from sage_tfx.transform.noise import add_laplace

    width = 10.0
    sensitivities = [1.0, width / 2.0, width**2 / 4.0]
    scales = [3.0 * s / epsilon for s in sensitivities]  # dp_scale_to_z_score's thirds
    centred = np.linspace(-width / 2.0, width / 2.0, RECORDS)
    exact = [float(RECORDS), float(centred.sum()), float((centred**2).sum())]
    shifts = [1.0, width / 2.0, width**2 / 4.0]  # a record at the top of the range: v - c = W/2

    def release(neighbour, seed):
        tables = [np.array([e + float(neighbour) * s]) for e, s in zip(exact, shifts)]
        noisy = add_laplace(
            tables, scales, seed=seed, stream="dp_scale_to_z_score", sensitivities=sensitivities, cells=[1, 1, 1]
        )
        return _laplace_cells_llr([n[0] for n in noisy], exact, shifts, scales)

    return Mechanism("transform-z-score", release, epsilon)


UNIT_ROWS = 5  # K: the most rows one privacy unit has in a block, on the per-unit entries


@register_mechanism(
    "record-count-unit",
    "BlockExampleGen's DP count on a stream with a privacy unit of K = 5 "
    "rows: laplace_count at split.per_row_budget(eps, 0, K); D' adds a whole "
    "unit (K rows)",
)
def _record_count_unit(epsilon):
    from sage_tfx.components._grant import laplace_count
    from sage_tfx.privacy.split import per_row_budget

    per_row, _ = per_row_budget(epsilon, 0.0, UNIT_ROWS)

    def release(neighbour, seed):
        return laplace_count(1000 + UNIT_ROWS * int(neighbour), per_row, secure_rng(seed, "record_count"))

    return Mechanism("record-count-unit", release, epsilon)


@register_mechanism(
    "growth-clipped-mean-unit",
    "the growth schedules' black box (clipped_mean, [0, 10], 2 blocks "
    "of 100) at per_row_budget(eps, 0, K = 5), as charge_lifetime "
    "hands it on a unit stream; D' adds a whole unit of K rows of 10",
)
def _growth_clipped_mean_unit(epsilon):
    from sage_tfx.privacy.randomness import as_secure_rng
    from sage_tfx.privacy.split import per_row_budget
    from sage_tfx.release.growth import clipped_mean

    release_mean = clipped_mean(10.0, 100)
    blocks = [np.full(100, 3.0), np.full(100, 6.0)]
    per_row, _ = per_row_budget(epsilon, 0.0, UNIT_ROWS)

    def release(neighbour, seed):
        data = [np.append(blocks[0], np.full(UNIT_ROWS, 10.0)), blocks[1]] if neighbour else blocks
        return release_mean(data, per_row, as_secure_rng(seed))

    return Mechanism("growth-clipped-mean-unit", release, epsilon)
