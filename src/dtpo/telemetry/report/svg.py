"""Matplotlib figures as inline SVG for the HTML report: one style, one colour-blind-friendly palette.

Why matplotlib SVG (not plotly): matplotlib is already a dependency, an inline ``<svg>`` needs no JavaScript
(so a browser has no script to fail and nothing to fetch: the report opens offline and its plots are in the
DOM), and a report weighs a few hundred KB instead of carrying plotly's ~4 MB of JavaScript. Text stays text
(``svg.fonttype: none``): small files, selectable and searchable labels.

Figures are built on :class:`matplotlib.figure.Figure` directly, never through pyplot, so no global state
or GUI backend is touched. Every element id in a figure's SVG gets a prefix (:func:`inline_svg`), so several
figures in one page share no id.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Sequence

import matplotlib
from matplotlib import cycler
from matplotlib.figure import Figure

# Okabe & Ito's palette: distinguishable with every common colour-vision deficiency.
BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
GREY = "#999999"
PALETTE = (BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, BLACK, YELLOW)

# The parts of a step, in the order they happen, with the colour every plot gives them.
PARTS: tuple[tuple[str, str, str], ...] = (
    ("data wait", "data_wait_s", ORANGE), ("compute", "compute_s", BLUE),
    ("exposed comm", "comm_exposed_s", VERMILLION), ("sync wait", "sync_wait_s", PURPLE),
    ("optimizer", "optimizer_s", GREEN))
UNSPLIT = ("comm + sync wait (not split)", GREY)
PART_COLOURS = {name: colour for name, _, colour in PARTS} | {UNSPLIT[0]: UNSPLIT[1]}

STYLE = {
    "svg.fonttype": "none", "svg.hashsalt": "dtpo", "font.size": 9, "font.family": "sans-serif",
    "axes.prop_cycle": cycler(color=PALETTE), "axes.spines.top": False, "axes.spines.right": False,
    "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.6, "axes.titlesize": 10, "axes.titleweight": "bold",
    "axes.titlelocation": "left", "legend.frameon": False, "legend.fontsize": 8, "lines.linewidth": 1.4,
    "figure.facecolor": "white", "axes.facecolor": "white", "axes.axisbelow": True,
}

MAX_POINTS = 1500  # per series: longer ones are averaged in buckets, so an all-day run stays a small SVG

_PROLOG = re.compile(r"^.*?(?=<svg)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_NAMESPACES = re.compile(r'\s+xmlns(?::xlink)?="[^"]*"')


def render(draw: Callable[[Figure], None], size: tuple[float, float]) -> str:
    """Build a figure with ``draw`` in the report's style and return it as SVG text (no XML prolog).

    Args:
        draw: Fills the figure (adds axes, plots).
        size: Width and height in inches.
    """
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=size, layout="constrained")
        draw(fig)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return _METADATA.sub("", _PROLOG.sub("", buf.getvalue(), count=1), count=1)


def inline_svg(svg: str, prefix: str) -> str:
    """``svg`` ready to sit in an HTML page: every element id, and every reference to one, prefixed by ``prefix``
    (matplotlib names elements ``figure_1``, ``axes_1``, ... in every figure, and ids must be unique in a page);
    the namespace declarations dropped (the HTML parser puts ``<svg>`` and ``xlink:href`` in their namespaces
    itself), so the page names no URL at all."""
    svg = _NAMESPACES.sub("", svg, count=2)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}-{m.group(1)}"', svg)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)


def thin(xs: Sequence[float], ys: Sequence[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float], int]:
    """At most ``limit`` points: the means of consecutive buckets (NaNs ignored), and the bucket size (1 when
    the series was short enough as it was)."""
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys), 1
    k = math.ceil(n / limit)
    out_x, out_y = [], []
    for i in range(0, n, k):
        bucket = [y for y in ys[i:i + k] if not math.isnan(y)]
        out_x.append(sum(xs[i:i + k]) / len(xs[i:i + k]))
        out_y.append(sum(bucket) / len(bucket) if bucket else math.nan)
    return out_x, out_y, k


def colour(i: int) -> str:
    """The ``i``-th colour of the palette, cycling."""
    return PALETTE[i % len(PALETTE)]


def no_data(fig: Figure, text: str) -> None:
    """An empty figure that says why it is empty."""
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", color="#555555")
