"""The HTML report's figure primitives: style, colours, blank figures and SVG output.

Matplotlib Figure objects (no pyplot, no GUI backend) saved as SVG text. Apart from the plots
themselves (``record_figures``, ``breakdown_figures``, ``overview_figure``, ``load_figure``,
``trend_figure``) because every plot shares them: one style and one colour per side (now,
baseline, budget) on every figure, fixed margins instead of a layout pass, blank figures kept
for reuse, and the SVG made small. Each plot module draws; this one makes drawing cheap.
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np

from ..core.errors import LLMPerfError

NOW = "#1f5fbf"
BASELINE = "#8c8c8c"
BUDGET = "#c0392b"
FIRST_RUN = "#e67e22"
WIDTH_IN = 5.4

RC = {
    "svg.fonttype": "none",  # text stays text: small files, searchable, selectable
    "svg.hashsalt": "pytest-llmperf",  # deterministic ids
    "font.family": "sans-serif",
    "font.size": 8.5,
    "axes.titlesize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e3e3",
    "grid.linewidth": 0.6,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "path.simplify": True,
    "text.parse_math": False,  # test names may hold "$"; mathtext parsing is also the slow part
    "font.sans-serif": ["DejaVu Sans"],
    "axes.titley": 1.0,  # a fixed title position: placing it measures every tick label
}



class ReportError(LLMPerfError):
    """The HTML report cannot be drawn (matplotlib, the ``report`` extra, is not installed)."""


def require_matplotlib() -> Any:
    """The matplotlib module, or a one-line error that says what to install."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401  (the part we use)
    except ImportError:
        raise ReportError(
            'the HTML report needs matplotlib: pip install "pytest-llmperf[report]"'
        ) from None
    return matplotlib


#: Blank figures kept for reuse, by shape: creating axes and their ticks is half the cost of
#: drawing one, and every test of a report draws the same few shapes.
_BLANK: dict[tuple[Any, ...], Any] = {}


def _reset(fig: Any) -> None:
    """Back to blank: the data artists, legends and limits go; axes and ticks stay."""
    fig.legends.clear()
    for ax in fig.axes:
        for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
            artist.remove()
        if ax.legend_ is not None:
            ax.legend_.remove()
        ax.set_xscale("linear")  # also restores the default locators and formatters
        ax.set_yscale("linear")
        ax.set_title("")
        ax.set_xlabel("")
        ax.set_ylabel("")
        ax.grid(True)
        ax.relim()
        ax.set_autoscale_on(True)
        ax.ignore_existing_data_limits = True


def new_figure(
    height_in: float,
    ncols: int = 1,
    width_in: float = WIDTH_IN,
    margins_in: tuple[float, float, float, float] = (0.62, 0.5, 0.15, 0.3),
    wspace: float = 0.3,
    reuse: bool = False,
    **kw: Any,
) -> tuple[Any, Any]:
    """A figure with fixed margins (left, bottom, right, top in inches): a constrained layout
    would draw every figure twice, and 200 tests x 4 figures must render in seconds.

    ``reuse``: hand out the same blank figure again for the same shape (only for figure
    functions that set every property they change, whatever the data)."""
    from matplotlib.figure import Figure

    key = (height_in, ncols, width_in, margins_in, wspace, tuple(sorted(kw.items())))
    if reuse and key in _BLANK:
        fig = _BLANK[key]
        _reset(fig)
        axes = fig.axes[0] if ncols == 1 and kw.get("squeeze", True) else np.array(fig.axes)
    else:
        fig = Figure(figsize=(width_in, height_in))
        left, bottom, right, top = margins_in
        fig.subplots_adjust(left=left / width_in, bottom=bottom / height_in, right=1 - right / width_in,
                            top=1 - top / height_in, wspace=wspace)
        axes = fig.subplots(1, ncols, **kw)
        if reuse:
            _BLANK[key] = fig
    for ax in np.ravel(axes):
        ax.locator_params(nbins=4)
    return fig, axes


_NUMBER = re.compile(r"(\d+\.\d)\d+")
_FONT = re.compile(r"font-family: [^;\"]*;? ?")
_ID = re.compile(r'\sid="([^"]+)"')
_NOOP_ROTATE = re.compile(r' transform="rotate\(-?0 [\d.]+ [\d.]+\)"')


_TAG = re.compile(r"<[^>]+>")
#: One font rule per figure instead of a font list on every text element.
FONT_CSS = "text{font-family:'DejaVu Sans',Verdana,Geneva,sans-serif}"


def _minify_tag(match: re.Match[str]) -> str:
    tag = _NUMBER.sub(r"\1", match.group(0))  # inside tags only: text keeps its digits
    tag = re.sub(r"\s+", " ", tag)
    tag = _FONT.sub("", tag)
    return _NOOP_ROTATE.sub("", tag)


def minify(svg: str) -> str:
    """Smaller SVG, same picture: coordinates to 0.1 pt (1/720 inch), no layout whitespace,
    one font rule instead of a font list per text, no ids that nothing references."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = _TAG.sub(_minify_tag, svg)
    svg = re.sub(r">\s+<", "><", svg)
    svg = svg.replace("stroke-linecap: butt}", "stroke-linecap: butt}" + FONT_CSS, 1)
    used = set(re.findall(r"#([\w.-]+)", svg))
    svg = _ID.sub(lambda m: m.group(0) if m.group(1) in used else "", svg)
    return svg.replace(' style=""', "").strip()


def _svg(fig: Any) -> str:
    """The figure as a minified SVG element: no XML prolog, DOCTYPE, comment or metadata."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return minify(buf.getvalue())


def plain_log(axis: Any) -> None:
    """Log axis with plain tick labels (0.5, 1, 2) instead of 10^x."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _place_axis_labels(fig: Any) -> None:
    """Axis labels at fixed distances from the axes (inches): matplotlib would otherwise
    measure every tick label of every axes to place them, a third of the drawing time."""
    width_in, height_in = fig.get_size_inches()
    for ax in fig.axes:
        box = ax.get_position()
        if ax.get_xlabel():
            ax.xaxis.set_label_coords(0.5, -0.3 / (box.height * height_in))
        if ax.get_ylabel():
            ax.yaxis.set_label_coords(-0.4 / (box.width * width_in), 0.5)


def render(fn: Any, *args: Any) -> str:
    """Draw with the report's style and return the SVG."""
    matplotlib = require_matplotlib()
    with matplotlib.rc_context(RC):
        fig = fn(*args)
        _place_axis_labels(fig)
        return _svg(fig)



def budget_label(key: str, value: float, unit: str) -> str:
    """How a budget line is labelled on every figure."""
    return f"budget {key}={value:g} {unit}"
