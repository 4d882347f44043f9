"""A user's module file loaded as TFX loads it, with the files beside it importable, and the code that makes it up.

TFX imports a ``module_file`` by path under a generated name (``user_module_N``), with no package and without
its folder on ``sys.path``, so ``from helpers import X`` in a trainer fails although ``helpers.py`` sits beside
it. ``load_user_fn`` (DPTrainer's ``run_fn``, DPTransform's ``preprocessing_fn``) first puts the module file's
folder at the front of ``sys.path``, as Python does for a script, and drops the top-level modules an earlier
load imported from such a folder (another pipeline's ``preprocessing.py``, or this folder's file before an
edit), so a sibling is imported afresh from disk. A module given by ``module_path`` (TFX's packaged wheel, which
holds the ``.py`` files of the module's folder) or a module file on a URL is loaded as TFX loads it.

What a training release runs is its module and the ``.py`` files beside it (``sibling_sources``): DPTrainer's
computation digest covers each of them, and the pipeline's ``definition`` digest covers the ``.py`` files of
its modules' folders (``pipelines.definition``). Code in a subfolder (a package imported from the module's
folder) runs but is covered by neither: keep the code a module imports beside it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable

_FOLDERS: list = []  # the folders load_user_fn put on sys.path (the current one last)


def python_files(folder: str) -> list:
    """The ``.py`` files directly in ``folder``, sorted by name ([] for a folder that does not exist)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]


def load_user_fn(exec_properties: dict, fn_name: str) -> Callable:
    """``udf_utils.get_fn(exec_properties, fn_name)`` with the folder of a local ``module_file`` importable
    (``use_module_folder``): a module may import the modules beside it."""
    from tfx.components.util import udf_utils

    module_file = exec_properties.get("module_file")
    if (
        isinstance(module_file, str)
        and module_file
        and not exec_properties.get("module_path")
        and os.path.isfile(module_file)
    ):
        use_module_folder(module_file)
    return udf_utils.get_fn(exec_properties, fn_name)


def use_module_folder(module_file: str) -> str:
    """Put ``module_file``'s folder first on ``sys.path`` (removing the folders earlier calls added) and drop from
    ``sys.modules`` every top-level module loaded from one of those folders; return the folder."""
    folder = os.path.dirname(os.path.abspath(module_file))
    managed = set(_FOLDERS) | {folder}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." not in name and path and os.path.dirname(os.path.abspath(path)) in managed:
            del sys.modules[name]
    for old in managed:
        while old in sys.path:
            sys.path.remove(old)
    sys.path.insert(0, folder)
    _FOLDERS[:] = [folder]
    importlib.invalidate_caches()  # a file added to the folder since its last listing is found
    return folder


def sibling_sources(fn: Callable) -> list:
    """[(file name, bytes)] of the ``.py`` files beside the source file of ``fn``, by name (its own file left
    out: its callers read it themselves); [] when ``fn`` has no source file."""
    try:
        source = os.path.abspath(inspect.getsourcefile(fn))
    except (TypeError, OSError):
        return []
    out = []
    for path in python_files(os.path.dirname(source)):
        if path != source:
            with open(path, "rb") as f:
                out.append((os.path.basename(path), f.read()))
    return out
