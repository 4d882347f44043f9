"""What a component may learn about its grant, and the one release each stage opens under it.

``check_grant`` is the one door: every data-reading component calls it BEFORE reading a record. ``open_release``
opens the stage's one release under the grant with the ledger and only then hands out the stage's noise seed,
so nothing is drawn before the ledger has recorded what is drawn. Shared by the four components: the
execution-parameter keys ``GRANT_KEY`` / ``LEDGER_KEY``, ``grant_to_json`` and ``GrantedExecutor.CheckGrant`` (one
ledger connection per run). A pipeline never sees an exact row count: only the public number of blocks, or the
DP count released under the grant's ``count`` stage. Neither needs TensorFlow, TFX or Beam.

The rules: docs/growing_database.md, "The rule: what a pipeline learns about its data size"; releases:
docs/block_composition.md, "What a grant pays for".
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sage_tfx.components._grant_channel import ADDRESS, GrantClient, channel_client
from sage_tfx.privacy import GrantError, Ledger, grant_split, record_split
from sage_tfx.privacy.blocks import BlockSource
from sage_tfx.privacy.checks import positive
from sage_tfx.privacy.digests import computation_digest, data_digest
from sage_tfx.privacy.grants import require_registered
from sage_tfx.privacy.vocabulary import Stage

if TYPE_CHECKING:
    from tfx.orchestration.data_types import RuntimeParameter
    from tfx.types.artifact import Artifact

    from sage_tfx.privacy import Grant, Release
    from sage_tfx.privacy.randomness import RngLike


class GrantLedger(BlockSource, Protocol):
    """What the components ask of a ledger: the ``Ledger`` itself, or the confined child's ``GrantClient``."""

    def verify(
        self,
        grant: Grant | str | None,
        stream: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> Grant: ...

    def release(
        self,
        grant: Grant,
        stage: str,
        computation: str,
        epsilon: float,
        delta: float = 0.0,
        per_unit: str | None = None,
    ) -> Release: ...

    def private_seed(self, grant_id: str, purpose: str) -> int: ...

    def released_record_count(self, grant: Grant) -> tuple[float, float] | None: ...


# The execution-parameter keys every data-reading component spec declares (components/_spec.py).
GRANT_KEY = "grant"
LEDGER_KEY = "ledger"


def grant_to_json(grant: Grant | str | RuntimeParameter | None) -> str | RuntimeParameter | None:
    """A ``Grant`` (anything with ``to_json``) as its JSON; JSON text, None and RuntimeParameters pass as they are."""
    if grant is not None and hasattr(grant, "to_json"):
        return grant.to_json()
    return grant


@contextlib.contextmanager
def _connection(ledger):
    """``ledger`` itself if it is an open ``Ledger`` or ``GrantClient`` (left open); the process's ``GrantClient``
    for ``ADDRESS`` (a confined run: the launcher's grant server); else ``Ledger.open(ledger)`` closed on exit."""
    if isinstance(ledger, (Ledger, GrantClient)):
        yield ledger
    elif ledger == ADDRESS:
        yield channel_client()
    else:
        with Ledger.open(ledger) as opened:
            yield opened


# The noise seed's purpose for each stage (Ledger.private_seed): one seed per grant and stage.
SEED_PURPOSES = {
    Stage.PREPROCESSING: Stage.PREPROCESSING.value,
    Stage.COUNT: "record_count",
    Stage.TRAINING: Stage.TRAINING.value,
    Stage.REJECTION: Stage.VALIDATION.value,
    Stage.VALIDATION: Stage.VALIDATION.value,
}


def _renamer(rename: dict, before: str = r"\b", after: str = r"\b"):
    """``canonical(message)``: the message's text with every name of ``rename`` (a whole token: ``before`` and
    ``after`` bound it) replaced by its new name, longest names first."""

    pattern = (
        re.compile(before + "(" + "|".join(re.escape(n) for n in sorted(rename, key=len, reverse=True)) + ")" + after)
        if rename
        else None
    )

    def canonical(message) -> str:
        text = str(message)
        return pattern.sub(lambda m: rename[m.group(1)], text) if pattern else text

    return canonical


def _function_renamer(functions):
    """A text form of proto messages with the process-wide counters TensorFlow appends to the names of a function
    library (``..._true_234``, ``__inference_signature_wrapper_7055``) replaced by their rank among the library's
    functions of the same base name: the same functions traced in another process (other counters, same order of
    creation) give the same text, and the renaming is one-to-one, so different functions stay different."""

    parts = {}
    for f in functions:
        name = f.signature.name
        match = re.match(r"^(.*?)_(\d+)$", name)
        base, number = (match.group(1), int(match.group(2))) if match else (name, -1)
        parts.setdefault(base, []).append((number, name))
    return _renamer(
        {name: f"{base}__fn{rank}" for base, found in parts.items() for rank, (_, name) in enumerate(sorted(found))}
    )


def canonical_graph_text(graph_def: Any) -> bytes:
    """A GraphDef as text with its function library's counters ranked (``_function_renamer``) and the library's
    functions in sorted order (their order varies between traces), so the same function traced twice gives the
    same text (tests/components/test_dp_transform_component.py traces it three times)."""
    canonical = _function_renamer(graph_def.library.function)
    nodes = type(graph_def)()
    nodes.CopyFrom(graph_def)
    nodes.library.ClearField("function")
    return "\n".join([canonical(nodes)] + sorted(canonical(f) for f in graph_def.library.function)).encode()


def canonical_saved_model_text(saved_model: Any) -> bytes:
    """A SavedModel proto (``saved_model.pb``) as text, canonical across processes.

    TensorFlow names what it exports with one process-wide counter: the library's functions
    (``__inference_signature_wrapper_7055``), the nodes and arguments inside them (``dense_7115``, a captured
    variable's handle) and their arguments' ``_user_specified_name`` (``"7417"``). Two exports of the same model in two
    processes (a resumed iteration re-trains under the same seed: bit-identical variables) differ in those numbers
    only (tests/components/test_model_digest.py). Here every such name is rewritten with the RANK of its number among all of
    them (one-to-one and order-preserving: the same creation order gives the same text, and two models that differ
    in anything but those counters still differ), and the library's functions and the object graph's concrete
    functions (a map keyed by function names) are listed in sorted order."""

    uid = re.compile(r"^(.*?)_?(\d+)$")
    out = []
    for meta_graph in saved_model.meta_graphs:
        library = meta_graph.graph_def.library.function
        names = {f.signature.name for f in library}
        names.update(n.name for n in meta_graph.graph_def.node)
        for f in library:
            names.update(n.name for n in f.node_def)
            names.update(a.name for a in (*f.signature.input_arg, *f.signature.output_arg))
            for attrs in f.arg_attr.values():
                if "_user_specified_name" in attrs.attr:
                    names.add(attrs.attr["_user_specified_name"].s.decode("utf-8", "replace"))
        found = {name: uid.match(name) for name in names}
        numbers = sorted({int(m.group(2)) for m in found.values() if m})
        rank = {n: i for i, n in enumerate(numbers)}
        canonical = _renamer(
            {name: f"{m.group(1)}__uid{rank[int(m.group(2))]}" for name, m in found.items() if m},
            r"(?<![\w.])",
            r"(?![\w.])",
        )
        rest = type(meta_graph)()
        rest.CopyFrom(meta_graph)
        rest.graph_def.library.ClearField("function")
        rest.object_graph_def.ClearField("concrete_functions")
        out.append(canonical(rest))
        out.extend(sorted(canonical(f) for f in library))
        out.extend(
            sorted(
                f"{canonical(key)}\n{canonical(value)}"
                for key, value in meta_graph.object_graph_def.concrete_functions.items()
            )
        )
    return "\n".join(out).encode()


def open_release(
    ledger: GrantLedger | str,
    grant: Grant,
    stage: Stage,
    computation: str,
    epsilon: float,
    delta: float = 0.0,
    per_unit: str | None = None,
) -> int:
    """Open ``stage``'s release of ``computation`` under ``grant`` with the ledger; return the stage's noise seed.

    Raises GrantError before anything is drawn if the grant already released this stage for another
    computation, if the stage asks more than its share, or if a single-stage grant was spent by
    another stage. Re-opening the same computation returns the same seed (a re-run draws the same
    noise: no new release). ``ledger``: its location, or an open ``Ledger`` (then used and left open). ``per_unit``:
    the unit column of a mechanism calibrated to the unit (``Ledger.release``: it may spend the stage's whole share).
    """
    with _connection(ledger) as opened:
        if per_unit is None:
            opened.release(grant, stage, computation, epsilon, delta)
        else:
            opened.release(grant, stage, computation, epsilon, delta, per_unit=per_unit)
        return opened.private_seed(grant.id, SEED_PURPOSES[stage])


def check_grant(
    ledger_location: str,
    grant_json: str | None,
    stream: str | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
) -> Grant:
    """Verify a grant against the ledger and return the ledger's copy (a ``Grant``).

    Raises ``GrantError`` (a ValueError) for a missing, malformed, forged (bad
    signature), unknown (never charged by this ledger), altered, other-stream or
    too-small grant, if any granted block is not registered, and if its split composes to more than
    its charge (re-checked here, at every component's door, whoever signed it). Opens the ledger at
    ``ledger_location`` for the check only; an executor holds one connection with
    ``GrantedExecutor.CheckGrant`` instead.
    """
    _require_inputs(ledger_location, grant_json)
    with Ledger.open(ledger_location) as ledger:
        return verify_grant(ledger, grant_json, stream=stream, epsilon=epsilon, delta=delta)


def _require_inputs(ledger_location, grant_json):
    """GrantError, before the ledger is opened, for a missing grant or ledger location."""
    _require_grant(grant_json)
    if not ledger_location:
        raise GrantError("no ledger location given: a grant can only be checked against its ledger")


def _require_grant(grant_json):
    if grant_json is None or (isinstance(grant_json, str) and not grant_json.strip()):
        raise GrantError(
            "no grant given: this component reads data only under a grant from the ledger "
            "(pass the JSON of Ledger.request(...) as its `grant`)"
        )


def verify_grant(
    ledger: GrantLedger,
    grant_json: str | None,
    stream: str | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
) -> Grant:
    """``check_grant`` on an open ``Ledger``: the ledger's copy of the grant, or GrantError."""
    _require_grant(grant_json)
    grant = ledger.verify(grant_json, stream=stream, epsilon=epsilon, delta=delta)
    require_registered(ledger, grant)
    grant_split(grant)  # its split composes to at most its charge (GrantError otherwise)
    record_split(grant)  # the records it reads are split by a signed rule (a parallel grant without one: refused)
    return grant


# The lineage BlockExampleGen writes on its Examples (DPTransform copies it): the rule its records were split by
# ({name: buckets} as JSON, in hashing order) and the digest of the grant's data (``data_digest``).
SPLIT_RULE_PROPERTY, DATA_PROPERTY = "split_rule", "data_digest"


def release_data(digest: str, splits: Iterable[str]) -> dict:
    """The data part of a release's fingerprint: the grant's ``data_digest`` and the split(s) the release reads
    (in the order read). Two releases under one grant on other records (other blocks, another split rule,
    other splits) get other fingerprints."""
    return {"records": digest, "splits": list(splits)}


def check_examples_data(grant: Grant, examples: Artifact, reader: str, expected: str) -> None:
    """Refuse (GrantError, before a record is read) Examples whose records are not the grant's: made without
    BlockExampleGen's lineage, split by another rule than the grant's signed one, or of other data (another
    ``data_digest`` than ``expected``, the grant's). The messages name both values."""
    rule = record_split(grant)
    have = {
        key: examples.get_string_custom_property(key) if examples.has_custom_property(key) else ""
        for key in (SPLIT_RULE_PROPERTY, DATA_PROPERTY)
    }
    if not have[SPLIT_RULE_PROPERTY] or not have[DATA_PROPERTY]:
        missing = [k for k, v in have.items() if not v]
        raise GrantError(
            f"{reader}: the Examples artifact carries no {' / '.join(missing)}: it was not made by "
            f"BlockExampleGen (or DPTransform from its output) under grant {grant.id!r}; read the "
            "grant's blocks with BlockExampleGen"
        )
    try:
        made_by = list(json.loads(have[SPLIT_RULE_PROPERTY]).items())
    except (ValueError, AttributeError):
        made_by = have[SPLIT_RULE_PROPERTY]
    if made_by != list(rule.splits.items()):
        raise GrantError(
            f"{reader}: the Examples were split by {have[SPLIT_RULE_PROPERTY]}, but grant {grant.id!r} "
            f"signs the record split {rule.describe()}: a release of other records under one grant "
            "would draw the same noise on different data. Re-run BlockExampleGen without `splits`"
        )
    if have[DATA_PROPERTY] != expected:
        raise GrantError(
            f"{reader}: the Examples hold data {have[DATA_PROPERTY][:16]}, but grant {grant.id!r}'s "
            f"records are data {expected[:16]} (its blocks split by its signed rule): a release of "
            "other records under one grant would draw the same noise on different data. Re-run "
            "BlockExampleGen under this grant"
        )


def laplace_count(exact: int, epsilon: float, rng: RngLike) -> float:
    """``exact + Laplace(0, 1/epsilon)`` drawn floating-point safe: an epsilon-DP count.

    Mechanism: ``sage_tfx.privacy.samplers.grid_laplace(exact, 1, epsilon, rng)``: the count (an
    integer, on the grid) plus gamma times exact discrete Laplace noise, gamma = 2^-20 for
    epsilon <= 1, integer scale t = ceil((2^20 + 1)/epsilon) (noise scale within 2^-20 of 1/epsilon).
    ``rng``: a ``randomness.SecureRNG`` (or anything ``as_secure_rng`` takes).
    Sensitivity: adding or removing one record changes a count by at most 1 (one cell), so the
    release is (epsilon, 0)-DP, exactly (proof in ``grid_laplace``; Dwork et al. 2006 for the
    continuous analogue). The granted blocks are disjoint parts of the stream, so one count over
    their union is one query charged to every block of the grant.
    """
    from sage_tfx.privacy.samplers import grid_laplace

    epsilon = positive(epsilon, "count epsilon", error=ValueError, message="{what} {value!r} must be {rule}")
    return float(grid_laplace([float(exact)], 1.0, epsilon, rng, cells=1)[0])


RECORD_COUNT_COMPUTATION = "record_count/v1"  # one Laplace count over all granted blocks


def released_record_count(ledger: GrantLedger, grant: Grant) -> tuple[float, float] | None:
    """The DP record count of a verified grant, or None if its split has no ``count`` stage.

    The release is opened with the ledger (stage ``count``, one computation for every caller), and
    the noise comes from a seed only the ledger can derive for (grant, "record_count"), so
    BlockExampleGen and DPTrainer, and any re-run, release the same value: no extra privacy loss.
    ``ledger``: its location, or an open ``Ledger`` (one connection for the release and the count).
    """
    from sage_tfx.privacy.randomness import secure_rng

    split = grant_split(grant)
    if split is None or split.count <= 0:
        return None
    eps = split.count
    with _connection(ledger) as opened:
        if isinstance(opened, GrantClient):  # a confined run: the server releases it (no exact count leaves it)
            return opened.released_record_count(grant)
        rng = secure_rng(
            open_release(
                opened, grant, Stage.COUNT, computation_digest(RECORD_COUNT_COMPUTATION, list(grant.blocks)), eps
            ),
            "record_count",
        )
        exact = sum(opened.private_row_count(grant.stream, b) or 0 for b in grant.blocks)
    return laplace_count(exact, eps, rng), eps


def check_read_under(
    artifact: Artifact, grant: Grant, fix: str, what: str | None = None, required: bool = True
) -> None:
    """GrantError unless ``artifact`` (an MLMD artifact) carries custom property ``grant_id`` equal to
    ``grant.id``: data made under another grant (or none) is refused. ``fix`` ends the message (what to do);
    ``what`` names the artifact (default "the Examples artifact was read"); with ``required=False`` an
    artifact without ``grant_id`` passes (e.g. a TransformGraph made outside any grant)."""
    read_under = artifact.get_string_custom_property("grant_id") if artifact.has_custom_property("grant_id") else ""
    if not required and not read_under:
        return
    if read_under != grant.id:
        raise GrantError(
            f"{what or 'the Examples artifact was read'} under grant {read_under or 'none'!r}, not {grant.id!r}: {fix}"
        )


class GrantRun:
    """One executor run under one verified grant, on ONE open ledger connection (``GrantedExecutor.CheckGrant``).

    ``grant``: the ledger's copy of the grant; ``ledger``: the open ``Ledger`` (closed when the run's
    ``with`` block ends); ``location``: where it lives. Its methods are ``open_release`` and
    ``released_record_count`` on that connection.
    """

    def __init__(self, ledger: GrantLedger, location: str, grant: Grant) -> None:
        self.ledger, self.location, self.grant = ledger, location, grant
        self._data_digest = None

    def open_release(
        self, stage: Stage, computation: str, epsilon: float, delta: float = 0.0, per_unit: str | None = None
    ) -> int:
        """``open_release`` for this run's grant on this run's connection: the stage's noise seed."""
        return open_release(self.ledger, self.grant, stage, computation, epsilon, delta, per_unit)

    def released_record_count(self) -> tuple[float, float] | None:
        """``released_record_count`` for this run's grant on this run's connection."""
        return released_record_count(self.ledger, self.grant)

    def check_read_under(self, artifact: Artifact, fix: str, what: str | None = None, required: bool = True) -> None:
        """``check_read_under`` against this run's grant."""
        check_read_under(artifact, self.grant, fix, what=what, required=required)

    def data_digest(self) -> str:
        """``data_digest`` of this run's grant (read from the ledger once per run)."""
        if self._data_digest is None:
            self._data_digest = data_digest(self.ledger, self.grant)
        return self._data_digest

    def check_examples_data(self, examples: Artifact, reader: str) -> None:
        """``check_examples_data`` against this run's grant."""
        check_examples_data(self.grant, examples, reader, self.data_digest())

    def release_data(self, splits: Iterable[str]) -> dict:
        """``release_data`` for this run's grant."""
        return release_data(self.data_digest(), splits)


class GrantedExecutor:
    """The executors' shared first step, as TFX's Pusher has ``CheckBlessing``: mix in before TFX's executor
    base (``class Executor(GrantedExecutor, base_executor.BaseExecutor)``) and open the run with::

        with self.CheckGrant(exec_properties, stream=...) as run:
            ...  # run.grant verified; run.open_release(...), run.released_record_count() on one connection

    ``CheckGrant`` opens the ledger named by ``exec_properties[LEDGER_KEY]`` ONCE, verifies
    ``exec_properties[GRANT_KEY]`` through it (``verify_grant``: GrantError before any record is read)
    and closes the connection when the run ends, whatever happens. Override it to add checks (call the
    base first) or to resolve the grant differently.

    All four data-reading executors use it. BlockExampleGen's does so as a Beam executor: ``class
    Executor(GrantedExecutor, base_beam_executor.BaseBeamExecutor)``, then ``with self.CheckGrant(exec_properties,
    stream=exec_properties.get("stream")) as run:``, ``run.ledger`` for ``grant_blocks`` and
    ``run.released_record_count()`` for the DP count (tests/components/test_block_example_gen_grant_step.py).
    """

    @contextlib.contextmanager
    def CheckGrant(
        self,
        exec_properties: Mapping[str, Any],
        *,
        stream: str | None = None,  # noqa: N802 (TFX style)
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> Iterator[GrantRun]:
        location = exec_properties.get(LEDGER_KEY)
        grant_json = exec_properties.get(GRANT_KEY)
        _require_inputs(location, grant_json)
        with _connection(location) as ledger:
            grant = verify_grant(ledger, grant_json, stream=stream, epsilon=epsilon, delta=delta)
            yield GrantRun(ledger, location, grant)
