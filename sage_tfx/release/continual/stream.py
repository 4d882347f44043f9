"""The entry point: a model released for every new block of a stream, SLA-checked and pushed (``release_stream``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sage_tfx.ingest.access import grant_blocks

from .base import Reader, _Base
from .cumulative import ContinualRelease
from .params import ContinualReleaseError, ReleaseParams
from .push import push_model
from .sla import check_sla
from .sliding_window import SlidingWindowRelease


def grant_reader(ledger, data_root: str, featurize: Callable[[list[bytes]], tuple[np.ndarray, np.ndarray]]) -> Reader:
    """A Reader that opens a grant's block through ``sage_tfx.ingest.access.grant_blocks`` (checked, charged
    grants only) and turns its tf.Example records into (X, y) with ``featurize``."""

    def read(grant):
        _, blocks = grant_blocks(ledger, data_root, grant)
        records = [r for blk in blocks for r in blk.records()]
        return featurize(records)

    return read


def release_stream(
    ledger,
    data_root: str,
    stream: str,
    pipeline: str,
    params: ReleaseParams,
    *,
    featurize: Callable[[list[bytes]], tuple[np.ndarray, np.ndarray]],
    dim: int,
    blocks: Sequence[str] | None = None,
    validator=None,
    push_dir: str | None = None,
    serving_dir: str | None = None,
    release: _Base | None = None,
) -> tuple[_Base, list[dict]]:
    """The entry point: release a model for every new block of ``stream`` (``blocks``, default the stream's
    blocks not yet observed, in ledger order), each charged before it is read; with ``validator`` every model
    goes through the SLA check (``check_sla``) and, with ``push_dir``, is written with its ModelBlessing
    (``push_model``: blessed only on ACCEPT) and, with ``serving_dir`` too, pushed there if blessed. A window in
    ``params`` selects SlidingWindowRelease. Pass the returned release back in as
    ``release`` on the next call to continue the same stream.

    Args:
        ledger: the privacy ledger.
        data_root: the stream's data root.
        stream: the stream.
        pipeline: the pipeline name charged.
        params: the checked ReleaseParams.
        featurize: tf.Example records -> (X, y).
        dim: the number of features.
        blocks: the block ids to observe (default: the unobserved ones, in ledger order).
        validator: a DPLossValidator for the SLA check, or None.
        push_dir: where models and blessings are written, or None.
        serving_dir: where blessed models are pushed (needs push_dir), or None.
        release: the release returned by an earlier call, to continue the stream.
    """
    if serving_dir is not None and push_dir is None:
        raise ContinualReleaseError(
            f"serving_dir {serving_dir!r} needs push_dir: the models and their blessings "
            "are written there first (the artifacts a Pusher reads)"
        )
    if release is None:
        cls = ContinualRelease if params.window is None else SlidingWindowRelease
        v_eps = None if validator is None else float(validator.epsilon)
        release = cls(
            ledger,
            stream,
            pipeline,
            params,
            grant_reader(ledger, data_root, featurize),
            dim=dim,
            validation_epsilon=v_eps,
        )
    if blocks is None:
        blocks = [b.id for b in ledger.blocks(stream) if b.id not in release.grants]
    out = []
    for block in blocks:
        model = release.observe(block)
        result = check_sla(release, model, validator) if validator is not None else None
        pushed = push_model(push_dir, model, result, serving_dir) if push_dir else None
        out.append(
            {
                "t": model.t,
                "block": block,
                "kind": model.kind,
                "sla": None if result is None else str(result.outcome),
                "model": pushed and pushed.model_uri,
                "blessing": pushed and pushed.blessing_uri,
                "blessed": pushed and pushed.blessed,
                "pushed": pushed and pushed.pushed_to,
            }
        )
    return release, out
