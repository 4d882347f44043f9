"""Figures for the benchmarks, the simulator and the reports: one way to get pyplot and to write a PNG.

matplotlib is imported only when a figure is drawn (never by ``import sage_tfx``), with the Agg backend, so a
figure is written the same with or without a display.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT_DPI = 110


def pyplot() -> Any:
    """matplotlib's ``pyplot`` on the Agg backend (no display needed); imports matplotlib on the first call."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label_bars(ax: Any, bars: Any, texts: list[str], **text_options: Any) -> None:
    """Write ``texts[i]`` centred above bar ``i`` of ``bars`` (what ``ax.bar`` returned).

    Args:
        ax: the bars' axes.
        bars: the bars, in the order of ``texts``.
        texts: one label per bar.
        **text_options: more options of ``ax.text`` (e.g. ``fontsize``).
    """
    for bar, text in zip(bars, texts, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), text, ha="center", va="bottom", **text_options)


def save_figure(fig: Any, path: str, *, dpi: float | str = DEFAULT_DPI) -> str:
    """Lay ``fig`` out tightly, write it to ``path`` (its folder made if missing) and close it.

    Args:
        fig: a matplotlib figure.
        path: the PNG file to write.
        dpi: its resolution in dots per inch (``"figure"``: the figure's own, matplotlib's default).

    Returns:
        ``path``.
    """
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
