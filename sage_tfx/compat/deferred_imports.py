"""Packages whose ``__init__`` runs only when one of its own names is used, not when a submodule is imported.

Starting a TFX run imports ``tfx.components`` (TFX's input resolution reaches ``tfx.components.evaluator``'s
constants), and that package's ``__init__`` imports every TFX component: the Tuner and InfraValidator bring
Keras 3, the Kubernetes client, matplotlib and more, none of which a sage pipeline uses: about a tenth of the
CPU a process spends importing what a TFX run needs (``sage bench startup``; docs/BENCHMARKS.md, "Start-up").

``defer(name)`` installs an import hook for package ``name``: importing the package or any of its submodules
works as before, but the package's own ``__init__`` runs on the first access to an attribute it defines
(``from tfx.components import Pusher`` runs it, ``import tfx.components.pusher.component`` does not). Nothing is
imported when the hook is installed. ``SAGE_EAGER_IMPORTS=1`` turns it off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading

# The packages sage_tfx defers when it is imported (sage_tfx/__init__.py).
DEFERRED = ("tfx.components",)


class _DeferredInit(importlib.abc.Loader):
    """Creates the package module (with ``__path__``, so submodules import) and runs ``loader``'s
    ``exec_module`` (the package's ``__init__``) on the first attribute lookup the module cannot answer."""

    def __init__(self, loader):
        self.loader = loader
        self.lock = threading.RLock()

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        loader, lock = self.loader, self.lock

        def __getattr__(name):  # noqa: N807 (the module-level hook PEP 562 names)
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
