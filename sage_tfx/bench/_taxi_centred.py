"""taxi_mse's DP linear regression with a public centre (``sage bench sample-complexity --taxi-trainer centred``)."""

import math

import numpy as np

TAXI_CENTER = 0.5  # the public mid-range of every taxi_mse feature but the intercept, and of the label


def centred_release(fitted, epsilon, delta, rng):
    """taxi_mse's AdaSSP as DPLinearRegressor runs it with ``feature_center`` 0.5: the features but the intercept
    and the label shifted by their public mid-range 0.5 (||x - c||^2 <= 1 + 8/4 = 3, |y - 0.5| <= 0.5), the
    sufficient statistics of the shifted rows computed exactly from the raw ones (the intercept column gives
    the sums and the count), and the released theta mapped back to raw coefficients (w = theta, w_0 += 0.5 -
    c . theta). Same (epsilon, delta) and the same mechanism as the uncentred release; only its bounds shrink."""
    from sage_tfx.privacy import adassp

    xtx, xty = fitted
    c = np.full(xty.size, TAXI_CENTER)
    c[0] = 0.0
    count, sums, label_sum = xtx[0, 0], xtx[:, 0], xty[0]
    xtx_c = xtx - np.outer(c, sums) - np.outer(sums, c) + count * np.outer(c, c)
    xty_c = xty - c * label_sum - TAXI_CENTER * sums + TAXI_CENTER * count * c
    bound_x = math.sqrt(1.0 + (xty.size - 1) * TAXI_CENTER**2)
    theta = adassp.release(xtx_c, xty_c, epsilon, delta, bound_x, TAXI_CENTER, calibration="exact", rng=rng).theta
    w = theta.copy()
    w[0] += TAXI_CENTER - c @ theta
    return w
