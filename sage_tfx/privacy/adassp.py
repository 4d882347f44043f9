"""AdaSSP: (epsilon, delta)-DP linear regression by adaptive sufficient-statistics perturbation.

Wang 2018 (arXiv 1803.02596), Algorithm 2, with the paper's constants. Contract: on rows clipped to L2
norm B_x and labels clipped to [-B_y, B_y] (non-finite values mapped to public defaults first), the three
data releases (lam_min(X'X), X'X, X'y) have sensitivities B_x^2, B_x^2 and B_x*B_y and together are
(epsilon, delta)-DP by the RDP conversion of three Gaussian mechanisms of multiplier c
(``AdaSSPResult.dp_event``); lam and theta are post-processing. Proof, the calibrations "paper" and
"exact", and the non-finite defaults: docs/models.md, "AdaSSP: sensitivity and privacy (the proof)".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import gaussian
from .checks import integer, positive, probability
from .errors import SageError
from .randomness import as_secure_rng
from .samplers import grid_gaussian, grid_gaussian_params, grid_sums

if TYPE_CHECKING:
    import dp_accounting
    import numpy.typing as npt

    from .randomness import RngLike

INVALID = "{what}={value!r} is invalid: must be {rule}"
NOT_A_NUMBER = "{what}={value!r} is not a number"

CALIBRATIONS = ("paper", "exact")


class AdaSSPConfigError(SageError, ValueError):
    """An AdaSSP parameter is invalid; the message names it."""


def _check_positive(value, name):
    return positive(value, name, error=AdaSSPConfigError, message=INVALID, not_number=NOT_A_NUMBER)


def _check_budget(epsilon, delta):
    epsilon = _check_positive(epsilon, "epsilon")
    delta = probability(delta, "delta", error=AdaSSPConfigError, message=INVALID, not_number=INVALID)
    return epsilon, delta


def paper_multiplier(epsilon: float, delta: float) -> float:
    """The paper's per-release noise multiplier c = sqrt(log(6/delta)) / (eps/3)."""
    epsilon, delta = _check_budget(epsilon, delta)
    return math.sqrt(math.log(6.0 / delta)) / (epsilon / 3.0)


def exact_multiplier(epsilon: float, delta: float, releases: int = 3) -> float:
    """Smallest per-release multiplier c making ``releases`` Gaussian-type releases jointly (eps, delta)-DP.

    ``gaussian.rdp_multiplier`` (the RDP conversion docs/models.md proves), its search started from the
    paper's c; the returned c meets the target (tolerance 1e-7 c).
    """
    epsilon, delta = _check_budget(epsilon, delta)
    return gaussian.rdp_multiplier(epsilon, delta, releases=releases, guess=paper_multiplier(epsilon, delta))


def noise_multiplier(epsilon: float, delta: float, calibration: str = "paper") -> float:
    """Per-release noise multiplier c (see docs/models.md for the proof)."""
    if calibration not in CALIBRATIONS:
        raise AdaSSPConfigError(f"calibration={calibration!r} is invalid: choose one of {CALIBRATIONS}")
    exact = exact_multiplier(epsilon, delta)
    if calibration == "exact":
        return exact
    return max(paper_multiplier(epsilon, delta), exact)


def noise_scales(
    epsilon: float,
    delta: float,
    bound_x: float,
    bound_y: float,
    dim: int,
    rho: float = 0.05,
    calibration: str = "paper",
) -> dict[str, float]:
    """The noise standard deviations and offsets AdaSSP uses (Algorithm 2's formulas)."""
    bound_x = _check_positive(bound_x, "bound_x")
    bound_y = _check_positive(bound_y, "bound_y")
    rho = probability(rho, "rho", error=AdaSSPConfigError, message=INVALID, not_number=INVALID)
    dim = integer(
        dim,
        "dim",
        low=1,
        error=AdaSSPConfigError,
        message="{what}={value!r} is invalid: need at least one feature ({rule})",
    )
    c = noise_multiplier(epsilon, delta, calibration)
    log6 = math.log(6.0 / float(delta))
    return {
        "multiplier": c,
        "lambda_min_std": c * bound_x**2,
        "lambda_min_shift": c * bound_x**2 * math.sqrt(log6),
        "ridge_target": c * bound_x**2 * math.sqrt(dim * math.log(2.0 * dim**2 / rho)),
        "xtx_std": c * bound_x**2,
        "xty_std": c * bound_x * bound_y,
    }


