"""Constraint sets C of the private incremental regression (Kasiviswanathan, Nissim, Jin, PODS 2017, seed 004).

The regressor theta_t is confined to a declared convex set C (public): the L2 ball {||theta||_2 <= R} (the
default), the L1 ball {||theta||_1 <= R} or the simplex {theta >= 0, sum_i theta_i <= R} (the probability simplex
scaled by R, with 0: the convex hull of 0 and R e_1 .. R e_d). The L1 ball and the simplex have small Gaussian
width w(C) = E sup_{theta in C} <g, theta>: R E max_i |g_i| <= R sqrt(2 log(2d)) and R E max(0, max_i g_i) <=
R sqrt(2 log d), against R E ||g|| ~ R sqrt(d) for the L2 ball: the geometry PrivIncReg2's bound uses. This module
has the Euclidean projection onto each (the descent's P_C), the Minkowski gauge ||theta||_C and the lifting of
PrivIncReg2 (Algorithm 3, step 9: the theta of smallest gauge with Phi theta = vartheta). All are functions of
released values and public parameters only: post-processing, no privacy statement changes with C. Numpy (and
scipy's linprog for the L1 and simplex liftings) only.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "CONSTRAINTS",
    "L2_BALL",
    "L1_BALL",
    "SIMPLEX",
    "project_ball",
    "project_l1_ball",
    "project_simplex",
    "project",
    "gauge",
    "lift",
]

L2_BALL = "l2_ball"
L1_BALL = "l1_ball"
SIMPLEX = "simplex"
CONSTRAINTS = (L2_BALL, L1_BALL, SIMPLEX)


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
    return np.sign(theta) * np.maximum(np.abs(theta) - _sphere_threshold(np.abs(theta), radius), 0.0)


def _sphere_threshold(u: np.ndarray, radius: float) -> float:
    """The tau >= 0 with sum_i max(u_i - tau, 0) = radius, for u >= 0 with sum u > radius (Duchi et al. 2008,
    Fig. 1: sort, the largest rho with u_(rho) > (sum of the rho largest - radius) / rho)."""
    u = np.sort(u)[::-1]
    cumulative = np.cumsum(u)
    k = np.arange(1, u.size + 1)
    rho = int(np.nonzero(u * k > cumulative - radius)[0][-1])
    return float((cumulative[rho] - radius) / (rho + 1.0))


def project_simplex(theta: np.ndarray, radius: float) -> np.ndarray:
    """The Euclidean projection onto {theta >= 0, sum_i theta_i <= radius}: max(theta, 0) when its sum is at most
    radius, else max(theta - tau, 0) with tau > 0 putting the sum at radius (the KKT conditions: one multiplier
    for the sum, the coordinates clipped at 0; exact up to float rounding).

    Args:
        theta: the point to project.
        radius: R > 0.
    """
    theta = np.asarray(theta, dtype=np.float64)
    positive = np.maximum(theta, 0.0)
    if float(positive.sum()) <= radius:
        return positive
    return np.maximum(theta - _sphere_threshold(positive, radius), 0.0)


def project(theta: np.ndarray, constraint: str, radius: float) -> np.ndarray:
    """P_C(theta) for C = ``constraint`` (one of ``CONSTRAINTS``) of ``radius``.

    Args:
        theta: the point to project.
        constraint: "l2_ball", "l1_ball" or "simplex".
        radius: R > 0.
    """
    if constraint == SIMPLEX:
        return project_simplex(theta, radius)
    return project_l1_ball(theta, radius) if constraint == L1_BALL else project_ball(theta, radius)


def gauge(theta: np.ndarray, constraint: str, radius: float) -> float:
    """The Minkowski functional ||theta||_C = inf{rho : theta in rho C} (<= 1 exactly on C; the simplex: sum theta
    / R, +inf when a coordinate is negative).

    Args:
        theta: the point.
        constraint: "l2_ball", "l1_ball" or "simplex".
        radius: R > 0.
    """
    theta = np.asarray(theta, dtype=np.float64)
    if constraint == SIMPLEX:
        return float(theta.sum()) / radius if float(theta.min(initial=0.0)) >= 0 else float("inf")
    order = 1 if constraint == L1_BALL else 2
    return float(np.linalg.norm(theta, order)) / radius


def lift(phi: np.ndarray, vartheta: np.ndarray, constraint: str) -> np.ndarray:
    """argmin ||theta||_C subject to Phi theta = vartheta (PrivIncReg2's step 9; the gauge's scale does not
    change the argmin). L2: the minimum-norm solution pinv(Phi) vartheta. L1: basis pursuit as a linear program
    over (theta+, theta-) >= 0 (scipy's HiGHS). Simplex: the linear program min sum theta over theta >= 0. If the
    solver fails, the L2 solution (projected onto the simplex for the simplex).

    Args:
        phi: the m x d projection matrix (public).
        vartheta: the m-dimensional estimate in Phi C.
        constraint: "l2_ball", "l1_ball" or "simplex".
    """
    least_norm = np.linalg.pinv(phi) @ vartheta
    if constraint == L2_BALL:
        return least_norm
    from scipy.optimize import linprog

    m, d = phi.shape
    if constraint == SIMPLEX:
        result = linprog(np.ones(d), A_eq=phi, b_eq=vartheta, bounds=(0, None), method="highs")
        return result.x if result.status == 0 else np.maximum(least_norm, 0.0)
    result = linprog(np.ones(2 * d), A_eq=np.hstack([phi, -phi]), b_eq=vartheta, bounds=(0, None), method="highs")
    return result.x[:d] - result.x[d:] if result.status == 0 else least_norm
