"""Roofline: join each row's cost (FLOPs, bytes) with its measured latency and the device's peaks.

Per row, :func:`add_roofline` derives

- ``achieved_gflops`` = flops / latency, in GFLOP/s (1e9 FLOP/s)
- ``achieved_gbps``   = (read_bytes + write_bytes) / latency, in GB/s (1e9 B/s)
- ``intensity``       = flops / (read_bytes + write_bytes), FLOP per byte
- ``memory_level``    = the level of the memory hierarchy the row is judged against (``L1``,
  ``L2``, ``L3``, ``DRAM``): the smallest whose capacity holds the row's working set
  (read + write bytes), or a faster one when the row's measured bandwidth proves its data came
  from there (it beats the roof of the level it fits in)
- ``roofline_ms``     = max(flops / peak_flops, bytes / that level's bandwidth), the least time
  the device needs for that row's work, in ms
- ``bound``           = ``"compute"`` when the FLOP term is the larger (or equal) one, else ``"memory"``
- ``efficiency``      = roofline_ms / latency_ms (1.0 = at the roof)

``intensity``, ``roofline_ms`` and ``bound`` need no timing; the achieved rates and the efficiency
are NaN on rows without a positive latency. A row with no bytes has NaN intensity and no level; a
row with neither FLOPs nor bytes has no bound (missing).

Memory is a hierarchy: a layer whose data sits in a cache moves it faster than DRAM, so judging it
against the DRAM roof makes it look impossibly efficient. The probe therefore measures a roof per
level, the way cache-aware roofline models do: copies whose working set fits each cache level (and
one far larger than the last level, for DRAM), each level's bandwidth taken as the best copy that
fits it and no lower than the next slower level's.

Probed roofs are lower bounds of what the device can do: where a row of the table ran faster,
:func:`observed_peaks` raises the roof to what it reached, so no row sits above the roof it is
judged against (``Peaks.raised`` names the raised roofs; datasheet and user peaks stay as given).

Peaks come from a short measured probe (:func:`probe_peaks`: a matmul for FLOP/s, copies for the
bandwidth of each memory level) or from the table of datasheet values :data:`KNOWN_DEVICES`
(:func:`lookup_peaks`, DRAM only). The probe draws its random operands from a private
``torch.Generator``, so it leaves the global RNG where it was.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from modelprof.errors import ModelProfError
from modelprof.render.views import LOADED_FLAG
from modelprof.timing.peaks import MemoryLevel, Peaks

__all__ = ["ROOFLINE_COLUMNS", "add_roofline", "compute_roofs", "judged_levels", "observed_peaks"]


ROOFLINE_COLUMNS: tuple[str, ...] = (
    "achieved_gflops",
    "achieved_gbps",
    "intensity",
    "memory_level",
    "roofline_ms",
    "bound",
    "efficiency",
)


def add_roofline(
    df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms"
) -> pd.DataFrame:
    """A copy of ``df`` (modelprof view) with the roofline columns appended (replaced if present).
    Against a probe that ran on a busy machine (``peaks.loaded``), ``efficiency_loaded`` marks
    every efficiency judged against it (the human-readable views mark those cells).

    Needs ``flops``, ``read_bytes`` and ``write_bytes``; ``latency_column`` is optional (without it
    the achieved rates and the efficiency are NaN).
    """
    if not isinstance(df, pd.DataFrame):
        raise ModelProfError(f"expected a pandas DataFrame, got {type(df).__name__}")
    if not isinstance(peaks, Peaks):
        raise ModelProfError(
            f"peaks must be a modelprof.timing.peaks.Peaks, got {type(peaks).__name__}"
        )
    missing = [c for c in ("flops", "read_bytes", "write_bytes") if c not in df.columns]
    if missing:
        raise ModelProfError(
            f"add_roofline needs column(s) {missing} (the modelprof view of the report); "
            f"the table has {list(map(str, df.columns))}"
        )
    flops, traffic, latency = _work(df, latency_column)
    timed = np.isfinite(latency) & (latency > 0)
    safe_latency = np.where(timed, latency, 1.0)
    has_bytes = traffic > 0
    peaks = observed_peaks(df, peaks, latency_column=latency_column)

    # bytes / ms * 1e3 = bytes/s
    achieved_bps = np.where(timed, traffic / safe_latency * 1e3, np.nan)
    level_index = judged_levels(traffic, achieved_bps, peaks.memory_levels)
    levels = peaks.memory_levels
    bandwidth = np.array([levels[i].bandwidth if i >= 0 else peaks.peak_bytes for i in level_index])
    compute_ms = flops / compute_roofs(df, peaks) * 1e3
    memory_ms = traffic / bandwidth * 1e3
    roofline_ms = np.maximum(compute_ms, memory_ms)
    working = (flops > 0) | has_bytes
    bound = np.where(compute_ms >= memory_ms, "compute", "memory").astype(object)
    bound[~working] = None
    text = pd.Series(["x"]).dtype

    out = df.drop(columns=[c for c in (*ROOFLINE_COLUMNS, LOADED_FLAG) if c in df.columns])
    # flops / (ms * 1e-3) / 1e9 = flops / ms / 1e6
    out["achieved_gflops"] = np.where(timed, flops / safe_latency / 1e6, np.nan)
    out["achieved_gbps"] = achieved_bps / 1e9
    out["intensity"] = np.where(has_bytes, flops / np.where(has_bytes, traffic, 1.0), np.nan)
    out["memory_level"] = pd.Series(
        [levels[i].name if i >= 0 else None for i in level_index], index=df.index, dtype=text
    )
    out["roofline_ms"] = roofline_ms
    out["bound"] = pd.Series(list(bound), index=df.index, dtype=text)
    out["efficiency"] = np.where(timed, roofline_ms / safe_latency, np.nan)
    if peaks.loaded:  # judged against roofs a busy machine measured low: each one says so
        out[LOADED_FLAG] = timed
    return out


def _work(df: pd.DataFrame, latency_column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: FLOPs, traffic (read + write bytes) and latency in ms (NaN without the column)."""
    flops = df["flops"].to_numpy(dtype=float)
    traffic = df["read_bytes"].to_numpy(dtype=float) + df["write_bytes"].to_numpy(dtype=float)
    if latency_column in df.columns:
        latency = df[latency_column].to_numpy(dtype=float)
    else:
        latency = np.full(len(df), np.nan)
    return flops, traffic, latency


