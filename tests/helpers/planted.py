"""Planted bugs shared by the audit tests (never shipped): each patches one draw of the real code."""

import numpy as np

from sage_tfx.release.growth import pmwg


def pmwg_laplace_scaled(monkeypatch, which, factor):
    """A planted PMWG: the sparse vector's draws of epsilon ``which(eps, round_eps)`` with their epsilon times
    ``factor`` (factor inf: no noise at all), PMWG's code otherwise unchanged."""
    real = pmwg.grid_laplace

    def draw(values, sensitivity, epsilon, rng=None):
        if which(epsilon):
            if factor == np.inf:
                return np.asarray(values, dtype=np.float64)
            return real(values, sensitivity, epsilon * factor, rng=rng)
        return real(values, sensitivity, epsilon, rng=rng)

    monkeypatch.setattr(pmwg, "grid_laplace", draw)
