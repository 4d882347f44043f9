"""The base learner: regularised ERM solved to a tolerance the sensitivity bound assumes, released by output
perturbation with the grid discrete Gaussian (the paper's Algorithms 1 and 3; docs/release_strategies.md,
"Continual and sliding-window release: the proofs").
"""

from __future__ import annotations

import math

import numpy as np

from sage_tfx.privacy.samplers import grid_gaussian

from .params import MAX_ITERATIONS, XI, ContinualReleaseError, Loss, ReleaseParams, lipschitz, smoothness


def clip_features(
    x: np.ndarray, y: np.ndarray, loss: Loss, classes: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows clipped to ||x||_2 <= 1; labels to {-1, +1} (logistic: y > 0 is +1), [-1, 1] (squared) or, for
    softmax, rounded to an integer class in 0..classes-1 (out-of-range labels clipped, never refused: the
    labels are private).

    Args:
        x: the (n, d) features.
        y: the n labels.
        loss: the model's loss.
        classes: the declared number of classes (softmax only).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ContinualReleaseError(
            f"features of shape {x.shape} and labels of shape {y.shape} do not match: "
            "give a 2-D (n, d) array and n labels"
        )
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ContinualReleaseError("features or labels hold NaN or infinity: clean the block's records first")
    norms = np.linalg.norm(x, axis=1)
    x = x / np.maximum(norms, 1.0)[:, None]
    loss = Loss(loss)
    if loss is Loss.SOFTMAX:
        if classes is None:
            raise ContinualReleaseError("classes None: the softmax loss needs the declared number of classes")
        return x, np.clip(np.rint(y), 0, int(classes) - 1)
    y = np.where(y > 0, 1.0, -1.0) if loss is Loss.LOGISTIC else np.clip(y, -1.0, 1.0)
    return x, y


def _softmax_loss_grad(w, x, y):
    k = w.size // x.shape[1]
    z = x @ w.reshape(x.shape[1], k)
    lse = np.logaddexp.reduce(z, axis=1)
    labels = y.astype(np.int64)
    p = np.exp(z - lse[:, None])
    p[np.arange(len(labels)), labels] -= 1.0
    return lse - z[np.arange(len(labels)), labels], (x.T @ p).reshape(-1)


def _loss_grad(w, x, y, loss):
    if loss is Loss.SOFTMAX:
        return _softmax_loss_grad(w, x, y)
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


def record_losses(w: np.ndarray, x: np.ndarray, y: np.ndarray, loss: Loss, classes: int | None = None) -> np.ndarray:
    """Each record's loss of w on already clipped (x, y) (``clip_features``).

    Args:
        w: the weights (softmax: the d x classes matrix, flattened row-major).
        x: the clipped (n, d) features.
        y: the clipped labels.
        loss: the model's loss.
        classes: the number of classes (softmax only; the weights' size tells it too).
    """
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    if Loss(loss) is Loss.SOFTMAX and classes is not None and w.size != x.shape[1] * int(classes):
        raise ContinualReleaseError(f"weights of size {w.size} do not fit {x.shape[1]} features x {classes} classes")
    return _loss_grad(w, x, y, Loss(loss))[0]


def predict(w: np.ndarray, x: np.ndarray, loss: Loss) -> np.ndarray:
    """The model's prediction on clipped x: the class index (softmax), the sign (logistic) or x.w (squared).

    Args:
        w: the weights (softmax: flattened d x k).
        x: the clipped (n, d) features.
        loss: the model's loss.
    """
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    if Loss(loss) is Loss.SOFTMAX:
        return np.argmax(x @ w.reshape(x.shape[1], -1), axis=1)
    z = x @ w
    return np.where(z > 0, 1.0, -1.0) if Loss(loss) is Loss.LOGISTIC else z


def empirical_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray, loss: Loss, classes: int | None = None) -> float:
    """Mean loss (unregularised) of w on (x, y), clipped here.

    Args:
        w: the weights.
        x: the (n, d) features.
        y: the n labels.
        loss: the model's loss.
        classes: the number of classes (softmax only).
    """
    x, y = clip_features(x, y, loss, classes)
    return float(np.mean(record_losses(w, x, y, loss, classes))) if len(y) else math.nan


