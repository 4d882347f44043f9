"""Constraint sets C of the private incremental regression (Kasiviswanathan, Nissim, Jin, PODS 2017, seed 004).

The regressor theta_t is confined to a declared convex set C (public): the L2 ball {||theta||_2 <= R} (the
default) or the L1 ball {||theta||_1 <= R} (a set of small Gaussian width, about R sqrt(2 log d), against about
R sqrt(d) for the L2 ball: the geometry PrivIncReg2's bound uses). This module has the Euclidean projection onto
each (the descent's P_C), the Minkowski gauge ||theta||_C and the lifting of PrivIncReg2 (Algorithm 3, step 9:
the theta of smallest gauge with Phi theta = vartheta). All are functions of released values and public
parameters only: post-processing, no privacy statement changes with C. Numpy (and scipy's linprog for the L1
lifting) only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CONSTRAINTS", "L2_BALL", "L1_BALL", "project_ball", "project_l1_ball", "project", "gauge", "lift"]

L2_BALL = "l2_ball"
L1_BALL = "l1_ball"
CONSTRAINTS = (L2_BALL, L1_BALL)


def project_ball(theta: np.ndarray, radius: float) -> np.ndarray:
    """P_C(theta) for C the L2 ball of ``radius`` (Appendix B's projection).

    Args:
        theta: the point to project.
        radius: R > 0.
    """
    norm = float(np.linalg.norm(theta))
    return theta if norm <= radius else theta * (radius / norm)


def project_l1_ball(theta: np.ndarray, radius: float) -> np.ndarray:
    """The Euclidean projection onto {||theta||_1 <= radius} (Duchi et al. 2008: soft-threshold at the tau that
    puts the result on the sphere; theta itself when inside).

    Args:
        theta: the point to project.
        radius: R > 0.
    """
    theta = np.asarray(theta, dtype=np.float64)
    if float(np.abs(theta).sum()) <= radius:
        return theta
    u = np.sort(np.abs(theta))[::-1]
    cumulative = np.cumsum(u)
    k = np.arange(1, u.size + 1)
    rho = int(np.nonzero(u * k > cumulative - radius)[0][-1])
    tau = (cumulative[rho] - radius) / (rho + 1.0)
    return np.sign(theta) * np.maximum(np.abs(theta) - tau, 0.0)


def project(theta: np.ndarray, constraint: str, radius: float) -> np.ndarray:
    """P_C(theta) for C = ``constraint`` (one of ``CONSTRAINTS``) of ``radius``.

    Args:
        theta: the point to project.
        constraint: "l2_ball" or "l1_ball".
        radius: R > 0.
    """
    return project_l1_ball(theta, radius) if constraint == L1_BALL else project_ball(theta, radius)


def gauge(theta: np.ndarray, constraint: str, radius: float) -> float:
    """The Minkowski functional ||theta||_C = inf{rho : theta in rho C} (<= 1 exactly on C).

    Args:
        theta: the point.
        constraint: "l2_ball" or "l1_ball".
        radius: R > 0.
    """
    order = 1 if constraint == L1_BALL else 2
    return float(np.linalg.norm(np.asarray(theta, dtype=np.float64), order)) / radius


def lift(phi: np.ndarray, vartheta: np.ndarray, constraint: str) -> np.ndarray:
    """argmin ||theta||_C subject to Phi theta = vartheta (PrivIncReg2's step 9; the gauge's scale does not
    change the argmin). L2: the minimum-norm solution pinv(Phi) vartheta. L1: basis pursuit as a linear program
    over (theta+, theta-) >= 0 (scipy's HiGHS); if the solver fails, the L2 solution.

    Args:
        phi: the m x d projection matrix (public).
        vartheta: the m-dimensional estimate in Phi C.
        constraint: "l2_ball" or "l1_ball".
    """
    least_norm = np.linalg.pinv(phi) @ vartheta
    if constraint != L1_BALL:
        return least_norm
    from scipy.optimize import linprog

    m, d = phi.shape
    result = linprog(np.ones(2 * d), A_eq=np.hstack([phi, -phi]), b_eq=vartheta, bounds=(0, None), method="highs")
    return result.x[:d] - result.x[d:] if result.status == 0 else least_norm
