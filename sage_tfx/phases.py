"""Where a process's CPU goes, by phase: an opt-in sampler for `sage bench iteration`.

With ``SAGE_PROFILE`` set to a file path, `sage run` (the launcher) and each confined child it starts sample
their own main thread every ``INTERVAL`` seconds: the process's CPU time since the previous sample
(``time.process_time``: every thread, TensorFlow's and Beam's C++ threads included) is charged to the phase of
the main thread's stack at that moment (``classify``). CPU spent before the sampler started (the interpreter
and the imports of the module that starts it) is charged to ``imports``. A child returns its split in its
result message (the launcher passes the variable to it by ``SAGE_CONFINED_ENV``; the child writes no file);
the launcher writes its own and its children's splits to the file at exit, one JSON object. Unset (the
default), nothing is sampled and nothing is written.
"""

import atexit
import json
import os
import sys
import threading
import time

PROFILE_ENV = "SAGE_PROFILE"
INTERVAL = 0.01
# Phases, in the order a stack is tested: the first whose marker is in any frame's file path wins (an import
# inside a Beam stage is an import; a noise draw inside a Beam stage is DP work).
PHASES = (
    ("imports", ("<frozen importlib._bootstrap", "importlib/__init__.py")),
    ("export", ("tensorflow/python/saved_model/save.py", "tensorflow/python/saved_model/builder_impl.py")),
    ("tracing", ("tensorflow/python/framework/func_graph.py", "tensorflow/python/autograph/")),
    (
        "dp",
        (
            "sage_tfx/privacy/",
            "sage_tfx/release/",
            "sage_tfx/validation/",
            "sage_tfx/transform/",
            "sage_tfx/models/linear.py",
            "components/_grant",
        ),
    ),
    ("beam", ("apache_beam/",)),
)
OTHER = "other"
_state: dict = {"children": []}


def classify(paths: list[str]) -> str:
    """The phase of a stack given as its frames' file paths: the first of ``PHASES`` with a marker in one of
    them, else ``OTHER`` (TFX's orchestration, MLMD, model execution, reading records, the launcher's waits)."""
    for phase, markers in PHASES:
        if any(marker in path for path in paths for marker in markers):
            return phase
    return OTHER


def _sample(main_ident: int, split: dict, stop: threading.Event) -> None:
    last = time.process_time()
    while not stop.wait(INTERVAL):
        frame = sys._current_frames().get(main_ident)
        paths = []
        while frame is not None:
            paths.append(frame.f_code.co_filename.replace(os.sep, "/"))
            frame = frame.f_back
        now = time.process_time()
        phase = classify(paths)
        split[phase] = split.get(phase, 0.0) + now - last
        last = now


def start() -> dict | None:
    """Start sampling this process if ``SAGE_PROFILE`` is set; return the live split ({phase: CPU seconds}),
    or None (not set: nothing runs). Idempotent."""
    if not os.environ.get(PROFILE_ENV):
        return None
    if "split" not in _state:
        split = {"imports": time.process_time()}
        stop = threading.Event()
        thread = threading.Thread(target=_sample, args=(threading.main_thread().ident, split, stop), daemon=True)
        thread.start()
        _state.update(split=split, stop=stop, wall=time.time())
    return _state["split"]


def finish() -> dict | None:
    """Stop sampling; this process's {"cpu", "wall", "phases"} (None if it was not sampling)."""
    if "split" not in _state:
        return None
    _state["stop"].set()
    return {
        "cpu": round(time.process_time(), 3),
        "wall": round(time.time() - _state["wall"], 3),
        "phases": {k: round(v, 3) for k, v in _state["split"].items()},
    }


def add_child(profile: dict | None) -> None:
    """Keep a confined child's split (from its result message) for the launcher's file."""
    if profile:
        _state["children"].append(profile)


def start_launcher() -> None:
    """``start`` in the launcher, and write {"launcher", "children"} to ``$SAGE_PROFILE`` at exit."""
    if start() is not None:
        atexit.register(_write, os.environ[PROFILE_ENV])


def _write(path: str) -> None:
    with open(path, "w") as f:
        json.dump({"launcher": finish(), "children": _state["children"]}, f)
