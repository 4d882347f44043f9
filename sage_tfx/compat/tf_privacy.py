"""Load tensorflow-privacy's Keras DP optimizers on TensorFlow 2.21.

tensorflow-privacy 0.9.0's package ``__init__`` imports ``tf.estimator``,
which TensorFlow 2.21 removed, so ``import tensorflow_privacy`` fails. Its
Keras optimizers do not need that code. We register an empty package module
for ``tensorflow_privacy`` whose ``__path__`` points at the installed files;
Python then imports the submodules directly and never runs the broken
``__init__``. The package is installed without its dependencies (its pins
cannot hold on this stack; see requirements.lock).
"""

import importlib
import importlib.util
import os
import sys
import types

import sage_tfx  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

_PACKAGE = "tensorflow_privacy"
_OPTIMIZERS = "tensorflow_privacy.privacy.optimizers.dp_optimizer_keras"


def _register_bare_package():
    existing = sys.modules.get(_PACKAGE)
    if existing is not None:
        return existing
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "tensorflow-privacy is not installed; install the lock (make test/demo does) "
            "or `pip install --no-deps tensorflow-privacy==0.9.0`"
        )
    package = types.ModuleType(_PACKAGE)
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = os.path.join(package.__path__[0], "__init__.py")
    package.__spec__ = spec
    sys.modules[_PACKAGE] = package
    return package


def dp_keras_optimizers():
    """Return tensorflow-privacy's ``dp_optimizer_keras`` module.

    It holds ``DPKerasSGDOptimizer``, ``DPKerasAdamOptimizer`` and
    ``make_keras_optimizer_class``.
    """
    _register_bare_package()
    return importlib.import_module(_OPTIMIZERS)


def import_submodule(name):
    """Import ``tensorflow_privacy.<name>`` without running the package ``__init__``."""
    _register_bare_package()
    return importlib.import_module(f"{_PACKAGE}.{name}")
