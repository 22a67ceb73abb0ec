"""Utilization: how much of the device a profiled call used — MFU, HFU and MBU, per row, per
phase and for the whole call, with the convention they follow stated beside them.

    model FLOPs  the FLOPs of the model's forward (and, for a training step, its backward and
                 the loss's) as counted, without what activation checkpointing recomputed
    MFU          model FLOPs / (measured time x peak FLOP/s)
    HFU          (model FLOPs + the recomputed forward, as counted) / (time x peak FLOP/s)
    MBU          (read + write bytes as counted) / (measured time x peak bytes/s); of the
                 forward (a decode step: weights and KV cache read, cache and outputs written)

Conventions (:class:`Convention`), each named in :meth:`Utilization.describe`:

- ``flops="2macs"``: 2 x the multiply-accumulates of contractions (matmuls, convolutions,
  attention), what PaLM, Megatron, nanoGPT and MaxText count; ``"flops"``: modelprof's full
  ``flops`` (the contractions and every elementwise op, normalisation and softmax).
- ``causal="counted"``: attention as it ran (as ``torch.utils.flop_counter`` and MaxText's
  default); ``"half"``: the attention contractions of a causal self-attention halved (MaxText's
  ``causal``), never for a decode step (one query against the whole cache masks nothing). An
  attention contraction is a fused attention op, or a ``bmm``/``baddbmm``/``matmul`` in a row
  beside a softmax; for ``"2macs"``, an op's share in a row is its FLOPs there times its
  2 x MACs / FLOPs over the pass (exact whenever its calls share head sizes and masking).
- the peak: the datasheet's **dense** figure for the dtype (never the sparse one), or the
  report's probed peak; both are recorded when both are known (``Utilization.by_peak``). The
  dtype is the one the matmuls ran in: under autocast (``amp=``) its dtype, not the inputs'.

A row's time (``time_ms``, what MFU and HFU divide by) is its ``latency_ms`` (a training step:
plus its ``backward_latency_ms``); its MBU divides its bytes, the forward's, by the forward's
time: a training step's rows print it beside them (``forward_time_ms``, the ``latency_ms``). The
phases of a forward are ``forward``; of a training step ``forward`` (over the step's own
forward, with autograd recording: not the clean eval-mode runs), ``backward`` (the loss's
backward included) and ``step`` (forward, loss and backward FLOPs over the step's median; the
optimizer's time is in the step, its FLOPs are not model FLOPs). A phase whose time its own
runs say is no figure to quote (read on a loaded machine or too few:
``modelprof.timing.measurement.unquotable``, the rule of the report's end-to-end row) has
``time_rough`` set, and its ratios their ``<ratio>_rough``: ``~`` where printed.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch.distributed as dist

import modelprof.columns as registry
from modelprof.errors import ModelProfError
from modelprof.render.units import format_count, format_rate
from modelprof.report.frames import shown
from modelprof.report.roofline import run_peaks
from modelprof.runtime.device import mig_refusal, mig_slice
from modelprof.runtime.group import group_up
from modelprof.timing.measurement import unquotable
from modelprof.timing.peaks import (
    KNOWN_DEVICES,
    Peaks,
    autocast_dtype,
    lookup_peaks,
    peak_dtype,
)

__all__ = [
    "CAUSAL_CONVENTIONS",
    "FLOPS_CONVENTIONS",
    "Convention",
    "RATIOS",
    "Utilization",
    "attention_flops",
    "group_mfu",
    "group_utilization",
    "mark_loaded",
    "recompute_notes",
    "report_amp",
    "report_peak_dtype",
    "resolve_peaks",
    "utilization",
]

FLOPS_CONVENTIONS = ("2macs", "flops")
CAUSAL_CONVENTIONS = ("counted", "half")
_SOFTMAX = frozenset({"_softmax", "_safe_softmax", "softmax", "_softmax_backward_data"})
_BATCHED = frozenset({"bmm", "baddbmm", "matmul"})
_FLOPS_WORDS = {
    "2macs": "2 x MACs of contractions",
    "flops": "full FLOPs (contractions + elementwise, norms, softmax)",
}
# the frames' own columns, so that they are shown in human units (1.82 G, 31.71%)
registry.declare(
    registry.Column("model_flops", "model FLOPs", "count", "utilization", dtype="float64"),
    registry.Column("hardware_flops", "hardware FLOPs", "count", "utilization", dtype="float64"),
    registry.Column("mfu_generation", "MFU (generation)", "ratio", "utilization"),
    registry.Column("mbu_generation", "MBU (generation)", "ratio", "utilization"),
)
_UNITS = {"bytes": "_bytes"}  # a frame's ``bytes``: read + write bytes, in IEC units
#: the fractions of a peak; against a probe that ran loaded each has its ``<name>_rough`` flag
RATIOS = ("mfu", "hfu", "mbu")
_SOURCE_WORDS = {"table": "datasheet, dense", "probe": "probed", "user": "given"}
_PEAK_NAMES = {"table": "datasheet", "probe": "probe", "user": "given"}


@dataclasses.dataclass(frozen=True)
class Convention:
    """What the utilization counts and against which peak (see the module doc)."""

    flops: str = "2macs"
    causal: str = "counted"
    peaks: Peaks | None = None
    #: the autocast dtype the run's matmuls ran in (``amp=``; None without), said with the peak
    amp: str | None = None

    def __post_init__(self) -> None:
        if self.flops not in FLOPS_CONVENTIONS:
            raise ModelProfError(f"flops={self.flops!r} is not one of {FLOPS_CONVENTIONS}")
        if self.causal not in CAUSAL_CONVENTIONS:
            raise ModelProfError(f"causal={self.causal!r} is not one of {CAUSAL_CONVENTIONS}")
        if self.peaks is not None and not isinstance(self.peaks, Peaks):
            raise ModelProfError(f"peaks={self.peaks!r} must be a modelprof Peaks")

    def describe(self) -> str:
        """One line: the FLOPs counted, causal attention, the peak and where it comes from."""
        causal = "causal attention halved" if self.causal == "half" else "attention as counted"
        p, peak = self.peaks, "no peak"
        if p is not None:
            peak = (
                f"peak {format_rate(p.peak_flops, 'FLOP/s')} {p.dtype}{self._amp_words()}, "
                f"{format_rate(p.peak_bytes, 'B/s')} ({_SOURCE_WORDS[p.source]}"
                f"{', ' + p.device if p.device else ''}{_raised_words(p)}{_loaded_words(p)})"
            )
        return f"model FLOPs = {_FLOPS_WORDS[self.flops]}; {causal}; {peak}"

    def _amp_words(self) -> str:
        """Under autocast, that the peak is of the dtype its matmuls ran in (or, a peak of
        another dtype given, which one they ran in)."""
        if self.amp is None:
            return ""
        if self.peaks is not None and self.peaks.dtype == self.amp:
            return " (the autocast dtype the matmuls ran in)"
        return f" (the matmuls ran in {self.amp} under autocast)"


@dataclasses.dataclass(frozen=True, repr=False)
class Utilization:
    """Per row (``rows``: the report's rows in order, numeric) and per phase (``phases``):
    model and hardware FLOPs, bytes, time, MFU, HFU, MBU; ``by_peak``: the whole call's MFU
    against each peak known (``"datasheet"``, ``"probe"``, ``"given"``)."""

    convention: Convention
    rows: pd.DataFrame
    phases: pd.DataFrame
    by_peak: Mapping[str, float]
    #: conventions behind the figures a reader could take otherwise (:func:`recompute_notes`)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:  # printed whole and in human units, flags as their ~
        for name in ("rows", "phases"):
            frame = getattr(self, name)
            # (a generation's phases add generation_rough and the ratios over it)
            flags = [f for f in frame.columns if str(f).endswith("_rough")]
            object.__setattr__(self, name, shown(frame, units=_UNITS, marks=flags))

    @property
    def mfu(self) -> float:
        """The whole call's MFU: the last phase (``forward``, or a training ``step``)."""
        return float(self.phases["mfu"].iloc[-1])

    @property
    def hfu(self) -> float:
        return float(self.phases["hfu"].iloc[-1])

    def describe(self) -> str:
        """The whole call's MFU (and HFU where recomputation ran) with its convention."""
        last = self.phases.iloc[-1]
        source = _PEAK_NAMES.get(getattr(self.convention.peaks, "source", None))
        hfu = last["hardware_flops"] != last["model_flops"]
        hfu = f", HFU {_ratio_text(last['hfu'], source, last.get('hfu_rough'))}" if hfu else ""
        others = "".join(
            f"; against the {k} peak {_ratio_text(v, k)}"
            for k, v in self.by_peak.items()
            if k != source and k != "given"
        )
        mfu = _ratio_text(last["mfu"], source, last.get("mfu_rough"))
        notes = "".join(f"; {n}" for n in self.notes)
        if _is_set(last.get("time_rough")):  # (its ~ is
            # the mfu_rough flag's, which a rough time sets)
            notes += (
                f"; ~: the {last['phase']}'s time is no figure to quote (its runs read on a "
                "loaded machine or too few), nor is a ratio over it"
            )
        return f"MFU {mfu}{hfu} ({last['phase']}; {self.convention.describe()}{others}){notes}"

    def __repr__(self) -> str:
        """What ``print`` and a notebook show: the sentence and the phases (``rows``: per row)."""
        return f"{self.describe()}\n\n{self.phases!r}"


def _raised_words(p: Peaks) -> str:
    """Where a probed roof was raised to what a layer proved, that in words."""
    if not p.raised:
        return ""
    return (
        f"; the {', '.join(p.raised)} roof{'s' if len(p.raised) > 1 else ''} raised to what a "
        "layer of this run reached: the probe was disturbed and read low"
    )


def _loaded_words(p: Peaks) -> str:
    """Where the probe ran on a busy machine, that in words: every ratio against it is rough."""
    if not p.loaded:
        return ""
    return "; run on a busy machine: its roofs read low, every ratio against them marked ~"


def _is_set(flag: Any) -> bool:
    """A frame's flag cell set: True (a bool or numpy's); not NaN, None or pd.NA."""
    return isinstance(flag, (bool, np.bool_)) and bool(flag)


def _ratio_text(value: float, peak: str | None, rough: Any = False) -> str:
    """A utilization as the summary prints it (``peak``: ``"probe"``, ``"datasheet"`` or
    ``"given"``): work cannot outrun the device, so a ratio above 1 is printed with why the
    peak reads low, not as a utilization; no time is said in words, never ``nan``; ``rough``
    (its ``<ratio>_rough`` flag): marked ``~``, as in the frames."""
    if not math.isfinite(value):
        return "not measured (no time: profile with timing)"
    if not value > 1:
        return f"{'~' if _is_set(rough) else ''}{value:.3f}"
    if peak == "probe":
        why = "the probe under-reads the peak; utilization(peak='<device name>') uses a datasheet"
    else:
        why = f"more than the {peak} peak allows: check the device, dtype and peak"
    return f"above 1 ({value:.3f}: {why})"


def resolve_peaks(peak: Any, report: Any) -> tuple[Peaks | None, dict[str, Peaks]]:
    """The peaks to judge ``report`` against (``peak`` as :meth:`Report.utilization` takes it)
    and every peak known for it."""
    known: dict[str, Peaks] = {}
    probed = run_peaks(report)  # a probe with the roofs the rows beat raised: the plot's too
    if isinstance(probed, Peaks):
        known["probe" if probed.source == "probe" else "given"] = probed
    dtype = report_peak_dtype(report, tf32=True)
    device = report.env.get("device_name", report.device)
    sheet = _datasheet(device, dtype)
    if sheet is not None:
        known["datasheet"] = sheet
    if isinstance(peak, Peaks):
        known["given"] = peak
        return peak, known
    if peak is None:
        chosen = known.get("datasheet", known.get("probe", known.get("given")))
        if chosen is None:
            raise ModelProfError(_no_peak(report))
        return chosen, known
    if peak in ("datasheet", "probe"):
        if peak == "datasheet" and mig_slice(device) is not None:
            raise mig_refusal(str(device), "device", "use peak='probe' or pass a Peaks")
        if peak not in known:
            raise ModelProfError(
                f"peak={peak!r}: this report has no {peak} peak (known: "
                f"{sorted(known) or 'none'}); profile with timing for a probe, "
                "or name the device (peak='H100 SXM')"
            )
        return known[peak], known
    if isinstance(peak, str):
        if mig_slice(peak) is not None:
            raise mig_refusal(
                peak, "peak", "use peak='probe' (measured on the slice) or pass a Peaks"
            )
        named = lookup_peaks(peak, report_peak_dtype(report))
        if named is None:
            raise ModelProfError(
                f"peak={peak!r}: no datasheet peak at {report_peak_dtype(report)} for that "
                f"name; known: {sorted(KNOWN_DEVICES)}"
            )
        known["datasheet"] = named
        return named, known
    raise ModelProfError(f"peak={peak!r} must be 'datasheet', 'probe', a device name or a Peaks")


def report_peak_dtype(report: Any, *, tf32: bool = False) -> str:
    """The dtype ``report``'s peak is of (``peak_dtype``): its autocast dtype where it ran under
    ``amp=`` (:func:`report_amp`), else its inputs'; ``tf32``: float32 matmuls that ran on TF32
    tensor cores (``env["tf32_matmul"]``, off the CPU) are judged at that rate."""
    tf32 = tf32 and bool(report.env.get("tf32_matmul")) and str(report.device) != "cpu"
    return peak_dtype(report.dtype, report_amp(report), tf32=tf32)


def report_amp(report: Any) -> str | None:
    """The dtype ``report``'s matmuls ran in under autocast (``env["mode"]["amp"]``), else None."""
    return autocast_dtype(report.dtype, (report.env.get("mode") or {}).get("amp"))


#: how a timed report comes to have no probed peaks, as each message that says so puts it
UNPROBED = "(profile(..., roofline=False), or a phase of profile_generation, which does not probe)"


def _no_peak(report: Any) -> str:
    """Why ``report`` has no peak to judge its utilization against, and how to give one."""
    device = report.env.get("device_name", report.device)
    where = (
        f"{device} is not in the datasheet table (it holds GPUs: "
        f"{', '.join(sorted(KNOWN_DEVICES)[:4])}, ...)"
        if mig_slice(device) is None
        else f"{device} is a MIG slice, which the whole GPU's datasheet figures do not describe"
    )
    why = (
        f"this report has no probed peak {UNPROBED}"
        if report.timed
        else "this report was not timed (timing=False), so it has neither a probe nor a time"
    )
    return (
        f"utilization(): no peak to judge against: {where}, and {why}; pass "
        "peak=Peaks(peak_flops=..., peak_bytes=...) or a device name of the table "
        "(peak='H100 SXM'), or profile with timing and roofline=None, which probes the device"
    )


def _datasheet(name: str, dtype: str) -> Peaks | None:
    """The datasheet's peaks for the device ``name``; none for a MIG slice (the whole GPU's
    would read a 1g slice's MFU ~7x low)."""
    if mig_slice(name) is not None:
        return None
    try:
        return lookup_peaks(str(name), dtype)
    except ModelProfError:  # a dtype without a roofline peak, an ambiguous name: none known
        return None


def attention_flops(ops: Mapping[str, int], by_op: Mapping[str, Any], flops: str) -> float:
    """FLOPs (in the ``flops`` convention) of the attention contractions among ``ops`` (one
    row's FLOPs by op); ``by_op``: the pass's per-op totals, for an op's 2 x MACs share."""
    softmax = any(_base(op) in _SOFTMAX for op in ops)
    total = 0.0
    for op, f in ops.items():
        base = _base(op)
        if "attention" in base or (softmax and base in _BATCHED):
            total += f * _share(op, by_op, flops)
    return total


def fused_recompute(ops: Mapping[str, int], by_op: Mapping[str, Any], flops: str) -> float:
    """FLOPs a fused attention backward spends recomputing the scores ``Q K^T``: one of its
    five contractions (``S``, ``dP``, ``dV``, ``dQ``, ``dK``). Model FLOPs count an attention
    backward as twice its forward (nanoGPT, MaxText), so that fifth is HFU's, not MFU's."""
    return sum(
        f * _share(op, by_op, flops) / 5
        for op, f in ops.items()
        if "attention" in _base(op) and "backward" in _base(op)
    )


def _base(op: str) -> str:
    return op.removeprefix("aten.").split(".")[0]


def _share(op: str, by_op: Mapping[str, Any], flops: str) -> float:
    """The fraction of an op's FLOPs that the convention counts: 1, or 2 x MACs / FLOPs."""
    if flops == "flops":
        return 1.0
    stats = by_op.get(op)
    return 2.0 * stats.macs / stats.flops if stats is not None and stats.flops else 0.0


def utilization(
    report: Any, convention: Convention, by_op: Mapping[str, Any], *, decode: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-row and per-phase frames of :class:`Utilization` for ``report`` (``by_op``: its
    forward's per-op totals); ``decode``: the report is a decode step (causal halving does not
    apply)."""
    rows = report.rows
    own = _own_counts(report, convention, by_op, halve=convention.causal == "half" and not decode)
    inclusive = _inclusive([r.depth for r in rows], [r.leaf for r in rows], own)
    step = report.training_step is not None
    forward_ms = np.array([r.latency_ms for r in rows], dtype=float)
    backward_ms = [r.backward_latency_ms if step and r.kind != "optimizer" else 0.0 for r in rows]
    time_ms = forward_ms + np.array(backward_ms)  # the optimizer's row: no backward (NaN)
    columns: dict[str, Any] = {
        "module": [r.module for r in rows],
        "call": [r.call for r in rows],
        "model_flops": inclusive[:, 0] + inclusive[:, 1],
        "hardware_flops": inclusive.sum(axis=1),
        "bytes": np.array([float(r.read_bytes + r.write_bytes) for r in rows]),
    }
    if step:  # the bytes are the forward's: MBU is over this time, printed beside them
        columns["forward_time_ms"] = forward_ms
    frame = pd.DataFrame({**columns, "time_ms": time_ms})
    _add_ratios(frame, convention.peaks, bytes_ms=forward_ms)
    return frame, _phases(report, own, convention.peaks)


def recompute_notes(report: Any) -> tuple[str, ...]:
    """A training step's note where its fused attention backward recomputed ``Q K^T`` (the raw
    totals count those FLOPs, model FLOPs do not)."""
    cost = getattr(report.training_step, "cost", None)
    if cost is None:
        return ()
    total = 0.0
    for r in report.rows:
        if not r.leaf or r.kind == "optimizer":
            continue
        ops, _ = _backward_of(cost, r)
        if ops is not None:
            total += fused_recompute(ops, cost.by_op, "flops")
    if not total > 0:
        return ()
    return (
        f"the raw training totals (backward_flops, the step's FLOPs) include "
        f"{format_count(total)} FLOPs the fused attention backward spent recomputing Q K^T; "
        "model FLOPs (MFU) leave them out, hardware FLOPs (HFU) count them",
    )


def _add_ratios(frame: pd.DataFrame, peaks: Peaks | None, bytes_ms: Any = None) -> pd.DataFrame:
    """``frame`` with ``mfu``, ``hfu`` (its FLOPs over ``time_ms``) and ``mbu`` (its bytes over
    ``bytes_ms``, default ``time_ms``: a training row's bytes are its forward's)."""
    flops_peak, bytes_peak = (None, None) if peaks is None else (peaks.peak_flops, peaks.peak_bytes)
    frame["mfu"] = _ratio(frame["model_flops"], frame["time_ms"], flops_peak)
    frame["hfu"] = _ratio(frame["hardware_flops"], frame["time_ms"], flops_peak)
    bytes_ms = frame["time_ms"] if bytes_ms is None else bytes_ms
    frame["mbu"] = _ratio(frame["bytes"], bytes_ms, bytes_peak)
    return mark_loaded(frame, peaks)


def mark_loaded(frame: pd.DataFrame, peaks: Peaks | None) -> pd.DataFrame:
    """``frame`` with ``<ratio>_rough`` set on each MFU, HFU and MBU it holds (where measured)
    when ``peaks`` came from a probe that ran on a busy machine: its roofs read low, so every
    ratio divided by them reads high, as the efficiency judged against them does
    (``efficiency_loaded``). Unchanged otherwise."""
    if peaks is None or not peaks.loaded:
        return frame
    for name in RATIOS:
        if name in frame.columns:
            frame[f"{name}_rough"] = np.isfinite(frame[name].to_numpy(dtype=float))
    return frame


def _ratio(amount: np.ndarray, time_ms: np.ndarray, peak: float | None) -> np.ndarray:
    """amount / (time x peak), NaN where the time or the peak is unknown."""
    amount = np.asarray(amount, dtype=float)
    time_ms = np.asarray(time_ms, dtype=float)
    if peak is None:
        return np.full(amount.shape, np.nan)
    ok = np.isfinite(time_ms) & (time_ms > 0)
    return np.where(ok, amount / (np.where(ok, time_ms, 1.0) * 1e-3 * peak), np.nan)


def _own_counts(report: Any, c: Convention, fwd_ops: Mapping[str, Any], halve: bool) -> np.ndarray:
    """Per row, what the row ran itself (leaf and ``(self)`` rows; zeros for parents):
    columns forward model FLOPs, backward model FLOPs, recomputed FLOPs."""
    cost = getattr(report.training_step, "cost", None)
    bwd_ops = {} if cost is None else cost.by_op
    out = np.zeros((len(report.rows), 3))
    for i, r in enumerate(report.rows):
        if not r.leaf or r.kind == "optimizer":  # the optimizer's FLOPs are not the model's
            continue
        out[i, 0] = _in(c, r.macs, r.flops) - (
            0.5 * attention_flops(r.ops, fwd_ops, c.flops) if halve else 0.0
        )
        if cost is None:
            continue
        ops, again = _backward_of(cost, r)
        out[i, 2] = 0.0 if again is None else _in(c, again.macs, again.flops)
        out[i, 1] = _in(c, r.backward_macs or 0, r.backward_flops or 0) - out[i, 2]
        if ops is None:
            continue
        fused = fused_recompute(ops, bwd_ops, c.flops) * (0.5 if halve else 1.0)
        out[i, 1] -= fused
        out[i, 2] += fused
        if halve:
            out[i, 1] -= 0.5 * attention_flops(ops, bwd_ops, c.flops)
            if again is not None:
                out[i, 2] -= 0.5 * attention_flops(again.ops, fwd_ops, c.flops)
    return out


def _in(c: Convention, macs: int, flops: int) -> float:
    return float(2 * macs if c.flops == "2macs" else flops)


def _backward_of(cost: Any, row: Any) -> tuple[dict[str, int] | None, Any]:
    """The FLOPs by op of the row's own backward less its recomputed forward (None: no
    backward), and that recomputed part (a ``PassCost``, or None)."""
    i = row.record
    if row.kind == "loss":
        return dict(cost.loss_backward.ops), None
    if not 0 <= i < len(cost.backward):
        return None, None
    again = cost.recompute[i] if i < len(cost.recompute) else None
    redone = {} if again is None else again.ops
    return {k: v - redone.get(k, 0) for k, v in cost.backward[i].ops.items()}, again


def _inclusive(depths: Sequence[int], leaves: Sequence[bool], own: np.ndarray) -> np.ndarray:
    """``own`` (non-zero on leaf rows only) summed over each row's subtree: rows come in
    pre-order, so a parent's subtree is the rows after it down to the next of its depth."""
    out = own.copy()
    stack: list[int] = []
    for i, d in enumerate(depths):
        while stack and depths[stack[-1]] >= d:
            stack.pop()
        if leaves[i]:
            for j in stack:
                out[j] += own[i]
        else:
            stack.append(i)
    return out


