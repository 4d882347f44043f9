"""`sage bench iteration` (sage_tfx/bench/iteration.py; docs/BENCHMARKS.md, "One iteration against stock TFX"): a
private `sage run` iteration beside TFX's stock components on the same taxi days, and the private side's CPU split
by phase (sage_tfx/phases.py). Figures are not asserted, only the JSON's shape and what must hold whatever the
machine's load: each side's min <= median, the ratios are the sides' quotients, the split's phases are the known
ones and sum to at most the private side's CPU, and both pipelines ran to their end."""

import json
import os
import subprocess
import sys

import pytest

from sage_tfx import phases

KNOWN_PHASES = {name for name, _ in phases.PHASES} | {phases.OTHER}


def test_a_stack_is_charged_to_its_first_matching_phase():
    beam = "/venv/site-packages/apache_beam/runners/direct/executor.py"
    noise = "/repo/sage_tfx/transform/noise.py"
    assert phases.classify(["<frozen importlib._bootstrap>", beam]) == "imports"  # an import inside a Beam stage
    assert phases.classify([noise, beam]) == "dp"  # a noise draw inside a Beam stage
    assert phases.classify(["/venv/site-packages/tensorflow/python/framework/func_graph.py", noise]) == "tracing"
    assert phases.classify([beam]) == "beam"
    assert phases.classify(["/venv/site-packages/tfx/orchestration/launcher.py"]) == phases.OTHER


def test_without_the_variable_nothing_is_sampled(monkeypatch):
    monkeypatch.delenv(phases.PROFILE_ENV, raising=False)
    assert phases.start() is None and phases.finish() is None


def test_bad_sizes_are_refused_before_anything_runs():
    out = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "bench", "iteration", "--repeats", "0"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "--repeats 0" in out.stderr


@pytest.mark.slow
@pytest.mark.tf
def test_bench_iteration_reports_both_sides_and_the_private_split(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "bench", "iteration", "--json", "--days", "16", "--repeats", "1"]
        + ["--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    figures = json.loads(out.stdout)
    assert figures["days"] == 16 and figures["repeats"] == 1 and figures["rows"] > 0
    for side in ("private", "stock"):
        for kind in ("wall", "cpu"):
            summary = figures[side][kind]
            assert len(summary["runs"]) == 1 and 0 < summary["min"] <= summary["median"], (side, kind)
    for kind in ("wall", "cpu"):
        for stat in ("min", "median"):
            quotient = figures["private"][kind][stat] / figures["stock"][kind][stat]
            assert figures["ratio"][f"{kind}_{stat}"] == pytest.approx(quotient, abs=1e-3)
    assert figures["outcomes"][0] in ("ACCEPT", "RETRY", "REJECT")
    split = figures["split"]
    assert set(split) <= KNOWN_PHASES and split["imports"] > 0 and split.get("dp", 0) > 0
    # the launcher and its two confined children (the iteration's, the validation's) are sampled, and what they
    # sampled is part of the CPU the whole process tree used
    assert figures["split_processes"] == 3 and set(figures["process_cpu"]) == {
        "launcher",
        "iteration_child",
        "validation_child",
    }
    imports = figures["process_imports"]
    assert set(imports) == set(figures["process_cpu"]) and all(
        0 < imports[p] <= figures["process_cpu"][p] for p in imports
    ), imports
    assert 0 < sum(split.values()) <= 1.05 * figures["private"]["cpu"]["median"]
    assert 0 < figures["dp_share"] < 1
    assert figures["stock_components"] == ["CsvExampleGen", "ImportSchemaGen", "Transform", "Trainer"] + [
        "Evaluator",
        "Pusher",
    ]
    assert not os.listdir(tmp_path)  # the runs' folders are removed