def clip_rows(x: npt.ArrayLike, bound_x: float) -> np.ndarray:
    """Scale each row of x down to L2 norm <= bound_x (rows already inside are unchanged).

    NaN / +-inf entries become 0.0 first (the public default, docs/models.md). The norm is taken as
    max|x_j| * ||x / max|x_j|||, so huge finite entries cannot overflow it to inf (inf * 0 = NaN).
    """
    x = np.asarray(x, dtype=float)
    x = np.where(np.isfinite(x), x, 0.0)
    if x.ndim != 2 or x.shape[1] == 0:
        return x
    peak = np.max(np.abs(x), axis=1)
    safe = np.where(peak > 0, peak, 1.0)
    unit = np.linalg.norm(x / safe[:, None], axis=1)  # ||x|| / peak, in [1, sqrt(d)] (0 for a zero row)
    scale = np.minimum(1.0, (bound_x / safe) / np.maximum(unit, 1e-300))
    return x * scale[:, None]


def clip_labels(y: npt.ArrayLike, bound_y: float) -> np.ndarray:
    """Labels clipped to [-bound_y, bound_y] (+-inf to the ends), then NaN to 0, the range's centre."""
    y = np.clip(np.asarray(y, dtype=float).reshape(-1), -bound_y, bound_y)
    return np.where(np.isnan(y), 0.0, y)


def _check_data(x, y):
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float).reshape(-1)
    if x.ndim != 2:
        raise AdaSSPConfigError(f"features must be a 2-D array, got shape {x.shape}")
    if x.shape[0] != y.shape[0]:
        raise AdaSSPConfigError("features and labels have different numbers of rows: pass one label per row")
    return x, y  # non-finite values are mapped by clip_rows / clip_labels (docs/models.md), never refused


def sufficient_statistics(
    x: npt.ArrayLike, y: npt.ArrayLike, bound_x: float, bound_y: float
) -> tuple[np.ndarray, np.ndarray]:
    """(X'X, X'y) of the clipped data. Sum them over chunks to stream large data.

    Non-finite features and labels are mapped to the public defaults of docs/models.md, then clipped:
    each row contributes x x' with ||x|| <= bound_x and x y with |y| <= bound_y (the sensitivities used).
    """
    x, y = _check_data(x, y)
    x = clip_rows(x, _check_positive(bound_x, "bound_x"))
    y = clip_labels(y, _check_positive(bound_y, "bound_y"))
    return x.T @ x, x.T @ y


def statistic_grids(
    epsilon: float,
    delta: float,
    bound_x: float,
    bound_y: float,
    dim: int,
    rho: float = 0.05,
    calibration: str = "paper",
) -> tuple:
    """(gamma_xtx, gamma_xty): the public power-of-two grids ``release`` puts X'X's upper triangle and X'y on.

    A function of the budget, the bounds and the dimension only (``samplers.grid_gaussian_params`` with the
    sensitivities, standard deviations and cells ``release`` uses), so the statistics can be summed on them
    before the release (``grid_statistics``).
    """
    epsilon, delta = _check_budget(epsilon, delta)
    scales = noise_scales(epsilon, delta, bound_x, bound_y, dim, rho, calibration)
    cells = dim * (dim + 1) // 2
    return (
        grid_gaussian_params(bound_x**2, scales["xtx_std"], cells)[0],
        grid_gaussian_params(bound_x * bound_y, scales["xty_std"], dim)[0],
    )


