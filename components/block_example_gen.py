"""BlockExampleGen: the only door from the growing database into a TFX pipeline.

It reads exactly a grant's blocks into a standard ``Examples`` artifact, split by a hash of each record alone
by the grant's signed record split. The executor verifies the grant with the ledger before it reads any data;
the output's lineage (grant, blocks, split rule, data digest, the DP record count) lets the other components
refuse Examples of other records. No exact row count is ever recorded.

Parameters and lineage: docs/growing_database.md, "BlockExampleGen"; remote workers: docs/scale_out.md,
"BlockExampleGen on remote workers".
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
