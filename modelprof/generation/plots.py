"""Plots of a ``GenerationReport``: decode time and bytes against the context, and each
layer's share of the prefill and of a decode step (matplotlib Figures, saved when asked)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from modelprof.render.views import ROUGH_MARK
from modelprof.report.plots import (
    ROUGH_COLOUR,
    ROUGH_WORDS,
    figure_class,
    rough_cells,
    save_figure,
)

__all__ = ["HATCHED_WORDS", "layer_shares", "plot_decode_growth", "plot_phase_share"]

#: how a rough share's bar is drawn: in its phase's colour (the legend's), hatched and faded
ROUGH_HATCH, ROUGH_ALPHA = "///", 0.45
HATCHED_WORDS = f"{ROUGH_MARK}, hatched: rough, no figure to quote"


def plot_decode_growth(
    report: Any, *, save: str | os.PathLike[str] | None = None, batch_size: int | None = None
) -> Any:
    """Left: a decode step's time against the context (every measured step, their median and
    fit, the per-layer passes' medians, the bound). Right: its counted bytes and the KV cache.
    A phase's time the tables mark rough (``latency_rough``, ``~``) is a grey point ringed in
    the passes' colour, and the legend says so. Nothing timed and no bound: the bytes alone."""
    g = report.growth(batch_size)
    ctx = g["context"]
    timing = report.timings.get(report._batch(batch_size))
    stepped = timing is not None and timing.step_ms.size > 0
    timed = stepped or g["latency_ms"].notna().any() or "bound_ms" in g.columns
    fig = figure_class()(figsize=(11.0, 4.0) if timed else (5.5, 4.0), layout="constrained")
    from matplotlib.ticker import MaxNLocator  # (matplotlib is there: figure_class found it)

    ax_t, ax_b = fig.subplots(1, 2) if timed else (None, fig.subplots())
    if stepped:
        every = np.broadcast_to(timing.contexts, timing.step_ms.shape)
        ax_t.scatter(
            every.ravel(),
            timing.step_ms.ravel(),
            s=6,
            alpha=0.3,
            color="0.5",
            label="decode steps (generations)",
        )
        med = np.median(timing.step_ms, axis=0)
        ax_t.plot(timing.contexts, med, color="tab:blue", label="median per context")
        slope = timing.step_slope
        if slope is not None and slope.measurable:
            ax_t.plot(
                timing.contexts,
                slope.intercept_ms + slope.ms_per_token * timing.contexts,
                "--",
                color="tab:blue",
                label=f"fit: {slope.describe()}",
            )
        elif slope is not None:  # no growth measured: said in the legend, no line drawn
            ax_t.plot([], [], " ", label=f"growth {slope.describe()}")
    if g["latency_ms"].notna().any():
        _draw_passes(ax_t, g)
    if "bound_ms" in g.columns:
        bound = f"roofline bound ({report.peaks.device})"
        ax_t.plot(ctx, g["bound_ms"], "s-", color="tab:red", label=bound)
    # MiB, as the tables write bytes (1 MiB = 2**20 B)
    ax_b.plot(ctx, g["read_bytes"] / 2**20, "o-", label="read (counted)")
    ax_b.plot(ctx, g["write_bytes"] / 2**20, "o-", label="written (counted)")
    if g["kv_cache_bytes"].notna().any():
        ax_b.plot(ctx, g["kv_cache_bytes"] / 2**20, "s--", label="KV cache after the step")
    batch = f", batch {report._batch(batch_size)}"  # (a report may hold several)
    for ax, unit, what in ((ax_t, "ms per decode step", "time"), (ax_b, "MiB", "bytes")):
        if ax is None:
            continue
        ax.set(
            xlabel="context (tokens in the cache)",
            ylabel=unit,
            title=f"Decode step {what}{batch}",
        )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # contexts are whole tokens
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return save_figure(fig, save)


