"""A released model as a TFX Model artifact and its ModelBlessing (``release.blessing``), pushed if blessed."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from sage_tfx.privacy.vocabulary import Outcome
from sage_tfx.release.blessing import SERVING_MODEL_DIR, push_blessed, write_blessing

from .base import Released


@dataclass(frozen=True)
class Pushed:
    """Where ``push_model`` put a released model: its Model artifact URI, its ModelBlessing URI, whether it was
    blessed, and the serving path it was pushed to (None: not pushed -- not blessed, or no serving dir).

    Args:
        model_uri: the Model artifact's URI.
        blessing_uri: the ModelBlessing's URI.
        blessed: whether the model was blessed.
        pushed_to: the serving path it was pushed to, or None.
    """

    model_uri: str
    blessing_uri: str
    blessed: bool
    pushed_to: str | None


def push_model(push_dir: str, model: Released, result=None, serving_dir: str | None = None) -> Pushed:
    """Write ``model`` as a TFX Model artifact (push_dir/model-<t>/Format-Serving/: weights.npy, model.json) and
    its ModelBlessing (push_dir/blessing-<t>/, ``write_blessing``): blessed iff the SLA check ACCEPTed, or
    when no SLA check is set (``result`` None -- as a Pusher without a model_blessing input pushes every
    model). With ``serving_dir``, push it there (``push_blessed``: blessed models only, version t). A TFX
    Pusher given these two artifacts (tests/release/test_release_pusher.py) pushes exactly the same models.

    Args:
        push_dir: the folder the artifacts are written in.
        model: the released model.
        result: the SLA check's result, or None (no SLA: blessed).
        serving_dir: where blessed models are pushed, or None.
    """

    model_uri = os.path.join(push_dir, f"model-{model.t:06d}")
    serving = os.path.join(model_uri, SERVING_MODEL_DIR)
    os.makedirs(serving, exist_ok=True)
    np.save(os.path.join(serving, "weights.npy"), model.weights)
    outcome = None if result is None else str(result.outcome)
    info = {"t": model.t, "blocks": model.blocks, "kind": model.kind, "sla_outcome": outcome}
    with open(os.path.join(serving, "model.json"), "w") as f:
        json.dump(info, f, indent=1)
    accepted = result is None or outcome == Outcome.ACCEPT
    blessing_uri = write_blessing(
        os.path.join(push_dir, f"blessing-{model.t:06d}"), model_uri, model.t, accepted, outcome=outcome
    )
    pushed = push_blessed(model_uri, blessing_uri, serving_dir, model.t) if serving_dir else None
    return Pushed(model_uri, blessing_uri, accepted, pushed)
