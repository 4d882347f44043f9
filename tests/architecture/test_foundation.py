"""The package's foundation: fast core imports, the Keras 2 switch, the tf-privacy loader, the CLI."""

import json
import os
import subprocess
import sys

import pytest

PY = sys.executable


def _run(code, env=None):
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_privacy_core_imports_without_tensorflow_tfx_or_beam():
    out = _run(
        "import sys, json, sage_tfx, sage_tfx.privacy, sage_tfx.privacy.curves, sage_tfx.privacy.audit,"
        " sage_tfx.privacy.report, sage_tfx.cli\n"
        "sage_tfx.cli.build_parser()\n"
        "heavy = [m for m in ('tensorflow', 'tfx', 'apache_beam', 'tensorflow_transform', 'dp_accounting')"
        " if m in sys.modules]\n"
        "print(json.dumps(heavy))"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_package_sets_legacy_keras_before_tensorflow_loads():
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    out = _run("import os, sage_tfx; print(os.environ['TF_USE_LEGACY_KERAS'])", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


@pytest.mark.tf
def test_tf_keras_is_keras2_after_importing_sage_tfx():
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    out = _run("import sage_tfx, tensorflow as tf; print(tf.keras.__name__)", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("tf_keras"), out.stdout


@pytest.mark.tf
def test_tensorflow_privacy_keras_optimizers_load_and_train():
    """Fails the day tensorflow-privacy's Keras DP optimizers stop importing through the loader."""
    out = _run(
        "from sage_tfx.compat.tf_privacy import dp_keras_optimizers\n"
        "import numpy as np, tensorflow as tf\n"
        "m = dp_keras_optimizers()\n"
        "opt = m.DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, num_microbatches=8,"
        " learning_rate=0.1)\n"
        "model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])\n"
        "model.compile(optimizer=opt, loss=tf.keras.losses.MeanSquaredError("
        "reduction=tf.keras.losses.Reduction.NONE))\n"
        "x = np.random.default_rng(0).normal(size=(64, 3)).astype('float32')\n"
        "h = model.fit(x, x.sum(1, keepdims=True), batch_size=8, epochs=1, verbose=0)\n"
        "import sys; print(type(opt).__name__, 'tensorflow_privacy' in sys.modules, len(h.history['loss']))"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    name, loaded, epochs = out.stdout.strip().splitlines()[-1].split()
    assert "DPOptimizerClass" in name or "DP" in name
    assert loaded == "True" and epochs == "1"


def test_sage_help_lists_commands():
    out = subprocess.run([PY, "-m", "sage_tfx", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for command in ("ledger", "bench"):
        assert command in out.stdout


def test_ledger_command_does_not_import_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from sage_tfx.cli import main\n"
        f"rc = main(['ledger', 'init', '--db', {str(tmp_path / 'l.db')!r}, '--stream', 's', '--epsilon', '1',"
        " '--delta', '1e-6'])\n"
        "print(rc, 'tensorflow' in sys.modules, 'dp_accounting' in sys.modules)"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0 False False"
