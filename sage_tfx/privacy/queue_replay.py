"""The queued policies' state (DPF-N, DPF-T, DPack: docs/scheduling_policies.md) replayed from the log for the
audit (``audit.py``, step 4): demands, per-block arrivals, and every ``admit`` entry re-run through the policy's
own scheduler (``allocation.QueuedAllocation``) on the replayed state at the logged time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .allocation import QueuedAllocation, get_policy
from .chain import canonical as _canonical
from .errors import LedgerError
from .vocabulary import BlockState, DemandState, Policy

if TYPE_CHECKING:
    from .allocation import AllocationPolicy
    from .filters import Filter


class QueueReplay:
    """The queued policies' state replayed from the log: demands, per-block arrivals, admissions (audit step 4)."""

    def __init__(
        self,
        streams: Mapping[str, Filter],
        configs: Mapping[str, Mapping[str, Any]],
        blocks: Mapping[tuple[str, str], Any],
        block_rows: Mapping[tuple[str, str], Sequence[Any]],
        problems: list[str],
    ) -> None:
        self.streams, self.configs, self.blocks, self.block_rows = streams, configs, blocks, block_rows
        self.problems = problems
        self.arrivals: dict[
            tuple[str, str], int
        ] = {}  # (stream, block) -> pipeline arrivals counted while it was active (queued streams)
        self.demands: dict[
            tuple[str, str], Any
        ] = {}  # (stream, pipeline) -> [blocks, cost, rule, meta text, seq, state, grant id]
        self.admissions: dict[str, tuple] = {}  # grant id -> (stream, pipeline, blocks, cost, seq of its admit entry)
        self.granted: set[str] = set()  # admitted grant ids whose grant entry followed
        self._rules: dict[str, AllocationPolicy] = {}  # stream -> its AllocationPolicy

    def rules(self, stream: str) -> AllocationPolicy | None:
        config = self.configs.get(stream)
        if config is None:
            return None
        rules = self._rules.get(stream)
        if rules is None:
            try:
                rules = get_policy(config["policy"], config.get("policy_params"))
            except LedgerError as exc:
                self.problems.append(f"stream {stream!r}: its policy cannot be applied ({exc})")
                rules = get_policy(Policy.CONSERVE.value)
            self._rules[stream] = rules
        return rules

    def queued(self, stream: str) -> bool:
        rules = self.rules(stream)
        return rules is not None and rules.queued

    def arrive(self, stream: str) -> None:
        if self.queued(stream):
            for (s, b), block in self.blocks.items():
                if s == stream and block["state"] == BlockState.ACTIVE:
                    self.arrivals[(s, b)] += 1

    def demand(self, seq: int, body: Mapping[str, Any]) -> None:
        if not self.queued(body["stream"]):
            self.problems.append(f"log entry {seq}: a demand on stream {body['stream']!r}, whose policy queues none")
            return
        self.demands[(body["stream"], body["pipeline"])] = [
            tuple(body["blocks"]),
            tuple(body["cost"]),
            body["rule"],
            _canonical(body["meta"]),
            seq,
            DemandState.PENDING,
            None,
        ]

    def admit(self, seq: int, body: Mapping[str, Any]) -> None:
        stream = body["stream"]
        if not self.queued(stream):
            self.problems.append(f"log entry {seq}: admissions on stream {stream!r}, whose policy queues none")
            return
        filt, config = self.streams[stream], self.configs[stream]
        queue = QueuedAllocation(
            filt, filt.cost(epsilon=config["min_epsilon"]), cast("AllocationPolicy", self.rules(stream))
        )
        pending = sorted(
            (d[4], p, d) for (s, p), d in self.demands.items() if s == stream and d[5] == DemandState.PENDING
        )
        for b in dict.fromkeys(b for _, _, d in pending for b in d[0]):
            block = self.blocks.get((stream, b))
            if block is not None:
                queue.load_block(
                    b,
                    spent=block["spent"],
                    arrived=self.block_rows[(stream, b)][3],
                    arrivals=self.arrivals[(stream, b)],
                    retired=block["state"] != BlockState.ACTIVE,
                )
        for demand_seq, pipeline, d in pending:
            queue.demand(pipeline, d[0], d[1], seq=demand_seq)
        expected = [p for p, _, _ in queue.schedule(float(body["now"]))]
        logged = [p for p, _ in body[DemandState.ADMITTED]]
        if logged != expected:
            self.problems.append(
                f"log entry {seq}: the {config['policy']} scheduler at time {body['now']} admits "
                f"{expected} in that order, but the log admitted {logged} (an admission that did "
                "not fit the unlocked budget, or out of the policy's order)"
            )
        for pipeline, gid in body[DemandState.ADMITTED]:
            d = self.demands.get((stream, pipeline))
            if d is None or d[5] != DemandState.PENDING:
                self.problems.append(f"log entry {seq}: pipeline {pipeline!r} admitted without a pending demand")
                continue
            self.admissions[gid] = (stream, pipeline, d[0], d[1], seq)
            if pipeline == body.get("collected"):
                del self.demands[(stream, pipeline)]
            else:
                d[5], d[6] = DemandState.ADMITTED, gid

    def collect(self, seq: int, body: Mapping[str, Any]) -> None:
        d = self.demands.get((body["stream"], body["pipeline"]))
        if d is None or d[5] != DemandState.ADMITTED or d[6] != body["grant"]:
            self.problems.append(
                f"log entry {seq}: pipeline {body['pipeline']!r} collected grant {body['grant']!r}, "
                "which was not admitted for it"
            )
        self.demands.pop((body["stream"], body["pipeline"]), None)

    def grant(self, seq: int, body: Mapping[str, Any]) -> None:
        if not self.queued(body["stream"]):
            return
        gid = cast(str, body.get("id"))  # a grant entry without one is not admitted: the audit says so below
        admitted = self.admissions.get(gid)
        if admitted is None:
            self.problems.append(
                f"log entry {seq}: grant {gid!r} on queued stream {body['stream']!r} was not admitted by its scheduler"
            )
            return
        stream, pipeline, blocks, cost, _ = admitted
        if (body["stream"], body["pipeline"], tuple(body["blocks"]), tuple(body["cost"])) != (
            stream,
            pipeline,
            blocks,
            cost,
        ):
            self.problems.append(
                f"log entry {seq}: grant {gid!r} differs from the demand its admission granted "
                f"(pipeline {pipeline!r}, blocks {list(blocks)}, cost {list(cost)})"
            )
        self.granted.add(gid)

    def finish_checks(self) -> None:
        for gid in sorted(set(self.admissions) - self.granted):
            self.problems.append(f"grant {gid!r} was admitted (log entry {self.admissions[gid][4]}) but never charged")
