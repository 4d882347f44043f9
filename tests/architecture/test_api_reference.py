"""docs/api.md is the public surface as the code declares it: each package's ``__all__`` with signatures.

The page is rendered from the code (``render``); this test fails when the two differ, naming the first line
that does. After changing a public name or signature, rewrite the page with
``SAGE_API_WRITE=1 .venv/bin/python -m pytest tests/architecture/test_api_reference.py``.
"""

import enum
import importlib
import inspect
import os
import re

import pytest

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "api.md")

# package -> what it is for (one line), in the order a user meets them
PACKAGES = {
    "sage_tfx": "the names most pipelines need, importable from the top (TensorFlow loads only when one is used)",
    "sage_tfx.privacy": "the privacy core: ledger, grants, budget splits, accounting, audit (no TensorFlow)",
    "sage_tfx.pipelines": "your own pipeline: SagePipeline, SLA, the loader and the built-in pipelines",
    "sage_tfx.transform": "DP analyzers for a preprocessing_fn (tf.Transform)",
    "sage_tfx.models": "DP models, make_private and the DP-SGD engine (TensorFlow)",
    "sage_tfx.validation": "SLAed validators",
    "sage_tfx.adaptive": "Sage's privacy-adaptive iterator",
    "sage_tfx.release": "release strategies for a growing database",
    "sage_tfx.simulate": "the load simulator",
    "sage_tfx.auditing": "empirical privacy auditing: a lower bound on a mechanism's epsilon (TensorFlow only in the "
    "DP-SGD and Beam audits)",
}
# modules without __all__ whose public names are part of the surface: module -> names
MODULES = {
    "sage_tfx.components.block_example_gen": ["BlockExampleGen"],
    "sage_tfx.components.dp_transform": ["DPTransform"],
    "sage_tfx.components.dp_trainer": ["DPTrainer"],
    "sage_tfx.components.dp_model_validator": ["DPModelValidator"],
}
# what a signature's text shortens: an object's address, TensorFlow's and our own module paths
SHORTER = [
    (re.compile(r" at 0x[0-9a-f]+"), ""),
    (re.compile(r"tensorflow\.python\.[\w.]+\.(\w+)"), r"tf.\1"),
    (re.compile(r"\bsage_tfx\.[\w.]+\.(\w+)"), r"\1"),
    (re.compile(r"\bnumpy\."), "np."),
]


def _names(package) -> list:
    module = importlib.import_module(package)
    if package == "sage_tfx":
        return sorted(module._LAZY)
    return list(module.__all__)


def _signature(obj) -> str:
    target = obj
    if inspect.isclass(obj):
        if issubclass(obj, (enum.Enum, BaseException)):
            return ""
        target = obj.__init__ if "__init__" in vars(obj) or not hasattr(obj, "__signature__") else obj
    try:
        sig = str(inspect.signature(target))
    except (TypeError, ValueError):
        return ""
    sig = re.sub(r"\(self,? ?", "(", sig)
    if inspect.isclass(obj):
        sig = sig.removesuffix(" -> None")
    for pattern, short in SHORTER:
        sig = pattern.sub(short, sig)
    return sig


def _summary(obj) -> str:
    doc = inspect.getdoc(obj) if (inspect.isclass(obj) or callable(obj)) else None
    if not doc:
        return ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return first if len(first) <= 200 else first[:197].rsplit(" ", 1)[0] + " ..."


def _entry(name, obj) -> list:
    if inspect.isclass(obj):
        kind = "enum" if issubclass(obj, enum.Enum) else "exception" if issubclass(obj, BaseException) else "class"
    elif callable(obj):
        kind = "function"
    else:
        return [f"- `{name}`: a constant ({type(obj).__name__})"]
    line = f"- {kind} `{name}{_signature(obj)}`"
    summary = _summary(obj)
    return [line + (f": {summary}" if summary else "")]


def _section(title, about, items) -> list:
    lines = [f"## `{title}`", "", about, ""]
    for name, obj in items:
        lines.extend(_entry(name, obj))
    return lines + [""]


def render() -> str:
    lines = [
        "# API reference",
        "",
        "The public names of each package, with their signatures and the first line of their docstrings",
        "(rendered from the code by tests/architecture/test_api_reference.py, which fails when this page is out of date).",
        "Everything a user needs is here: no underscore module is part of the API.",
        "",
    ]
    for package, about in PACKAGES.items():
        module = importlib.import_module(package)
        lines += _section(package, about, [(n, getattr(module, n)) for n in _names(package)])
    components = [(name, getattr(importlib.import_module(m), name)) for m, names in MODULES.items() for name in names]
    lines += _section(
        "sage_tfx.components",
        "the TFX components (each also importable from its module, e.g. `sage_tfx.components.dp_trainer`)",
        components,
    )
    return "\n".join(lines).rstrip() + "\n"


@pytest.mark.tf
def test_the_api_page_matches_the_code():
    text = render()
    if os.environ.get("SAGE_API_WRITE"):
        with open(PAGE, "w") as f:
            f.write(text)
    with open(PAGE) as f:
        page = f.read()
    if page != text:
        diff = next(
            (i, a, b) for i, (a, b) in enumerate(zip(page.splitlines() + [""], text.splitlines() + [""])) if a != b
        )
        pytest.fail(
            f"docs/api.md line {diff[0] + 1} is {diff[1]!r}, the code gives {diff[2]!r}: rewrite it with "
            "SAGE_API_WRITE=1 .venv/bin/python -m pytest tests/architecture/test_api_reference.py"
        )


def test_every_public_name_has_a_docstring():
    """A name in the reference without a summary line is a name a user cannot learn from its page."""
    missing = [
        f"{package}.{name}"
        for package in ("sage_tfx.privacy", "sage_tfx.adaptive", "sage_tfx.simulate")
        for name in _names(package)
        if (inspect.isclass(obj := getattr(importlib.import_module(package), name)) or callable(obj))
        and not inspect.getdoc(obj)
    ]
    assert not missing, f"public names without a docstring: {missing}"
