"""Roofline: join each row's cost (FLOPs, bytes) with its measured latency and the device's peaks.

Per row, :func:`add_roofline` derives

- ``achieved_gflops`` = flops / latency, in GFLOP/s (1e9 FLOP/s)
- ``achieved_gbps``   = (read_bytes + write_bytes) / latency, in GB/s (1e9 B/s)
- ``intensity``       = flops / (read_bytes + write_bytes), FLOP per byte
- ``memory_level``    = the memory level the row is judged against (``L1``, ``L2``, ``L3``,
  ``DRAM``; see :func:`judged_levels`)
- ``roofline_ms``     = max(flops / peak_flops, bytes / that level's bandwidth), in ms
- ``bound``           = ``"compute"`` when the FLOP term is the larger (or equal) one, else ``"memory"``
- ``efficiency``      = roofline_ms / latency_ms (1.0 = at the roof)

``intensity``, ``roofline_ms`` and ``bound`` need no timing; the achieved rates and the efficiency
are NaN on rows without a positive latency. A row with no bytes has NaN intensity and no level; a
row with neither FLOPs nor bytes has no bound (missing).

Memory is a hierarchy: judged against the DRAM roof, a layer whose data sits in a cache looks
impossibly efficient, so the probe measures a roof per level (as cache-aware roofline models do).
Probed roofs are lower bounds: :func:`observed_peaks` raises each to what a row proved, and
:func:`run_peaks` is the run's one set of peaks, which the table, MFU, MBU and the plot all use.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pandas as pd

import modelprof.columns as registry
from modelprof.errors import ModelProfError
from modelprof.render.units import format_rate
from modelprof.render.views import LOADED_FLAG, module_labels, require_columns
from modelprof.report.rows import SELF_SUFFIX, modelprof_frame
from modelprof.timing.peaks import MemoryLevel, Peaks

__all__ = [
    "PROOF_COLUMN",
    "ROOFLINE_COLUMNS",
    "add_roofline",
    "compute_roofs",
    "judged_levels",
    "observed_peaks",
    "peak_notes",
    "peak_words",
    "roof_proofs",
    "scattered",
    "run_peaks",
    "with_read_times",
]


#: the columns add_roofline derives (declared in modelprof.columns), without the loaded flag
ROOFLINE_COLUMNS: tuple[str, ...] = tuple(n for n in registry.names("roofline") if n != LOADED_FLAG)


def add_roofline(
    df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms"
) -> pd.DataFrame:
    """A copy of ``df`` (modelprof view: ``flops``, ``read_bytes``, ``write_bytes``, and
    optionally ``latency_column``) with the roofline columns appended (replaced if present).
    Against a probe that ran on a busy machine, ``efficiency_loaded`` marks every efficiency."""
    require_columns(
        df,
        ["flops", "read_bytes", "write_bytes"],
        "add_roofline",
        " (the modelprof view of the report)",
    )
    if not isinstance(peaks, Peaks):
        raise ModelProfError(
            f"peaks must be a modelprof.timing.peaks.Peaks, got {type(peaks).__name__}"
        )
    flops, traffic, latency, timed = _work(df, latency_column)
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


def _work(df: pd.DataFrame, latency_column: str) -> tuple[np.ndarray, ...]:
    """Per row: FLOPs, traffic (read + write bytes), latency in ms (NaN without the column),
    and whether the row is timed (a finite, positive latency)."""
    flops = df["flops"].to_numpy(dtype=float)
    traffic = df["read_bytes"].to_numpy(dtype=float) + df["write_bytes"].to_numpy(dtype=float)
    if latency_column not in df.columns:
        latency = np.full(len(df), np.nan)
    else:
        latency = df[latency_column].to_numpy(dtype=float)
    return flops, traffic, latency, np.isfinite(latency) & (latency > 0)


#: the per-layer median as read (hooks included), what a row proves a roof by, where a frame has it
PROOF_COLUMN = "latency_read_ms"


def observed_peaks(df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms") -> Peaks:
    """``peaks`` with each probed roof raised to the best rate a timed row of ``df`` reached
    above it (a probe is a lower bound: a layer that ran faster proves the device can), each
    faster memory level to at least the one behind it; the raised roofs named in
    ``Peaks.raised``. Datasheet and user peaks are left as given."""
    proofs = roof_proofs(df, peaks, latency_column=latency_column)
    if not proofs:
        return peaks
    peak_flops = max(float(peaks.peak_flops), proofs.get("compute", (0.0, -1))[0])
    conv_peak = peaks.conv_peak_flops
    if conv_peak is not None:
        conv_peak = max(float(conv_peak), proofs.get("conv compute", (0.0, -1))[0])
    levels = list(peaks.memory_levels)
    for i in range(len(levels) - 1, -1, -1):  # slowest first: a cache is at least as fast
        floor = max(proofs.get(levels[i].name, (0.0, -1))[0], *(lv.bandwidth for lv in levels[i:]))
        if floor > levels[i].bandwidth:
            levels[i] = MemoryLevel(levels[i].name, levels[i].capacity_bytes, floor)
    raised = [n for n in proofs if n in ("compute", "conv compute")]
    raised += [b.name for a, b in zip(peaks.memory_levels, levels) if b.bandwidth > a.bandwidth]
    return dataclasses.replace(
        peaks,
        peak_flops=peak_flops,
        peak_bytes=levels[-1].bandwidth,
        levels=tuple(levels) if peaks.levels else (),
        conv_peak_flops=conv_peak,
        raised=(*peaks.raised, *dict.fromkeys(raised)),
    )


def roof_proofs(
    df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms"
) -> dict[str, tuple[float, int]]:
    """The probed roofs a timed row of ``df`` beat: roof name (``"compute"``, ``"conv
    compute"``, a memory level's name) -> (the rate proved, in FLOP/s or B/s, and the position
    of the row that proved it). A slower level (DRAM) is proved by the bytes a leaf moved past
    the caches in front of it. A ``(self)`` row proves nothing: its time is its parent's span
    less its children's, which the hooks' correction and the load can leave short (a loaded
    resnet18's ``layer2.0.(self)`` at 3x112x112, 25,088 FLOP, read 0.18 us: 139 GFLOP/s over a
    101 GFLOP/s probe). Nor does a row's time less the hooks' cost where that cost took more
    than half of its span as read (``latency_read_ms``, where ``df`` has it: a loaded
    newcomer's ``downsample.0``, 9.6 us after 187 us a hooked call were taken off, "proved"
    1.34 TFLOP/s on a 2-core CPU probed at 156 GFLOP/s), a row whose passes scatter wider than
    its median (:func:`scattered`), or one marked rough (``latency_rough``): faster than its
    roof, such a row is marked rough, and a roof a row raised is the rate its table row reads
    (a loaded CLI run's note raised compute to 84.84 GFLOP/s by a block's median plus its
    spread, while its row read 290 GFLOP/s, efficiency 3.4). Empty for peaks that are not a
    probe's."""
    if peaks.source != "probe" or not {"flops", "read_bytes", "write_bytes"} <= set(df.columns):
        return {}
    flops, traffic, latency, timed = _work(df, latency_column)
    timed &= ~own_rows(df) & ~scattered(df, latency_column) & ~_rough(df, latency_column)
    if latency_column == "latency_ms" and PROOF_COLUMN in df.columns:
        timed &= ~(latency < df[PROOF_COLUMN].to_numpy(dtype=float) / 2)  # (NaN: not cut)
    if not timed.any():
        return {}
    seconds = np.where(timed, latency, np.inf) / 1e3
    proofs = _compute_proofs(df, peaks, flops / seconds)  # 0 on untimed rows
    levels = peaks.memory_levels
    rate = traffic / seconds
    _prove(proofs, levels[0].name, rate, levels[0].bandwidth)
    leaf = df.get("leaf", pd.Series(False, index=df.index)).fillna(False).to_numpy(dtype=bool)
    # bytes a leaf must have moved past the caches: at least max(read, write) are distinct
    # (a parent's traffic holds its children's intermediates, which a cache can keep)
    distinct = np.maximum(df["read_bytes"].to_numpy(float), df["write_bytes"].to_numpy(float))
    held = 0
    for lv_in_front, lv in zip(levels, levels[1:]):
        held += lv_in_front.capacity_bytes or 0
        beyond = np.where(leaf, np.clip(distinct - held, 0.0, None), 0.0) / seconds
        _prove(proofs, lv.name, beyond, lv.bandwidth)
    return proofs


