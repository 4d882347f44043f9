"""The statistical test of a DP release on neighbouring data sets, as the unit tests run it.

``violations(d, d_prime, base, epsilon)``: ``d`` are draws of the release on D (one unit more), ``d_prime`` on D'.
For S = {out >= base + cut} and {out <= base + 1 - cut} at each cut, it checks P[M(D) in S] <= e^eps P[M(D') in S]
(and the mirror), allowing 4.5 standard errors (binomial variance of both rates): a correct release fails one
comparison with probability below 3.4e-6, the 8 of four cuts below 3e-5 (union bound).
"""

import math

import numpy as np

CUTS = (0.5, 1.0, 2.0, 4.0)


def violations(d: np.ndarray, d_prime: np.ndarray, base: float, epsilon: float, cuts=CUTS) -> list:
    """The (cut, p, q) of every comparison beyond e^epsilon (empty: within it)."""
    bound, draws, bad = math.exp(epsilon), len(d), []
    for cut in cuts:
        for p, q in (
            ((d >= base + cut).mean(), (d_prime >= base + cut).mean()),
            ((d_prime <= base + 1.0 - cut).mean(), (d <= base + 1.0 - cut).mean()),
        ):
            se = math.sqrt(p * (1 - p) / draws + bound**2 * q * (1 - q) / draws)
            if p > bound * q + 4.5 * max(se, 1.0 / draws):
                bad.append((cut, p, q))
    return bad
