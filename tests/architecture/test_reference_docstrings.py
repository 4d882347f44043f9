"""The public surface documents its parameters: an ``Args:`` entry for each, as TFX's components do.

The surface is what docs/api.md renders (tests/architecture/test_api_reference.py): each public package's
``__all__``, sage_tfx's lazy names and the four component classes, and for an exported class its own public
methods. A callable with parameters needs a docstring whose ``Args:`` section names every one of them (for a class:
the class docstring or its ``__init__``'s; ``*args`` / ``**kwargs`` by their bare name). Exceptions and enums have
nothing to document there.
"""

import enum
import importlib
import inspect
import re

import pytest

from tests.architecture.test_api_reference import MODULES, PACKAGES, _names

COMPONENTS = "sage_tfx.components"
SECTION = re.compile(
    r"^\s*Args:\s*$(.*?)(^\s*(Returns|Yields|Raises|Examples?|Notes?|Attributes):|\Z)", re.DOTALL | re.MULTILINE
)
HOW_TO_FIX = (
    "give each an `Args:` section naming every parameter, one `name: what it is` line each (for a class in the "
    "class docstring or its __init__'s), followed by `Returns:` and `Raises:` where they apply: see "
    "tfx/components/pusher/component.py, or sage_tfx/privacy/requests.py here"
)


def _exported(package: str) -> list:
    """(name, object) of what ``package`` exports; for sage_tfx, only what no other package exports."""
    if package == COMPONENTS:
        return [
            (name, getattr(importlib.import_module(module), name))
            for module, names in MODULES.items()
            for name in names
        ]
    module = importlib.import_module(package)
    items = [(name, getattr(module, name)) for name in _names(package)]
    if package != "sage_tfx":
        return items
    elsewhere = {id(obj) for other in list(PACKAGES)[1:] + [COMPONENTS] for _, obj in _exported(other)}
    return [(name, obj) for name, obj in items if id(obj) not in elsewhere]


def _parameters(fn) -> list:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def _args_section(doc: str | None) -> str | None:
    match = SECTION.search(doc or "")
    return match.group(1) if match else None


def _undocumented(fn, doc: str | None) -> list:
    """The parameters of ``fn`` that ``doc``'s Args: section does not name (["(no Args:)"] without one)."""
    names = _parameters(fn)
    if not names:
        return []
    section = _args_section(doc)
    if section is None:
        return ["(no Args:)"]
    return [n for n in names if not re.search(r"^\s*\**" + re.escape(n) + r"\b", section, re.MULTILINE)]


def _class_gaps(name: str, cls: type) -> list:
    init = vars(cls).get("__init__")
    doc = cls.__doc__ if _args_section(cls.__doc__) is not None else (init.__doc__ if init else None)
    gaps = [(name, _undocumented(init or cls, doc))]
    for method_name, method in vars(cls).items():
        fn = method.__func__ if isinstance(method, (staticmethod, classmethod)) else method
        if not method_name.startswith("_") and inspect.isfunction(fn):
            gaps.append((f"{name}.{method_name}", _undocumented(fn, fn.__doc__)))
    return gaps


def _gaps(package: str) -> list:
    """``name: [missing parameters]`` for each public callable of ``package`` that lacks Args: entries."""
    gaps = []
    for name, obj in _exported(package):
        if inspect.isclass(obj):
            if not issubclass(obj, (enum.Enum, BaseException)):
                gaps += _class_gaps(name, obj)
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            gaps.append((name, _undocumented(obj, obj.__doc__)))
    return [f"{name}: {missing}" for name, missing in gaps if missing]


@pytest.mark.tf
@pytest.mark.parametrize("package", list(PACKAGES) + [COMPONENTS])
def test_public_callables_document_their_parameters(package):
    gaps = _gaps(package)
    assert not gaps, f"{len(gaps)} public callable(s) of {package} lack Args: entries ({HOW_TO_FIX}):\n" + "\n".join(
        gaps
    )


def test_the_check_finds_a_missing_parameter():
    """The check itself: a docstring naming one of two parameters is caught, naming the other."""

    def documented(a, *, b):
        """Sum.

        Args:
            a: one.
        """

    assert _undocumented(documented, documented.__doc__) == ["b"]
    assert _undocumented(lambda x: x, None) == ["(no Args:)"]
