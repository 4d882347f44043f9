"""The attempts ``SageIterator`` can make on a stream as it is now, from public numbers only.

What a pipeline may still be granted on each block (``Ledger.available_per_block``: the budget state, no data)
and the iterator's own rule (``next_attempt``: after a RETRY, double epsilon if the window still offers twice
it, else double the window) give the attempts a run can make before it needs blocks that do not exist yet;
``sage run`` does not wait for blocks, so it ends there in TIMEOUT. ``plan_attempts`` charges each planned
attempt's epsilon on its blocks as basic composition does (what is left drops by it): exact on a stream with
basic accounting; on an RDP stream, where composition is sub-additive, the plan may list fewer attempts than
the ledger would grant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedAttempt:
    """One attempt a run can make on the blocks present now.

    Args:
        attempt: its number, 1, 2, ...: its eta is eta / (attempt (attempt + 1)).
        epsilon: charged on each block of the window.
        window: its window, in blocks.
        blocks: the newest ``window`` blocks that offer ``epsilon``, oldest first.
    """

    attempt: int  # 1, 2, ...: its eta is eta / (attempt (attempt + 1))
    epsilon: float  # charged on each block of the window
    window: int  # blocks
    blocks: tuple  # the newest ``window`` blocks that offer ``epsilon``, oldest first


@dataclass(frozen=True)
class AttemptPlan:
    """The attempts a run can make before it needs blocks that do not exist yet (``plan_attempts``).

    Args:
        attempts: the ``PlannedAttempt``s, in order.
        stop: why no further attempt can run on the blocks present now.
        blocks: the stream's active blocks now.
    """

    attempts: tuple  # PlannedAttempt, in order
    stop: str  # why no further attempt can run on the blocks present now
    blocks: int  # active blocks of the stream now

    @property
    def retries(self) -> int:
        """The RETRYs the plan allows: every attempt after the first follows one."""
        return max(0, len(self.attempts) - 1)

    def describe(self) -> str:
        """One line: the attempts, and why the list ends."""
        if not self.attempts:
            return f"none: the first attempt cannot run: {self.stop}"
        steps = ", ".join(f"{a.epsilon:g} on {a.window}" for a in self.attempts)
        return (
            f"{len(self.attempts)} attempt(s) (epsilon per block on blocks: {steps}), so {self.retries} "
            f"RETRY(s); then {self.stop}"
        )


def next_attempt(epsilon: float, window: int, window_available: float, aggressive: bool = False) -> tuple:
    """The iterator's next (epsilon, window) after a RETRY at (``epsilon``, ``window``): twice the epsilon if
    ``window_available`` (what the window's blocks offer together now) is at least that, under any policy but
    aggressive; else the same epsilon on twice the window."""
    if not aggressive and window_available >= 2 * epsilon:
        return 2 * epsilon, window
    return epsilon, 2 * window


def plan_attempts(
    available: dict,
    *,
    epsilon_start: float,
    min_window: int,
    max_iterations: int = 10,
    aggressive: bool = False,
    min_epsilon: float = 0.0,
) -> AttemptPlan:
    """The attempts a run starting at (``epsilon_start``, ``min_window``) can make on the blocks of ``available``
    ({block: epsilon this pipeline may be granted on it now}, oldest first), each ending in RETRY, with no new
    block: the iterator's choice (``SageIterator.choose_blocks``; aggressive: what the newest ``window`` blocks
    offering ``min_epsilon`` offer together) and ``next_attempt``, at most ``max_iterations`` attempts.

    Args:
        available: {block: the epsilon this pipeline may be granted on it now}, oldest first
            (``Ledger.available_per_block``).
        epsilon_start: the first attempt's per-block epsilon.
        min_window: the first attempt's window, in blocks.
        max_iterations: the most attempts listed.
        aggressive: the stream's policy is aggressive (ask what the window offers; never double epsilon).
        min_epsilon: the stream's minimum per-block epsilon an aggressive window must offer.

    Returns:
        The ``AttemptPlan``; it reads public budget numbers only and charges nothing.
    """
    left = {b: float(v) for b, v in available.items()}
    epsilon, window, attempts = float(epsilon_start), int(min_window), []
    while len(attempts) < max_iterations:
        floor = min_epsilon if aggressive else epsilon
        chosen = [b for b in reversed(left) if left[b] >= floor][:window][::-1]
        if len(chosen) < window:
            stop = (
                f"fewer than {window} block(s) offer epsilon {floor:.4g} (the stream has {len(left)} active "
                "block(s) now): `sage run` ends in TIMEOUT there; new blocks allow more"
            )
            return AttemptPlan(tuple(attempts), stop, len(left))
        if aggressive:
            epsilon = min(left[b] for b in chosen)
        for b in chosen:
            left[b] -= epsilon
        attempts.append(PlannedAttempt(len(attempts) + 1, epsilon, window, tuple(chosen)))
        epsilon, window = next_attempt(epsilon, window, min(left[b] for b in chosen), aggressive)
    return AttemptPlan(tuple(attempts), f"max_iterations {max_iterations} reached (TIMEOUT)", len(left))
