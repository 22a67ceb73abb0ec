"""Figures of a report: per-layer latency and FLOPs, the roofline, throughput curves, comparisons.

matplotlib is optional and imported inside each function; figures are built as
``matplotlib.figure.Figure``, never through pyplot, so no global state is touched. Every function
returns the Figure; ``save=path`` also writes it (.png, .svg, .pdf, from the extension).
"""

from __future__ import annotations

import itertools
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from modelprof.errors import ModelProfError
from modelprof.render.formats import needs_package
from modelprof.render.units import format_bytes, format_count, format_percent, format_time_ms
from modelprof.render.views import (
    ROUGH_MARK,
    column_spec,
    is_rough_cell,
    module_labels,
    require_columns,
    select_rows,
)
from modelprof.report.roofline import add_roofline, observed_peaks, peak_words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from modelprof.timing.peaks import Peaks

__all__ = [
    "plot_latency",
    "plot_flops",
    "plot_roofline",
    "plot_throughput",
    "plot_compare",
    "plot_cost_latency",
]

_SAVE_FORMATS = (".png", ".svg", ".pdf")


def figure_class() -> Any:
    """matplotlib's ``Figure`` (no pyplot state), or a ModelProfError saying how to install it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise needs_package("plotting", "matplotlib") from e
    return Figure


#: the resolution a figure is saved at; its text sets a little wider against the axes there
#: than at the screen's (a caption 9 % wider at 150 dpi than at 100): wraps are checked at both
SAVE_DPI = 150


def save_figure(fig: Any, save: str | os.PathLike[str] | None) -> Any:
    """Write ``fig`` to ``save`` (.png, .svg or .pdf; None: nothing), creating its folder;
    returns ``fig``."""
    if save is None:
        return fig
    path = Path(save)
    if path.suffix.lower() not in _SAVE_FORMATS:
        raise ModelProfError(
            f"save={str(save)!r}: the extension must be one of {list(_SAVE_FORMATS)}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lower()[1:], bbox_inches="tight", dpi=SAVE_DPI)
    return fig


#: a bar's colour, and a rough one's (a figure the run says is no figure to quote), and what a
#: figure with a rough bar or point says under it or in its legend
PLAIN_COLOUR, ROUGH_COLOUR = "tab:blue", "tab:gray"
ROUGH_WORDS = f"{ROUGH_MARK}, grey: rough, no figure to quote"


def rough_cells(frame: pd.DataFrame, column: str) -> list[bool]:
    """Per row of ``frame``: its ``column`` is rough, as the tables mark it (``is_rough_cell``:
    ``latency_rough`` for ``latency_ms``, ``backward_latency_rough`` for the backward's)."""
    return [is_rough_cell(frame, i, column) for i in range(len(frame))]


def bar_colours(rough: Sequence[bool]) -> list[str]:
    """A bar's colour per rough flag: grey where rough."""
    return [ROUGH_COLOUR if r else PLAIN_COLOUR for r in rough]


def _top_rows(
    df: pd.DataFrame, column: str, top_k: int | None, leaf_only: bool
) -> tuple[pd.DataFrame, str]:
    """The ``top_k`` rows by ``column`` and, where that cut some, the words that say so
    (``", top 20 of 68 leaves"``) for the title."""
    leaves = leaf_only and "leaf" in df.columns
    rows = select_rows(df, leaf_only=leaves)
    rows = rows[rows[column].notna()]
    if rows.empty:
        raise ModelProfError(f"no row has a value in column {column!r} to plot")
    top = select_rows(rows, top_k=top_k or None, sort_by=column)
    cut = len(top) < len(rows)
    return top, f", top {len(top)} of {len(rows)} {'leaves' if leaves else 'rows'}" * cut


def _barh(
    rows: pd.DataFrame,
    column: str,
    *,
    title: str,
    xlabel: str,
    error: tuple[str, str] | None = None,
    formatter: Any = None,
    save: str | os.PathLike[str] | None = None,
) -> Any:
    """Horizontal bars of ``rows[column]``, the first on top, saved to ``save``; a bar the
    tables mark rough (:func:`rough_cells`) is grey, and the caption says so."""
    n = len(rows)
    fig = figure_class()(figsize=(8.0, max(2.5, 0.32 * n + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(n)
    values = rows[column].to_numpy(dtype=float)
    xerr = None
    if error is not None and all(c in rows.columns for c in error):
        low, high = (rows[c].to_numpy(dtype=float) for c in error)
        xerr = np.nan_to_num(
            np.vstack([np.clip(values - low, 0.0, None), np.clip(high - values, 0.0, None)])
        )
    marked = rough_cells(rows, column)
    ax.barh(y, values, xerr=xerr, color=bar_colours(marked), ecolor="0.3", capsize=2)
    ax.set_yticks(y, module_labels(rows["module"], rows.get("call")))
    ax.invert_yaxis()  # largest on top
    ax.set(xlabel=xlabel, title=title)
    if formatter is not None:
        ax.xaxis.set_major_formatter(_tick_formatter(formatter))
    ax.grid(axis="x", alpha=0.3)
    if any(marked):  # (the report's caption and notes say why)
        fig.supxlabel(ROUGH_WORDS, fontsize=8)
    return save_figure(fig, save)


def plot_latency(
    df: pd.DataFrame,
    top_k: int | None = 20,
    *,
    leaf_only: bool = True,
    title: str | None = None,
    save: str | os.PathLike[str] | None = None,
    column: str = "latency_ms",
) -> Figure:
    """Horizontal bars of per-layer latency (``latency_ms``, the median; a training step's
    ``backward_latency_ms`` with ``column=``), the ``top_k`` slowest first; ``leaf_only`` skips
    the parents. Error bars span the 10th to 90th percentile of the forward's passes where
    ``latency_p10_ms`` and ``latency_p90_ms`` are given (``Report.plot_latency`` adds them):
    unlike median +- std, they never reach below 0 ms. A time the tables mark rough (``~``:
    ``latency_rough``, the backward's ``backward_latency_rough``) is a grey bar, and the caption
    says so."""
    if column not in ("latency_ms", "backward_latency_ms"):
        raise ModelProfError(f"column={column!r}: 'latency_ms' or 'backward_latency_ms'")
    require_columns(df, ["module", column], "plot_latency", " (profile with timing=True)")
    forward = column == "latency_ms"
    bars = " (bars: p10-p90 of the passes)" if forward and "latency_p10_ms" in df.columns else ""
    rows, shown = _top_rows(df, column, top_k, leaf_only)
    return _barh(
        rows,
        column,
        title=title or f"{'Latency' if forward else 'Backward latency'} per layer{shown}{bars}",
        xlabel="latency (ms)" if forward else "backward latency (ms)",
        error=("latency_p10_ms", "latency_p90_ms") if forward else None,
        save=save,
    )


def plot_flops(
    df: pd.DataFrame,
    top_k: int | None = 20,
    *,
    column: str = "flops",
    leaf_only: bool = True,
    title: str | None = None,
    save: str | os.PathLike[str] | None = None,
) -> Figure:
    """Horizontal bars of a per-layer cost column (``flops`` by default; ``macs``, ``params``,
    ``read_bytes``...), the ``top_k`` largest first, axis in SI units."""
    require_columns(df, ["module", column], "plot_flops")
    spec = column_spec(column, df[column])
    rows, shown = _top_rows(df, column, top_k, leaf_only)
    return _barh(
        rows,
        column,
        title=title or f"{spec.header} per layer{shown}",
        xlabel=spec.header,
        formatter=_value_formatter(spec.kind),
        save=save,
    )


_ROOF_SOURCES = {"probe": "roofs probed", "table": "datasheet roofs", "user": "roofs given"}
_LEVEL_COLOURS = ("tab:green", "tab:purple", "tab:olive", "tab:blue", "tab:cyan")


def plot_roofline(
    df: pd.DataFrame,
    peaks: Peaks,
    *,
    leaf_only: bool = True,
    annotate: int = 5,
    title: str | None = None,
    save: str | os.PathLike[str] | None = None,
) -> Figure:
    """Log-log roofline of ``df`` (the modelprof view): one roof per memory level and each
    timed layer at (intensity, achieved FLOP/s), coloured like the roof it is judged against.
    The ``annotate`` slowest layers are numbered ``#1`` (the slowest) on and named in a key
    beside the plot. The roofs drawn are those the rows are judged against
    (``observed_peaks``); a disturbed probe is named under the heading and detailed in a
    caption (``peak_words``)."""
    require_columns(
        df,
        ["module", "flops", "read_bytes", "write_bytes", "latency_ms"],
        "plot_roofline",
        " (profile with timing=True)",
    )
    data = add_roofline(df, peaks)  # a peaks that is no Peaks is refused here
    sentence, caption = peak_words(df, peaks)
    peaks = observed_peaks(df, peaks)
    data = select_rows(data, leaf_only=leaf_only and "leaf" in data.columns)
    ok = (data["intensity"] > 0) & (data["achieved_gflops"] > 0)
    data = data[ok.fillna(False)]
    if data.empty:
        raise ModelProfError("plot_roofline: no timed row with both FLOPs and bytes to place")

    fig = figure_class()(figsize=(9.0, 5.2), layout="constrained")
    ax = fig.add_subplot()
    x = data["intensity"].to_numpy(dtype=float)
    y = data["achieved_gflops"].to_numpy(dtype=float) * 1e9
    ridges = [peaks.peak_flops / lv.bandwidth for lv in peaks.memory_levels]
    lo, hi = min(x.min(), *ridges) / 4, max(x.max(), *ridges) * 4
    roofs = _draw_roofs(ax, peaks, np.geomspace(lo, hi, 256))
    _draw_layers(ax, data, x, y, roofs, peaks)
    key = _number_slowest(ax, data, annotate) if annotate else []
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)")
    ax.set(
        xlim=(lo, hi),
        ylim=(min(y.min(), peaks.peak_flops) / 20, max(y.max(), peaks.peak_flops) * 3),
    )
    ax.set_ylabel("achieved FLOP/s")
    source = _ROOF_SOURCES.get(peaks.source, peaks.source)
    ax.grid(which="both", alpha=0.25)
    _legends(fig, ax, key)  # before the title: it is wrapped to the room they leave
    heading = f"Roofline: {peaks.device or 'device'} ({peaks.dtype}, {source})"
    _fit_title(ax, "\n".join(t for t in (title or heading, sentence) if t), small=bool(sentence))
    if caption:
        _caption(fig, ax, caption)
    return save_figure(fig, save)


def _draw_roofs(ax: Any, peaks: Peaks, xs: np.ndarray) -> list[list[Any]]:
    """One roof per memory level (levels of equal bandwidth share a line and a colour) and the
    compute roof; returns ``[[levels], colour]`` per line."""
    bandwidths = itertools.groupby(peaks.memory_levels, key=lambda lv: lv.bandwidth)
    roofs = [
        [list(g), _LEVEL_COLOURS[i % len(_LEVEL_COLOURS)]] for i, (_, g) in enumerate(bandwidths)
    ]
    for group, colour in reversed(roofs):  # slowest first
        name = group[0].name if len(group) == 1 else f"{group[0].name}-{group[-1].name}"
        cap = group[-1].capacity_bytes
        size = "" if cap is None else f", up to {format_bytes(cap, decimals=0)}"
        ax.plot(
            xs,
            np.minimum(peaks.peak_flops, xs * group[0].bandwidth),
            color=colour,
            lw=1.4,
            label=f"{name} roof: {format_count(group[0].bandwidth, unit='B/s')}{size}",
        )
    ax.axhline(
        peaks.peak_flops,
        color="k",
        lw=1.6,
        label=f"compute roof: {format_count(peaks.peak_flops, unit='FLOP/s')}",
    )
    return roofs


def _draw_layers(
    ax: Any, data: pd.DataFrame, x: np.ndarray, y: np.ndarray, roofs: list[list[Any]], peaks: Peaks
) -> None:
    """Each layer as a point, coloured like the roof it is judged against; one whose time the
    tables mark rough (``latency_rough``: its FLOP/s rest on it) filled grey, ringed in that
    colour, and the legend says so."""
    names = data["memory_level"].astype(object).to_numpy()
    order = [lv.name for lv in peaks.memory_levels]
    rough = np.array(rough_cells(data, "latency_ms"), dtype=bool)
    for group, colour in roofs:
        mask = np.isin(names, [lv.name for lv in group])
        if mask.any():
            judged = sorted({str(n) for n in names[mask]}, key=order.index)
            ax.scatter(
                x[mask],
                y[mask],
                s=20,
                color=colour,
                edgecolors="k",
                linewidths=0.4,
                zorder=3,
                label=f"layers judged at {', '.join(judged)}",
            )
            if (grey := mask & rough).any():  # drawn over, the legend's swatch kept
                ax.scatter(
                    x[grey],
                    y[grey],
                    s=30,  # (a little larger: the grey shows inside the ring)
                    facecolors=ROUGH_COLOUR,
                    edgecolors=colour,
                    linewidths=1.0,
                    zorder=3,
                )
    if rough.any():  # (the report's caption and notes say why)
        ax.plot([], [], "o", ms=4.5, color=ROUGH_COLOUR, mec="k", mew=0.4, label=ROUGH_WORDS)


def _number_slowest(ax: Any, data: pd.DataFrame, annotate: int) -> list[str]:
    """Number the ``annotate`` slowest layers on the plot from ``#1``, the slowest (a bare
    ``1`` read as the module of that name in an ``nn.Sequential``); their key lines (a rough
    time marked ``~``, as the tables mark it)."""
    slowest = data.sort_values("latency_ms", ascending=False, kind="stable").head(annotate)
    gflops = slowest["achieved_gflops"].to_numpy(dtype=float) * 1e9
    groups = _group_close(slowest["intensity"].to_numpy(dtype=float), gflops)
    for members in groups:
        first = members[0]
        ax.annotate(
            ",".join(f"#{m + 1}" for m in members),
            (slowest["intensity"].iloc[first], gflops[first]),
            fontsize=7,
            xytext=(4, 4),
            textcoords="offset points",
            zorder=4,
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "0.6", "lw": 0.5},
        )
    rough = rough_cells(slowest, "latency_ms")
    return [
        f"#{i + 1}  {label} ({ROUGH_MARK if r else ''}{format_time_ms(ms)})"
        for i, (label, ms, r) in enumerate(
            zip(module_labels(slowest["module"], slowest.get("call")), slowest["latency_ms"], rough)
        )
    ]


def _legends(fig: Any, ax: Any, key: list[str]) -> None:
    """Figure legends outside the axes, which the constrained layout makes room for."""
    fig.legend(
        *ax.get_legend_handles_labels(),
        loc="outside right upper",
        fontsize=7.5,
        title="roofs and layers",
        title_fontsize=8,
    )
    if key:
        from matplotlib.lines import Line2D

        blank = [Line2D([], [], linestyle="none")] * len(key)
        fig.legend(
            blank,
            key,
            loc="outside right lower",
            handlelength=0,
            handletextpad=0,
            title="slowest layers (#1 slowest)",
            title_fontsize=8,
            prop={"family": "monospace", "size": 7.5},
        )


def _caption(fig: Any, ax: Any, text: str) -> None:
    """``text`` in small type under the plot, wrapped so that no line runs past the axes (into
    the key beside them), on the screen or saved."""
    label = fig.supxlabel(
        text, fontsize=7.5, x=0.01, ha="left", multialignment="left", color="0.25"
    )
    width = len(text)
    while True:
        label.set_text(textwrap.fill(text, width=width))
        right = lambda r: label.get_window_extent(r).x1 / ax.get_window_extent(r).x1  # noqa: E731
        over = max(_at_both_resolutions(fig, right, redraw=True))
        if over <= 1 or width <= 40:
            break
        width = max(40, int(width * min(0.9, 0.98 / over)))  # about where it fits


def _at_both_resolutions(fig: Any, measure: Any, *, redraw: bool) -> list[float]:
    """``measure(renderer)`` at the figure's resolution and at :data:`SAVE_DPI`, laid out anew
    at each where ``redraw`` (a caption, which the layout makes room for; else as last laid
    out: a title, measured against its axes)."""
    dpi, out = fig.dpi, []
    try:
        for d in dict.fromkeys((dpi, SAVE_DPI)):
            fig.set_dpi(d)
            if redraw:
                fig.draw_without_rendering()
            out.append(measure(fig._get_renderer()))
    finally:
        fig.set_dpi(dpi)
    return out


def _fit_title(ax: Any, text: str, *, small: bool = False) -> None:
    """``ax``'s title, wrapped so that no line is wider than the axes (on the screen or
    saved); ``small``: a size smaller (a heading with a sentence under it)."""
    fig = ax.figure
    fig.draw_without_rendering()  # the constrained layout fixes the axes' size
    width = max(map(len, text.splitlines()))
    title = ax.title  # its width over the axes', measured at both resolutions
    wide = lambda r: title.get_window_extent(r).width / ax.get_window_extent(r).width  # noqa: E731
    while True:  # each paragraph (line of ``text``) wrapped on its own
        ax.set_title(
            "\n".join(textwrap.fill(p, width=width) for p in text.splitlines()),
            fontsize="medium" if small else None,
        )
        over = max(_at_both_resolutions(fig, wide, redraw=False))
        if over <= 1 or width <= 20:
            break
        width = max(20, min(width - 5, int(width * 0.98 / over)))  # about where it fits


def _group_close(x: np.ndarray, y: np.ndarray, factor: float = 1.35) -> list[list[int]]:
    """Indices of points within ``factor`` of each other on both log axes: one label each."""
    close = lambda a, b: max(a, b) / min(a, b) < factor  # noqa: E731
    groups: list[list[int]] = []
    for i in range(len(x)):
        for g in groups:
            if close(x[i], x[g[0]]) and close(y[i], y[g[0]]):
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


_THROUGHPUT_COLUMNS = ("samples_per_s", "throughput", "fps", "samples_per_sec")


def plot_throughput(
    curve_df: pd.DataFrame,
    *,
    x: str = "batch_size",
    y: str | None = None,
    title: str | None = None,
    save: str | os.PathLike[str] | None = None,
) -> Figure:
    """Samples/s against batch size (log2 x axis), the best point marked. ``y`` defaults to the
    first of ``samples_per_s``, ``throughput``, ``fps``, ``samples_per_sec`` present."""
    if y is None:
        present = getattr(curve_df, "columns", ())
        y = next((c for c in _THROUGHPUT_COLUMNS if c in present), _THROUGHPUT_COLUMNS[0])
    require_columns(curve_df, [x, y], "plot_throughput")
    data = curve_df[[x, y]].dropna().sort_values(x)
    if data.empty:
        raise ModelProfError("plot_throughput: the curve has no points")
    fig = figure_class()(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.add_subplot()
    xs = data[x].to_numpy(dtype=float)
    ys = data[y].to_numpy(dtype=float)
    ax.plot(xs, ys, marker="o", color="tab:blue")
    best = int(np.argmax(ys))
    ax.scatter(
        [xs[best]],
        [ys[best]],
        s=80,
        facecolors="none",
        edgecolors="tab:red",
        zorder=3,
        label=f"best: {ys[best]:.1f}/s at {x.replace('_', ' ')} {xs[best]:g}",
    )
    if (xs > 0).all():
        ax.set_xscale("log", base=2)
    ax.set(xlabel=x.replace("_", " "), ylabel="samples/s" if y != "fps" else "FPS")
    ax.set_title(title or "Throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, save)


_COMPARE_METRICS = ("params", "flops", "latency_median_ms", "throughput_samples_per_s")


def _model_labels(df: pd.DataFrame) -> list[str]:
    column = next((c for c in ("model", "name") if c in df.columns), None)
    return [str(v) for v in (df.index if column is None else df[column])]


def plot_compare(
    compare_df: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    *,
    title: str | None = None,
    save: str | os.PathLike[str] | None = None,
) -> Figure:
    """One bar panel per metric, one bar per model (labels from a ``model``/``name`` column, else
    the index). ``metrics`` defaults to those of ``params, flops, latency_median_ms,
    throughput_samples_per_s`` that the table has; a metric named but missing is an error. A
    figure the table marks rough (``~``: no figure to quote) is a grey bar whose value says so."""
    if metrics is None:
        metrics = [c for c in _COMPARE_METRICS if c in getattr(compare_df, "columns", ())]
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    if not metrics:
        raise ModelProfError("plot_compare needs at least one metric")
    require_columns(compare_df, metrics, "plot_compare")
    labels = _model_labels(compare_df)
    fig = figure_class()(figsize=(max(4.0, 3.2 * len(metrics)), 3.8), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    pos = np.arange(len(labels))
    marked = False
    for ax, metric in zip(axes, metrics):
        spec = column_spec(metric, compare_df[metric])
        values = compare_df[metric].to_numpy(dtype=float)
        rough = rough_cells(compare_df, metric)
        ax.bar(pos, values, color=bar_colours(rough))
        ax.set_xticks(pos, labels, rotation=30, ha="right")
        ax.set_title(spec.header)
        fmt = _value_formatter(spec.kind)
        for p, v, r in zip(pos, values, rough):
            if np.isfinite(v):
                ax.annotate(
                    (ROUGH_MARK if r else "") + fmt(v),
                    (p, v),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
        ax.yaxis.set_major_formatter(_tick_formatter(fmt))
        ax.margins(y=0.12)  # room for the value labels
        ax.grid(axis="y", alpha=0.3)
        marked = marked or any(rough)
    if title:
        fig.suptitle(title)
    if marked:  # (the table's caption and notes say why)
        fig.supxlabel(ROUGH_WORDS, fontsize=8)
    return save_figure(fig, save)


def _value_formatter(kind: str) -> Any:
    """Short tick/annotation text for a column kind (see modelprof.render.views)."""
    if kind == "time_ms":
        return format_time_ms
    fmt = {"bytes": format_bytes, "percent": format_percent, "count": format_count}.get(kind)
    return (lambda v: fmt(v, decimals=1)) if fmt else (lambda v: f"{v:.3g}")


def _tick_formatter(fmt: Any) -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: fmt(v))


def plot_cost_latency(
    compare_df: pd.DataFrame,
    cost: str = "macs",
    *,
    latency: str | None = None,
    title: str | None = None,
    save: str | os.PathLike[str] | None = None,
) -> Figure:
    """Each model of a comparison as a point: its cost (``macs``, ``flops``, ``params``...)
    against its latency median, with the 95 % interval as an error bar where defined.
    ``latency`` defaults to what the comparison ranks by (``attrs["ranked_by"]``: the CPU
    work on a loaded CPU, else the wall clock). Log scales where a quantity spans over 10x."""
    if latency is None:
        latency = (
            "cpu_work_median_ms"
            if getattr(compare_df, "attrs", {}).get("ranked_by") == "cpu_work"
            else "latency_median_ms"
        )
    stem = latency.removesuffix("_median_ms")
    require_columns(
        compare_df,
        [cost, latency],
        "plot_cost_latency",
        hint=" (compare(..., timing=True) measures the latency)",
    )
    x = compare_df[cost].to_numpy(dtype=float)
    y = compare_df[latency].to_numpy(dtype=float)
    absent = pd.Series(np.nan, index=compare_df.index)  # no interval columns: no error bars
    lo = y - compare_df.get(f"{stem}_ci_low_ms", absent).to_numpy(dtype=float)
    hi = compare_df.get(f"{stem}_ci_high_ms", absent).to_numpy(dtype=float) - y
    fig = figure_class()(figsize=(5.5, 4.0), layout="constrained")
    ax = fig.subplots()
    ok = np.isfinite(lo) & np.isfinite(hi)
    ax.errorbar(
        x[ok],
        y[ok],
        yerr=np.vstack([lo[ok], hi[ok]]),
        fmt="o",
        color="tab:blue",
        capsize=3,
        label="median, 95 % CI",
    )
    if (~ok).any():
        ax.plot(x[~ok], y[~ok], "o", mfc="none", color="tab:blue", label="median (no interval)")
    for label, xi, yi in zip(_model_labels(compare_df), x, y):
        ax.annotate(label, (xi, yi), xytext=(4, 4), textcoords="offset points", fontsize=8)
    for axis, values in (("x", x), ("y", y)):
        finite = values[np.isfinite(values) & (values > 0)]
        if finite.size and finite.max() > 10 * finite.min():
            getattr(ax, f"set_{axis}scale")("log")
    cost_spec, lat_spec = column_spec(cost, compare_df[cost]), column_spec(latency)
    ax.set(xlabel=cost_spec.header, ylabel=lat_spec.header)
    ax.xaxis.set_major_formatter(_tick_formatter(_value_formatter(cost_spec.kind)))
    ax.yaxis.set_major_formatter(_tick_formatter(_value_formatter("time_ms")))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title)
    return save_figure(fig, save)
