"""Privacy-adaptive pipelines: the public API to define your own, the loader, and the built-in ones.

Define a pipeline with ``SagePipeline`` and ``SLA`` (``sage_tfx.pipelines.definition``; docs/your_pipeline.md)
in a Python file; ``sage run`` and ``sage serve`` take a built-in name, the path of such a file, or a dotted
module path (``load_pipeline``; for a user's file or module they call it only in a confined child,
``sage_tfx.pipelines.confined``). The built-in pipelines are defined with the same API:
``taxi_regression`` and ``taxi_classification``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback

from sage_tfx.pipelines.definition import (
    SLA,
    Metric,
    PipelineDefinitionError,
    SagePipeline,
    StandardComponents,
)
from sage_tfx.pipelines.runner import PipelineRunner, RunSettings, build_runner, make_iterator
from sage_tfx.pipelines.scoring import accepted_model, pushed_models, score_model

BUILTIN = {
    "taxi_regression": "sage_tfx.pipelines.taxi_regression",
    "taxi_classification": "sage_tfx.pipelines.taxi_classification",
}

__all__ = [
    "SLA",
    "Metric",
    "SagePipeline",
    "StandardComponents",
    "PipelineDefinitionError",
    "load_pipeline",
    "pushed_models",
    "accepted_model",
    "score_model",
    "BUILTIN",
    "build_runner",
    "make_iterator",
    "PipelineRunner",
    "RunSettings",
]


def load_pipeline(spec: str) -> SagePipeline:
    """The ``SagePipeline`` named by ``spec``: a built-in name, a Python file, or a dotted module path.

    The module must define exactly one SagePipeline (or name the one to run ``PIPELINE``); nothing else is
    touched.

    Args:
        spec: a built-in pipeline's name (``BUILTIN``), the path of a pipeline file, or a dotted module path.

    Returns:
        The pipeline, with ``base_dir`` and ``source_file`` set and its module files checked.

    Raises:
        PipelineDefinitionError: a missing file, a module that fails to import (naming the line) or defines
            no pipeline, or a module file that does not exist.
    """
    if not isinstance(spec, str) or not spec:
        raise PipelineDefinitionError(
            f"pipeline {spec!r} must be a built-in name ({', '.join(sorted(BUILTIN))}), "
            "a pipeline file or a dotted module path"
        )
    if spec in BUILTIN:
        module, where = importlib.import_module(BUILTIN[spec]), spec
    elif is_pipeline_file(spec):
        module, where = _import_file(spec), spec
    else:
        module, where = _import_module(spec), spec
    pipeline = _the_pipeline(module, where)
    base = os.path.dirname(os.path.abspath(module.__file__)) if getattr(module, "__file__", None) else os.getcwd()
    pipeline = pipeline.with_base_dir(base).with_source_file(getattr(module, "__file__", None))
    try:
        pipeline.check_files()
    except PipelineDefinitionError as exc:
        raise PipelineDefinitionError(f"{exc} (defined in {getattr(module, '__file__', where)})") from None
    return pipeline


def is_pipeline_file(spec: str) -> bool:
    """Whether ``load_pipeline`` reads ``spec`` as a pipeline file: not a built-in name, and a ``.py`` name, a path
    or an existing file (else it is a dotted module path)."""
    return spec not in BUILTIN and (spec.endswith(".py") or os.sep in spec or os.path.exists(spec))


def _import_file(path):
    if not os.path.isfile(path):
        raise PipelineDefinitionError(
            f"pipeline file {path!r} does not exist (or give a built-in pipeline: {', '.join(sorted(BUILTIN))})"
        )
    path = os.path.abspath(path)
    name = "sage_user_pipeline_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # its own code raised: name the file and the line
        sys.modules.pop(name, None)
        raise PipelineDefinitionError(
            f"pipeline file {path!r} failed to import{_line_in(path, exc)}: {type(exc).__name__}: {exc}"
        ) from None
    return module


def _import_module(dotted):
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and dotted.startswith(exc.name):
            raise PipelineDefinitionError(
                f"pipeline {dotted!r} is not a built-in ({', '.join(sorted(BUILTIN))}), an existing file, nor an "
                "importable module"
            ) from None
        raise PipelineDefinitionError(
            f"pipeline module {dotted!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    except BaseException as exc:
        path = getattr(importlib.util.find_spec(dotted), "origin", None) or dotted
        raise PipelineDefinitionError(
            f"pipeline module {dotted!r} ({path}) failed to import{_line_in(path, exc)}: {type(exc).__name__}: {exc}"
        ) from None


def _line_in(path, exc):
    """' at line N' of the deepest frame of ``exc`` in ``path`` (a SyntaxError's own line), or ''."""
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f" at line {exc.lineno}"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == path]
    return f" at line {lines[-1]}" if lines else ""


def _the_pipeline(module, where):
    named = getattr(module, "PIPELINE", None)
    if isinstance(named, SagePipeline):
        return named
    found = {k: v for k, v in vars(module).items() if isinstance(v, SagePipeline)}
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise PipelineDefinitionError(
            f"pipeline {where!r} defines no SagePipeline: define "
            "PIPELINE = SagePipeline(name=..., sla=SLA(...), trainer_module=...)"
        )
    raise PipelineDefinitionError(
        f"pipeline {where!r} defines several SagePipelines ({', '.join(sorted(found))}): name the one to run PIPELINE"
    )