def _phases(report: Any, own: np.ndarray, peaks: Peaks | None) -> pd.DataFrame:
    """One row per phase: forward; with a training step backward and step."""
    leaf = np.array([r.leaf and r.kind == "module" for r in report.rows], dtype=bool)
    loss = np.array([r.kind == "loss" for r in report.rows], dtype=bool)
    traffic = float(sum(r.read_bytes + r.write_bytes for r, m in zip(report.rows, leaf) if m))
    fwd = float(own[leaf, 0].sum())
    step = report.training_step
    t = None if step is None else step.timing  # the step's phase Measurements, where timed
    # a step's forward is its own (autograd recording), not the clean runs' (eval, no grad)
    forward = report.latency if t is None else t.forward
    spans = [("forward", fwd, fwd, traffic, *_time(forward))]
    if step is not None:
        bwd = float(own[leaf | loss, 1].sum())  # the loss's backward included
        again = float(own[leaf, 2].sum())
        whole = fwd + float(own[loss, 0].sum()) + bwd  # forward, loss, backward
        for phase, model in (("backward", bwd), ("step", whole)):
            spans.append((phase, model, model + again, math.nan, *_time(getattr(t, phase, None))))
    columns = ["phase", "model_flops", "hardware_flops", "bytes", "time_ms", "time_rough"]
    frame = _add_ratios(pd.DataFrame(spans, columns=columns), peaks)
    rough = frame["time_rough"].to_numpy(dtype=bool)
    if not rough.any():
        return frame
    for name in RATIOS:  # a ratio over a time that is no figure to quote is none either
        measured = np.isfinite(frame[name].to_numpy(dtype=float))
        flag = frame[f"{name}_rough"].to_numpy(dtype=bool) if f"{name}_rough" in frame else False
        frame[f"{name}_rough"] = (flag | rough) & measured
    return frame