def scattered(df: pd.DataFrame, latency_column: str = "latency_ms") -> np.ndarray:
    """Per row: its passes' standard deviation (``latency_std_ms``) above its median, which
    is then no time its passes support (a loaded resnet18's ``layer3.1.conv1`` read 0.43 ms,
    std 40 ms, beside 7.87 ms for its twin, and "proved" 539 GFLOP/s on 2 cores): it proves no
    roof, and faster than its roof it is rough. False where ``df`` has no spread."""
    std = _spread(df, latency_column)
    if std is None or latency_column not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return np.isfinite(std) & (std > df[latency_column].to_numpy(dtype=float))


def _rough(df: pd.DataFrame, latency_column: str) -> np.ndarray:
    """Per row: its time marked rough (``latency_rough`` beside ``latency_ms``, where ``df`` has
    it: :func:`with_read_times` marks a report's rows so where its layers are rough as a whole)."""
    flag = latency_column.removesuffix("_ms") + "_rough"
    if flag not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return df[flag].fillna(False).to_numpy(dtype=bool)


def _spread(df: pd.DataFrame, latency_column: str) -> np.ndarray | None:
    """The passes' standard deviation beside ``latency_column`` (``latency_std_ms``), None
    where ``df`` has none."""
    spread = latency_column.removesuffix("_ms") + "_std_ms"
    return df[spread].to_numpy(dtype=float) if spread in df.columns else None


