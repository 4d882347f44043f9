"""sage bench dp-sgd, the TFX taxi wide-and-deep part: the model is TFX's own architecture, and a tiny run
gives sane figures (GENERATED rows; imports TensorFlow). Never checks speed."""

import argparse

import pytest

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)
from sage_tfx.bench import dp_sgd as bench  # noqa: E402


def _signature(model):
    import tensorflow as tf

    layers = [
        (type(layer).__name__, tuple(tuple(w.shape) for w in layer.weights))
        for layer in model.layers
        if not isinstance(layer, tf.keras.layers.InputLayer)
    ]
    inputs = sorted((t.name.split(":")[0], t.dtype.name, tuple(t.shape)) for t in model.inputs)
    return sorted(layers), inputs, model.count_params()


def test_wide_and_deep_is_tfx_taxi_architecture():
    tfx_module = pytest.importorskip("tfx.examples.chicago_taxi_pipeline.taxi_utils_native_keras")
    ours = bench.build_wide_and_deep(0)
    theirs = tfx_module._build_keras_model()  # default hidden units 100/70/50/25
    assert _signature(ours) == _signature(theirs)


@pytest.mark.slow(weight=20)  # 26 s alone at load 10
def test_tiny_wide_deep_run():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--only-wide-deep",
            "--wide-deep-rows",
            "3000",
            "--wide-deep-batch",
            "100",
            "--wide-deep-steps",
            "4",
            "--warmup",
            "1",
            "--repeats",
            "2",
        ]
    )
    figures = bench.run(args)
    assert "GENERATED" in figures["wide_deep_data"]
    assert figures["wide_deep_implementation"] == "make_private/ghost"
    assert figures["wide_deep_timed_steps"] >= 4
    assert figures["wide_deep_dp_examples_per_second"] > 0 and figures["wide_deep_nondp_examples_per_second"] > 0
    assert len(figures["wide_deep_overhead_ratio_all"]) == 2
    assert figures["wide_deep_overhead_ratio"] > 0 and figures["wide_deep_overhead_ratio_total_time"] > 0
    with pytest.raises(SystemExit, match="--wide-deep-batch 5000 exceeds"):
        bench.run(parser.parse_args(["--only-wide-deep", "--wide-deep-rows", "3000", "--wide-deep-batch", "5000"]))


@pytest.mark.slow  # six whole fits of two models: 41 s and a 15 s teardown alone at load 10
def test_tiny_whole_fit_comparison():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = ["--only-fit", "--fit-rows", "1000", "--fit-batch", "100", "--fit-epochs", "1", "--fit-repeats", "1"]
    figures = bench.run(parser.parse_args(args))
    assert "GENERATED" in figures["fit_setting"]
    for model in bench.DEFAULT_FIT_MODELS:
        one = figures["fit_comparison"][model]
        for side in ("make_private", "tf_privacy_fast"):
            for key in ("fit", "first_step", "step"):
                assert one[f"{side}_{key}_ratio"]["median"] > 0
        assert one["keras_fit_cpu_s"]["min"] >= one["keras_first_step_cpu_s"]["min"] > 0


def test_nn_repeats_give_median_min_and_runs():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = ["--skip-taxi-nn", "--skip-wide-deep", "--skip-fit", "--implementations", "ghost"]
    figures = bench.run(
        parser.parse_args(args + ["--rows", "2000", "--steps", "3", "--warmup", "1", "--nn-repeats", "2"])
    )
    runs = figures["small_ghost_overhead_ratio_all"]
    assert len(runs) == 2 and figures["small_ghost_overhead_ratio_min"] == min(runs)
    assert figures["overhead_ratio"] == figures["small_ghost_overhead_ratio"] > 0
    assert figures["small_ghost_overhead_ratio_cpu"] > 0
    with pytest.raises(SystemExit, match="--fit-models: 'conv3d'"):
        bench.run(parser.parse_args(["--only-fit", "--fit-models", "conv3d"]))
    # checked with the other options, before any model is built (the other checks come after it)
    with pytest.raises(SystemExit, match="--fit-models: 'conv3d'"):
        bench.run(parser.parse_args(["--fit-models", "conv3d", "--rows", "0"]))