def _time(m: Any) -> tuple[float, bool]:
    """A phase's time: its Measurement's median and whether its own runs say it is no figure
    to quote (``unquotable``: loaded, too few runs; marked ~ as the end-to-end row marks it)."""
    return (math.nan, False) if m is None else (float(m.median_ms), bool(unquotable(m)))


def group_mfu(model_flops: Sequence[float], times_ms: Sequence[float], peak_flops: float) -> float:
    """A process group's MFU: all ranks' model FLOPs over (the slowest rank's time x world size
    x the per-device peak) — the ranks wait for the slowest at the next collective."""
    flops, times = list(model_flops), list(times_ms)
    if not flops or len(flops) != len(times):
        raise ModelProfError(
            f"group_mfu needs one time per rank: {len(flops)} FLOP counts, {len(times)} times"
        )
    if not _finite(peak_flops) or not peak_flops > 0:
        raise ModelProfError(f"peak_flops={peak_flops!r} must be a finite positive number")
    # each rank checked: max() would pass a NaN by
    for rank, (f, t) in enumerate(zip(flops, times)):
        if not _finite(t) or not t > 0:
            raise ModelProfError(
                f"times_ms[{rank}]={t!r}: every rank's time must be a finite positive number "
                "of milliseconds (a rank without a measurement has no group MFU)"
            )
        if not _finite(f) or f < 0:
            raise ModelProfError(
                f"model_flops[{rank}]={f!r}: every rank's FLOPs must be a finite number >= 0"
            )
    return float(sum(flops) / (max(times) * 1e-3 * len(flops) * peak_flops))