def grid_statistics(
    x: npt.ArrayLike, y: npt.ArrayLike, bound_x: float, bound_y: float, grids: tuple[float, float]
) -> tuple[list[int], list[int]]:
    """The upper triangle (with diagonal, row-major) of X'X and X'y of the clipped data, as exact integer sums on
    ``grids`` (``statistic_grids``): lists of Python ints. Sum them over chunks to stream large data.

    Clipping and public defaults as ``sufficient_statistics``; then each record's x x' and x y are put on the grid
    on their own and the integers added exactly (``samplers.grid_sums``): one record moves the sums by its own
    grid vector, the integer sensitivity ``grid_gaussian``'s proof uses, whatever the other records and their
    order (a float64 sum of the records would round by an amount that depends on them).
    """
    x, y = _check_data(x, y)
    x = clip_rows(x, _check_positive(bound_x, "bound_x"))
    y = clip_labels(y, _check_positive(bound_y, "bound_y"))
    upper = np.triu_indices(x.shape[1])
    outer = np.einsum("ni,nj->nij", x, x)[:, upper[0], upper[1]]
    return grid_sums(outer, grids[0]), grid_sums(x * y[:, None], grids[1])


def statistics_on_grid(upper_sums: Sequence[int], xty_sums: Sequence[int], grids: tuple[float, float]) -> tuple:
    """(X'X, X'y) as float64 from ``grid_statistics``' integer sums: gamma times each integer, exactly.

    Refused (AdaSSPConfigError) unless every sum is below 2^52 grid units, where float64 holds it and ``release``
    rounds it back to the same integer.
    """
    if any(abs(int(v)) >= 2**52 for v in list(upper_sums) + list(xty_sums)):
        raise AdaSSPConfigError(
            "X'X or X'y is too large for its grid (|sum| / gamma must stay below 2^52): "
            "fit on fewer rows or with a smaller feature_bound / label range"
        )
    dim = len(xty_sums)
    xtx = np.zeros((dim, dim))
    xtx[np.triu_indices(dim)] = np.array([int(v) for v in upper_sums], dtype=np.float64) * grids[0]
    xtx = xtx + np.triu(xtx, 1).T
    return xtx, np.array([int(v) for v in xty_sums], dtype=np.float64) * grids[1]


def prior_residuals(
    rows: npt.ArrayLike,
    labels: npt.ArrayLike,
    prior_coef: npt.ArrayLike,
    prior_intercept: float,
    low: float,
    high: float,
) -> np.ndarray:
    """Labels minus a PUBLIC prior prediction ``rows @ prior_coef + prior_intercept``, clipped to [low, high].

    Fitting the residual instead of the label makes AdaSSP's ridge shrink the coefficients towards the prior
    instead of towards 0 (``DPLinearRegressor(prior_coef=...)``). Privacy: each residual is a fixed function of
    its own record (its already clipped row and label) and of public constants, and lies in [low, high]; centred
    at (low + high) / 2 it is bounded by B_y = (high - low) / 2, so the sensitivities of docs/models.md hold
    with that B_y. A NaN residual (from a NaN label) becomes the centre, as in ``clip_labels``.
    """
    rows = np.asarray(rows, dtype=float)
    prior = rows @ np.asarray(prior_coef, dtype=float).reshape(-1) + float(prior_intercept)
    residual = np.clip(np.asarray(labels, dtype=float).reshape(-1) - prior, low, high)
    return np.where(np.isnan(residual), (low + high) / 2.0, residual)


@dataclass
class AdaSSPResult:
    theta: np.ndarray
    xtx_noisy: np.ndarray
    xty_noisy: np.ndarray
    lambda_min_noisy: float
    ridge: float
    noise_multiplier: float
    epsilon: float
    delta: float
    calibration: str

    @property
    def dp_event(self) -> dp_accounting.DpEvent:
        """dp_accounting event: three Gaussian releases of multiplier c (lam_min, X'X, X'y)."""
        import dp_accounting

        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier=self.noise_multiplier)
        return dp_accounting.ComposedDpEvent([gaussian, gaussian, gaussian])


