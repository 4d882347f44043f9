"""sage bench ghost-plans: a tiny run per plan (imports TensorFlow); both engines trace and time a step."""

import argparse

import pytest

from sage_tfx.bench import ghost_plans as bench

pytestmark = pytest.mark.tf


@pytest.mark.parametrize("layer", bench.LAYERS)
def test_tiny_run_times_both_engines(layer):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    figures = bench.run(parser.parse_args(["--layer", layer, "--batch", "8", "--steps", "2", "--repeats", "1"]))
    assert set(figures["cpu_s_per_step"]) == {"ghost", "vmap_fallback"}
    assert all(t > 0 for t in figures["cpu_s_per_step"].values()) and figures["speedup"] > 0