def _finite(value: Any) -> bool:
    """A real number (numpy's too), not a bool, neither NaN nor infinite."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def group_utilization(util: Utilization, group: Any = None) -> pd.DataFrame:
    """Every rank's whole-call MFU and the group's, on every rank (a collective: each rank of
    ``group`` calls it with its own ``Utilization``). Rows ``rank`` 0..world-1, then ``-1``
    for the group: its model FLOPs summed over the ranks, its time the slowest rank's."""
    if not group_up():
        raise ModelProfError(
            "group_utilization() needs an initialised process group "
            "(torch.distributed.init_process_group); none is active"
        )
    peaks = util.convention.peaks
    if peaks is None:
        raise ModelProfError("group_utilization() needs a peak: report.utilization(peak=...)")
    last = util.phases.iloc[-1]
    mine = (dist.get_rank(group), float(last["model_flops"]), float(last["time_ms"]))
    got: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, mine, group=group)
    got.sort()
    frame = pd.DataFrame(got, columns=["rank", "model_flops", "time_ms"])
    frame["mfu"] = _ratio(frame["model_flops"], frame["time_ms"], peaks.peak_flops)
    whole = group_mfu(frame["model_flops"], frame["time_ms"], peaks.peak_flops)
    total = pd.DataFrame(
        [(-1, float(frame["model_flops"].sum()), float(frame["time_ms"].max()), whole)],
        columns=frame.columns,
    )
    return mark_loaded(pd.concat([frame, total], ignore_index=True), peaks)
