"""The model dependency chain of the paper's Algorithm 5 (Private Sliding Window ERM) as written, with w0 one block
and a window of w = 2^k - 1 blocks (docs/release_strategies.md, "Sliding window as written"). Data-independent.
"""

from __future__ import annotations

from .params import ContinualReleaseError

Interval = tuple[int, int]  # [start, end) in blocks


def check_window(window: int) -> int:
    """k with window = 2^k - 1 (k >= 1): the only windows Algorithm 5 is stated for.

    Args:
        window: the window in blocks.
    """
    k = (int(window) + 1).bit_length() - 1
    if window < 1 or 2**k - 1 != window:
        raise ContinualReleaseError(
            f"window {window!r} is invalid for Algorithm 5 as written: give 2^k - 1 blocks "
            "(1, 3, 7, 15, ...), or use SlidingWindowRelease for any window"
        )
    return k


def _pieces(start: int, length: int, leftward: bool, half: int) -> list[Interval]:
    """``length`` blocks cut into power-of-two pieces, the largest next to ``start``, going right (or left)."""
    out, pos = [], start
    for j in range(half.bit_length() - 1, -1, -1):
        size = 2**j
        if length & size:
            out.append((pos - size, pos) if leftward else (pos, pos + size))
            pos = pos - size if leftward else pos + size
    return out


def chain_at(t: int, window: int) -> list[Interval]:
    """The dependency chain released at arrival t (t blocks seen), largest bucket first: the base (the newest
    2^(k-1) blocks at the last refresh t_r, a multiple of 2^(k-1)), the older window blocks left of it and the
    blocks arrived since t_r, each cut into power-of-two buckets; each bucket's model is regularised toward the
    previous one's. Before the first refresh there is no base.

    Args:
        t: the number of blocks seen (>= 1).
        window: the window in blocks (2^k - 1).
    """
    half = 2 ** (check_window(window) - 1)
    t_r = (t // half) * half
    pieces = _pieces(t_r, t - t_r, False, half)
    if t_r >= half:
        pieces.append((t_r - half, t_r))
        start = max(0, t - window)
        pieces += _pieces(t_r - half, t_r - half - start, True, half)
    return sorted(pieces, key=lambda iv: -(iv[1] - iv[0]))


def chain_keys(t: int, window: int) -> list[tuple[Interval, ...]]:
    """Each chain model's identity: its bucket and those of every model it is regularised toward (a model is
    trained again only when this changes).

    Args:
        t: the number of blocks seen.
        window: the window in blocks.
    """
    chain = chain_at(t, window)
    return [tuple(chain[: i + 1]) for i in range(len(chain))]


def participation(window: int) -> float:
    """A block's worst-case sum over the models trained on it of 4^-j (2^j its bucket's blocks), over a run long
    enough that every block's whole life is in it (the structure has period 2^(k-1)): c with 1/z_eff^2 = c / z^2.

    Args:
        window: the window in blocks.
    """
    half = 2 ** (check_window(window) - 1)
    horizon = 3 * window + 4 * half + 2
    trained: set[tuple[Interval, ...]] = set()
    for t in range(1, horizon + 1):
        trained.update(chain_keys(t, window))
    load = [0.0] * horizon
    for key in trained:
        a, b = key[-1]
        for block in range(a, b):
            load[block] += 4.0 ** -((b - a).bit_length() - 1)
    return max(load)
