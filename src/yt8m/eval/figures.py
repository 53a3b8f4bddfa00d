"""The one look of every figure yt8m draws (the evaluation report's, the per-class plots, a study's page): matplotlib
on its file backend in yt8m's style, whole-number ticks on step and trial axes, and a figure as PNG bytes.

matplotlib is the plots extra: the caller checks it is installed (yt8m.optional) before calling pyplot().
"""

from __future__ import annotations

import io
from typing import Any

# Plain white axes with a light grid, no top or right frame, matplotlib's tab10 colours: the same in every figure,
# whatever style another library set before (Optuna's plots set ggplot's grey).
STYLE: dict[str, Any] = {
    "figure.facecolor": "white", "axes.facecolor": "white", "savefig.facecolor": "white",
    "axes.edgecolor": "#888888", "axes.grid": True, "grid.color": "#e6e6e6", "grid.linewidth": 0.8,
    "axes.spines.top": False, "axes.spines.right": False, "axes.titlesize": 11, "axes.titleweight": "bold",
    "axes.labelsize": 10, "font.size": 10, "legend.frameon": False, "legend.fontsize": 9,
    "lines.linewidth": 1.6, "lines.markersize": 5,
}
DPI = 100


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files, no display), in STYLE."""
    import matplotlib  # the plots extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # the plots extra

    plt.style.use(["default", STYLE])  # matplotlib's own first (its colours are tab10), then yt8m's
    return plt


def whole_numbers(axis: Any) -> None:
    """Ticks at whole numbers only, on an axis of steps, epochs or trials (no step 1.25 on a 3-step run)."""
    from matplotlib.ticker import MaxNLocator  # the plots extra, imported by pyplot() already

    axis.set_major_locator(MaxNLocator(integer=True))


def png_bytes(plt: Any, figure: Any) -> bytes:
    """A figure as PNG bytes (closed after)."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return png.getvalue()
