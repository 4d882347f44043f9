"""User code without the key: pipeline files, and each iteration's TFX run, load in a confined child.

The launcher (``sage run``) holds the ledger, its key and the iterator, and never imports a user's pipeline file:
``describe`` loads it in a child for its declarative fields, ``confined_execute`` runs the iteration's pipeline in
a child served one grant (``components._grant_server``), ``validate_confined`` validates the run's model again in a
child that runs no user code, and ``score_outputs`` runs a pushed model for ``sage score``. A child holds no key,
secret or ledger handle, and its errors come back classified (``ConfinedRunError``).

What a child may read and write: docs/security.md, "User code runs without the key".
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection

from sage_tfx import phases
from sage_tfx.isolation import Confinement, child_user, confine_from_environment, landlock_abi, spawn
from sage_tfx.pipelines import BUILTIN, is_pipeline_file, load_pipeline
from sage_tfx.pipelines.definition import SLA, PipelineDefinitionError, SagePipeline
from sage_tfx.privacy.vocabulary import Outcome

CHILD_MODULE = "sage_tfx.pipelines.confined"


# ---------------------------------------------------------------- the launcher's side
def describe(spec: str, secrets=()) -> SagePipeline:
    """The ``SagePipeline`` of ``spec`` (``load_pipeline``'s argument), loaded in a confined child unless it is a
    built-in; PipelineDefinitionError with the loader's message (file, line) if it cannot be loaded."""
    if not isinstance(spec, str) or not spec or spec in BUILTIN:
        return load_pipeline(spec)
    is_file = is_pipeline_file(spec)
    if is_file and not os.path.isfile(spec):
        return load_pipeline(spec)  # its own message, and no child for a missing file
    spec = normalized(spec)
    confinement = Confinement(read=code_paths([spec] if is_file else [], secrets), network=False)
    check_confinement(confinement, secrets)
    result = run_child({"mode": "describe", "spec": spec}, confinement)
    if result.get("status") != "ok":
        raise PipelineDefinitionError(str(result.get("message") or f"pipeline {spec!r} could not be loaded"))
    try:
        fields = result["pipeline"]
        pipeline = SagePipeline(**{**fields, "sla": SLA(**fields["sla"]), "models": tuple(fields["models"])})
    except (KeyError, TypeError, AttributeError) as exc:  # a child that sent something else than its fields
        raise PipelineDefinitionError(
            f"pipeline {spec!r}: its loader sent an unusable description ({type(exc).__name__}: {exc})"
        ) from None
    pipeline.check_files()
    return pipeline


def normalized(spec: str) -> str:
    """``spec`` as a child loads it: a pipeline file's absolute path (the child runs in another folder)."""
    return os.path.abspath(spec) if is_pipeline_file(spec) else spec


def confined_execute(spec: str, definition: SagePipeline, config, secrets=(), check: bool = False):
    """``execute(grant, split, eta, iteration)`` for ``make_run_iteration``: the iteration's pipeline (``spec``,
    described as ``definition``) built and run in a confined child served ``grant`` by a ``GrantServer`` on
    ``config.ledger``. ``secrets``: the ledger's key, head and database paths, none of which the child may be
    granted (ValueError here, before any charge). ``check``: a ``--check`` run, whose child may send its whole
    error (generated rows)."""
    spec = normalized(spec)
    confinement = iteration_confinement(definition, config, secrets)
    check_confinement(confinement, secrets)

    def execute(grant, split, eta, iteration):
        from sage_tfx.components._grant_channel import ADDRESS
        from sage_tfx.pipelines._runner import folder_names, keep_declared_outputs
        from sage_tfx.privacy.errors import ConfinedRunError

        for folder in confinement.write:  # the child may create nothing outside them: they exist first
            os.makedirs(folder, mode=0o700, exist_ok=True)
        # its Pusher pushes into a folder of its own, removed afterwards: the launcher pushes what it validated
        child_config = {
            **dataclasses.asdict(config),
            "ledger": ADDRESS,
            "serving_dir": os.path.join(os.path.dirname(config.metadata_path), PUSH_FOLDER),
        }
        job = {
            "mode": "iterate",
            "spec": spec,
            "config": child_config,
            "grant": grant.to_json(),
            "eta": eta,
            "iteration": iteration,
            "check": check,
        }
        before = folder_names([f for f in confinement.write if not _within(f, config.pipeline_root)])
        try:
            result = run_child(job, confinement, location=config.ledger, grant=grant, output=child_output(check))
        finally:
            keep_declared_outputs(config, before)  # only the declared artifacts stay, whatever the outcome
        if result.get("status") != "ok":
            raise ConfinedRunError(
                result.get("public") or "the confined pipeline failed",
                environment=bool(result.get("environment")),
                environment_text=result.get("environment_text") or "",
                detail=result.get("detail") if check else None,
            )
        return validate_confined(definition, config, grant, eta, secrets)

    return execute


PUSH_FOLDER = "_confined_push"  # where a confined run's own Pusher writes (inside the MLMD folder; removed)
SHOW_OUTPUT = "SAGE_SHOW_CONFINED_OUTPUT"  # "1": an iteration child's stdout and stderr go to the launcher's


def child_output(check: bool = False):
    """Where an iteration child's stdout and stderr go: nowhere (``subprocess.DEVNULL``), since user code there
    holds the granted records and may print them; the launcher's own for a ``--check`` run (generated rows) or
    when the operator sets ``SAGE_SHOW_CONFINED_OUTPUT=1`` (NOT private: docs/security.md)."""
    return None if check or os.environ.get(SHOW_OUTPUT) == "1" else subprocess.DEVNULL


def _within(path: str, root: str) -> bool:
    """Whether the local ``path`` is the pipeline root or lies in it (a ``file://`` root by its local path)."""
    from sage_tfx.pipelines._runner import is_url

    root = root[len("file://") :] if root.startswith("file://") else root
    if is_url(root):
        return False
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def validate_confined(definition: SagePipeline, config, grant, eta, secrets=()) -> dict:
    """The validation result the launcher trusts for a confined run under ``grant``: the model its validator named
    (a folder inside the pipeline root) validated again in a fresh confined child that runs no user Python code
    (it loads only that SavedModel, and the custom loss module if the SLA names one) on the grant's records, read
    from its sealed blocks through the grant server, with the pipeline's own test (``validator_properties``). It
    re-opens the grant's validation release: the same model and test draw the same noise as the run's validator,
    anything else is refused by the ledger. On ACCEPT the launcher pushes that model to the serving folder.
    RuntimeError if the run recorded no validation result or names a model outside the pipeline root."""
    from sage_tfx.pipelines._runner import inside_root, is_url, validation_result
    from sage_tfx.privacy.errors import ConfinedRunError
    from sage_tfx.release.blessing import SERVING_MODEL_DIR, push_model

    claimed = validation_result(config.metadata_path, grant.id, config.pipeline_root)
    if claimed is None:
        raise RuntimeError(f"the pipeline run under grant {grant.id} recorded no validation result")
    model_uri = str(claimed.get("model_uri") or "")
    if not inside_root(model_uri, config.pipeline_root):
        raise RuntimeError(
            f"the validation result under grant {grant.id} names a model outside the pipeline root "
            f"{config.pipeline_root}: it was not written by DPModelValidator"
        )
    model_dir = model_uri.rstrip("/") + "/" + SERVING_MODEL_DIR
    properties = definition.validator_properties(config, grant, eta)
    loss_module = properties.get("loss_module")
    remote = is_url(config.pipeline_root) or is_url(config.data_root)
    local = [p[len("file://") :] if p.startswith("file://") else p for p in (model_dir, config.data_root)]
    confinement = Confinement(
        read=[p for p in local if not is_url(p)] + code_paths([loss_module] if loss_module else [], secrets),
        network=remote,
    )
    check_confinement(confinement, secrets)
    job = {
        "mode": "validate",
        "grant": grant.to_json(),
        "properties": properties,
        "model_uri": model_uri,
        "model_dir": model_dir,
        "data_root": config.data_root,
    }
    result = run_child(job, confinement, location=config.ledger, grant=grant, output=subprocess.DEVNULL)
    if result.get("status") != "ok":
        raise ConfinedRunError(
            result.get("public") or "the launcher's validation of the model failed",
            environment=bool(result.get("environment")),
            environment_text=result.get("environment_text") or "",
        )
    report = result["report"]
    if report.get("outcome") == Outcome.ACCEPT:
        push_model(model_dir, config.serving_dir, _version(config.serving_dir))
    return report


def _version(serving_dir: str) -> int:
    """A new version number for serving_dir: the time in seconds, as TFX's Pusher names them, past any there."""
    import time

    taken = [int(n) for n in os.listdir(serving_dir) if n.isdigit()] if os.path.isdir(serving_dir) else []
    return max([int(time.time()), *(v + 1 for v in taken)])


def iteration_confinement(definition: SagePipeline, config, secrets=()) -> Confinement:
    """What an iteration's child may touch: read the data root (sealed blocks) and the pipeline's code
    (``code_paths``); write its local pipeline root (not the rest of the work folder), the MLMD folder and a local
    staging folder; never the serving folder (the launcher pushes). TCP stays open: Beam's in-process runner binds
    and connects to local ports of its own (its gRPC channels)."""
    from sage_tfx.pipelines._runner import is_url

    files = [
        definition.source_file,
        *(definition.module_path(r) for r in ("trainer_module", "preprocessing_module", "loss_module")),
    ]
    write = [os.path.dirname(config.metadata_path)]
    for path in (config.pipeline_root, config.staging_location):
        if path is not None and (not is_url(path) or path.startswith("file://")):  # file://: a local folder
            write.append(path[len("file://") :] if path.startswith("file://") else path)
    return Confinement(
        read=code_paths([f for f in files if f], secrets) + [os.path.abspath(config.data_root)],
        write=sorted(set(write)),
    )


def code_paths(files, secrets) -> list:
    """What a child may read of the pipeline's code: each file's folder (sibling modules import), or, for a folder
    that holds one of ``secrets`` (a pipeline file beside the ledger's key), the file alone."""
    found = set()
    for path in files:
        folder = os.path.dirname(path)
        found.add(path if Confinement(write=[folder]).exposes_any(secrets) else folder)
    return sorted(found)


def ledger_secrets(location, key_file=None) -> list:
    """The files a confined child must never reach: the ledger's key file and head file, and an SQLite ledger's
    database (with its journal files)."""
    from sage_tfx.privacy.keys import HEAD_SUFFIX, resolve_key_path

    found = []
    try:
        key = resolve_key_path(location, key_file)
        found += [key, key + HEAD_SUFFIX]
    except ValueError:
        pass
    text = str(location)
    if "://" not in text:
        database = os.path.abspath(text)
        found += [database] + [database + s for s in ("-wal", "-shm", "-journal")]
    return found


def check_confinement(confinement: Confinement, secrets) -> None:
    """ValueError naming the folder and the fix if ``confinement`` would let the child read ``secrets``."""
    for secret in secrets:
        granted = confinement.exposes(secret)
        if granted is not None:
            raise ValueError(
                f"{secret} lies in {granted}, which the pipeline's confined process may read or write: "
                "keep the ledger, its key file and head file out of the pipeline's folder, the data "
                "root, the work, serving and staging folders and the Python install (move them, or "
                "give other folders)"
            )


def score_outputs(model_dir: str, held: list, train: list, *, label: str, label_signature: str | None = None) -> dict:
    """A pushed model run on serialized tf.Examples in a confined child, so a user-trained graph never runs
    beside the key: ``held_labels`` / ``train_labels`` (its ``label_signature`` outputs, one per record, when
    set), then ``raw_labels`` and ``outputs`` of ``model_outputs`` over the held records (those with a finite
    signature label). The child reads only the model and the records, opens no TCP connection and writes only a
    private folder removed afterwards; its stdout and stderr are discarded. ValueError with the child's message
    if the model cannot be served."""
    import base64

    folder = tempfile.mkdtemp(prefix="sage-score-")
    try:
        path = os.path.join(folder, "records.json")
        with open(path, "w") as f:
            json.dump(
                {
                    name: [base64.b64encode(r).decode("ascii") for r in records]
                    for name, records in (("held", held), ("train", train))
                },
                f,
            )
        confinement = Confinement(read=[os.path.abspath(model_dir), folder], network=False)
        job = {
            "mode": "score",
            "model_dir": os.path.abspath(model_dir),
            "records": path,
            "label": label,
            "label_signature": label_signature,
        }
        result = run_child(job, confinement, output=subprocess.DEVNULL)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if result.get("status") != "ok":
        raise ValueError(str(result.get("message") or f"the model at {model_dir} could not be served"))
    return result


def run_child(job: dict, confinement: Confinement, location=None, grant=None, output=None) -> dict:
    """Run one confined child on ``job``, serving it (``GrantServer``) until it ends; its result message, or an
    environment error's result if it ended without one (killed, crashed). ``output``: the child's stdout and
    stderr (e.g. ``subprocess.DEVNULL``; default: the launcher's)."""
    from sage_tfx.components._grant_channel import FD_ENV
    from sage_tfx.components._grant_server import GrantServer

    private_tmp = tempfile.mkdtemp(prefix="sage-confined-")
    confinement = dataclasses.replace(confinement, write=[*confinement.write, private_tmp])
    ours, theirs = socket.socketpair()
    try:
        streams = {} if output is None else {"stdout": output, "stderr": output}
        child = spawn(
            CHILD_MODULE,
            [],
            confinement,
            private_tmp,
            pass_fds=[theirs.fileno()],
            env={FD_ENV: str(theirs.fileno())},
            **streams,
        )
        theirs.close()
        connection = Connection(ours.detach())
        try:
            result = GrantServer(job, location, grant).serve(connection)
        finally:
            connection.close()
            code = child.wait()
        phases.add_child(result.pop("profile", None) if result else None)
    finally:
        theirs.close()
        shutil.rmtree(private_tmp, ignore_errors=True)
    if result is None:
        text = f"the pipeline's confined process ended with exit code {code} before it reported a result"
        return {"status": "error", "public": text, "environment": True, "environment_text": text, "message": text}
    return result


# ---------------------------------------------------------------- the child's side
# SagePipeline's fields the launcher does not get: a function, which stays in the child that builds the pipeline.
NOT_DESCRIBED = ("components",)


def _fields(pipeline: SagePipeline) -> dict:
    """The declarative fields of a loaded pipeline (every field but ``NOT_DESCRIBED``), as JSON the launcher
    rebuilds it from; module paths made absolute."""
    fields = {f.name: getattr(pipeline, f.name) for f in dataclasses.fields(pipeline) if f.name not in NOT_DESCRIBED}
    fields.update(
        sla=dataclasses.asdict(pipeline.sla),
        models=list(pipeline.models),
        **{role: pipeline.module_path(role) for role in ("trainer_module", "preprocessing_module")},
    )
    return json.loads(json.dumps(fields, default=repr))


def _iterate(job: dict) -> None:
    from sage_tfx.pipelines._runner import PipelineConfig, run_built
    from sage_tfx.privacy import BudgetSplit, Grant

    definition = load_pipeline(job["spec"])
    config = PipelineConfig(**job["config"])
    grant = Grant.from_json(job["grant"])
    run_built(definition.build_pipeline, config, grant, BudgetSplit.from_meta(grant.meta), job["eta"], job["iteration"])


def _validate(job: dict) -> dict:
    """The child's side of ``validate_confined``: no user Python code runs here (the pipeline is not loaded)."""
    from sage_tfx.components._grant import GrantedExecutor
    from sage_tfx.components._grant_channel import ADDRESS
    from sage_tfx.components.granted_reads import granted_records  # neither imports TFX nor Beam
    from sage_tfx.components.validation_steps import validate_model, validation_plan, validation_report

    with GrantedExecutor().CheckGrant({"grant": job["grant"], "ledger": ADDRESS}) as run:
        plan = validation_plan(job["properties"], run.grant)
        splits = [plan["eval_split"]] + ([] if plan["train_split"] is None else [plan["train_split"]])
        records = granted_records(run.ledger, job["data_root"], run.grant, splits)
        result, computation = validate_model(run, plan, job["model_dir"], records.__getitem__)
        report = validation_report(result, plan, run.grant, computation, model_uri=job["model_uri"])
    return {"status": "ok", "report": json.loads(json.dumps(report, default=str))}


def _score(job: dict) -> dict:
    """The child's side of ``score_outputs``: JSON-ready lists (non-numeric outputs left out)."""
    import base64

    import numpy as np

    from sage_tfx.components.validator_records import ServingModel, model_outputs

    with open(job["records"]) as f:
        records = {name: [base64.b64decode(r) for r in items] for name, items in json.load(f).items()}
    model, signature, label = ServingModel(job["model_dir"]), job["label_signature"], job["label"]
    held, result = records["held"], {"status": "ok"}
    if signature:
        for name in ("held", "train"):
            found = model.labels(records[name], signature, label) if records[name] else np.zeros(0)
            result[f"{name}_labels"] = found.tolist()
        held = [r for r, y in zip(held, result["held_labels"]) if np.isfinite(y)]
    raw_labels, outputs = model_outputs(model, held, label, signature)
    result["raw_labels"] = np.asarray(raw_labels, dtype=np.float64).tolist()
    result["outputs"] = {}
    for key, values in outputs.items():
        try:
            result["outputs"][key] = np.asarray(values, dtype=np.float64).tolist()
        except (TypeError, ValueError):
            continue  # a string output (class names): no metric reads it
    return result


def _failure(exc: BaseException, job: dict) -> dict:
    """The child's error as the launcher may see it: classified here, its public parts only (the whole error
    with its traceback for a ``--check`` run, on generated rows)."""
    from sage_tfx.privacy.errors import environment_error_text, is_environment_error, public_error_text

    if job.get("mode") in ("describe", "score"):
        message = str(exc) if isinstance(exc, (PipelineDefinitionError, ValueError)) else f"{type(exc).__name__}: {exc}"
        return {"status": "error", "message": message}
    environment = is_environment_error(exc)
    result = {
        "status": "error",
        "public": public_error_text(exc),
        "environment": environment,
        "environment_text": environment_error_text(exc) if environment else "",
    }
    if job.get("check"):
        from sage_tfx.pipelines.check import describe_failure

        result["detail"] = describe_failure(exc)
    return result


def main() -> None:
    """The confined child: confine itself, get its job from the launcher, do it, report, exit."""

    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: it never outlives the launcher
    confine_from_environment()
    phases.start()  # after the confinement: the sampling thread is confined too
    from sage_tfx.components._grant_channel import channel_client

    client = channel_client()
    job = client.job()
    try:
        if job.get("mode") == "describe":
            result = {"status": "ok", "pipeline": _fields(load_pipeline(job["spec"]))}
        elif job.get("mode") == "score":
            result = _score(job)
        elif job.get("mode") == "validate":
            result = _validate(job)
        else:
            _iterate(job)
            result = {"status": "ok"}
    except BaseException as exc:  # noqa: B036 (SystemExit from user code too: reported, classified)
        result = _failure(exc, job)
    profile = phases.finish()
    if profile:
        result["profile"] = profile
    client.report(result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # Beam's and TensorFlow's threads never hold the exit; everything is committed


def confinement_status() -> str:
    """One line on how user code is confined on this host: the Landlock ABI (or its absence) and the OS user its
    children run as (``isolation.child_user``: which one, or why they keep the launcher's)."""
    abi = landlock_abi()
    landlock = (
        f"Landlock ABI {abi}" if abi else "no Landlock on this kernel: separate process and scrubbed environment only"
    )
    return f"{landlock}; {child_user()[1]}"


if __name__ == "__main__":
    main()
