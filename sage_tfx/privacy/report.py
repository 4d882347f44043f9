"""Readable ledger reports: a per-block budget table and a heat-map PNG of budget spent over time."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sage_tfx.plots import pyplot, save_figure

if TYPE_CHECKING:
    from .ledger import Ledger


def format_time(ts: float | None) -> str:
    """``ts`` (unix seconds) as a UTC date and time; as seconds when no date names it (a window registered before
    ``check_block`` bounded them), so a report never fails on a registered block."""
    if ts is None:
        return "-"
    try:
        return _dt.datetime.fromtimestamp(float(ts), _dt.UTC).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return f"{float(ts):g} s"


def block_key_text(block: Mapping[str, Any]) -> str:
    if block.get("shard") is not None:
        return f"shard {block['shard']}"
    if block.get("start") is not None:
        return f"[{format_time(block['start'])}, {format_time(block['end'])})"
    return "-"


def _unit_text(status):
    """The status's privacy unit in words: whom the guarantee protects."""
    if status.get("privacy_unit", "row") == "row":
        return "row (event-level DP)"
    return (
        f"{status['privacy_unit']}, at most {status['max_rows_per_unit']} rows a block (each stage's mechanisms "
        f"get epsilon/{status['max_rows_per_unit']} per row)"
    )


def status_table(status: Mapping[str, Any], width: int = 20) -> str:
    """The status dict of ``Ledger.status`` as a fixed-width text table with a budget bar per block."""
    eps = status["epsilon"]
    lines = [
        f"stream {status['stream']}: global (epsilon={eps:g}, delta={status['delta']:g}), "
        f"accounting={status['accounting']}, policy={status['policy']}",
        f"privacy unit: {_unit_text(status)}",
        f"blocks: {status['active_blocks']} active, {status['retired_blocks']} retired; grants: {status['grants']}",
        "",
        f"{'block':<16} {'key':<38} {'state':<8} {'eps spent':>10} {'eps left':>10} {'delta spent':>12}  budget used",
    ]
    for b in status["blocks"]:
        used = min(1.0, b["epsilon_spent"] / eps) if eps else 1.0
        filled = int(round(used * width))
        bar = "#" * filled + "." * (width - filled)
        lines.append(
            f"{b['id']:<16} {block_key_text(b):<38} {b['state']:<8} {b['epsilon_spent']:>10.4f} "
            f"{b['epsilon_remaining']:>10.4f} {b['delta_spent']:>12.3g}  [{bar}]"
        )
    for p in status.get("pipelines", []):
        lines.append(f"pipeline {p['name']}: {p['state']}" + (f" ({p['outcome']})" if p["outcome"] else ""))
    return "\n".join(lines)


def spending_history(
    ledger: Ledger, stream: str, max_columns: int = 300
) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """(block ids, event times, column labels, matrix of used share per block after each column).

    One column per grant, and one per run of consecutive block arrivals, so the
    picture reads the same whether the stream grew over a minute or a year and
    however many blocks arrive between two grants; NaN marks blocks that had
    not arrived yet. Past ``max_columns`` columns they are sampled evenly
    (always keeping the last).
    """

    s = ledger.stream(stream)
    filt = s.filter()
    blocks = [b.id for b in ledger.blocks(stream)]
    index = {b: i for i, b in enumerate(blocks)}
    spent: dict[str, tuple[float, ...]] = {}
    columns: list[np.ndarray]
    times: list[float]
    labels: list[str]
    columns, times, labels = [], [], []

    def snapshot():
        column = np.full(len(blocks), np.nan)
        for b, vector in spent.items():
            column[index[b]] = min(1.0, filt.summary(vector)[0] / s.epsilon)
        return column

    arrivals = 0
    for _seq, ts, kind, body_text, _prev, _hash in ledger.log_entries():
        if kind not in ("block", "grant"):
            continue
        body = json.loads(body_text)
        if body["stream"] != stream:
            continue
        if kind == "block":
            spent[body["id"]] = filt.zero()
            arrivals += 1
            if labels and labels[-1].startswith("+"):  # extend the current run of arrivals
                columns[-1], times[-1], labels[-1] = snapshot(), ts, f"+{arrivals} blocks"
                continue
            columns.append(snapshot())
            times.append(ts)
            labels.append(f"+{arrivals} blocks")
        else:
            arrivals = 0
            for b in body["blocks"]:
                spent[b] = tuple(x + c for x, c in zip(spent[b], body["cost"]))
            columns.append(snapshot())
            times.append(ts)
            labels.append(f"{body['pipeline']}\neps {body['epsilon']:.3g}")
    if not columns:
        return blocks, np.zeros(0), [], np.zeros((len(blocks), 0))
    keep = np.unique(np.linspace(0, len(columns) - 1, min(max_columns, len(columns))).round().astype(int))
    return (blocks, np.asarray(times)[keep], [labels[i] for i in keep], np.stack(columns, axis=1)[:, keep])


def heatmap_png(ledger: Ledger, stream: str, out_path: str) -> str:
    """Write the budget heat-map: blocks (rows) by time (columns), colour = share of epsilon spent."""
    import matplotlib  # its colormap registry

    plt = pyplot()
    blocks, times, labels, matrix = spending_history(ledger, stream)
    height = min(12.0, 2.5 + 0.25 * min(len(blocks), 40))
    fig, ax = plt.subplots(figsize=(11, height))
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(matrix), aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
    shown = np.unique(np.linspace(0, len(blocks) - 1, min(40, len(blocks))).astype(int)) if blocks else []
    ax.set_yticks(shown)
    ax.set_yticklabels([blocks[i] for i in shown], fontsize=7)
    if len(times):
        ticks = np.unique(np.linspace(0, len(times) - 1, min(16, len(times))).astype(int))
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[t] for t in ticks], fontsize=6, rotation=0)
    ax.set_xlabel("ledger events in order: runs of block arrivals, and grants (pipeline, epsilon)")
    ax.set_ylabel(f"block ({len(blocks)})")
    s = ledger.stream(stream)
    ax.set_title(
        f"Privacy budget spent per block, stream {stream!r} (global epsilon={s.epsilon:g}, "
        f"{s.accounting}); grey = not yet arrived"
    )
    fig.colorbar(image, ax=ax, label="share of the block's epsilon spent")
    save_figure(fig, out_path)
    return out_path
