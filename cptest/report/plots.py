"""The HTML report's pictures: matplotlib figures rendered to inline SVG text.

Why matplotlib to SVG: one well-kept library, no browser JavaScript, no network; the SVG sits in
the page itself, so a report is one file that works offline (docs/reports.md, "How it is made").

Deterministic: the same evidence gives the same bytes, so `cptest check --write` on an archive
rewrites an identical report.html. That takes the Agg backend (no display), a fixed `svg.hashsalt`
per figure (the ids of clip paths are hashes of it), `svg.fonttype: none` (text stays text, no
glyph outlines that depend on the fonts installed) and no Date in the metadata.

Text from an archive (request ids, status words) only ever reaches a figure through `_label`, and
`text.parse_math` is off: a `$` in a request id is a dollar, not mathtext (which would raise).
matplotlib escapes `<`, `>` and `&` in SVG text itself; the tests feed it markup to show that.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import matplotlib

matplotlib.use("Agg")  # before any figure: no display, and the same renderer on every machine

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from cptest.report.ownership import DOUBLE, HOLE, GroupOwnership, matrix  # noqa: E402
from cptest.report.views import Capacity, Latency, Outcomes, RankSteps  # noqa: E402

WIDTH_IN = 9.0
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
STATUS_COLORS = {"ok": "#2ca02c", "error": "#d62728", "timeout": "#ff7f0e", "not_sent": "#7f7f7f"}
HOLE_COLOR, DOUBLE_COLOR, OTHER_COLOR, PAST_COLOR = "#000000", "#e6007e", "#e8e8e8", "#ffffff"
MAX_REQUESTS, MAX_COLUMNS = 48, 1024
"""The ownership map's size: more requests or positions are summarised, never dropped silently."""


def _rc(salt: str) -> dict[str, object]:
    return {"svg.hashsalt": f"cptest-{salt}", "svg.fonttype": "none", "text.parse_math": False,
            "font.size": 9, "axes.titlesize": 10, "font.family": "sans-serif", "svg.image_inline": True}


@contextmanager
def _figure(salt: str, height_in: float, rows: int = 1, cols: int = 1, **kw: object) -> Iterator[Figure]:
    with matplotlib.rc_context(_rc(salt)):
        fig = Figure(figsize=(WIDTH_IN, height_in), layout="constrained")
        fig.subplots(rows, cols, squeeze=False, **kw)  # type: ignore[arg-type]
        yield fig


def svg(fig: Figure, salt: str) -> str:
    """The figure as an `<svg>` element to paste into HTML: no XML prolog, no doctype, no date."""
    buf = io.StringIO()
    with matplotlib.rc_context(_rc(salt)):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):].strip()


_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def _label(text: str, limit: int = 24) -> str:
    """A string of an archive as a figure label: printable ASCII, shortened."""
    text = _UNPRINTABLE.sub("?", str(text))
    return text if len(text) <= limit else text[:limit - 1] + "~"


# ---------------------------------------------------------------- ownership
def ownership(g: GroupOwnership, salt: str) -> tuple[str, int, int]:
    """(svg, positions per column, requests shown) of one DCP group's map."""
    codes, per, shown = matrix(g, max_requests=MAX_REQUESTS, max_columns=MAX_COLUMNS)
    n = len(g.ranks)
    rgb = np.zeros((*codes.shape, 3), dtype=np.uint8)
    palette = {0: PAST_COLOR, 1: OTHER_COLOR, HOLE: HOLE_COLOR, DOUBLE: DOUBLE_COLOR}
    for code, color in palette.items():
        rgb[codes == code] = _rgb(color)
    for k in range(n):
        mine = np.zeros(codes.shape, dtype=bool)
        mine[k::n] = codes[k::n] == 2
        rgb[mine] = _rgb(COLORS[k % len(COLORS)])
    height = min(9.0, 1.4 + 0.11 * codes.shape[0])
    with _figure(salt, height) as fig:
        ax = fig.axes[0]
        ax.imshow(rgb, aspect="auto", interpolation="nearest",
                  extent=(0, codes.shape[1] * per, codes.shape[0], 0))  # fmt: skip
        ticks = [i * n + n / 2 for i in range(shown)]
        step = max(1, shown // 24)
        ax.set_yticks(ticks[::step], [_label(r.rid, 10) for r in g.requests[:shown]][::step], fontsize=7)
        ax.set_xlabel("K/V position" + (f" ({per} positions per column)" if per > 1 else ""))
        ax.set_ylabel(f"request (one row per rank: {', '.join(str(w) for w in g.ranks)})")
        handles = [_patch(COLORS[k % len(COLORS)], f"rank {w}") for k, w in enumerate(g.ranks)]
        handles += [_patch(HOLE_COLOR, f"hole ({g.holes})"),
                    _patch(DOUBLE_COLOR, f"double write ({g.doubles})")]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), frameon=False,
                   fontsize=8)
        return svg(fig, salt), per, shown


