"""The five budgeting strategies of the load simulation (paper Fig. 8), and the queued policies beside them.

Block strategies (``block-conserve``, ``block-aggressive``, ``block-conserve-rdp``) and ``query`` charge the REAL
ledger on a throw-away SQLite file (every attempt a ``request``; an in-memory ``Allocation`` only proposes
blocks); ``streaming`` reads each record once at eps_g, so needs no ledger; ``block-dpf-n``, ``block-dpf-t`` and
``block-dpack`` run the queued policies in memory (``QueuedAllocation``). Contract: no block exceeds the global
budget; an attempt ACCEPTs iff it reads at least ``config.n_required(n_np, eps)`` records (no REJECT).

Each strategy's attempt and RETRY rule: docs/simulation.md ("The model", "Policies compared").
"""

import math
import os

from sage_tfx.privacy import BudgetRefused, Ledger, curves, filters
from sage_tfx.privacy.allocation import BlockAllocation, QueuedAllocation, get_policy
from sage_tfx.privacy.split import BudgetSplit
from sage_tfx.privacy.vocabulary import Accounting, Outcome, Policy

STRATEGIES = ("query", "streaming", "block-aggressive", "block-conserve", "block-conserve-rdp")
LABELS = {
    "query": "Query composition",
    "streaming": "Streaming composition",
    "block-aggressive": "Block/Aggressive",
    "block-conserve": "Block/Conserve (Sage)",
    "block-conserve-rdp": "Block/Conserve, RDP",
}
# The queued policies as strategies of the same engine (not in STRATEGIES: the default sweep is Fig. 8's five).
POLICY_STRATEGIES = {
    Policy.CONSERVE: "block-conserve",
    Policy.AGGRESSIVE: "block-aggressive",
    Policy.DPF_N: "block-dpf-n",
    Policy.DPF_T: "block-dpf-t",
    Policy.DPACK: "block-dpack",
}
QUEUED_STRATEGIES = ("block-dpf-n", "block-dpf-t", "block-dpack")
ALL_STRATEGIES = STRATEGIES + QUEUED_STRATEGIES
LABELS.update({"block-dpf-n": "Block/DPF-N", "block-dpf-t": "Block/DPF-T", "block-dpack": "Block/DPack"})
STREAM = "sim"
HOUR = 3600.0


class PipelineState:
    """One simulated pipeline: its spec, its iterator state and what it spent."""

    def __init__(self, spec, config):
        self.spec = spec
        self.name = spec.name
        self.epsilon = config.epsilon_start
        self.window = config.min_window  # blocks (block strategies), hours of records (query, streaming)
        self.attempts = 0
        self.block_epsilon = 0.0  # sum over attempts of eps * blocks read
        self.released_at = None
        self.buffer = 0.0  # streaming: records assigned to this pipeline, unread

    def to_dict(self):
        return {
            "pipeline": self.name,
            "arrival": self.spec.arrival,
            "n_np": self.spec.n_np,
            "released_at": self.released_at,
            "attempts": self.attempts,
            "final_epsilon": self.epsilon,
            "final_window": self.window,
            "block_epsilon": self.block_epsilon,
        }


def make_strategy(name, config, workdir, policy_params=None):
    if name in QUEUED_STRATEGIES:
        return QueuedStrategy(name, config, get_policy(name[len("block-") :], (policy_params or {}).get(name)))
    if name in ("block-conserve", "block-aggressive", "block-conserve-rdp"):
        policy = Policy.AGGRESSIVE if name == "block-aggressive" else Policy.CONSERVE
        accounting = Accounting.RDP if name.endswith("rdp") else Accounting.BASIC
        return BlockStrategy(name, config, workdir, policy, accounting)
    if name == "query":
        return QueryStrategy(name, config, workdir)
    if name == "streaming":
        return StreamingStrategy(name, config)
    raise ValueError(f"strategy {name!r} is unknown: use one of {', '.join(STRATEGIES)}")


