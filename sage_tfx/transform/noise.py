"""The Laplace mechanism on exact tables, and argument checks (numpy and stdlib only).

This is the one place the tf.Transform analyzers' noise is drawn. The Beam analysis calls
`add_laplace` once, on the per-key totals of the whole data set; the benchmark calls the same
function to estimate the expected error without re-running a pipeline. The noise is the exact
discrete Laplace on a power-of-two grid (`sage_tfx.privacy.samplers.grid_laplace`), drawn from a
ChaCha20 keystream (`randomness.SecureRNG`): no floating-point leak (Mironov 2012).
"""
import math

import numpy as np

from sage_tfx.privacy.checks import positive
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.samplers import grid_laplace, grid_laplace_params

from .errors import DPTransformError


def check_epsilon(epsilon, what="epsilon"):
    """Return epsilon as a float; raise naming it unless it is finite and > 0."""
    return positive(epsilon, what, error=DPTransformError, message="{what} must be a finite number > 0, got {value!r}",
                    not_number="{what} must be a positive number, got {value!r}")


def check_value_range(value_range, what="value_range"):
    """Return the bound R of values clipped to [0, R]; raise naming it unless finite and > 0."""
    return check_epsilon(value_range, what)


def check_int(value, what, least=1, allow_none=False, fix=None):
    """Return ``value`` as an int; raise naming it unless an integer >= ``least`` (or None if ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise DPTransformError(f"{what} must be an integer >= {least}{' or None' if allow_none else ''}, got "
                               f"{value!r}" + (f" ({fix})" if fix else ""))
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


def guarded_mean(dp_sums, dp_counts, value_range):
    """Post-processing of noisy per-key sums and counts into means in [0, value_range].

    A noisy count can be <= 0 (or tiny), so the denominator is floored at 1; the
    quotient is clipped into [0, value_range], where every true mean lies. Both
    steps use only the noisy values, so they cost no privacy.
    """
    return np.clip(np.asarray(dp_sums) / np.maximum(np.asarray(dp_counts), 1.0), 0.0, value_range)


def guarded_variance(dp_counts, dp_centered_sums, dp_centered_squares, value_range):
    """Post-processing of noisy (count, sum of x-R/2, sum of (x-R/2)^2) into a variance in [0, R^2/4].

    Var(x) = E[(x-c)^2] - (E[x]-c)^2 for c = R/2; the centred mean is clipped into
    [-R/2, R/2] and the result into [0, R^2/4], the largest variance of values in [0, R].
    """
    n = np.maximum(np.asarray(dp_counts), 1.0)
    half = value_range / 2.0
    centred_mean = np.clip(np.asarray(dp_centered_sums) / n, -half, half)
    return np.clip(np.asarray(dp_centered_squares) / n - centred_mean**2, 0.0, half * half)
