"""The one allocation module (sage_tfx/privacy/allocation.py) against the simulator's former copy of the rules.

tests/helpers/oracle_allocation.py is the in-memory model the simulator used before the allocation module, written
independently of the ledger's code. Both are driven with the same random workload (fixed seeds: new blocks
with the pipelines waiting then, charges on chosen windows, finishes) and must agree exactly: every choice,
every source, every spent vector, reservation and retirement. Deterministic (fixed seeds): no false failures.
"""

import random

import pytest

from sage_tfx.privacy import allocation, allocation_policies, filters
from sage_tfx.privacy.allocation import AllocationPolicy, BlockAllocation, get_policy, register
from sage_tfx.privacy.charges import pick_source
from sage_tfx.privacy.errors import LedgerError
from sage_tfx.privacy.vocabulary import Policy, Source
from tests.helpers.oracle_allocation import Allocation as OracleAllocation


def _holdings_of(oracle, block):
    return {p: (tuple(r), tuple(u)) for p, (r, u) in oracle.reservations[block].items()}


def _holdings(state, block):
    return {p: (tuple(h["reserved"]), tuple(h["used"])) for p, h in state.holdings[block].items()}


def _assert_same(oracle, state):
    assert state.active == oracle.active
    assert state.retired == oracle.retired
    assert state.spent == oracle.spent
    for block in oracle.spent:
        assert _holdings(state, block) == _holdings_of(oracle, block), block


def _drive(seed, filt, policy, steps=600):
    rng = random.Random(seed)
    min_cost = filt.cost(epsilon=filt.epsilon / 10)
    oracle = OracleAllocation(filt, min_cost)
    state = BlockAllocation(filt, min_cost, policy)
    names = [f"p{i:02d}" for i in range(25)]
    waiting, done, blocks, charges, finishes = set(), set(), 0, 0, 0
    for step in range(steps):
        op = rng.random()
        if op < 0.15 and len(waiting) + len(done) < len(names):
            waiting.add(next(n for n in names if n not in waiting and n not in done))
        elif op < 0.40:
            block = f"b{blocks:04d}"
            blocks += 1
            shuffled = list(waiting)
            rng.shuffle(shuffled)  # the oracle sorts; the order given must not matter
            oracle.add_block(block, shuffled)
            state.add_block(block, shuffled)
        elif op < 0.92 and waiting:
            pipeline = rng.choice(sorted(waiting))
            eps = filt.epsilon * rng.choice([0.02, 0.05, 0.1, 0.2, 0.4]) * rng.uniform(0.5, 1.5)
            cost = filt.cost(epsilon=eps, delta=rng.choice([0.0, filt.delta / 50]))
            window = rng.randint(1, 4)
            for block in oracle.active:
                assert state.source(block, pipeline, cost) == oracle.source(block, pipeline, cost)
                if filt.accounting == "basic":
                    assert state.available_epsilon(block, pipeline, cost[1]) == oracle.available_epsilon(
                        block, pipeline, cost[1]
                    )
            chosen = oracle.choose(pipeline, cost, window)
            assert state.choose(pipeline, cost, window) == chosen
            if chosen is not None:
                oracle.charge(chosen, pipeline, cost)
                state.charge(chosen, pipeline, cost)
                charges += 1
        elif waiting:
            pipeline = rng.choice(sorted(waiting))
            waiting.discard(pipeline)
            done.add(pipeline)
            others = list(waiting)
            rng.shuffle(others)
            oracle.finish(pipeline, others)
            state.finish(pipeline, others)
            finishes += 1
        if step % 10 == 0:
            _assert_same(oracle, state)
    _assert_same(oracle, state)
    return charges, finishes, len(oracle.retired)


@pytest.mark.parametrize("policy", [Policy.CONSERVE, Policy.AGGRESSIVE])
@pytest.mark.parametrize("accounting", ["basic", "rdp"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_allocation_module_agrees_with_the_oracle_on_random_workloads(seed, accounting, policy):
    filt = filters.make_filter(accounting, 1.0, 1e-6)
    charges, finishes, retired = _drive(seed, filt, policy)
    # The workload exercised every rule: charges, redistribution on finish, retirement.
    assert charges > 50 and finishes > 10 and retired >= 3


def test_the_ledgers_rules_are_the_modules():
    """The ledger's source of a charge is the policy's (no second copy of the rule in ledger.py)."""

    filt = filters.BasicFilter(1.0, 1e-6)
    holdings = {"a": {"reserved": (0.5, 5e-7), "used": (0.45, 0.0)}, "b": {"reserved": (0.5, 5e-7), "used": (0.0, 0.0)}}
    spent = (0.45, 0.0)
    assert pick_source(filt, spent, (0.04, 0.0), holdings, "a") == Source.OWN
    assert get_policy("conserve").source(filt, spent, (0.04, 0.0), holdings, "a") == Source.OWN
    refused = pick_source(filt, spent, (0.1, 0.0), holdings, "a")
    assert get_policy("conserve").source(filt, spent, (0.1, 0.0), holdings, "a") is None
    assert "unreserved pool: 0 left" in refused.reason


def test_policy_registry():
    assert set(allocation.policy_names()) >= {"conserve", "aggressive"}
    assert get_policy("aggressive").plan_epsilon(0.7, 0.1) == 0.7
    assert get_policy(Policy.CONSERVE).plan_epsilon(0.7, 0.1) == 0.1
    assert get_policy(Policy.CONSERVE).plan_epsilon(0.05, 0.1) == 0.05
    with pytest.raises(LedgerError, match="policy 'fifo' is unknown: use one of conserve, aggressive"):
        get_policy("fifo")

    class Greedy(AllocationPolicy):
        name = "conserve"

        def plan_epsilon(self, available, start_epsilon):
            return available

    with pytest.raises(ValueError, match="already registered"):
        register(Greedy)
    Greedy.name = "test-greedy"
    try:
        register(Greedy)
        assert isinstance(get_policy("test-greedy"), Greedy)
        state = BlockAllocation(filters.BasicFilter(1.0, 0.0), (0.01, 0.0), "test-greedy")
        state.add_block("b0", ["x"])
        assert state.fits("b0", "x", (1.0, 0.0)) and not state.fits("b0", "y", (0.01, 0.0))
    finally:
        allocation_policies._REGISTRY.pop("test-greedy")
    with pytest.raises(TypeError):
        register(object)