def _draw_passes(ax: Any, g: pd.DataFrame) -> None:
    """The decode phases' per-layer passes (median) against the context; one the tables mark
    rough (``latency_rough``, ``~``) grey, ringed in the passes' colour, the legend saying so
    (the generations' steps are the small grey dots)."""
    ctx, ms = g["context"], g["latency_ms"]
    rough = np.array(rough_cells(g, "latency_ms"), dtype=bool)
    passes = "per-layer passes (median)"
    if not rough.all():
        ax.plot(ctx[~rough], ms[~rough], "o", color="tab:orange", label=passes)
    if rough.any():
        ax.plot(
            ctx[rough],
            ms[rough],
            "o",
            mfc=ROUGH_COLOUR,
            mec="tab:orange",
            mew=1.2,
            label=f"{passes}; {ROUGH_WORDS}",
        )


def layer_shares(
    report: Any, batch_size: int | None = None, column: str | None = None
) -> pd.DataFrame:
    """Each block (depth 2, and the leaves above) as a share of the prefill and of the last
    decode step, by ``column`` (default: latency when timed per layer, else FLOPs);
    ``prefill_rough``, ``decode_rough``: a share with a rough row summed into it (as a layer
    type's sum is rough, ``Report.by_module_type``)."""
    phases = {"prefill": report.prefill(batch_size), "decode": report.decode(batch_size=batch_size)}
    timed = all(p.report.latency is not None for p in phases.values())
    column = column or ("latency_ms" if timed else "flops")
    out, rough = {}, {}
    for name, phase in phases.items():
        df = report.phase_frame(phase)
        keep = ((df["depth"] == 2) | (df["leaf"] & (df["depth"] < 2))).to_numpy()
        marked = pd.Series(rough_cells(df, column), index=df.index)[keep]
        rows = df[keep].groupby("module", sort=False)[column].sum()
        rough[f"{name}_rough"] = marked.groupby(df["module"][keep], sort=False).any()
        total = rows.sum()
        out[name] = rows / total if total else rows * np.nan
    shares = pd.DataFrame(out).fillna(0.0)
    shares = shares.assign(
        **{k: v.reindex(shares.index, fill_value=False) for k, v in rough.items()}
    )
    shares.attrs["column"] = column
    return shares


def plot_phase_share(
    report: Any,
    *,
    save: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    column: str | None = None,
) -> Any:
    """Grouped bars: each block's share of the prefill beside its share of a decode step, in
    the phase's colour; a share with a rough time summed into it (``~`` in the tables) is
    hatched and faded, keeping that colour (grey bars matched neither phase's swatch), and the
    legend says so."""
    shares = layer_shares(report, batch_size, column)
    n = len(shares)
    fig = figure_class()(figsize=(8.0, max(2.5, 0.35 * n + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(n)
    from matplotlib.patches import Patch  # (matplotlib is there: figure_class found it)

    key = []  # the legend's swatches: a phase's first bar may be rough
    for offset, phase, colour in ((-0.2, "prefill", "tab:blue"), (0.2, "decode", "tab:orange")):
        rough = shares[f"{phase}_rough"].to_numpy(dtype=bool)
        bars = ax.barh(y + offset, shares[phase] * 100, height=0.4, color=colour)
        for bar in (b for b, r in zip(bars, rough) if r):
            bar.set(hatch=ROUGH_HATCH, alpha=ROUGH_ALPHA, edgecolor=ROUGH_COLOUR)
        key.append(Patch(color=colour, label=phase))
    ax.set_yticks(y, [m or "(root)" for m in shares.index])
    ax.invert_yaxis()
    ax.set_xlabel(f"share of the phase's {shares.attrs['column']} (%)")
    ax.set_title("Prefill vs decode, per layer")
    if shares[["prefill_rough", "decode_rough"]].to_numpy().any():
        swatch = dict(facecolor="white", edgecolor=ROUGH_COLOUR, hatch=ROUGH_HATCH)
        key.append(Patch(**swatch, label=HATCHED_WORDS))
    ax.legend(handles=key)
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, save)
