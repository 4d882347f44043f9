"""The certificate request a pipeline name is run for: signed into each grant's meta (``REQUEST_KEY``); a name
with iterations asked for another request is refused (``RequestMismatch``) before anything is registered or
charged, as an outcome certifies only the request it tested. One rule for the Sage iterator and the schedule
driver (``sage_tfx.release.scheduled_pipeline``).
"""

from sage_tfx.privacy.errors import LedgerError as _LedgerError
from sage_tfx.privacy.vocabulary import PipelineState

from .results import bound_text

REQUEST_KEY = "request"  # the grant meta's copy of what the pipeline was asked to certify
# the request's fields that a stored outcome predating REQUEST_KEY still shows (its validator's result)
LOGGED_REQUEST = ("target", "metric")


class RequestMismatch(_LedgerError):
    """A pipeline name with iterations asked for another target, SLA, model or definition than it was run with."""


def stored_request(history) -> dict | None:
    """What a pipeline's ``history`` (``Ledger.history`` entries, oldest first) was asked to certify: the request
    signed into its last grant's meta; for grants from before it was signed, the target and metric its
    last validator result names; None if neither is recorded."""
    for grant, _outcome, _details in reversed(history):
        if REQUEST_KEY in grant.meta:
            return dict(grant.meta[REQUEST_KEY])
    for _grant, _outcome, details in reversed(history):
        validation = (details or {}).get("validation")
        if isinstance(validation, dict) and all(k in validation for k in LOGGED_REQUEST):
            return {k: validation[k] for k in LOGGED_REQUEST}
    return None


def request_differences(stored: dict, asked: dict) -> list:
    """The fields of ``stored`` that ``asked`` gives otherwise, as "field stored -> asked" texts."""
    return [f"{key} {stored[key]!r} -> {asked.get(key)!r}" for key in stored if stored[key] != asked.get(key)]


def check_request(ledger, stream: str, pipeline: str, request: dict | None, history) -> None:
    """Refuse (``RequestMismatch``, nothing written) a ``request`` other than the one pipeline name ``pipeline``'s
    grants were run for (``history``: its ``Ledger.history`` entries, oldest first): its stored outcome certifies
    that request only. The message names the stored target, the last bound, what this run asks and the fix (a new
    pipeline name). None asks nothing: no check. One rule for the Sage iterator and the schedule driver
    (``sage_tfx.release.scheduled_pipeline``)."""
    if request is None:
        return
    stored = stored_request(history)
    if stored is None:
        return
    differences = request_differences(stored, request)
    if not differences:
        return
    status = {p["name"]: p for p in ledger.pipelines(stream)}.get(pipeline) or {}
    bound = (history[-1][2] or {}).get("bound") if history else None
    state = (
        f"finished with {status['outcome']}"
        if status.get("state") == PipelineState.DONE
        else f"has {len(history)} iteration(s) (not finished)"
    )
    raise RequestMismatch(
        f"pipeline {pipeline!r} {state} on stream {stream!r} for target {stored.get('target')!r} "
        f"(bound {bound_text(bound)}); this run asks {', '.join(differences)}. Its outcome certifies only what "
        "it was run for: run the new request under a new pipeline name (sage run --name NEW, sage serve "
        "--pipeline NEW=...), or repeat the stored request to see its outcome"
    )