def _plain_tick(value: float, _pos: object) -> str:
    return f"{value:g}"


_plain = FuncFormatter(_plain_tick)


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _patch(color: str, label: str) -> object:
    from matplotlib.patches import Patch

    return Patch(facecolor=color, edgecolor="#999999", label=label)


# ---------------------------------------------------------------- rows per step
def rows(ranks: Sequence[RankSteps], salt: str) -> str:
    panels = (("attention rows", "attn"), ("FFN rows", "ffn"), ("logits rows", "logits"))
    with _figure(salt, 5.4, rows=3, sharex=True) as fig:
        for ax, (title, attr) in zip(fig.axes, panels, strict=True):
            for k, r in enumerate(ranks):
                ys = [np.nan if v is None else v for v in getattr(r, attr)]
                ax.step(r.step, ys, where="mid", color=COLORS[k % len(COLORS)], linewidth=1.0,
                        linestyle=("-", "--", ":", "-.")[k % 4], label=f"rank {r.world}")
            ax.set_ylabel(title)
            # Decode steps carry a few rows, extends thousands: a log scale shows both (symlog keeps 0).
            ax.set_yscale("symlog", linthresh=1)
            ax.yaxis.set_major_formatter(_plain)  # log ticks are mathtext otherwise, which is off
            ax.grid(alpha=0.3)
        fig.axes[0].legend(loc="upper right", ncol=min(len(ranks), 8), fontsize=8)
        fig.axes[-1].set_xlabel("forward step")
        return svg(fig, salt)


# ---------------------------------------------------------------- capacity
def capacity(cap: Capacity, salt: str) -> str:
    with _figure(salt, 3.2) as fig:
        ax = fig.axes[0]
        for k, line in enumerate(cap.timelines):
            group = line.label.startswith("DCP")
            label = line.label + (f" (of {line.limit})" if line.limit else "")
            ax.step(line.step, line.held, where="post", label=_label(label, 40),
                    color="#000000" if group else COLORS[k % len(COLORS)], linewidth=1.6 if group else 1.0,
                    linestyle="-" if group else ("-", "--", ":", "-.")[k % 4])  # fmt: skip
        ax.set_xlabel("forward step")
        ax.set_ylabel("K/V rows held")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
        return svg(fig, salt)


# ---------------------------------------------------------------- latency
def latency(lat: Sequence[Latency], salt: str) -> str:
    panels = (("time to first token (s)", "ttft"), ("time per output token (s)", "tpot"))
    with _figure(salt, 3.0, cols=2) as fig:
        for ax, (title, attr) in zip(fig.axes, panels, strict=True):
            for k, x in enumerate(lat):
                values = getattr(x, attr)
                if values:
                    ys = np.arange(1, len(values) + 1) / len(values)
                    ax.step(values, ys, where="post", color=COLORS[k % len(COLORS)],
                            label=f"{x.role} ({len(values)})")
            ax.set_xlabel(title)
            ax.set_ylabel("fraction of requests")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="lower right", fontsize=8)
        return svg(fig, salt)


# ---------------------------------------------------------------- requests and lifecycle
MARKED_EVENTS = {"ready": "#2ca02c", "fault": "#d62728", "signal": "#9467bd", "exited": "#000000",
                 "timeout": "#ff7f0e", "interrupted": "#ff7f0e", "launch_failed": "#d62728"}


def outcomes(out: Outcomes, salt: str) -> str:
    n = max(len(out.requests), 1)
    with _figure(salt, min(8.0, 1.8 + 0.09 * n)) as fig:
        ax = fig.axes[0]
        for r in out.requests:
            color = STATUS_COLORS.get(r.status, "#7f7f7f")
            if r.e2e is not None:
                ax.barh(r.index, r.e2e, left=r.sent_at, height=0.7, color=color)
            else:
                ax.plot([r.sent_at], [r.index], marker="|", color=color, markersize=6)
            if r.ttft is not None:
                ax.plot([r.sent_at + r.ttft], [r.index], marker="|", color="#000000", markersize=5)
            if r.status != "ok":  # a refused connection is a bar a few ms long: mark where it ended
                ax.plot([r.sent_at + (r.e2e or 0.0)], [r.index], marker="x", color=color, markersize=4)
        for e in out.events:
            if e.event in MARKED_EVENTS:
                ax.axvline(e.t, color=MARKED_EVENTS[e.event], linewidth=1.2,
                           linestyle="-" if e.event == "fault" else "--")
                ax.annotate(_label(e.event, 16), (e.t, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                            xytext=(-2, -2), textcoords="offset points", va="top", ha="right", fontsize=7,
                            color=MARKED_EVENTS[e.event])
        handles = [_patch(c, s) for s, c in STATUS_COLORS.items() if s in out.counts()]
        if handles:
            fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the runner started (bars: sent to answered; tick: first token)")
        ax.set_ylabel("request")
        ax.grid(alpha=0.3, axis="x")
        return svg(fig, salt)
