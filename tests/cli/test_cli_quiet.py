"""The `sage` command's log chatter and exit: TensorFlow's C++ start-up lines and absl's execution errors off
by default (in the process and in its child processes), back with --verbose; a finished run that loaded
TensorFlow / Beam ends through ``sage_tfx.exit_now`` (atexit handlers run, exit code kept)."""

import logging
import subprocess
import sys
import textwrap

import pytest

from sage_tfx.cli._quiet import is_chatter, quiet_libraries
from tests.helpers.cli import sage as _sage

# what TensorFlow 2.21 writes to descriptor 2 while it loads, before its logging starts (copied from a run)
CHATTER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795831585.980416    7304 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.",
    "I0000 00:00:1795831585.980879    7304 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "I0000 00:00:1795831586.658319    7304 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.",
    "E0000 00:00:1795830860.842325   31966 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error",
]
KEPT = [
    "sage run: error: --target is required",
    "F0000 00:00:1795830860.842325   31966 tensor.cc:52] Check failed: a fatal line stays",
    "Traceback (most recent call last):",
    "I think this is a sentence, not a log line",
]


def test_is_chatter_drops_only_the_start_up_lines():
    assert all(is_chatter(line.encode()) for line in CHATTER)
    assert not any(is_chatter(line.encode()) for line in KEPT)


FILTER_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys
    from sage_tfx.cli._quiet import filter_stderr
    chatter, kept = {chatter!r}, {kept!r}
    stop = filter_stderr()
    os.write(2, ("\\n".join(chatter + kept[:2]) + "\\n").encode())   # straight to the descriptor, as C++ does
    child = "import os; os.write(2, ({chatter!r}[1] + '\\\\nchild line\\\\n').encode())"
    subprocess.run([sys.executable, "-c", child], check=True)            # a child inherits the filter
    os.write(2, b"a prompt without newline")
    stop()
    print("stdout untouched")
""")


def test_the_filter_drops_chatter_of_the_process_and_its_children_and_keeps_the_rest():
    script = FILTER_SCRIPT.format(chatter=CHATTER, kept=KEPT)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stdout untouched\n"
    assert done.stderr == "\n".join(KEPT[:2]) + "\nchild line\na prompt without newline"


def test_absl_execution_errors_are_off_and_critical_ones_stay():
    """TFX's launcher logs ``Execution N failed.`` at ERROR through absl before it re-raises; the command
    reports the failure itself, so only CRITICAL absl records pass."""
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    absl = logging.getLogger("absl")
    absl.addHandler(handler)
    try:
        quiet_libraries()
        absl.error("Execution %d failed.", 3)
        logging.getLogger("apache_beam.runners").warning("beam chatter")
        absl.critical("kept")
    finally:
        absl.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["kept"]


TF_PIPELINE = "import tensorflow  # loads TensorFlow's C++ core, which prints its start-up lines\n"


@pytest.mark.tf
@pytest.mark.slow
def test_sage_loading_tensorflow_prints_no_start_up_lines_unless_verbose(tmp_path):
    """`sage run` on a pipeline file that imports TensorFlow (refused for defining no pipeline: cheap) prints
    only its own error; --verbose brings TensorFlow's start-up lines back."""
    path = tmp_path / "tf_pipeline.py"
    path.write_text(TF_PIPELINE)
    args = ("run", path, "--db", tmp_path / "none.db", "--stream", "s", "--data-root", tmp_path)
    quiet = _sage(*args)
    assert quiet.returncode == 2, quiet.stderr
    assert quiet.stderr.startswith("sage run: error: pipeline"), quiet.stderr
    assert not any(is_chatter(line.encode()) for line in quiet.stderr.splitlines()), quiet.stderr
    assert "I0000" not in quiet.stderr and "absl::InitializeLog" not in quiet.stderr
    verbose = _sage(*args, "--verbose")
    assert verbose.returncode == 2, verbose.stderr
    assert any(is_chatter(line.encode()) for line in verbose.stderr.splitlines()), verbose.stderr
    assert "sage run: error: pipeline" in verbose.stderr


TFT_SCRIPT = textwrap.dedent("""
    import atexit, sys, tempfile
    import sage_tfx  # before TensorFlow
    import numpy as np
    import apache_beam as beam
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tfx_bsl.tfxio import tensor_adapter, tensor_representation_util
    from sage_tfx.bench._tft_harness import arrow_batch
    from sage_tfx.transform import dp_scale_to_z_score

    def preprocessing_fn(inputs):
        return {"z": dp_scale_to_z_score(inputs["x"], 1.0, value_range=(0.0, 100.0))}

    atexit.register(lambda: print("atexit handlers ran", flush=True))
    spec = {"x": tf.io.FixedLenFeature([], tf.float32)}
    schema = tft.DatasetMetadata.from_feature_spec(spec).schema
    batch = arrow_batch({"x": np.linspace(0, 100, 200).astype(np.float32)})
    config = tensor_adapter.TensorAdapterConfig(
        batch.schema, tensor_representation_util.InferTensorRepresentationsFromSchema(schema))
    with tempfile.TemporaryDirectory() as tmp:
        with beam.Pipeline(argv=[]) as p, tft_beam.Context(temp_dir=tmp):
            (out, _), _ = ((p | beam.Create([batch], reshuffle=False)), config) | \\
                tft_beam.AnalyzeAndTransformDataset(preprocessing_fn, output_record_batches=True)
    print("pipeline done", flush=True)
    sage_tfx.exit_now(0)
""")


@pytest.mark.tf
@pytest.mark.slow
def test_a_tft_pipeline_script_ending_with_exit_now_exits_0(tmp_path):
    """A user's script running a tf.Transform pipeline with a DP analyzer on the DirectRunner, ended as
    docs/dp_preprocessing.md says: exit code 0, its atexit handlers ran, nothing after exit_now."""
    script = tmp_path / "tft_script.py"
    script.write_text(TFT_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.splitlines()[-2:] == ["pipeline done", "atexit handlers ran"], done.stdout
