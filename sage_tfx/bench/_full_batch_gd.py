"""Full-batch noisy GD on L2-regularised logistic regression: the regime of Hong et al.'s Theorem 3.2 (seed 002).

The task. Rows x_i of the real taxi features (``taxi_task_data``: 39 standardised features), each scaled by
1 / max(1, ||x_i||) (a per-row map: every row has norm <= 1), label y_i = +-1 (big_tipper). The loss
f(theta) = mean_i log(1 + exp(-y_i x_i'theta)) + (lam / 2) ||theta||^2 is mu = lam strongly convex and
M = lambda_max(X'X / N) / 4 + lam smooth; kappa = M / mu. Each example's gradient of the data term has norm
<= ||x_i|| <= 1 = C, so clipping at C never binds (Theorem 3.2's C_t >= G).

The run. T steps of theta <- theta - (1/M) (g_t + lam theta), g_t the exact mean gradient of the data term
plus N(0, (C sigma_t / N)^2 I) (N public here; the regulariser's gradient reads no data). Every step
is a Gaussian mechanism of L2 sensitivity C / N on the mean and multiplier sigma_t; the T steps compose to
a Gaussian mechanism with sigma_eff^-2 = sum_t sigma_t^-2 (zCDP: rho = sum_t 1 / (2 sigma_t^2), the paper's
budget R = sum_t sigma_t^-2; exact, not a bound). So every schedule is scaled to the SAME R: the one the
constant schedule needs for (epsilon, delta) on dp_accounting (``noise_schedules.calibrate_schedule`` at
sampling rate 1); each schedule's realised epsilon is reported on the same accountant.

The metric: excess empirical risk f(theta_{T+1}) - f*, f* by Newton's method (non-private).
"""

import numpy as np

from sage_tfx.plots import pyplot, save_figure
from sage_tfx.privacy import noise_schedules as ns

DELTA = 1e-5


def logistic_task(x, labels, lam):
    """(X with rows of norm <= 1, y in {-1, +1}, lam, M, kappa) of the L2-regularised logistic loss."""
    x = np.asarray(x, dtype=np.float64)
    x = x / np.maximum(1.0, np.linalg.norm(x, axis=1))[:, None]
    y = np.where(np.asarray(labels) > 0, 1.0, -1.0)
    smooth = float(np.linalg.eigvalsh(x.T @ x / len(x))[-1]) / 4.0 + lam
    return x, y, lam, smooth, smooth / lam


def _data_grad(x, y, theta):
    sig = 0.5 * (1.0 - np.tanh(0.5 * y * (x @ theta)))  # 1 / (1 + exp(y x'theta)), without overflow
    return -(x.T @ (y * sig)) / len(x)


def loss(x, y, lam, theta):
    """The regularised logistic loss f(theta)."""
    return float(np.mean(np.logaddexp(0.0, -y * (x @ theta))) + 0.5 * lam * theta @ theta)


def optimum(x, y, lam, iterations=50):
    """f* (Newton's method on the strongly convex loss; non-private)."""
    theta = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = 0.5 * (1.0 + np.tanh(0.5 * y * (x @ theta)))
        hess = (x.T * (p * (1 - p))) @ x / len(x) + lam * np.eye(x.shape[1])
        theta = theta - np.linalg.solve(hess, _data_grad(x, y, theta) + lam * theta)
    return loss(x, y, lam, theta)


def equal_budget_sigmas(schedule, steps, constant_sigma):
    """sigma_t = s f_t with sum_t sigma_t^-2 = steps / constant_sigma^2 (the constant run's zCDP budget R)."""
    f = schedule.factors(steps)
    budget = steps / constant_sigma**2
    return np.sqrt(np.sum(f**-2.0) / budget) * f


def noisy_gd(task, sigmas, seed, beta=0.0, step=1.0):
    """theta_{T+1} of full-batch noisy GD with step ``step`` / M and noise multipliers ``sigmas`` (C = 1); with
    ``beta`` > 0 the noisy gradients g_t go through Hong et al.'s debiased momentum (Algorithm 2, as
    sage_tfx.models.momentum: v = beta v + (1 - beta) g_t, theta -= step / M * v / (1 - beta^t))."""
    x, y, lam, smooth, _ = task
    rng = np.random.default_rng(seed)
    theta = np.zeros(x.shape[1])
    velocity = np.zeros_like(theta)
    for t, sigma in enumerate(sigmas, start=1):
        noisy = _data_grad(x, y, theta) + rng.normal(0.0, sigma / len(x), size=theta.shape) + lam * theta
        velocity = beta * velocity + (1.0 - beta) * noisy
        theta = theta - step / smooth * velocity / (1.0 - beta**t)
    return theta


