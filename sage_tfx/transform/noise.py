"""The Laplace mechanism on exact tables, and argument checks (numpy and stdlib only).

This is the one place the tf.Transform analyzers' noise is drawn. The Beam analysis calls
`add_laplace` once, on the per-key totals of the whole data set; the benchmark calls the same
function to estimate the expected error without re-running a pipeline. The noise is the exact
discrete Laplace on a power-of-two grid (`sage_tfx.privacy.samplers.grid_laplace`), drawn from a
ChaCha20 keystream (`randomness.SecureRNG`): no floating-point leak (Mironov 2012).
"""

import math
from typing import NamedTuple

import numpy as np

from sage_tfx.privacy.checks import positive
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_laplace, grid_laplace_params

from .errors import DPTransformError


def check_epsilon(epsilon, what="epsilon"):
    """Return epsilon as a float; raise naming it unless it is finite and > 0."""
    return positive(
        epsilon,
        what,
        error=DPTransformError,
        message="{what} must be a finite number > 0, got {value!r}",
        not_number="{what} must be a positive number, got {value!r}",
    )


def check_value_range(value_range, what="value_range"):
    """Return the bound R of values clipped to [0, R]; raise naming it unless finite and > 0."""
    return check_epsilon(value_range, what)


def check_int(value, what, least=1, allow_none=False, fix=None):
    """Return ``value`` as an int; raise naming it unless an integer >= ``least`` (or None if ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise DPTransformError(
            f"{what} must be an integer >= {least}{' or None' if allow_none else ''}, got "
            f"{value!r}" + (f" ({fix})" if fix else "")
        )
    return int(value)


def check_nkeys(nkeys, what="nkeys"):
    """Return the number of keys as an int; raise naming it unless an integer >= 1."""
    return check_int(nkeys, what)


def check_seed(seed):
    """A test-only seed: None (the default: fresh OS entropy) or an int >= 0."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DPTransformError(f"seed must be None or an integer >= 0, got {seed!r}")
    return int(seed)


def add_laplace(tables, scales, seed=None, stream="", sensitivities=None, cells=None):
    """Return each exact table released with Laplace-scale noise on a grid, one exact draw per cell.

    tables: sequence of float arrays; scales: one Laplace scale b = sensitivity/epsilon per table;
    sensitivities: the L1 sensitivity Delta of each table (one record added or removed moves the
    table by at most Delta in L1); cells: how many cells of each table that change touches at most
    (default: the table's size, always safe). All tables draw, in order, from ONE generator
    `randomness.secure_rng(seed, stream)` (seed=None: a fresh 256-bit key from `secrets`; an int seed,
    e.g. the analyzer's grant-derived seed, and the stream name make it reproducible).

    Mechanism (per table, `samplers.grid_laplace`): gamma * (round(x / gamma) + Y) with gamma a public
    power of two <= min(b, Delta / k) / 2^20 and Y iid exact discrete Laplace of integer scale
    t = ceil((floor(Delta / gamma) + k) / epsilon_i), epsilon_i = Delta / b (taken one float step
    down, so never above Delta / b).
    Guarantee: each table is (Delta / b)-DP, exactly (proof in `grid_laplace`: rounding moves a
    k-cell change of L1 norm Delta by at most floor(Delta / gamma) + k grid units, and the discrete
    Laplace of scale t is (units / t)-DP for that many units); the tables compose as before.
    The noise is the float Laplace(b) it replaces up to a relative 2^-20 in scale: in law,
    gamma * Y = Lap(gamma t) + xi with |xi| < gamma (a difference of two geometrics is a difference
    of floors of exponentials), and the rounding moves x by <= gamma / 2 (`samplers.grid_laplace_coupling`).
    The tables must be sums already on each table's grid (`table_grid`: the analyzers sum their rows
    there exactly), or the rounding of a float64 sum falls outside that proof; a table that is not is
    rounded to the grid as a whole (the benchmark's estimate, the legacy callers).
    Without `sensitivities` (legacy callers, tests), Delta is taken as b and k as the table's size:
    a table of true L1 sensitivity Delta' touching k' cells is then (Delta'/b + k' gamma / b)-DP,
    i.e. at most (Delta'/b + 2^-20)-DP; every analyzer passes its sensitivities.
    """
    rng = secure_rng(seed, stream)
    out = []
    for i, (table, scale) in enumerate(zip(tables, scales)):
        table = np.asarray(table, dtype=np.float64)
        scale = float(scale)
        if sensitivities is None:
            delta, k = scale, max(1, table.size)
        else:
            delta = float(sensitivities[i])
            k = max(1, table.size) if cells is None else int(cells[i])
        out.append(grid_laplace(table, delta, _table_epsilon(scale, delta), rng, cells=k))
    return tuple(out)


def _table_epsilon(scale, sensitivity):
    """The epsilon `add_laplace` releases a table of Laplace scale b and sensitivity Delta at: Delta / b, one float
    step down (never above it)."""
    return math.nextafter(float(sensitivity) / float(scale), 0.0)


