"""Plots of a ``GenerationReport``: decode time and bytes against the context, and each
layer's share of the prefill and of a decode step (matplotlib Figures, saved when asked)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from modelprof.report.plots import figure_class, save_figure

__all__ = ["layer_shares", "plot_decode_growth", "plot_phase_share"]


def plot_decode_growth(
    report: Any, *, save: str | os.PathLike[str] | None = None, batch_size: int | None = None
) -> Any:
    """Left: a decode step's time against the context (every measured step, their median and
    fit, the per-layer passes' medians, the bound). Right: its counted bytes and the KV cache.
    Nothing timed and no bound: the bytes alone."""
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
        ax_t.plot(ctx, g["latency_ms"], "o", color="tab:orange", label="per-layer passes (median)")
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


def layer_shares(
    report: Any, batch_size: int | None = None, column: str | None = None
) -> pd.DataFrame:
    """Each block (depth 2, and the leaves above) as a share of the prefill and of the last
    decode step, by ``column`` (default: latency when timed per layer, else FLOPs)."""
    phases = {"prefill": report.prefill(batch_size), "decode": report.decode(batch_size=batch_size)}
    timed = all(p.report.latency is not None for p in phases.values())
    column = column or ("latency_ms" if timed else "flops")
    out = {}
    for name, phase in phases.items():
        df = phase.report.to_dataframe()
        keep = (df["depth"] == 2) | (df["leaf"] & (df["depth"] < 2))
        rows = df[keep].groupby("module", sort=False)[column].sum()
        total = rows.sum()
        out[name] = rows / total if total else rows * np.nan
    shares = pd.DataFrame(out).fillna(0.0)
    shares.attrs["column"] = column
    return shares


def plot_phase_share(
    report: Any,
    *,
    save: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
    column: str | None = None,
) -> Any:
    """Grouped bars: each block's share of the prefill beside its share of a decode step."""
    shares = layer_shares(report, batch_size, column)
    n = len(shares)
    fig = figure_class()(figsize=(8.0, max(2.5, 0.35 * n + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(n)
    ax.barh(y - 0.2, shares["prefill"] * 100, height=0.4, label="prefill")
    ax.barh(y + 0.2, shares["decode"] * 100, height=0.4, label="decode")
    ax.set_yticks(y, [m or "(root)" for m in shares.index])
    ax.invert_yaxis()
    ax.set_xlabel(f"share of the phase's {shares.attrs['column']} (%)")
    ax.set_title("Prefill vs decode, per layer")
    ax.legend()
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, save)