def own_rows(df: pd.DataFrame) -> np.ndarray:
    """Per row: a ``(self)`` pseudo-row, whose time is its parent's less its children's."""
    if "module" not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return df["module"].astype(str).str.endswith(SELF_SUFFIX).to_numpy(dtype=bool)


def _compute_proofs(df: pd.DataFrame, peaks: Peaks, rate: np.ndarray) -> dict[str, Any]:
    """The compute roofs rows beat, each row against the roof :func:`compute_roofs` gives it."""
    proofs: dict[str, tuple[float, int]] = {}
    if peaks.conv_peak_flops is None:
        _prove(proofs, "compute", rate, float(peaks.peak_flops))
        return proofs
    conv, mixed = _compute_classes(df)
    _prove(proofs, "compute", np.where(~conv & ~mixed, rate, 0.0), float(peaks.peak_flops))
    _prove(proofs, "conv compute", np.where(conv, rate, 0.0), float(peaks.conv_peak_flops))
    plain = proofs.get("compute", (float(peaks.peak_flops), -1))
    convs = proofs.get("conv compute", (float(peaks.conv_peak_flops), -1))
    faster = "conv compute" if convs[0] >= plain[0] else "compute"
    _prove(proofs, faster, np.where(mixed, rate, 0.0), max(plain[0], convs[0]))
    return proofs


def _prove(proofs: dict[str, Any], name: str, rates: np.ndarray, roof: float) -> None:
    """Record in ``proofs`` the best of ``rates`` where it beats ``roof``."""
    if not len(rates):
        return
    best = int(np.argmax(rates))
    if rates[best] > roof:
        proofs[name] = (float(rates[best]), best)


def run_peaks(report: Any) -> Peaks | None:
    """The one peak a report's numbers are judged against: its peaks as given or looked up, or
    its probe raised by its own rows (:func:`observed_peaks`)."""
    peaks = getattr(report, "peaks", None)
    if not isinstance(peaks, Peaks) or peaks.source != "probe" or not report.timed:
        return peaks
    frame = modelprof_frame(report.rows, True, report.training_step is not None)
    return observed_peaks(with_read_times(frame, report), peaks)


