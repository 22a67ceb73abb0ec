"""Every column of modelprof's tables, declared once.

A :class:`Column` gives its human header, cell format (``kind``), dtype (in a frame and read back
from CSV), whether its leaf rows add up to a model total (``additive``: the footer's sums), whether
it is an exact count kept in ``Report.totals`` (``counted``), whether a rough row marks it rough,
and its place in the compact view. The table, totals, views, exporters, CSV read-back, sweeps and
``compare()`` read these facts from here alone. ``group`` names who fills a column (``count``: the
counted pass, ``timing``: the per-layer instrument, ...). A new column is one :func:`declare`: see
docs/development.md, "where to add".

Kinds: ``text``, ``int``, ``bool`` as they are; ``count`` SI-prefixed; ``bytes`` IEC-prefixed;
``time_ms`` a duration in ms; ``percent`` already in percent; ``ratio`` a fraction shown as
percent; ``float`` two decimals; ``gflops``/``gbps`` rates in 1e9 units; ``multiple`` a ratio to a
baseline (0.61×).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "KINDS",
    "Column",
    "column",
    "count_column",
    "declare",
    "declared",
    "flag_column",
    "names",
    "undeclare",
    "whole_column",
]

KINDS = frozenset(
    "text int bool count bytes time_ms percent ratio float gflops gbps multiple".split()
)
_DTYPES = {"text": "str", "bool": "bool", "int": "int64", "count": "int64", "bytes": "int64"}


@dataclasses.dataclass(frozen=True)
class Column:
    """One column (see the module doc); ``dtype`` defaults from ``kind`` (:data:`_DTYPES`, else
    float64)."""

    name: str
    header: str
    kind: str
    group: str
    dtype: str = ""
    additive: bool = False
    counted: bool = False
    rough: bool = False
    compact: int | None = None  # position in the compact view, or None: not in it
    # an instrument's per-call reading: "own" (the call itself) or "inclusive" (with children)
    reading: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"column {self.name!r}: kind {self.kind!r} is not one of {sorted(KINDS)}"
            )
        if not self.dtype:
            object.__setattr__(self, "dtype", _DTYPES.get(self.kind, "float64"))


_REGISTRY: dict[str, Column] = {}


def declare(*columns: Column) -> None:
    """Add columns to the registry; declaring a name again with other facts is an error."""
    for c in columns:
        known = _REGISTRY.get(c.name)
        if known is not None and known != c:
            raise ValueError(f"column {c.name!r} is already declared as {known}")
        _REGISTRY[c.name] = c


def undeclare(*names_: str) -> None:
    """Take columns out of the registry (throwaway columns, after their use)."""
    for n in names_:
        _REGISTRY.pop(n, None)


@contextlib.contextmanager
def declared(*columns: Column) -> Iterator[None]:
    """The columns declared for the ``with`` block only (those it added are taken out after)."""
    new = [c.name for c in columns if c.name not in _REGISTRY]
    declare(*columns)
    try:
        yield
    finally:
        undeclare(*new)


def column(name: str) -> Column | None:
    """The declared column ``name``, or None."""
    return _REGISTRY.get(name)


def names(group: str | None = None, **flags: bool) -> tuple[str, ...]:
    """Declared column names in order, of one ``group`` and with the given flags
    (``names("count", additive=True)``)."""
    return tuple(
        c.name
        for c in _REGISTRY.values()
        if (group is None or c.group == group) and all(getattr(c, k) == v for k, v in flags.items())
    )


def count_column(values: Sequence[int]) -> np.ndarray:
    """A column of exact counts: int64, or float64 when a count does not fit in int64 (the
    exact integers remain in ``Report.totals`` and the rows)."""
    ints = [int(v) for v in values]
    if all(-(2**63) <= v < 2**63 for v in ints):
        return np.array(ints, dtype="int64")
    return np.array([float(v) for v in ints], dtype="float64")


def whole_column(values: Sequence[Any]) -> Any:
    """:func:`count_column` of whole numbers some of which may be missing (None, NaN: a failed
    model's row): nullable Int64 with <NA> there, float64 with NaN where a number does not fit
    in int64; none missing, :func:`count_column`'s."""
    missing = [v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) for v in values]
    if not any(missing):
        return count_column(values)
    ints = [None if gap else int(v) for v, gap in zip(values, missing)]
    if all(v is None or -(2**63) <= v < 2**63 for v in ints):
        return pd.array(ints, dtype="Int64")
    return np.array([math.nan if v is None else float(v) for v in ints], dtype="float64")


def flag_column(values: Sequence[Any]) -> np.ndarray:
    """Flags some of which may be missing (None, NaN: a failed model's, an untimed row's): True,
    False and None (not NaN), as ``read_csv`` reads them back."""
    return np.array([None if pd.isna(v) else bool(v) for v in values], dtype=object)


