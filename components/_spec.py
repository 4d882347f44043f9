"""The grant/ledger part of the data-reading components' specs, declared once.

TFX style (as ``tfx.types.standard_component_specs``): the keys are constants (``GRANT_KEY``,
``LEDGER_KEY``, defined TF-free in ``components/_grant.py``), ``GRANT_PARAMETERS`` is the ``PARAMETERS``
fragment every spec that reads under a grant starts with (BlockExampleGen, DPTransform, DPTrainer,
DPModelValidator), and ``grant_parameters`` is the one coercion of a component's constructor arguments
into it: a ``Grant`` becomes its JSON (a RuntimeParameter of type str passes, resolved at run time), the
ledger location a string, never with a password in it (it is stored in the pipeline metadata:
``privacy.store.location.check_location`` refuses it as the component is built).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tfx.types.component_spec import ExecutionParameter

from sage_tfx.components._grant import GRANT_KEY, LEDGER_KEY, grant_to_json
from sage_tfx.privacy.store.location import check_location

if TYPE_CHECKING:
    from tfx.orchestration.data_types import RuntimeParameter

    from sage_tfx.privacy import Grant

GRANT_PARAMETERS = {
    GRANT_KEY: ExecutionParameter(type=str, optional=True),  # the grant's JSON, or a RuntimeParameter of type str
    LEDGER_KEY: ExecutionParameter(type=str),  # the ledger's location (a file path or a postgresql:// URL)
}


def grant_parameters(grant: Grant | str | RuntimeParameter | None, ledger: str | os.PathLike[str]) -> dict:
    """The spec's grant/ledger execution properties: ``{GRANT_KEY: grant's JSON, LEDGER_KEY: str(ledger)}``."""
    return {GRANT_KEY: grant_to_json(grant), LEDGER_KEY: check_location(ledger)}