def table_grid(scale, sensitivity, cells=1) -> float:
    """The public grid gamma `add_laplace` puts a table of Laplace scale b and L1 sensitivity Delta on (one record
    touching at most `cells` cells): a function of (b, Delta, cells) only, so the records can be summed on it
    exactly before the release (`samplers.grid_sums`; `analyzers._GridSumsFn`)."""
    return grid_laplace_params(float(sensitivity), _table_epsilon(scale, sensitivity), cells)[0]


CENTRED_MEAN = "centred"  # the default: a sum of v - R/2 (sensitivity R/2) and a count, split by expected error
SAGE_MEAN = "sage"  # the paper's List. 1: a raw sum (sensitivity R) and a count, epsilon / 2 each
MEAN_FORMS = (CENTRED_MEAN, SAGE_MEAN)

# The centred form's share of epsilon for the count: 1 / (1 + 3^(1/3)) (docs/dp_preprocessing.md, "The mean's
# two forms"): it minimises the expected squared error of the mean, to first order, for a centred mean uniform
# over [-R/2, R/2] (E[(m - R/2)^2] = R^2 / 12), whatever R, n and epsilon.
CENTRED_COUNT_SHARE = 1.0 / (1.0 + 3.0 ** (1.0 / 3.0))


class MeanRelease(NamedTuple):
    """How a per-key mean is released: the two tables (count, sum of v - shift) with their Laplace scales b and L1
    sensitivities Delta (one record moves one cell of each), and the public shift c subtracted from each clipped
    value v in [0, R] before it is summed. Each table is (Delta / b)-DP; the two add up to the mean's epsilon."""

    form: str
    shift: float
    scales: tuple[float, float]
    sensitivities: tuple[float, float]

    @property
    def epsilons(self) -> tuple[float, float]:
        return (self.sensitivities[0] / self.scales[0], self.sensitivities[1] / self.scales[1])


def check_mean_form(mean_form, what="mean_form") -> str:
    """Return ``mean_form`` if it is one of MEAN_FORMS; raise naming it and the choices otherwise."""
    if not isinstance(mean_form, str) or mean_form not in MEAN_FORMS:
        raise DPTransformError(
            f"{what} must be one of {', '.join(map(repr, MEAN_FORMS))}, got {mean_form!r} "
            f"({CENTRED_MEAN!r}: the default, the smaller error; {SAGE_MEAN!r}: the paper's form)"
        )
    return mean_form


def mean_release(epsilon: float, value_range: float, mean_form: str = CENTRED_MEAN) -> MeanRelease:
    """The release of a per-key mean at ``epsilon`` for values clipped to [0, value_range] = [0, R].

    centred (default): count at epsilon_n = CENTRED_COUNT_SHARE * epsilon (sensitivity 1), sum of v - R/2 at
    epsilon - epsilon_n (sensitivity R/2: |v - R/2| <= R/2); sage: count and raw sum (sensitivity R) at epsilon / 2
    each. Guarantee, both forms: (epsilon, 0)-DP by basic composition of two Laplace releases whose epsilons add up
    to epsilon (one record has one key, so it moves one cell of each table). The analyzers, the benchmark's
    expected error and the privacy auditor all take their scales and sensitivities from here.
    """
    check_mean_form(mean_form)
    if mean_form == SAGE_MEAN:
        return MeanRelease(SAGE_MEAN, 0.0, (2.0 / epsilon, 2.0 * value_range / epsilon), (1.0, value_range))
    count_epsilon = CENTRED_COUNT_SHARE * epsilon
    half = value_range / 2.0
    return MeanRelease(CENTRED_MEAN, half, (1.0 / count_epsilon, half / (epsilon - count_epsilon)), (1.0, half))


def guarded_mean(dp_sums, dp_counts, value_range, shift=0.0):
    """Post-processing of noisy per-key sums (of v - shift) and counts into means in [0, value_range].

    A noisy count can be <= 0 (or tiny), so the denominator is floored at 1; shift plus the
    quotient is clipped into [0, value_range], where every true mean lies. Both
    steps use only the noisy values, so they cost no privacy.
    """
    return np.clip(shift + np.asarray(dp_sums) / np.maximum(np.asarray(dp_counts), 1.0), 0.0, value_range)


def guarded_variance(dp_counts, dp_centered_sums, dp_centered_squares, value_range):
    """Post-processing of noisy (count, sum of x-R/2, sum of (x-R/2)^2) into a variance in [0, R^2/4].

    Var(x) = E[(x-c)^2] - (E[x]-c)^2 for c = R/2; the centred mean is clipped into
    [-R/2, R/2] and the result into [0, R^2/4], the largest variance of values in [0, R].
    """
    n = np.maximum(np.asarray(dp_counts), 1.0)
    half = value_range / 2.0
    centred_mean = np.clip(np.asarray(dp_centered_sums) / n, -half, half)
    return np.clip(np.asarray(dp_centered_squares) / n - centred_mean**2, 0.0, half * half)