def _group(group: str, *specs: tuple) -> None:
    for name, header, kind, *extra in specs:
        declare(Column(name, header, kind, group, **(extra[0] if extra else {})))


_ADD = {"additive": True, "counted": True}
_group(
    "table",
    ("module", "module", "text", {"compact": 0}),
    ("type", "type", "text", {"compact": 1}),
    ("call", "call", "int"),
    ("depth", "depth", "int"),
    ("leaf", "leaf", "bool"),
    ("input_shape", "input shape", "text"),
    ("output_shape", "output shape", "text", {"compact": 2}),
)
_group(
    "count",
    ("params", "params", "count", {**_ADD, "compact": 3}),
    ("trainable_params", "trainable params", "count", _ADD),
    ("frozen_params", "frozen params", "count", _ADD),
    ("macs", "MACs", "count", {**_ADD, "compact": 4}),
    ("flops", "FLOPs", "count", {**_ADD, "compact": 5}),
    ("madd", "MAdd", "count", _ADD),
    # not additive: summed over the leaves it is every activation written (write_bytes)
    ("output_bytes", "output", "bytes", {"counted": True, "compact": 6}),
    ("read_bytes", "read", "bytes", _ADD),
    ("write_bytes", "write", "bytes", _ADD),
)
# each row's share of the model's total, beside the latency share (ptflops' and DeepSpeed's view)
_group(
    "share",
    ("macs_pct", "MACs share", "percent"),
    ("flops_pct", "FLOPs share", "percent", {"compact": 8}),
)
_group(
    "timing",
    ("latency_ms", "latency", "time_ms", {"rough": True, "compact": 7}),
    ("latency_std_ms", "latency std", "time_ms", {"rough": True}),
    ("latency_pct", "latency share", "percent", {"rough": True, "compact": 9}),
    ("peak_memory_bytes", "peak memory", "bytes", {"dtype": "float64"}),
)
_group(
    "step",
    ("backward_macs", "backward MACs", "count", {"counted": True}),
    ("backward_flops", "backward FLOPs", "count", {"counted": True, "compact": 12}),
    ("saved_bytes", "saved for backward", "bytes", {"counted": True}),
)
_group(
    "step_timing",
    ("backward_latency_ms", "backward latency", "time_ms", {"compact": 13, "rough": True}),
    ("backward_latency_std_ms", "backward latency std", "time_ms", {"rough": True}),
    ("backward_latency_pct", "backward latency share", "percent", {"rough": True}),
)
_group(
    "comm",
    ("comm_calls", "comm calls", "int", {"counted": True}),
    ("comm_kind", "comm kind", "text"),
    ("comm_group_size", "comm group size", "int"),
    ("comm_bytes", "comm payload", "bytes", {"counted": True}),
    ("comm_traffic_bytes", "comm traffic", "bytes", {"counted": True}),
)
# a training step's table has these whenever it has the forward's (zeros where its backward ran
# no collective), so its columns do not depend on which phase communicated
_group(
    "backward_comm",
    ("backward_comm_calls", "backward comm calls", "int", {"counted": True}),
    ("backward_comm_kind", "backward comm kind", "text"),
    ("backward_comm_group_size", "backward comm group size", "int"),
    ("backward_comm_bytes", "backward comm payload", "bytes", {"counted": True}),
    ("backward_comm_traffic_bytes", "backward comm traffic", "bytes", {"counted": True}),
)
_group(
    "kernels",
    ("kernel_ms", "kernel time", "time_ms", {"rough": True}),
    ("kernel_self_ms", "kernel self", "time_ms", {"rough": True}),
    ("kernels", "kernels", "float"),
    ("idle_ms", "device idle", "time_ms", {"rough": True, "compact": 10}),
    ("timeline_ms", "timeline", "time_ms", {"rough": True}),
    ("host_ms", "host time", "time_ms", {"rough": True}),
    ("launch_bound", "launch-bound", "bool", {"compact": 11}),
)
_group(
    "timing",
    ("latency_passes", "latency passes", "int"),
    ("latency_rough", "latency rough", "bool"),
    ("backward_latency_rough", "backward latency rough", "bool"),
    ("latency_loaded", "latency loaded", "bool"),
    ("backward_latency_loaded", "backward latency loaded", "bool"),
)
_group(
    "roofline",
    ("achieved_gflops", "achieved FLOP/s", "gflops", {"rough": True}),
    ("achieved_gbps", "achieved B/s", "gbps", {"rough": True}),
    ("intensity", "intensity (FLOP/B)", "float"),
    ("memory_level", "memory level", "text"),
    ("roofline_ms", "roofline", "time_ms"),
    ("bound", "bound", "text"),
    ("efficiency", "efficiency", "ratio", {"rough": True}),
    ("efficiency_loaded", "efficiency loaded", "bool"),
)
_group(
    "utilization",
    ("mfu", "MFU", "ratio", {"rough": True}),
    ("hfu", "HFU", "ratio", {"rough": True}),
    ("mbu", "MBU", "ratio", {"rough": True}),
    # against the peaks of a probe that ran on a busy machine (``utilization.mark_loaded``)
    ("mfu_rough", "MFU rough", "bool"),
    ("hfu_rough", "HFU rough", "bool"),
    ("mbu_rough", "MBU rough", "bool"),
)
# torchstat's view (its "params" is the column above)
_group(
    "torchstat",
    ("module name", "module name", "text"),
    ("input shape", "input shape", "text"),
    ("output shape", "output shape", "text"),
    ("memory(MB)", "memory (MiB)", "float"),
    ("MAdd", "MAdd", "count"),
    ("Flops", "Flops", "count"),
    ("MemRead(B)", "MemRead", "bytes"),
    ("MemWrite(B)", "MemWrite", "bytes"),
    ("duration[%]", "duration", "percent", {"rough": True}),
    ("MemR+W(B)", "MemR+W", "bytes"),
)
_group(
    "compare",
    # the MODEL a command-line comparison's row is (a file's factory, named by the file's stem)
    ("source", "source", "text"),
    # a row's own: a sweep configuration's, a comparison's model's where its models' differ
    ("device", "device", "text"),
    ("dtype", "dtype", "text"),
    # 1 / the latency median: rough with it; printed as a count (181.88 K), as samples/s
    ("fps", "FPS", "count", {"rough": True, "dtype": "float64"}),
    # (a throughput point's: over the same runs as its latency, rough where that is)
    ("samples_per_s", "samples/s", "count", {"rough": True, "dtype": "float64"}),
    ("batch_size", "batch size", "int"),
    # a training comparison's whole step: forward, loss, backward, optimizer (compare.py)
    ("step_flops", "step FLOPs", "count"),
    ("throughput_samples_per_s", "throughput (samples/s)", "count", {"dtype": "float64"}),
    ("throughput_batch_size", "throughput batch", "int"),
    # its best point loaded or slower than a bigger batch; a ratio with such a side
    ("throughput_samples_per_s_rough", "throughput rough", "bool"),
    ("throughput_x_rough", "throughput ratio rough", "bool"),
    ("latency_median_ms", "latency median", "time_ms"),
    ("latency_ci_low_ms", "latency 95% CI low", "time_ms"),
    ("latency_ci_high_ms", "latency 95% CI high", "time_ms"),
    ("latency_x_ci_low", "latency ratio CI low", "multiple"),
    ("latency_x_ci_high", "latency ratio CI high", "multiple"),
    # the runs a latency rests on: whole numbers, <NA> where none ran (a failed model)
    ("latency_n", "n", "int", {"dtype": "Int64"}),
    ("latency_stable", "stable", "bool"),
    ("cpu_work_median_ms", "CPU work median", "time_ms"),
    ("cpu_work_ci_low_ms", "CPU work 95% CI low", "time_ms"),
    ("cpu_work_ci_high_ms", "CPU work 95% CI high", "time_ms"),
    ("cpu_work_x", "CPU work ratio", "multiple"),
    ("cpu_work_x_ci_low", "CPU work ratio CI low", "multiple"),
    ("cpu_work_x_ci_high", "CPU work ratio CI high", "multiple"),
    ("backward_cpu_work_median_ms", "backward CPU work median", "time_ms"),
    ("backward_cpu_work_ci_low_ms", "backward CPU work 95% CI low", "time_ms"),
    ("backward_cpu_work_ci_high_ms", "backward CPU work 95% CI high", "time_ms"),
    ("backward_cpu_work_x", "backward CPU work ratio", "multiple"),
    ("wall_over_cpu", "wall/CPU", "float"),
    ("loaded", "loaded", "bool"),
    ("rank", "rank", "int"),
    ("step_rank", "step rank", "int", {"dtype": "Int64"}),
    ("latency_p90_ms", "latency p90", "time_ms"),
)
_group(
    "summary",
    ("layer_type", "layer type", "text"),
    ("calls", "calls", "int"),
)
# a sweep's own text, written for every row (a failed one's too), "" where there is none; and
# why a timed row's median is not quotable, "" where it is (none in a failed row: missing), and
# the (root) row's per-layer median, what that reason says to quote where the clean runs were
# slowed (NaN where no per-layer timing ran)
_group(
    "sweep",
    ("status", "status", "text"),
    ("error", "error", "text"),
    ("warnings", "warnings", "text"),
)
_group(
    "sweep_timing",
    ("latency_unquotable", "latency unquotable", "text"),
    ("backward_latency_unquotable", "backward latency unquotable", "text"),
    ("root_latency_ms", "(root) latency", "time_ms"),
)