def release(
    xtx: np.ndarray,
    xty: np.ndarray,
    epsilon: float,
    delta: float,
    bound_x: float,
    bound_y: float,
    rho: float = 0.05,
    calibration: str = "paper",
    rng: RngLike = None,
) -> AdaSSPResult:
    """AdaSSP on sufficient statistics ``xtx = X'X``, ``xty = X'y`` of CLIPPED data.

    The caller guarantees the clipping; the privacy proof in docs/models.md needs ||x_i|| <= bound_x and
    |y_i| <= bound_y. Give the statistics summed exactly on the release's grids (``statistic_grids``,
    ``grid_statistics``, ``statistics_on_grid``): the grid releases' integer sensitivity holds for those; a
    float64 sum (``sufficient_statistics``) is rounded onto the grid as a whole, and its rounding depends on the
    other records. lam_min is computed in float64 from ``xtx`` (docs/noise.md says what its proof uses).
    ``rng``: the noise generator, anything ``randomness.as_secure_rng`` takes (None: a fresh key from ``secrets``;
    an int seed, e.g. the grant-derived one, for reproducible noise; a ``SecureRNG``; a numpy Generator, whose
    next 32 bytes become the key). Every noisy number is on its release's public grid (exact discrete Gaussian).
    """
    epsilon, delta = _check_budget(epsilon, delta)
    xtx = np.asarray(xtx, dtype=float)
    xty = np.asarray(xty, dtype=float).reshape(-1)
    dim = xty.shape[0]
    if xtx.shape != (dim, dim):
        raise AdaSSPConfigError(f"X'X has shape {xtx.shape}, expected ({dim}, {dim})")
    scales = noise_scales(epsilon, delta, bound_x, bound_y, dim, rho, calibration)
    rng = as_secure_rng(rng, "adassp")
    # Three releases, each on its public grid with exact discrete Gaussian noise of std c times its sensitivity
    # (samplers.grid_gaussian; privacy in docs/models.md). cells: how many coordinates one record moves.
    lam_min = float(np.linalg.eigvalsh(xtx)[0])
    bx2 = bound_x**2
    lam_min_released = float(grid_gaussian([lam_min], bx2, scales["lambda_min_std"], rng, cells=1)[0])
    lam_min_noisy = max(0.0, lam_min_released - scales["lambda_min_shift"])
    ridge = max(0.0, scales["ridge_target"] - lam_min_noisy)
    upper = np.triu_indices(dim)
    released = grid_gaussian(xtx[upper], bx2, scales["xtx_std"], rng, cells=upper[0].size)
    xtx_noisy = np.zeros((dim, dim))
    xtx_noisy[upper] = released
    xtx_noisy = xtx_noisy + np.triu(xtx_noisy, 1).T
    xty_noisy = grid_gaussian(xty, bound_x * bound_y, scales["xty_std"], rng, cells=dim)
    theta = np.linalg.lstsq(xtx_noisy + ridge * np.eye(dim), xty_noisy, rcond=None)[0]
    return AdaSSPResult(
        theta=theta,
        xtx_noisy=xtx_noisy,
        xty_noisy=xty_noisy,
        lambda_min_noisy=lam_min_noisy,
        ridge=ridge,
        noise_multiplier=scales["multiplier"],
        epsilon=epsilon,
        delta=delta,
        calibration=calibration,
    )


def adassp(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    epsilon: float,
    delta: float,
    bound_x: float,
    bound_y: float,
    rho: float = 0.05,
    calibration: str = "paper",
    rng: RngLike = None,
) -> AdaSSPResult:
    """(epsilon, delta)-DP linear regression coefficients of y on x (no intercept column added).

    Rows of x are clipped to L2 norm ``bound_x`` and y to [-bound_y, bound_y]
    before anything is computed; the bounds must be public (not derived from the data). X'X and X'y are
    summed exactly on the release's grids (``grid_statistics``) before the noise is added.
    """
    x = np.asarray(x, dtype=float)
    dim = x.shape[1] if x.ndim == 2 else 0
    grids = statistic_grids(epsilon, delta, bound_x, bound_y, max(dim, 1), rho, calibration)
    xtx, xty = statistics_on_grid(*grid_statistics(x, y, bound_x, bound_y, grids), grids)
    return release(xtx, xty, epsilon, delta, bound_x, bound_y, rho, calibration, rng)