def schedules(kappa, steps, floor):
    """The compared shapes: the subsampled bench's four, and Lemma 3.1's gamma = 1 - 1/kappa per step at the
    default floor (gamma raised until its last sigma is 1/100 of the first when the true one is refused) and
    at ``floor``."""
    gamma = 1.0 - 1.0 / kappa
    last = gamma ** ((steps - 1) / 4.0)
    floored = gamma if last >= ns.MIN_FINAL_RATIO else ns.MIN_FINAL_RATIO ** (4.0 / (steps - 1))
    return {
        "constant": ns.ConstantSchedule(),
        "step": ns.StepSchedule(factor=0.5, drops=2),
        "exponential": ns.ExponentialSchedule(final_ratio=0.3),
        "polynomial": ns.PolynomialSchedule(final_ratio=0.3, power=2.0),
        "bound_optimal_floor_0.01": ns.BoundOptimalSchedule(gamma=floored, stages=steps),
        "bound_optimal": ns.BoundOptimalSchedule(gamma=gamma, stages=steps, floor=max(floor, min(1.0, last))),
    }


MOMENTUM = {"beta": 0.9, "step": 0.5}  # --momentum: Algorithm 2 at beta 0.9, step 0.5 / M (1 / M diverges early)


def compare(task, epsilon, steps, seeds, floor, momentum=False):
    """One T: per schedule (and with ``momentum`` each again through debiased momentum, ``+momentum``), the
    excess risks over the paired seeds and the realised epsilon (post-processing: the schedule's)."""
    x, y, lam, _, kappa = task
    f_star = optimum(x, y, lam)
    constant_sigma = ns.calibrate_schedule(
        ns.ConstantSchedule(), epsilon=epsilon, delta=DELTA, steps=steps, sampling_rate=1.0
    )
    out = {}
    variants = [(name, sched, {}) for name, sched in schedules(kappa, steps, floor).items()]
    if momentum:
        variants += [(f"{name}+momentum", sched, MOMENTUM) for name, sched, _ in variants]
    for name, sched, optimizer in variants:
        sigmas = equal_budget_sigmas(sched, steps, constant_sigma)
        risks = [loss(x, y, lam, noisy_gd(task, sigmas, seed, **optimizer)) - f_star for seed in range(seeds)]
        out[name] = {
            "excess_risk": risks,
            "first_sigma": float(sigmas[0]),
            "last_sigma": float(sigmas[-1]),
            "zcdp_budget_R": float(np.sum(sigmas**-2.0)),
            "realised_epsilon": _realised(sigmas, epsilon),
            "schedule": sched.describe(),
        }
    return out


def _realised(sigmas, epsilon):
    """Epsilon of the T Gaussian steps: exactly one Gaussian of sigma_eff^-2 = sum sigma_t^-2 (at rate 1)."""
    return ns.schedule_epsilon([float(np.sum(np.asarray(sigmas) ** -2.0) ** -0.5)], 1.0, DELTA)


def run_full_batch(args, data):
    """The figures of ``sage bench noise-schedule --regime full-batch`` (data: ``taxi_task_data()``)."""
    x, _, tipper = data[0], data[1], data[2]
    task = logistic_task(x, tipper, args.lam)
    kappa = task[4]
    figures = {
        "regime": "full-batch GD, L2-regularised logistic regression (strongly convex)",
        "data": f"real taxi trips (tfx wheel): {len(x)} training rows, {x.shape[1]} features, label "
        "big_tipper, rows scaled to norm <= 1",
        "lam": args.lam,
        "kappa": round(kappa, 3),
        "epsilon": args.epsilon,
        "delta": DELTA,
        "seeds": args.seeds,
        "floor": args.floor,
        "runs": [],
    }
    for mult in args.t_over_kappa:
        steps = max(2, int(round(mult * kappa)))
        result = compare(task, args.epsilon, steps, args.seeds, args.floor, args.momentum)
        base = np.array(result["constant"]["excess_risk"])
        row = {
            "t_over_kappa": mult,
            "steps": steps,
            "constant_excess_risk": float(np.median(base)),
            "ratio_vs_constant": {},
            "wins_vs_constant": {},
            "realised_epsilon": {},
            "sigma_first_last": {},
            "schedules": {},
        }
        for name, res in result.items():
            v = np.array(res["excess_risk"])
            row["ratio_vs_constant"][name] = round(float(np.median(v / base)), 4)
            row["wins_vs_constant"][name] = f"{int((v < base).sum())}/{len(v)}"
            row["realised_epsilon"][name] = round(res["realised_epsilon"], 5)
            row["sigma_first_last"][name] = [round(res["first_sigma"], 3), round(res["last_sigma"], 5)]
            row["schedules"][name] = res["schedule"]
        figures["runs"].append(row)
    if args.plot:
        figures["plot"] = plot_full_batch(figures, args.plot)
    return figures


def plot_full_batch(figures, path):
    """Ratio of excess risk vs constant (median over seeds) against T / kappa, one line per schedule."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    runs = figures["runs"]
    for name in runs[0]["ratio_vs_constant"]:
        ax.plot([r["t_over_kappa"] for r in runs], [r["ratio_vs_constant"][name] for r in runs], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T / kappa")
    ax.set_ylabel("excess risk / constant's (median of seeds)")
    ax.set_title(f"full-batch GD, logistic (kappa {figures['kappa']:.1f}), eps {figures['epsilon']:g}")
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=100)
    return path
