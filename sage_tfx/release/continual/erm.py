"""The base learner: regularised ERM solved to a tolerance the sensitivity bound assumes, released by output
perturbation with the grid discrete Gaussian (the paper's Algorithms 1 and 3; docs/release_strategies.md,
"Continual and sliding-window release: the proofs").
"""
from __future__ import annotations

import math

import numpy as np

from sage_tfx.privacy.samplers import grid_gaussian

from .params import MAX_ITERATIONS, XI, ContinualReleaseError, Loss, ReleaseParams, lipschitz, smoothness


def clip_features(x: np.ndarray, y: np.ndarray, loss: Loss) -> tuple[np.ndarray, np.ndarray]:
    """Rows clipped to ||x||_2 <= 1; labels to {-1, +1} (logistic: y > 0 is +1) or [-1, 1] (squared)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ContinualReleaseError(f"features of shape {x.shape} and labels of shape {y.shape} do not match: "
                                    "give a 2-D (n, d) array and n labels")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ContinualReleaseError("features or labels hold NaN or infinity: clean the block's records first")
    norms = np.linalg.norm(x, axis=1)
    x = x / np.maximum(norms, 1.0)[:, None]
    y = np.where(y > 0, 1.0, -1.0) if Loss(loss) is Loss.LOGISTIC else np.clip(y, -1.0, 1.0)
    return x, y


def _loss_grad(w, x, y, loss):
    z = x @ w
    if loss is Loss.LOGISTIC:
        m = y * z
        value = np.logaddexp(0.0, -m)
        g = -y * np.exp(-np.logaddexp(0.0, m))  # d/dz log(1 + e^{-yz}) = -y sigmoid(-yz)
    else:
        r = z - y
        value = 0.5 * r * r
        g = r
    return value, x.T @ g


def empirical_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray, loss: Loss) -> float:
    """Mean loss (unregularised) of w on clipped (x, y)."""
    x, y = clip_features(x, y, loss)
    return float(np.mean(_loss_grad(np.asarray(w, dtype=np.float64), x, y, Loss(loss))[0])) if len(y) else math.nan


def _project(w, radius):
    n = np.linalg.norm(w)
    return w if n <= radius else w * (radius / n)


def solve_erm(x: np.ndarray, y: np.ndarray, *, normaliser: float, lam: float, radius: float, loss: Loss,
              reference: np.ndarray | None = None, tolerance: float | None = None) -> np.ndarray:
    """argmin_{||w|| <= R} (1/N) sum loss + (lam/2)||w - ref||^2, to gradient-mapping norm <= ``tolerance``.

    Non-private. Inputs must already be clipped (``clip_features``). The default tolerance is XI L / N, the
    one the sensitivity of ``private_erm`` assumes.
    """
    loss = Loss(loss)
    d = x.shape[1]
    ref = np.zeros(d) if reference is None else np.asarray(reference, dtype=np.float64)
    L = lipschitz(loss, radius)
    tol = XI * L / normaliser if tolerance is None else tolerance
    beta = smoothness(loss) * len(y) / normaliser + lam
    step = 1.0 / beta
    w = _project(ref.copy(), radius)
    # Accelerated projected gradient with constant momentum (strongly convex case); the stopping test is on
    # the gradient mapping at the iterate w itself, which is what the sensitivity proof needs.
    kappa = beta / lam
    momentum = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)

    def grad(u):
        return _loss_grad(u, x, y, loss)[1] / normaliser + lam * (u - ref)

    v = w.copy()
    for _ in range(MAX_ITERATIONS):
        if np.linalg.norm(w - _project(w - step * grad(w), radius)) / step <= tol:
            return w
        w_next = _project(v - step * grad(v), radius)
        v = w_next + momentum * (w_next - w)
        w = w_next
    raise ContinualReleaseError(f"the ERM solver did not reach tolerance {tol:.3g} in {MAX_ITERATIONS} steps "
                                f"(condition number {kappa:.3g}): raise lam")


def sensitivity(params: ReleaseParams, blocks: int) -> float:
    """L2 sensitivity (1 + 4 xi) L / (lam N) of ``solve_erm`` on ``blocks`` blocks (N = blocks * m0)."""
    return (1 + 4 * XI) * params.lipschitz / (params.lam * blocks * params.records_per_block)


def private_erm(x: np.ndarray, y: np.ndarray, *, params: ReleaseParams, blocks: int, sigma: float, rng,
                reference: np.ndarray | None = None) -> np.ndarray:
    """The base learner (Algorithms 1/3, output perturbation): solve_erm + grid discrete Gaussian N(0, sigma^2).

    Sensitivity ``sensitivity(params, blocks)`` (docs/release_strategies.md); guarantee rho-zCDP with
    rho = Delta^2 / (2 sigma^2) on the records of the ``blocks`` blocks given (Bun and Steinke 2016 to (eps, delta)).
    """
    x, y = clip_features(x, y, params.loss)
    n_norm = blocks * params.records_per_block
    w = solve_erm(x, y, normaliser=n_norm, lam=params.lam, radius=params.radius, loss=params.loss,
                  reference=reference)
    return grid_gaussian(w, sensitivity(params, blocks), sigma, rng=rng, cells=w.size)  # a record moves every cell
