"""sage-tfx: Sage's block-level differential privacy for TFX pipelines.

Importing this package never imports TensorFlow. It only makes sure that,
when TensorFlow is imported later, ``tf.keras`` is Keras 2 (tf-keras), which
TFX, tf.Transform and tensorflow-privacy require.
"""

import importlib
import os
import sys
import warnings

if "tensorflow" in sys.modules and os.environ.get("TF_USE_LEGACY_KERAS") != "1":
    warnings.warn(
        "TensorFlow was imported before sage_tfx without TF_USE_LEGACY_KERAS=1; "
        "tf.keras may be Keras 3, which TFX and tensorflow-privacy do not support. "
        "Import sage_tfx first or set TF_USE_LEGACY_KERAS=1.",
        RuntimeWarning,
        stacklevel=2,
    )
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# Heavy package __init__s (TFX's ``tfx.components``: every TFX component, Keras 3, Kubernetes...; TFMA's;
# dp_accounting's PLD accountant) run only when one of their names is used, not when one of their submodules is
# imported (sage_tfx/compat/deferred_imports.py).
from sage_tfx.compat.deferred_imports import DEFERRED as _DEFERRED  # noqa: E402
from sage_tfx.compat.deferred_imports import defer as _defer

_defer(*_DEFERRED)

__version__ = "0.1.0"

# Heavy (TensorFlow) parts are exported lazily, so `import sage_tfx` and the
# privacy core stay fast: name -> module that defines it.
_LAZY = {
    # DP estimators (TensorFlow)
    "DPDNNRegressor": "sage_tfx.models.dpsgd_models",
    "DPDNNClassifier": "sage_tfx.models.dpsgd_models",
    "DPLogisticRegressor": "sage_tfx.models.dpsgd_models",
    "DPLinearRegressor": "sage_tfx.models.linear",
    # DP preprocessing for tf.Transform (TensorFlow, Beam)
    "dp_group_by_mean": "sage_tfx.transform",
    "dp_count_per_key": "sage_tfx.transform",
    "dp_sum_per_key": "sage_tfx.transform",
    "dp_histogram": "sage_tfx.transform",
    "dp_mean": "sage_tfx.transform",
    "dp_variance": "sage_tfx.transform",
    "dp_mean_per_key": "sage_tfx.transform",
    "dp_scale_to_z_score": "sage_tfx.transform",
    "dp_scale_to_0_1": "sage_tfx.transform",
    "dp_quantiles": "sage_tfx.transform",
    "dp_bucketize": "sage_tfx.transform",
    "dp_vocabulary": "sage_tfx.transform",
    "dp_compute_and_apply_vocabulary": "sage_tfx.transform",
    "apply_public_vocabulary": "sage_tfx.transform",
    "one_hot": "sage_tfx.transform",
    "PreprocessingBudget": "sage_tfx.transform",
    # SLAed validation (numpy/scipy)
    "DPLossValidator": "sage_tfx.validation",
    "DPAccuracyValidator": "sage_tfx.validation",
    "DPAbsoluteErrorValidator": "sage_tfx.validation",
    "Outcome": "sage_tfx.validation",
    # TFX components (TFX, TensorFlow)
    "BlockExampleGen": "sage_tfx.components.block_example_gen",
    "DPTransform": "sage_tfx.components.dp_transform",
    "DPTrainer": "sage_tfx.components.dp_trainer",
    "DPModelValidator": "sage_tfx.components.dp_model_validator",
    "fill_in_missing": "sage_tfx.components.transform_utils",
    # The privacy ledger (stdlib/numpy), the growing database, privacy-adaptive training
    "Ledger": "sage_tfx.privacy",
    "Replay": "sage_tfx.ingest.replay",
    "SageIterator": "sage_tfx.adaptive",
    "IteratorSettings": "sage_tfx.adaptive",
    # ending a script after a Beam / TensorFlow run without the interpreter's C++ teardown (stdlib only)
    "exit_now": "sage_tfx.shutdown",
    # the root of every error sage-tfx raises on purpose (stdlib only)
    "SageError": "sage_tfx.privacy.errors",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sage_tfx' has no attribute {name!r}")

    return getattr(importlib.import_module(module), name)