def with_read_times(df: pd.DataFrame, report: Any) -> pd.DataFrame:
    """``df`` (one row per row of ``report.rows``, in order) with each row's span as read
    (``PROOF_COLUMN``: a row the hooks' cost took more than half of proves no roof) and, where
    the report's layers are rough as a whole (``layers_rough``), every timed row marked rough
    (``latency_rough``), proving none (a loaded run's all-rough rows raised its L1 roof)."""
    df = df.assign(**{PROOF_COLUMN: [r.latency_read_ms for r in report.rows]})
    if report.layers_rough and "latency_ms" in df.columns:
        df["latency_rough"] = df["latency_ms"].notna()
    return df


_CONV_TYPE = re.compile(r"^(Lazy)?Conv(Transpose)?[123]d$")


def _compute_classes(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: a convolution layer (``type`` ``Conv2d``, ``ConvTranspose1d``, ...), and a parent
    (``leaf`` False: its work may mix convolutions and other ops)."""
    types = df.get("type", [None] * len(df))
    conv = np.array([isinstance(t, str) and bool(_CONV_TYPE.match(t)) for t in types], dtype=bool)
    mixed = ~df.get("leaf", pd.Series(True, index=df.index)).fillna(True).to_numpy(dtype=bool)
    return conv & ~mixed, mixed


def compute_roofs(df: pd.DataFrame, peaks: Peaks) -> np.ndarray:
    """Per row, the compute roof in FLOP/s: ``peaks.conv_peak_flops`` (where set) for a
    convolution, the faster of the two for a parent, else ``peaks.peak_flops``."""
    roofs = np.full(len(df), float(peaks.peak_flops))
    if peaks.conv_peak_flops is not None:
        conv, mixed = _compute_classes(df)
        roofs[conv] = float(peaks.conv_peak_flops)
        roofs[mixed] = max(float(peaks.peak_flops), float(peaks.conv_peak_flops))
    return roofs


def judged_levels(
    traffic_bytes: np.ndarray, achieved_bps: np.ndarray, levels: tuple[MemoryLevel, ...]
) -> list[int]:
    """Per row, the index into ``levels`` of the level it is judged against (-1: no traffic):
    the smallest level whose capacity holds its working set (read + write bytes), then, while
    its measured bandwidth beats that level's roof, the next faster level (data moved faster
    than a level allows came from a faster one)."""
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


#: a CPU probe's DRAM roof below this (B/s), slower than one DDR3 channel (10.7 GB/s), was
#: slowed by other work on the machine
IMPLAUSIBLE_CPU_DRAM = 5e9


def peak_notes(df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms") -> list[str]:
    """Sentences on every sign that the probe behind ``peaks`` was disturbed: a roof a layer of
    ``df`` beat, a probe that waited for a core, a CPU's DRAM roof slower than any main memory.
    Empty for undisturbed, datasheet or given peaks."""
    if peaks.source != "probe":
        return []
    notes = []
    if peaks.loaded:
        notes.append(
            f"The probe ran on a busy machine ({peaks.load_reason}): every roof it measured "
            "reads low."
        )
    proofs = roof_proofs(df, peaks, latency_column=latency_column)
    for name, old, unit, rate, who, how in _beaten(df, peaks, proofs):
        notes.append(
            f"The probe measured the {name} roof at {format_rate(old, unit)}, but {who} {how} "
            f"at {format_rate(rate, unit)}: the probe was disturbed and read low, so that roof "
            f"is {format_rate(rate, unit)} here."
        )
    if peaks.raised and not proofs:
        notes.append(
            f"The {', '.join(peaks.raised)} roof(s) are the rates layers reached, above what the "
            "probe measured: the probe was disturbed and read low."
        )
    if _dram_low(peaks, proofs):
        notes.append(_dram_sentence(peaks) + " Probe again on a quiet machine.")
    return notes


def peak_words(
    df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms"
) -> tuple[str | None, str | None]:
    """What :func:`peak_notes` says, as a plot says it: a sentence for its title (the probe was
    disturbed and read low, and which roofs are drawn at what layers reached) and a caption
    with the details. ``(None, None)`` for undisturbed, datasheet or given peaks."""
    if peaks.source != "probe":
        return None, None
    proofs = roof_proofs(df, peaks, latency_column=latency_column)
    dram_low = _dram_low(peaks, proofs)
    if not (peaks.loaded or proofs or peaks.raised or dram_low):
        return None, None
    dram = peaks.memory_levels[-1]
    dram_words = f"its DRAM roof, {format_rate(dram.bandwidth, 'B/s')}, is implausibly low"
    title = "The probe was disturbed" + (" (the machine was busy)" if peaks.loaded else "")
    title += " and read low" + (f": {dram_words}" if dram_low and not proofs else "")
    if proofs:
        reached = ", ".join(
            f"{_spelled(name)} {format_rate(rate, _probed(peaks, name)[1])}"
            for name, (rate, _) in proofs.items()
        )
        title += f", so these roofs are drawn at what layers of this run reached: {reached}"
    elif peaks.raised:
        roofs = "roofs are" if len(peaks.raised) > 1 else "roof is"
        title += (
            f", so the {', '.join(map(_spelled, peaks.raised))} {roofs} drawn at what layers "
            "of this run reached"
        )
    details = [
        f"{_spelled(name)} {format_rate(old, unit)} ({who} {how} at {format_rate(rate, unit)})"
        for name, old, unit, rate, who, how in _beaten(df, peaks, proofs)
    ]
    caption = []
    if peaks.loaded:
        caption.append(
            f"The probe ran on a busy machine: {peaks.load_reason}, and every roof it measured "
            "reads low."
        )
    if details:
        caption.append("The probe measured " + "; ".join(details) + ".")
    if dram_low:
        caption.append(_dram_sentence(peaks))
    caption.append("Probe again on a quiet machine for roofs of the device itself.")
    return title + ".", " ".join(caption)


def _beaten(df: pd.DataFrame, peaks: Peaks, proofs: dict[str, Any]) -> list[tuple]:
    """Per beaten roof: (name, probed rate, unit, rate proved, the layer that proved it, how)."""
    labels = module_labels(df["module"], df.get("call")) if "module" in df.columns else None
    out = []
    for name, (rate, row) in proofs.items():
        old, unit = _probed(peaks, name)
        who = f"layer {labels[row]}" if labels is not None else f"row {row}"
        how = "ran"
        if unit == "B/s":
            first = name == peaks.memory_levels[0].name
            how = "moved data" if first else "moved data past the caches"
        out.append((name, old, unit, rate, who, how))
    return out


def _dram_low(peaks: Peaks, proofs: dict[str, Any]) -> bool:
    """A CPU probe's DRAM roof no row beat, below :data:`IMPLAUSIBLE_CPU_DRAM`."""
    cpu = any(lv.name in ("L1", "L3") for lv in peaks.levels)  # a GPU probe measures L2, DRAM
    dram = peaks.memory_levels[-1]
    return cpu and dram.bandwidth < IMPLAUSIBLE_CPU_DRAM and "DRAM" not in proofs


def _dram_sentence(peaks: Peaks) -> str:
    return (
        f"The DRAM roof, {format_rate(peaks.memory_levels[-1].bandwidth, 'B/s')}, is implausibly "
        f"low: one DDR3 memory channel moves {format_rate(10.7e9, 'B/s')}; the probe's copy was "
        "most likely slowed by other work."
    )


def _spelled(name: str) -> str:
    """A roof's name in plain words (``conv compute`` is the convolutions' compute roof)."""
    return "convolution compute" if name == "conv compute" else name


def _probed(peaks: Peaks, name: str) -> tuple[float, str]:
    """The probed value of the roof ``name`` and its unit."""
    if name == "compute":
        return float(peaks.peak_flops), "FLOP/s"
    if name == "conv compute":
        return float(peaks.conv_peak_flops or peaks.peak_flops), "FLOP/s"
    return next(lv.bandwidth for lv in peaks.memory_levels if lv.name == name), "B/s"