class _LedgerStrategy:
    accounting = Accounting.BASIC
    policy = Policy.CONSERVE

    def __init__(self, name, config, workdir):
        self.name, self.config = name, config
        self.path = os.path.join(workdir, f"{name}.sqlite")
        self.ledger = Ledger.open(self.path, create=True)
        self.ledger.create_stream(
            STREAM,
            config.epsilon,
            config.delta,
            accounting=self.accounting,
            policy=self.policy,
            min_epsilon=config.min_epsilon,
        )
        self.filt = self.ledger.stream(STREAM).filter()
        self.model = BlockAllocation(self.filt, self.filt.cost(epsilon=config.min_epsilon), self.policy)
        self.waiting = {}
        self.refusals = 0  # charges the model proposed but the ledger refused (expected 0)

    def arrive(self, state):
        self.ledger.register(STREAM, state.name)
        self.waiting[state.name] = state

    def cost(self, epsilon, n_rows):
        return self.filt.cost(epsilon=epsilon, delta=self.config.query_delta)

    def _charge(self, state, blocks, epsilon, cost):
        """Charge through the real ledger; mirror the charge in the model. False if refused."""
        try:
            if self.accounting == Accounting.RDP:
                self.ledger.request(state.name, STREAM, blocks=blocks, curve=cost[1:], delta=cost[0])
            else:
                self.ledger.request(state.name, STREAM, blocks=blocks, epsilon=cost[0], delta=cost[1])
        except BudgetRefused:
            self.refusals += 1
            return False
        self.model.charge(blocks, state.name, cost)
        state.attempts += 1
        state.block_epsilon += epsilon * len(blocks)
        return True

    def _release(self, state, now):
        state.released_at = now
        del self.waiting[state.name]
        self.ledger.finish(STREAM, state.name, Outcome.ACCEPT)
        self.model.finish(state.name, self.waiting)

    def close(self):
        self.ledger.close()


class BlockStrategy(_LedgerStrategy):
    def __init__(self, name, config, workdir, policy, accounting):
        self.policy, self.accounting = policy, accounting
        super().__init__(name, config, workdir)
        self.hours = 0
        self._curves = {}

    def new_hour(self, hour):
        block = f"h{hour:06d}"
        self.ledger.add_block(STREAM, block, start=(hour - 1) * HOUR, end=hour * HOUR, rows=self.config.rows_per_hour)
        self.model.add_block(block, list(self.waiting))
        self.hours = hour

    def cost(self, epsilon, n_rows):
        if self.accounting == Accounting.BASIC:
            return super().cost(epsilon, n_rows)
        key = (epsilon, n_rows)
        if key not in self._curves:
            self._curves[key] = self.filt.cost(curve=attempt_curve(epsilon, n_rows, self.config, self.filt.orders))
        return self._curves[key]

    def advance(self, state, now):
        """Run attempts until ACCEPT (True) or until the pipeline must wait for budget or blocks (False)."""
        rows = self.config.rows_per_hour
        while True:
            if self.policy == Policy.AGGRESSIVE:
                floor = self.cost(self.config.min_epsilon, rows)
                blocks = self.model.choose(state.name, floor, state.window)
                if blocks is None:
                    return False
                delta = self.config.query_delta
                epsilon = min(self.model.available_epsilon(b, state.name, delta) for b in blocks)
                epsilon = epsilon * (1 - 1e-9)  # stay clear of float ties with the ledger's own sums
                if epsilon < self.config.min_epsilon:
                    return False
                state.epsilon = epsilon
            else:
                blocks = self.model.choose(state.name, self.cost(state.epsilon, state.window * rows), state.window)
                if blocks is None:
                    return False
            n_rows = len(blocks) * rows
            if not self._charge(state, blocks, state.epsilon, self.cost(state.epsilon, n_rows)):
                return False
            if n_rows >= self.config.n_required(state.spec.n_np, state.epsilon):
                self._release(state, now)
                return True
            # RETRY (the Sage paper §3.3): double eps if it fits the allocation on the window, else the window.
            double = 2 * state.epsilon
            if (
                self.policy == Policy.CONSERVE
                and double <= self.config.epsilon
                and all(self.model.fits(b, state.name, self.cost(double, n_rows)) for b in blocks)
            ):
                state.epsilon = double
            else:
                state.window *= 2


