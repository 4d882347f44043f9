"""The ModelBlessing writer and the pusher: the one layout TFX's Evaluator writes and its Pusher reads.

A blessing is a directory holding exactly one of the BLESSED / NOT_BLESSED markers and the custom properties
``blessed``, ``current_model`` and ``current_model_id``: on the MLMD artifact when there is one
(DPModelValidator), else in ``blessing.json`` (the continual release). docs/release_strategies.md describes the
push path.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

SERVING_MODEL_DIR = "Format-Serving"  # tfx.utils.path_constants.SERVING_MODEL_DIR: what TFX's Pusher copies
BLESSED_FILE, NOT_BLESSED_FILE = "BLESSED", "NOT_BLESSED"  # as tfx.components.evaluator.constants
BLESSING_PROPERTIES = "blessing.json"  # the custom properties, for a reader without MLMD


def _gfile(uri: str):
    """``tf.io.gfile`` for a URI with a scheme, else None (plain ``os``)."""
    if "://" not in uri:
        return None
    import tensorflow as tf

    return tf.io.gfile


def _write(path: str, text: str) -> None:
    gfile = _gfile(path)
    if gfile is None:
        with open(path, "w") as f:
            f.write(text)
    else:
        with gfile.GFile(path, "w") as f:
            f.write(text)


def write_blessing(
    uri: str, model_uri: str, model_id: int | None, accepted: bool, *, artifact: Any = None, outcome: str | None = None
) -> str:
    """Write a ModelBlessing at ``uri`` for the model at ``model_uri``; return ``uri``.

    Args:
      uri: the blessing's directory (created; a stale marker of the other outcome is removed, so a replay
        never leaves both).
      model_uri: the blessed (or not) Model artifact's URI.
      model_id: its MLMD id (written when truthy).
      accepted: True writes BLESSED and ``blessed`` = 1, False NOT_BLESSED and 0.
      artifact: the MLMD ModelBlessing artifact: the properties are set on it. Without one they are written
        to ``uri``/blessing.json, with ``outcome`` as ``sla_outcome``.
      outcome: the check's outcome, recorded in blessing.json.
    """
    gfile = _gfile(uri)
    exists, remove = (os.path.exists, os.remove) if gfile is None else (gfile.exists, gfile.remove)
    os.makedirs(uri, exist_ok=True) if gfile is None else gfile.makedirs(uri)
    for stale in (BLESSED_FILE, NOT_BLESSED_FILE):
        if exists(os.path.join(uri, stale)):
            remove(os.path.join(uri, stale))
    _write(os.path.join(uri, BLESSED_FILE if accepted else NOT_BLESSED_FILE), "")
    props = {"blessed": 1 if accepted else 0, "current_model": model_uri}
    if model_id:
        props["current_model_id"] = int(model_id)
    if artifact is None:
        _write(
            os.path.join(uri, BLESSING_PROPERTIES),
            json.dumps(dict(props, sla_outcome=outcome), indent=1, sort_keys=True),
        )
        return uri
    for name, value in props.items():
        if isinstance(value, int):
            artifact.set_int_custom_property(name, value)
        else:
            artifact.set_string_custom_property(name, value)
    return uri


def is_blessed(blessing_uri: str) -> bool:
    """TFX Pusher's CheckBlessing on a blessing.json ModelBlessing.

    Args:
        blessing_uri: the blessing's local directory.

    Returns:
        True iff its blessing.json has ``blessed`` == 1 and it holds the BLESSED marker only; False when
        blessing.json is missing or unreadable.
    """
    try:
        with open(os.path.join(blessing_uri, BLESSING_PROPERTIES)) as f:
            props = json.load(f)
    except (OSError, ValueError):
        return False
    return (
        props.get("blessed") == 1
        and os.path.exists(os.path.join(blessing_uri, BLESSED_FILE))
        and not os.path.exists(os.path.join(blessing_uri, NOT_BLESSED_FILE))
    )


def push_blessed(model_uri: str, blessing_uri: str, serving_dir: str, version: int) -> str | None:
    """Push as TFX's Pusher does: copy a blessed model's serving folder to serving_dir/<version>/.

    Nothing is copied unless ``is_blessed(blessing_uri)``; an existing version is kept, as Pusher skips an
    existing destination.

    Args:
        model_uri: the Model artifact's directory (its Format-Serving folder is copied).
        blessing_uri: the model's blessing directory.
        serving_dir: the local serving folder.
        version: the version folder's number.

    Returns:
        The serving path, or None when the model is not blessed.

    Raises:
        RuntimeError: the model folder holds a symbolic link (nothing copied).
    """
    if not is_blessed(blessing_uri):
        return None
    return push_model(os.path.join(model_uri, SERVING_MODEL_DIR), serving_dir, version)


def push_model(model_dir: str, serving_dir: str, version: int) -> str:
    """Copy the SavedModel folder ``model_dir`` (a local path, ``file://`` or another URL TensorFlow's file layer
    has) to the local serving_dir/<version>/, atomically (an existing version is kept); return that path.

    A symbolic link anywhere in a local ``model_dir`` is refused (RuntimeError, nothing copied): the copy is made
    by a process that may read files the model's author may not (`sage run`'s launcher)."""
    target = os.path.join(serving_dir, str(int(version)))
    if os.path.exists(target):
        return target
    if model_dir.startswith("file://"):
        model_dir = model_dir[len("file://") :]
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(serving_dir, exist_ok=True)
    gfile = _gfile(model_dir)
    if gfile is None:
        links = [
            os.path.join(folder, name)
            for folder, dirs, files in os.walk(model_dir)
            for name in dirs + files
            if os.path.islink(os.path.join(folder, name))
        ]
        if links or os.path.islink(model_dir):
            raise RuntimeError(
                f"the model at {model_dir} holds a symbolic link ({(links or [model_dir])[0]}): a "
                "model folder is pushed only when it holds plain files and folders"
            )
        shutil.copytree(model_dir, tmp)
    else:
        for folder, _, files in gfile.walk(model_dir):
            local = os.path.join(tmp, os.path.relpath(folder, model_dir))
            os.makedirs(local, exist_ok=True)
            for name in files:
                gfile.copy(os.path.join(folder, name), os.path.join(local, name), overwrite=True)
    os.replace(tmp, target)  # atomic: a serving system never sees a half-copied version
    return target
