"""Packages whose ``__init__`` runs only when one of its own names is used, not when a submodule is imported.

Starting a TFX run imports ``tfx.components`` (TFX's input resolution reaches ``tfx.components.evaluator``'s
constants), and that package's ``__init__`` imports every TFX component: the Tuner and InfraValidator bring
Keras 3, the Kubernetes client, matplotlib and more, none of which a sage pipeline uses. TFX's component specs
(``tfx.types.standard_component_specs``, imported by the Pusher, Trainer and Transform modules) import
``tensorflow_model_analysis.sdk`` for one proto class (``EvalConfig``), and TFMA's ``__init__`` imports all of
TFMA, with NLTK, scikit-learn and pandas' plotting behind its metrics. Together about a third of the CPU a
process spends importing what a TFX run needs (``sage bench startup``; docs/BENCHMARKS.md, "Start-up").

One more in an iteration's confined child (``sage bench iteration``; docs/BENCHMARKS.md, "What each process
imports"): ``dp_accounting``'s ``__init__`` imports its PLD accountant, whose ``dp_accounting.pld`` package pulls in
scipy.signal and scipy.stats (194 modules, about 0.8 s of CPU after TensorFlow, TFX and Beam), where AdaSSP's
release, the Gaussian calibration and the spend audit use the RDP accountant and the events alone.

``defer(name)`` installs an import hook for package ``name``: importing the package or any of its submodules
works as before (``from tensorflow_model_analysis import sdk`` imports the submodule alone), but the package's
own ``__init__`` runs on the first access to any other attribute (``from tfx.components import Pusher`` or
``tfma.EvalConfig`` run it, ``import tfx.components.pusher.component`` does not). Nothing is imported when the
hook is installed. ``SAGE_EAGER_IMPORTS=1`` turns it off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading

# The packages sage_tfx defers when it is imported (sage_tfx/__init__.py).
DEFERRED = ("tfx.components", "tensorflow_model_analysis", "dp_accounting.pld")


class _DeferredInit(importlib.abc.Loader):
    """Creates the package module (with ``__path__``, so submodules import) and runs ``loader``'s
    ``exec_module`` (the package's ``__init__``) on the first lookup of an attribute the module cannot answer
    that is not one of its submodules (a submodule is imported alone, as ``from package import sub`` expects)."""

    def __init__(self, loader):
        self.loader = loader
        self.lock = threading.RLock()

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        loader, lock = self.loader, self.lock

        def __getattr__(name):  # noqa: N807 (the module-level hook PEP 562 names)
            if module.__dict__.get("__getattr__") is __getattr__ and _is_submodule(module, name):
                return importlib.import_module(f"{module.__name__}.{name}")
            with lock:
                if module.__dict__.get("__getattr__") is __getattr__:
                    del module.__dict__["__getattr__"]
                    loader.exec_module(module)
            if name in module.__dict__:
                return module.__dict__[name]
            hook = module.__dict__.get("__getattr__")
            if hook is not None:
                return hook(name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        module.__getattr__ = __getattr__


def _is_submodule(module, name: str) -> bool:
    """Whether ``name`` is a module or package inside ``module``'s folders (not a name its ``__init__`` defines)."""
    if name.startswith("__"):
        return False
    spec = importlib.machinery.PathFinder.find_spec(f"{module.__name__}.{name}", list(module.__path__))
    return spec is not None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return spec
        spec.loader = _DeferredInit(spec.loader)
        return spec


def defer(*names: str) -> None:
    """Defer the ``__init__`` of each package in ``names`` not imported yet (see the module docstring)."""
    if os.environ.get("SAGE_EAGER_IMPORTS") == "1":
        return
    names = tuple(n for n in names if n not in sys.modules)
    if names and not any(isinstance(f, _Finder) and f.names >= set(names) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(names))