class QueryStrategy(_LedgerStrategy):
    """Query composition: one block for the whole stream, one global budget."""

    def __init__(self, name, config, workdir):
        super().__init__(name, config, workdir)
        self.ledger.add_block(STREAM, "stream", rows=0)
        self.model.add_block("stream", [])
        self.hours = 0

    def new_hour(self, hour):
        self.hours = hour

    def advance(self, state, now):
        rows = self.config.rows_per_hour
        while True:
            if self.hours < state.window:  # waiting for the data to grow
                return False
            cost = self.cost(state.epsilon, 0)
            if not self.model.fits("stream", state.name, cost):
                return False  # the global budget is gone: this pipeline waits forever
            n_rows = self.hours * rows
            if not self._charge(state, ["stream"], state.epsilon, cost):
                return False
            if n_rows >= self.config.n_required(state.spec.n_np, state.epsilon):
                self._release(state, now)
                return True
            double = 2 * state.epsilon
            if double <= self.config.epsilon and self.model.fits("stream", state.name, self.cost(double, 0)):
                state.epsilon = double
            else:
                state.window = 2 * self.hours


class StreamingStrategy:
    """Streaming composition: every record is read by exactly one attempt, at eps_g, then discarded."""

    def __init__(self, name, config):
        self.name, self.config = name, config
        self.waiting = {}
        self.records_in = 0.0
        self.records_read = 0.0
        self.refusals = 0

    def arrive(self, state):
        state.epsilon = self.config.epsilon
        self.waiting[state.name] = state

    def new_hour(self, hour):
        self.records_in += self.config.rows_per_hour
        if self.waiting:
            share = self.config.rows_per_hour / len(self.waiting)
            for state in self.waiting.values():
                state.buffer += share

    def advance(self, state, now):
        while True:
            need = state.window * self.config.rows_per_hour
            if state.buffer + 1e-6 < need:
                return False
            state.buffer -= need  # these records are read once, then discarded
            self.records_read += need
            state.attempts += 1
            state.block_epsilon += self.config.epsilon * need / self.config.rows_per_hour
            if need >= self.config.n_required(state.spec.n_np, self.config.epsilon):
                state.released_at = now
                del self.waiting[state.name]
                return True
            state.window *= 2

    def close(self):
        pass


class QueuedStrategy:
    """Block strategy under a queued policy (DPF-N, DPF-T, DPack), on ``QueuedAllocation`` in memory."""

    def __init__(self, name, config, policy):

        self.name, self.config, self.policy = name, config, policy
        self.filt = filters.BasicFilter(config.epsilon, config.delta)
        self.model = QueuedAllocation(self.filt, self.filt.cost(epsilon=config.min_epsilon), policy)
        self.waiting = {}
        self.refusals = 0
        self.hours = 0
        self.reschedule_on_arrival = True  # an arrival unlocks budget (DPF-N): the engine lets all retry

    def arrive(self, state):
        self.model.arrive(state.spec.arrival * HOUR)
        self.waiting[state.name] = state

    def new_hour(self, hour):
        self.model.add_block(f"h{hour:06d}", hour * HOUR)
        self.hours = hour

    def cost(self, epsilon):
        return self.filt.cost(epsilon=epsilon, delta=self.config.query_delta)

    def _demand(self, state, now):
        """The pipeline's next demand: (blocks, cost); blocks None when too few fit now."""
        cost = self.cost(state.epsilon)
        return self.model.choose(cost, state.window, now * HOUR), cost

    def order(self, waiting, now):
        """The waiting pipelines in the policy's order of their next demand (the others last, arrival order)."""
        keyed = []
        for i, state in enumerate(waiting):
            blocks, cost = self._demand(state, now)
            if blocks is None:
                keyed.append(((1, 0.0, i), state))
            else:
                spents = [self.model.spent[b] for b in blocks]
                keyed.append(((0, self.policy.demand_key(self.filt, cost, spents), i), state))
        keyed.sort(key=lambda kv: kv[0])
        return [state for _, state in keyed]

    def advance(self, state, now):
        rows = self.config.rows_per_hour
        t = now * HOUR
        while True:
            blocks, cost = self._demand(state, now)
            if blocks is None:
                return False
            self.model.charge(blocks, cost, t)
            state.attempts += 1
            state.block_epsilon += state.epsilon * len(blocks)
            n_rows = len(blocks) * rows
            if n_rows >= self.config.n_required(state.spec.n_np, state.epsilon):
                state.released_at = now
                del self.waiting[state.name]
                return True
            double = 2 * state.epsilon
            if double <= self.config.epsilon and all(self.model.fits(b, self.cost(double), t) for b in blocks):
                state.epsilon = double
            else:
                state.window *= 2

    def close(self):
        pass


