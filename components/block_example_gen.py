"""BlockExampleGen: the only door from the growing database into a TFX pipeline.

Input: a grant from the ledger (JSON; an execution parameter or a
RuntimeParameter), the ledger location, the data root and the stream. Output: a
standard ``Examples`` artifact holding exactly the granted blocks' records,
split by a hash of each record alone into the splits of the grant's signed record
split (default train/eval, 9:1 buckets; ``sage_tfx.privacy.split.RecordSplit``). The
executor verifies the grant with the ledger before it reads any data, and refuses
``splits`` other than the grant's rule.

Lineage (MLMD custom properties of the output): ``grant_id``, ``stream``,
``block_ids`` (JSON list), ``block_count``, ``epsilon``, ``delta``, ``charge`` (the
exact epsilon/delta as JSON: MLMD's SQLite store rounds doubles), and, when the
grant's split has a ``count`` stage, ``dp_record_count`` with
``dp_record_count_epsilon`` (that stage's one release, opened with the ledger:
DPTrainer reads the same value), ``split_rule`` ({name: buckets} JSON) and
``data_digest`` (the grant's blocks, their registered content digests and its
record split: ``components/_grant.py`` ``data_digest``; the other components refuse
Examples whose rule or digest is not their grant's). No exact row count is ever
recorded.

``staging_location`` (optional): for Beam workers that do not share the launcher's disk, the launcher
copies the granted sealed (encrypted) files there and the workers read them through Beam's FileSystems
(docs/scale_out.md); `sage run`/`sage serve --staging-location` set it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components._spec import GRANT_PARAMETERS, grant_parameters
from sage_tfx.components.block_example_gen_executor import STAGING_LOCATION_KEY, Executor

if TYPE_CHECKING:
    from tfx.orchestration.data_types import RuntimeParameter

    from sage_tfx.privacy import Grant


class BlockExampleGenSpec(ComponentSpec):
    PARAMETERS = {
        **GRANT_PARAMETERS,
        "data_root": ExecutionParameter(type=str),
        "stream": ExecutionParameter(type=str),
        "splits": ExecutionParameter(type=str, optional=True),
        # Where the launcher stages the granted sealed files for Beam workers that do not see data_root (a local
        # folder or a Beam FileSystems URL); unset: the run's Beam --temp_location, else no staging.
        STAGING_LOCATION_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {}
    OUTPUTS = {"examples": ChannelParameter(type=standard_artifacts.Examples)}


class BlockExampleGen(base_beam_component.BaseBeamComponent):
    """Reads the blocks of a grant into an Examples artifact (train/eval)."""

    SPEC_CLASS = BlockExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(
        self,
        ledger: str,
        data_root: str | os.PathLike[str],
        stream: str,
        grant: Grant | str | RuntimeParameter | None = None,
        splits: Mapping[str, int] | None = None,
        *,
        staging_location: str | None = None,
    ) -> None:
        """Construct a BlockExampleGen component.

        Args:
          ledger: The ledger's location (a file path or a ``postgresql://`` URL, without a password).
          data_root: The folder of the stream's sealed block files.
          stream: The stream whose blocks the grant names.
          grant: A ``Grant``, its JSON, or a RuntimeParameter of type str.
          splits: {name: buckets}; it must be the grant's signed record split (None: that rule, the default).
          staging_location: Where the granted sealed block files are staged for Beam workers that do not see
            ``data_root`` (a local folder or a Beam FileSystems URL every worker can read; docs/scale_out.md,
            "BlockExampleGen on remote workers"); None: the run's Beam ``--temp_location``, else no staging.

        Raises:
          LedgerError: ``ledger`` holds a password (``check_location``).
        """
        given = {} if splits is None else {"splits": json.dumps(dict(splits))}
        staging = {} if staging_location is None else {STAGING_LOCATION_KEY: str(staging_location)}
        super().__init__(
            spec=BlockExampleGenSpec(
                **grant_parameters(grant, ledger),
                data_root=str(data_root),
                stream=stream,
                **given,
                **staging,
                examples=channel.Channel(type=standard_artifacts.Examples),
            )
        )
