"""The roofline lower bound on a named device (the datasheet table): no layer takes less than
``max(flops / peak FLOP/s, (read + write bytes) / peak bytes/s)``; a phase's is the sum of its
leaf rows' (layers run one after another). A bound, never a measurement.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from modelprof.errors import ModelProfError
from modelprof.runtime.device import mig_refusal, mig_slice
from modelprof.timing.peaks import KNOWN_DEVICES, Peaks, lookup_peaks

__all__ = ["bound_rows", "phase_bound", "resolve_target", "row_bounds"]


def resolve_target(target: Any, dtype: Any) -> Peaks | None:
    """``None``, a ``Peaks``, or a device name of the datasheet table at ``dtype``."""
    if target is None or isinstance(target, Peaks):
        return target
    if not isinstance(target, str):
        raise ModelProfError(
            f"target={target!r} must be a device name such as 'H100 SXM' or a modelprof Peaks"
        )
    name = str(dtype).removeprefix("torch.")
    if mig_slice(target) is not None:
        raise mig_refusal(target, "target", "pass a modelprof Peaks measured on the slice")
    try:
        peaks = lookup_peaks(target, name)
    except ModelProfError as e:  # an ambiguous name: said as the argument it came from
        raise ModelProfError(
            str(e).replace(f"device name {target!r}", f"target={target!r}", 1)
        ) from None
    if peaks is None:
        raise ModelProfError(
            f"target={target!r} at dtype {name}: not in the datasheet table "
            f"(known: {sorted(KNOWN_DEVICES)}), or no {name} rate there"
        )
    return peaks


def row_bounds(df: pd.DataFrame, peaks: Peaks) -> dict[str, Any]:
    """Per row of ``df``: its compute, memory and roofline bound (ms), and which one binds."""
    traffic = df["read_bytes"].astype(float) + df["write_bytes"].astype(float)
    compute = df["flops"].astype(float) / peaks.peak_flops * 1e3
    memory = traffic / peaks.peak_bytes * 1e3
    return {
        "compute_bound_ms": compute,
        "memory_bound_ms": memory,
        "bound_ms": np.maximum(compute, memory),
        "bound": np.where(compute >= memory, "compute", "memory"),
    }


def bound_rows(report: Any, peaks: Peaks) -> pd.DataFrame:
    """The leaf rows of ``report`` with their compute, memory and roofline bound (ms)."""
    df = report.to_dataframe()
    leaf = df[df["leaf"]]
    cols = ["module", "type", "flops", "read_bytes", "write_bytes"]
    return leaf[cols].assign(**row_bounds(leaf, peaks)).reset_index(drop=True)


def phase_bound(report: Any, peaks: Peaks) -> dict[str, float]:
    """The phase's bound (sum of its leaf rows') and how much of it is memory bound."""
    rows = bound_rows(report, peaks)
    total = float(rows["bound_ms"].sum())
    memory = float(rows.loc[rows["bound"] == "memory", "bound_ms"].sum())
    return {
        "bound_ms": total,
        "memory_bound_share": memory / total if total > 0 else 0.0,
        "compute_bound_ms": float(rows["compute_bound_ms"].sum()),
        "memory_bound_ms": float(rows["memory_bound_ms"].sum()),
    }