def attempt_curve(epsilon, n_rows, config, orders):
    """RDP curve of one attempt at per-block budget ``epsilon`` on ``n_rows`` records.

    The attempt's (eps, delta) split is ``BudgetSplit.for_epsilon`` (the
    iterator's): preprocessing eps_pre (Laplace, eps_pre-DP), training eps_t by
    DP-SGD (batch ``dpsgd_batch``, ``dpsgd_epochs`` epochs, Poisson sampling
    q = batch/n, noise multiplier calibrated so that the run alone is
    (eps_t, delta_g)-DP), validation eps_v (Laplace). Train and test records are
    disjoint (per-record 90:10 split), so by parallel composition, order by
    order, a record pays pre + max(train, val); sequential composition of RDP
    adds the preprocessing curve.
    """
    split = BudgetSplit.for_epsilon(epsilon, config.delta, config.preprocessing_share)
    train = dpsgd_curve_for_epsilon(split.training, n_rows, config, orders)

    pre = curves.laplace_curve(split.preprocessing, orders)
    val = curves.laplace_curve(split.validation, orders)
    return tuple(p + max(t, v) for p, t, v in zip(pre, train, val))


_CALIBRATION_ORDERS = (128.0, 256.0, 512.0, 1024.0)


def dpsgd_curve_for_epsilon(epsilon, n_rows, config, orders):
    """DP-SGD's RDP curve on ``orders`` with the smallest noise that is (epsilon, delta_g)-DP on its own.

    The noise multiplier is calibrated by dp_accounting's ``mechanism_calibration.calibrate_dp_mechanism``
    (Brent's method) on its RDP accountant, with extra high orders so that small epsilons can be certified,
    then moved up by the tolerance (the calibration returns a value within ``tol`` of the optimum, on either
    side; more noise is the private side). The curve charged is that mechanism's RDP on the stream's
    orders, so the ledger charges exactly what the simulated mechanism spends.
    """
    import dp_accounting
    from dp_accounting import mechanism_calibration
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    all_orders = list(orders) + [a for a in _CALIBRATION_ORDERS if a not in orders]
    q = min(1.0, config.dpsgd_batch / n_rows)
    steps = max(1, math.ceil(config.dpsgd_epochs * n_rows / config.dpsgd_batch))

    def event(sigma):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
        )

    tol = 1e-6
    try:
        sigma = (
            float(
                mechanism_calibration.calibrate_dp_mechanism(
                    lambda: rdp.RdpAccountant(orders=all_orders),
                    event,
                    epsilon,
                    config.delta,
                    bracket_interval=mechanism_calibration.LowerEndpointAndGuess(0.3, 1.0),
                    tol=tol,
                )
            )
            + tol
        )
    except (mechanism_calibration.NoBracketIntervalFoundError, mechanism_calibration.NoOptimumFoundError):
        raise ValueError(f"cannot calibrate DP-SGD to epsilon {epsilon!r} on {n_rows} records") from None
    acc = rdp.RdpAccountant(orders=all_orders)
    acc.compose(event(sigma))
    assert acc.get_epsilon(config.delta) <= epsilon, (sigma, epsilon)
    return tuple(float(v) for v in acc._rdp[: len(orders)])