def _project(w, radius):
    n = np.linalg.norm(w)
    return w if n <= radius else w * (radius / n)


def solve_erm(
    x: np.ndarray,
    y: np.ndarray,
    *,
    normaliser: float,
    lam: float,
    radius: float,
    loss: Loss,
    reference: np.ndarray | None = None,
    tolerance: float | None = None,
    classes: int | None = None,
) -> np.ndarray:
    """argmin_{||w|| <= R} (1/N) sum loss + (lam/2)||w - ref||^2, to gradient-mapping norm <= ``tolerance``.

    Non-private. Inputs must already be clipped (``clip_features``). The default tolerance is XI L / N, the
    one the sensitivity of ``private_erm`` assumes.

    Args:
        x: the clipped (n, d) features.
        y: the clipped labels.
        normaliser: N, the declared record count the loss sum is divided by.
        lam: the ridge weight.
        radius: the parameter ball's radius R.
        loss: the model's loss.
        reference: the point the ridge pulls toward (a released model), default 0.
        tolerance: the gradient-mapping norm to stop at (default XI L / N).
        classes: the number of classes (softmax: the weights are d x classes, flattened row-major).
    """
    loss = Loss(loss)
    d = x.shape[1] * (int(classes) if loss is Loss.SOFTMAX and classes is not None else 1)
    if loss is Loss.SOFTMAX and classes is None:
        raise ContinualReleaseError("classes None: the softmax loss needs the declared number of classes")
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
    raise ContinualReleaseError(
        f"the ERM solver did not reach tolerance {tol:.3g} in {MAX_ITERATIONS} steps "
        f"(condition number {kappa:.3g}): raise lam"
    )


def sensitivity(params: ReleaseParams, blocks: int) -> float:
    """L2 sensitivity (1 + 4 xi) L / (lam N) of ``solve_erm`` on ``blocks`` blocks (N = blocks * m0).

    Args:
        params: the release's parameters (L from its loss: 1 logistic, R + 1 squared, sqrt(2) softmax).
        blocks: the blocks the release reads.
    """
    return (1 + 4 * XI) * params.lipschitz / (params.lam * blocks * params.records_per_block)


def private_erm(
    x: np.ndarray,
    y: np.ndarray,
    *,
    params: ReleaseParams,
    blocks: int,
    sigma: float,
    rng,
    reference: np.ndarray | None = None,
) -> np.ndarray:
    """The base learner (Algorithms 1/3, output perturbation): solve_erm + grid discrete Gaussian N(0, sigma^2).

    Sensitivity ``sensitivity(params, blocks)`` (docs/release_strategies.md); guarantee rho-zCDP with
    rho = Delta^2 / (2 sigma^2) on the records of the ``blocks`` blocks given (Bun and Steinke 2016 to (eps, delta)).
    Softmax (multiclass): the same contract on the flattened d x k weights, L = sqrt(2), every one of the d k
    cells perturbed.

    Args:
        x: the (n, d) features (clipped here).
        y: the n labels (clipped here).
        params: the release's parameters.
        blocks: the blocks x, y come from (the normaliser is blocks * m0).
        sigma: the Gaussian's standard deviation.
        rng: the secure generator the noise is drawn from.
        reference: the released model the ridge pulls toward, default 0.
    """
    x, y = clip_features(x, y, params.loss, params.classes)
    n_norm = blocks * params.records_per_block
    w = solve_erm(
        x,
        y,
        normaliser=n_norm,
        lam=params.lam,
        radius=params.radius,
        loss=params.loss,
        reference=reference,
        classes=params.classes,
    )
    return grid_gaussian(w, sensitivity(params, blocks), sigma, rng=rng, cells=w.size)  # a record moves every cell
