"""The load simulator (paper Fig. 8): determinism, ledger invariants after a run, the qualitative ordering."""

import math

import pytest

from sage_tfx.cli import main as sage_main
from sage_tfx.simulate import SimConfig, make_workload, simulate
from sage_tfx.simulate.strategies import STREAM

SHORT = dict(hours=48, warmup=8, drain=16)


def _records(result):
    return [p.to_dict() for p in result.pipelines]


def test_same_seed_same_run_and_other_seed_differs():
    a = simulate("block-conserve", 0.7, seed=3, **SHORT)
    b = simulate("block-conserve", 0.7, seed=3, **SHORT)
    c = simulate("block-conserve", 0.7, seed=4, **SHORT)
    assert _records(a) == _records(b)
    assert a.summary()["mean_release_h"] == b.summary()["mean_release_h"]
    assert [p.spec for p in a.pipelines] != [p.spec for p in c.pipelines]


def test_workload_follows_its_parameters():
    config = SimConfig()
    specs = make_workload(2.0, 2000, seed=1, config=config)
    # Gamma arrivals at 2/h: about 4000 in 2000 h (sd of the count ~ sqrt(4000/shape) ~ 45; 5 sd bound).
    assert abs(len(specs) - 4000) < 5 * 45
    n = [s.n_np for s in specs]
    assert min(n) >= config.n_min and max(n) <= config.n_max
    # Power law, exponent 1.5: P(n > 4 n_min) = 4^-1.5 = 1/8 (minus the tiny truncation); binomial sd ~ 0.005.
    frac = sum(x > 4 * config.n_min for x in n) / len(n)
    assert abs(frac - 0.125) < 5 * math.sqrt(0.125 * 0.875 / len(n))
    # The documented default: 1.5x NP SLA's records at eps = 1.
    assert config.n_required(10_000, 1.0) == pytest.approx(15_000)


@pytest.mark.parametrize("strategy", ["block-conserve", "block-aggressive", "query"])
def test_ledger_invariants_after_a_run(strategy):
    checked = {}

    def inspect(sim):
        ledger = sim.ledger
        report = ledger.audit()
        assert report.ok, report.problems
        stream = ledger.stream(STREAM)
        blocks = ledger.blocks(STREAM)
        for block in blocks:
            assert block.spent[0] <= stream.epsilon + 1e-12, block
            assert block.spent[1] <= stream.delta, block
            # The in-memory allocation model charged exactly what the ledger charged.
            assert block.spent == pytest.approx(sim.model.spent[block.id], abs=1e-12)
            assert (block.state == "retired") == (block.id in sim.model.retired)
        assert sim.refusals == 0
        checked["blocks"] = len(blocks)
        checked["grants"] = len(ledger.grants(STREAM))
        checked["accepted"] = sum(p["outcome"] == "ACCEPT" for p in ledger.pipelines(STREAM))

    result = simulate(strategy, 1.0, seed=5, inspect=inspect, **SHORT)
    assert checked["blocks"] >= 1
    assert checked["grants"] == sum(p.attempts for p in result.pipelines) > 0
    assert checked["accepted"] == sum(p.released_at is not None for p in result.pipelines)


def test_rdp_run_keeps_every_block_within_its_filter():
    def inspect(sim):
        assert sim.ledger.audit().ok
        filt = sim.ledger.stream(STREAM).filter()
        for block in sim.ledger.blocks(STREAM):
            assert filt.admits(block.spent, filt.zero()), block
        assert sim.refusals == 0

    result = simulate("block-conserve-rdp", 0.5, seed=2, hours=24, warmup=4, drain=8, inspect=inspect)
    assert any(p.released_at is not None for p in result.pipelines)


def test_streaming_reads_each_record_at_most_once():
    def inspect(sim):
        assert sim.records_read <= sim.records_in + 1e-6

    simulate("streaming", 1.0, seed=1, inspect=inspect, **SHORT)


def test_ordering_under_load():
    """At 1 arrival per hour: Conserve releases faster than Aggressive and than streaming composition."""
    run = dict(hours=120, warmup=24, drain=48, seed=0)
    conserve = simulate("block-conserve", 1.0, **run).summary()
    aggressive = simulate("block-aggressive", 1.0, **run).summary()
    streaming = simulate("streaming", 1.0, **run).summary()
    assert conserve["mean_release_h"] < aggressive["mean_release_h"]
    assert conserve["mean_release_h"] < streaming["mean_release_h"]
    assert conserve["released"] >= streaming["released"]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(strategy="block-conserve", rate=-1.0), "-1.0"),
        (dict(strategy="block-conserve", rate=float("nan")), "nan"),
        (dict(strategy="blocks", rate=1.0), "blocks"),
        (dict(strategy="streaming", rate=1.0, hours=10, warmup=10), "warmup"),
    ],
)
def test_bad_input_is_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        simulate(**kwargs)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="dp_overhead"):
        SimConfig(dp_overhead=-0.5)
    with pytest.raises(ValueError, match="epsilon_start"):
        SimConfig(epsilon_start=2.0)


def test_cli_bad_input_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's usage error, before anything runs
        sage_main(["simulate", "--rates", "0.5,-1"])
    assert (
        exc.value.code == 2 and "argument --rates: '0.5,-1': '-1' is not a finite number > 0" in capsys.readouterr().err
    )
    assert sage_main(["simulate", "--set", "bogus=1"]) == 2