def observed_peaks(df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms") -> Peaks:
    """``peaks`` with each probed roof raised to the best rate a timed row of ``df`` reached
    above it: the roofs :func:`add_roofline` judges ``df`` against.

    A probe measures a lower bound of what the device can do (a short run on a shared machine,
    copies limited by their per-call overhead); a layer that ran faster proves the device can,
    so the roof is at least that. Each compute roof is raised by the rows judged against it
    (:func:`compute_roofs`); a memory roof only where a row beat even the fastest level (slower
    levels are never raised: a row faster than its level is judged against a faster one, see
    :func:`judged_levels`). The raised roofs are named in ``Peaks.raised``. Peaks from the
    datasheet table or the user (``source`` ``"table"``, ``"user"``) are left as given: a row
    above them says the measurement or the given roof is wrong.
    """
    if peaks.source != "probe" or not {"flops", "read_bytes", "write_bytes"} <= set(df.columns):
        return peaks
    flops, traffic, latency = _work(df, latency_column)
    timed = np.isfinite(latency) & (latency > 0)
    if not timed.any():
        return peaks
    seconds = np.where(timed, latency, np.inf) / 1e3
    rate_flops = flops / seconds  # 0 on untimed rows
    rate_bytes = traffic / seconds
    raised: list[str] = []
    peak_flops, conv_peak = float(peaks.peak_flops), peaks.conv_peak_flops
    if conv_peak is None:
        best = float(rate_flops.max())
        if best > peak_flops:
            peak_flops = best
            raised.append("compute")
    else:
        conv, mixed = _compute_classes(df)
        plain = ~conv & ~mixed
        best, best_conv = rate_flops[plain].max(initial=0.0), rate_flops[conv].max(initial=0.0)
        if best > peak_flops:
            peak_flops = float(best)
            raised.append("compute")
        if best_conv > conv_peak:
            conv_peak = float(best_conv)
            raised.append("conv compute")
        best_mixed = rate_flops[mixed].max(initial=0.0)
        if best_mixed > max(peak_flops, conv_peak):  # the faster roof, which mixed rows get
            if conv_peak >= peak_flops:
                conv_peak = float(best_mixed)
                raised.append("conv compute")
            else:
                peak_flops = float(best_mixed)
                raised.append("compute")
    levels = peaks.memory_levels
    fastest = float(rate_bytes.max())
    if fastest > levels[0].bandwidth:
        levels = (MemoryLevel(levels[0].name, levels[0].capacity_bytes, fastest), *levels[1:])
        raised.append(levels[0].name)
    if not raised:
        return peaks
    return Peaks(
        peak_flops=peak_flops,
        peak_bytes=levels[-1].bandwidth,
        source=peaks.source,
        device=peaks.device,
        dtype=peaks.dtype,
        levels=levels if peaks.levels else (),
        conv_peak_flops=conv_peak,
        raised=(*peaks.raised, *dict.fromkeys(raised)),
        wall_over_cpu=peaks.wall_over_cpu,
    )


_CONV_TYPE = re.compile(r"^(Lazy)?Conv(Transpose)?[123]d$")


def _compute_classes(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: a convolution layer (``type`` ``Conv2d``, ``ConvTranspose1d``, ...), and a parent
    (``leaf`` False: its work may mix convolutions and other ops)."""
    n = len(df)
    conv = np.zeros(n, dtype=bool)
    if "type" in df.columns:
        conv = np.array(
            [isinstance(t, str) and _CONV_TYPE.match(t) is not None for t in df["type"]], dtype=bool
        )
    mixed = np.zeros(n, dtype=bool)
    if "leaf" in df.columns:
        mixed = ~df["leaf"].fillna(True).to_numpy(dtype=bool)
    return conv & ~mixed, mixed


def compute_roofs(df: pd.DataFrame, peaks: Peaks) -> np.ndarray:
    """Per row, the compute roof in FLOP/s: where ``peaks.conv_peak_flops`` is set, it for
    convolution layers (``type`` ``Conv2d``, ``ConvTranspose1d``, ...) and the faster of the two
    for parents (whose work may mix both); else ``peaks.peak_flops`` for every row."""
    roofs = np.full(len(df), float(peaks.peak_flops))
    if peaks.conv_peak_flops is not None:
        conv, mixed = _compute_classes(df)
        roofs[conv] = float(peaks.conv_peak_flops)
        roofs[mixed] = max(float(peaks.peak_flops), float(peaks.conv_peak_flops))
    return roofs


def judged_levels(
    traffic_bytes: np.ndarray, achieved_bps: np.ndarray, levels: tuple[MemoryLevel, ...]
) -> list[int]:
    """Per row, the index into ``levels`` of the level it is judged against (-1: no traffic).

    The smallest level whose capacity holds the row's working set (its read + write bytes);
    then, while the row's measured bandwidth beats that level's roof, the next faster level:
    data a row moved faster than a level allows came from a faster one (a working set slightly
    larger than a cache still finds most of its data there). Only when even the fastest level's
    roof is beaten does a row stay above its roof (the probe under-measured: re-probe on a quiet
    machine).
    """
    out: list[int] = []
    for ws, rate in zip(traffic_bytes, achieved_bps):
        if not ws > 0:
            out.append(-1)
            continue
        i = next(
            k for k, lv in enumerate(levels) if lv.capacity_bytes is None or ws <= lv.capacity_bytes
        )
        while i > 0 and math.isfinite(rate) and rate > levels[i].bandwidth:
            i -= 1
        out.append(i)
    return out
