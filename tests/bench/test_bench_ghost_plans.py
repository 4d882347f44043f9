"""sage bench ghost-layer-norm: a tiny run (imports TensorFlow); both engines trace and time a step."""

import argparse

import pytest

from sage_tfx.bench import ghost_layer_norm as bench

pytestmark = pytest.mark.tf


def test_tiny_run_times_both_engines():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    figures = bench.run(parser.parse_args(["--batch", "8", "--steps", "2", "--repeats", "1"]))
    assert set(figures["cpu_s_per_step"]) == {"ghost", "vmap_fallback"}
    assert all(t > 0 for t in figures["cpu_s_per_step"].values()) and figures["speedup"] > 0
