"""An on-disk memo of DP-SGD noise calibrations, so that a repeat fit in a new process skips the search.

Contract: ``stored(key)`` is the noise multiplier a search with the same public numbers wrote before (``remember``),
read back bit for bit (``float.hex``), or None. The key names every number the search depends on and
dp_accounting's version. The caller must re-check a stored value with the accountant before using it (the
files live in the user's cache directory, which other code of the user may write): a value whose epsilon is
over the target is ignored. Reads and writes never fail a fit: an unreadable, unwritable or malformed entry is
a miss. ``SAGE_CALIBRATION_CACHE`` names the directory (default ``$XDG_CACHE_HOME/sage_tfx/calibration``, else
``~/.cache/sage_tfx/calibration``); ``off`` turns the memo off.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

ENV_CACHE = "SAGE_CALIBRATION_CACHE"
OFF = "off"

__all__ = ["ENV_CACHE", "cache_dir", "remember", "stored"]


def cache_dir() -> Path | None:
    """The memo's directory, or None when ``SAGE_CALIBRATION_CACHE=off``."""
    configured = os.environ.get(ENV_CACHE, "")
    if configured == OFF:
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sage_tfx" / "calibration"


def _path(key: tuple) -> Path | None:
    directory = cache_dir()
    if directory is None:
        return None
    try:
        version = metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:
        version = "unknown"
    text = json.dumps([version, [repr(part) for part in key]])
    return directory / (hashlib.sha256(text.encode()).hexdigest() + ".json")


def stored(key: tuple) -> float | None:
    """The multiplier remembered for ``key``, or None (no entry, or one that cannot be read)."""
    path = _path(key)
    if path is None:
        return None
    try:
        entry = json.loads(path.read_text())
        if entry["key"] != [repr(part) for part in key]:
            return None
        return float.fromhex(entry["sigma"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember(key: tuple, sigma: float) -> None:
    """Write ``sigma`` for ``key`` (atomically: a concurrent reader sees the whole entry or none)."""
    path = _path(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": [repr(part) for part in key], "sigma": float(sigma).hex()}, f)
        os.replace(tmp, path)
    except OSError:
        return
