"""The per-layer timing columns of a table, from the instrumented passes.

``latency_ms``/``latency_std_ms`` (``latency_p10_ms``/``latency_p90_ms``, for error bars): the
median/std (percentiles) of a call's samples over the passes; a
``(self)`` row's samples are its parent's minus its children's, pass by pass; a
``(communication)`` row's are its call's collectives' stamps (taken out of the call's leaf or
``(self)`` row); ``latency_pct``: the share of the median instrumented pass.
``peak_memory_bytes`` comes from the warm memory pass (after timing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modelprof.counting.scope import CallRecord
from modelprof.counting.tree import own_part
from modelprof.timing.kernels import KernelTiming, with_kernel_columns
from modelprof.timing.layers import latency_stats

__all__ = ["layer_columns"]

#: No clock modelprof reads resolves less than a nanosecond.
_RESOLUTION_MS = 1e-6


def _samples(
    records: Sequence[CallRecord], samples: dict, index: int, is_self: bool, leaf: bool, comm: dict
) -> np.ndarray | None:
    if index < 0:  # a (communication) row (rows.row_keys): its collectives' own stamps
        return comm.get(records[-1 - index].key)
    record = records[index]
    s = samples.get(record.key)
    if s is not None and comm and record.key in comm and record.comm and (is_self or leaf):
        # never below 0: a collective on a stream of its own (FSDP2's) may outlast the call
        s = np.maximum(s - comm[record.key], 0.0)
    if s is None or not is_self:
        return s
    by_index = {index: s, **{c: samples.get(records[c].key) for c in record.children}}
    s = own_part(records, by_index, index)
    # children scaled to fit the parent (HookCost.correct) leave rounding residue, not a time
    return np.where(s >= _RESOLUTION_MS, s, 0.0)


def layer_columns(
    keys: Sequence[tuple[int, bool, bool]], records: Sequence[CallRecord], latency: Any, layers: Any
) -> tuple[list[dict[str, float]], float, float]:
    """The timing columns of each row (``keys``: record index, is a (self) row, is a leaf, in
    table order), the overhead (instrumented over the interleaved plain passes) and the sum of
    the leaf rows' medians in ms."""
    total = float(np.median(layers.corrected_passes_ms))
    peaks = getattr(layers, "peak_memory_bytes", None) or {}
    columns: list[dict[str, float]] = []
    leaf_sum = 0.0
    comm = getattr(layers, "comm_samples", None) or {}
    # as read, where the hooks' cost was taken off (a kernels run's headline is the device's)
    read = None if isinstance(layers, KernelTiming) else getattr(layers, "raw_samples", None)
    for index, is_self, leaf in keys:
        col: dict[str, float] = {}
        s = _samples(records, layers.samples, index, is_self, leaf, comm)
        if s is not None:
            p10, p90 = np.percentile(s, [10.0, 90.0])
            col.update(
                latency_stats(s, total), latency_p10_ms=float(p10), latency_p90_ms=float(p90)
            )
            leaf_sum += col["latency_ms"] if leaf else 0.0
            raw = read.get(records[index].key) if read and index >= 0 and not is_self else None
            col["latency_read_ms"] = float(np.median(raw)) if raw is not None else np.nan
        peak = peaks.get(records[index].key) if index >= 0 else None
        if peak is not None and not is_self:
            col["peak_memory_bytes"] = peak
        columns.append(col)
    if isinstance(layers, KernelTiming):  # the kernel columns, and the headline from them
        with_kernel_columns(
            columns, layers, [(records[i].key if i >= 0 else None, s) for i, s, _ in keys]
        )
    return columns, layers.overhead(latency), leaf_sum
