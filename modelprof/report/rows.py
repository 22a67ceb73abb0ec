"""From call records to table rows, and the two table styles (modelprof, torchstat).

Rows come in execution order, one per module call. A parent's numbers aggregate its subtree.
Ops a parent runs itself (a residual add in a ResNet block, ViT's class token concat) go to a
pseudo-child row ``<parent>.(self)`` placed after the parent's last child, so that the *leaf*
rows (calls that called no other module, and the ``(self)`` rows) add up to the totals.

Communication (under a process group): the collectives a call ran itself go to a pseudo-child
row ``<call>.(communication)`` placed after the call's subtree (and its ``(self)`` row), a leaf
whose compute columns are 0; a parent's row aggregates the collectives of its subtree. Columns
``comm_*`` (forward) and ``backward_comm_*`` (the backward run by the call's autograd nodes; DDP's
gradient all-reduce on the root's row): see ``modelprof.counting.collectives``.

Bytes: a leaf call reads its inputs and the parameters it owns and writes its outputs
(torchstat's MemRead/MemWrite); a ``(self)`` row reads and writes what its ops read and wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd

from modelprof.counting.collectives import comm_summary, merge_comm
from modelprof.counting.scope import CallRecord
from modelprof.timing.kernels import KERNEL_COLUMNS

__all__ = [
    "ADDITIVE",
    "BACKWARD_COMM_COLUMNS",
    "COLUMNS",
    "COMM_ADDITIVE",
    "COMM_COLUMNS",
    "SHARE_COLUMNS",
    "STEP_ADDITIVE",
    "STEP_TIMING_COLUMNS",
    "TORCHSTAT_COLUMNS",
    "Row",
    "build_rows",
    "count_column",
    "has_comm",
    "join_rows",
    "row_keys",
    "modelprof_frame",
    "torchstat_frame",
    "totals_of",
]

ADDITIVE = (
    "params",
    "trainable_params",
    "frozen_params",
    "macs",
    "flops",
    "madd",
    "output_bytes",
    "read_bytes",
    "write_bytes",
)
# each row's share of the model's total, beside the latency share (ptflops' and DeepSpeed's view)
SHARE_COLUMNS = ("macs_pct", "flops_pct")
COLUMNS = (
    "module",
    "type",
    "call",
    "depth",
    "leaf",
    "input_shape",
    "output_shape",
    *ADDITIVE,
    *SHARE_COLUMNS,
)

TIMING_COLUMNS = ("latency_ms", "latency_std_ms", "latency_pct", "peak_memory_bytes")
# the training step (profile(..., backward=True); see modelprof/step/table.py)
STEP_ADDITIVE = ("backward_macs", "backward_flops", "saved_bytes")
STEP_TIMING_COLUMNS = ("backward_latency_ms", "backward_latency_std_ms", "backward_latency_pct")
# collectives (under a process group; modelprof.counting.collectives)
COMM_COLUMNS = ("comm_calls", "comm_kind", "comm_group_size", "comm_bytes", "comm_traffic_bytes")
BACKWARD_COMM_COLUMNS = (
    "backward_comm_calls",
    "backward_comm_bytes",
    "backward_comm_traffic_bytes",
)
COMM_ADDITIVE = ("comm_calls", "comm_bytes", "comm_traffic_bytes", *BACKWARD_COMM_COLUMNS)
COMM_SUFFIX = "(communication)"
TORCHSTAT_COLUMNS = (
    "module name",
    "input shape",
    "output shape",
    "params",
    "memory(MB)",
    "MAdd",
    "Flops",
    "MemRead(B)",
    "MemWrite(B)",
    "duration[%]",
    "MemR+W(B)",
)
SELF_SUFFIX = "(self)"


@dataclasses.dataclass(slots=True, frozen=True)
class Row:
    module: str
    type: str
    call: int
    depth: int
    leaf: bool
    input_shapes: list
    output_shapes: list
    params: int
    macs: int
    flops: int
    madd: int
    output_bytes: int
    read_bytes: int
    write_bytes: int
    torchstat_flops: int
    torchstat_madd: int
    record: int  # index of the call record
    is_self: bool = False  # the (self) pseudo-row of record ``record``
    peak_memory_bytes: float = float("nan")
    latency_ms: float = float("nan")
    latency_std_ms: float = float("nan")
    latency_pct: float = float("nan")
    # FLOPs by aten op of the ops this row ran itself (a leaf: all of its ops; a (self) row: its
    # parent's own ops; a parent row: none), to type a row by what it does
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    kind: str = "module"  # "module", or the training step's "loss" / "optimizer" row
    backward_macs: int | None = None
    backward_flops: int | None = None
    saved_bytes: int | None = None
    backward_latency_ms: float = float("nan")
    backward_latency_std_ms: float = float("nan")
    backward_latency_pct: float = float("nan")
    trainable_params: int = 0  # of ``params``, those with requires_grad
    # of ``read_bytes``, the buffers the leaves of the row's subtree read: torchstat's MemRead
    # leaves them out
    buffer_read_bytes: int = 0

    @property
    def frozen_params(self) -> int:
        """Of ``params``, those without requires_grad."""
        return self.params - self.trainable_params

    comm: dict | None = None  # collectives, (kind, group size) -> CommStats
    backward_comm: dict | None = None  # the same in the backward
    # per_layer="kernels": the kernel columns (modelprof.timing.kernels.KERNEL_COLUMNS)
    kernel: dict | None = None

    def comm_value(self, column: str) -> int | str:
        """One of ``COMM_COLUMNS`` / ``BACKWARD_COMM_COLUMNS`` for this row."""
        backward = column.startswith("backward_")
        calls, payload, traffic, kinds, group = comm_summary(
            self.backward_comm if backward else self.comm
        )
        key = column.removeprefix("backward_")
        return {
            "comm_calls": calls,
            "comm_bytes": payload,
            "comm_traffic_bytes": traffic,
            "comm_kind": kinds,
            "comm_group_size": group,
        }[key]


def count_column(values: Sequence[int]) -> np.ndarray:
    """A column of exact counts: int64, or float64 when a count does not fit in int64 (above
    2**63 - 1, e.g. the FLOPs of a huge model at a huge batch): the column stays numeric, and
    the exact integers remain in ``Report.totals`` and the rows."""
    ints = [int(v) for v in values]
    if all(-(2**63) <= v < 2**63 for v in ints):
        return np.array(ints, dtype="int64")
    return np.array([float(v) for v in ints], dtype="float64")


def _self_name(name: str) -> str:
    return f"{name}.{SELF_SUFFIX}" if name else SELF_SUFFIX


def _subtree_buffer_bytes(records: Sequence[CallRecord]) -> list[int]:
    """Buffer bytes the leaves under each call read (torchstat's MemRead leaves them out)."""
    buffers = [0] * len(records)
    for r in reversed(records):
        buffers[r.index] = sum(buffers[c] for c in r.children) if r.children else r.buffer_bytes
    return buffers


def build_rows(records: Sequence[CallRecord], force_self: Collection[int] = ()) -> list[Row]:
    """Rows from records; ``force_self`` names parents that get a ``(self)`` row even when their
    own forward ops cost nothing (their autograd nodes do, in the backward)."""
    n = len(records)
    inc, ts, own = _inclusive_costs(records)
    buffers = _subtree_buffer_bytes(records)
    inc_comm = _inclusive_comm(records)
    end = list(range(n))  # last descendant index of each record's subtree
    for r in reversed(records):
        if r.parent is not None:
            end[r.parent] = max(end[r.parent], end[r.index])

    trainable = _inclusive_trainable(records)
    rows: list[Row] = []
    nan = float("nan")
    for r in records:
        i = r.index
        params, macs, flops, madd, read, write = inc[i]
        ts_flops, ts_madd = ts[i]
        peak = r.peak_memory_bytes
        fwd, bwd = inc_comm[i] if r.children else (None, None)
        rows.append(
            Row(
                r.name,
                r.type,
                r.call,
                r.depth,
                not r.children,
                r.input_shapes,
                r.output_shapes,
                params,
                macs,
                flops,
                madd,
                r.output_bytes,
                read,
                write,
                ts_flops,
                ts_madd,
                i,
                False,
                nan if peak is None else float(peak),
                ops=dict(r.ops) if not r.children else {},
                trainable_params=trainable[i],
                buffer_read_bytes=buffers[i],
                comm=fwd,
                backward_comm=bwd,
            )
        )
        a: int | None = i
        while a is not None and end[a] == i:  # subtrees that end here: their pseudo-rows
            rows.extend(_pseudo_rows(records[a], own[a], a in force_self))
            a = records[a].parent
    return rows


def _inclusive_costs(records: Sequence[CallRecord]) -> tuple[list, list, list]:
    """Per record: (params, macs, flops, madd, read, write) of its subtree, torchstat's (flops,
    madd) of its subtree, and the (self) part of a parent (None for a leaf)."""
    n = len(records)
    inc: list[tuple] = [()] * n  # params, macs, flops, madd, read, write (inclusive)
    ts: list[tuple] = [()] * n  # torchstat flops, madd (inclusive)
    own: list[tuple | None] = [None] * n  # the (self) part of non-leaf calls
    for r in reversed(records):
        if r.children:  # its own part plus its children's, column by column
            own[r.index] = (r.params, r.macs, r.flops, r.madd, r.op_read_bytes, r.op_write_bytes)
            inc[r.index] = _column_sums(own[r.index], [inc[c] for c in r.children])
            ts[r.index] = _column_sums((r.flops - r.macs, r.madd), [ts[c] for c in r.children])
        else:
            # read: inputs, parameters (an Embedding's gathered rows), buffers its ops touch
            inc[r.index] = (
                r.params,
                r.macs,
                r.flops,
                r.madd,
                r.input_bytes + r.param_bytes + r.buffer_bytes,
                r.output_bytes,
            )
            over = r.torchstat
            ts[r.index] = (
                (r.flops - r.macs, r.madd)
                if over is None
                else (over.get("Flops", r.flops - r.macs), over.get("MAdd", r.madd))
            )
    return inc, ts, own


def _column_sums(first: tuple, rest: Sequence[tuple]) -> tuple:
    return tuple(sum(column) for column in zip(first, *rest))


def _pseudo_rows(pr: CallRecord, part: tuple | None, force: bool) -> list[Row]:
    """The ``(self)`` row (its own ops, where it has any or is forced) and the
    ``(communication)`` row (its own collectives) of call ``pr``, placed after its subtree."""
    out = []
    if part is not None and (any(part) or force):
        params, macs, flops, madd, read, write = part
        out.append(
            Row(
                _self_name(pr.name),
                pr.type,
                pr.call,
                pr.depth + 1,
                True,
                [],
                [],
                params,
                macs,
                flops,
                madd,
                write,
                read,
                write,
                flops - macs,
                madd,
                pr.index,
                is_self=True,
                ops=dict(pr.ops),
                trainable_params=pr.trainable_params,
            )
        )
    if pr.comm or pr.backward_comm:
        out.append(_comm_row(pr))
    return out


def _inclusive_comm(records: Sequence[CallRecord]) -> list[tuple[dict | None, dict | None]]:
    """Each record's collectives with its subtree's (forward, backward); None where none."""
    inc: list[tuple[dict | None, dict | None]] = [(None, None)] * len(records)
    if not any(r.comm or r.backward_comm for r in records):
        return inc
    for r in reversed(records):
        fwd: dict = {}
        bwd: dict = {}
        merge_comm(fwd, r.comm or {})
        merge_comm(bwd, r.backward_comm or {})
        for c in r.children:
            merge_comm(fwd, inc[c][0] or {})
            merge_comm(bwd, inc[c][1] or {})
        inc[r.index] = (fwd or None, bwd or None)
    return inc


def _comm_row(r: CallRecord) -> Row:
    """The ``(communication)`` pseudo-row of call ``r``: its own collectives, no compute."""
    name = f"{r.name}.{COMM_SUFFIX}" if r.name else COMM_SUFFIX
    return Row(
        name,
        COMM_SUFFIX,
        r.call,
        r.depth + 1,
        True,
        [],
        [],
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        r.index,
        kind="communication",
        comm=r.comm,
        backward_comm=r.backward_comm,
    )


def has_comm(rows: Sequence[Row]) -> tuple[bool, bool]:
    """Whether any row carries collectives (forward, backward)."""
    return any(r.comm for r in rows), any(r.backward_comm for r in rows)


def row_keys(rows: Sequence[Row]) -> list[tuple[int, bool, bool]]:
    """(record index, is a (self) row, is a leaf) of each row: what a pass that produces columns
    needs to know of the table. A ``(communication)`` row's record index is negated minus one
    (``-1 - index``): no pass's per-call columns are its (timing/columns.py gives it its
    collectives' own time)."""
    return [
        (-1 - r.record if r.kind == "communication" else r.record, r.is_self, r.leaf) for r in rows
    ]


def join_rows(
    rows: Sequence[Row], column_sets: Sequence[Sequence[dict]] = (), extra: Sequence[dict] = ()
) -> list[Row]:
    """The table, joined once: the counted ``rows`` with each pass's columns (one dict per row,
    in row order), then the ``extra`` rows (the training step's, given as fields)."""
    for columns in column_sets:
        if len(columns) != len(rows):
            raise ValueError(f"{len(columns)} column dicts for {len(rows)} rows")
    joined = []
    for i, row in enumerate(rows):
        update: dict = {}
        for columns in column_sets:
            update.update(columns[i])
        joined.append(dataclasses.replace(row, **update) if update else row)
    return joined + [Row(**fields) for fields in extra]


def _inclusive_trainable(records: Sequence[CallRecord]) -> list[int]:
    """Trainable parameters per record, a parent's including its subtree's (like ``params``)."""
    trainable = [0] * len(records)
    for r in reversed(records):
        trainable[r.index] = r.trainable_params + sum(trainable[c] for c in r.children)
    return trainable


def totals_of(rows: Sequence[Row]) -> dict[str, int]:
    """Sums over the leaf rows: each parameter, op and byte counted exactly once."""
    keys = ADDITIVE + (STEP_ADDITIVE if any(r.backward_macs is not None for r in rows) else ())
    out = {k: int(sum(getattr(r, k) or 0 for r in rows if r.leaf)) for k in keys}
    fwd, bwd = has_comm(rows)
    for k in COMM_ADDITIVE if fwd or bwd else ():
        if k.startswith("backward_") and not bwd:
            continue
        out[k] = int(sum(r.comm_value(k) for r in rows if r.leaf))
    return out


def _shape(s: tuple) -> str:
    return "x".join(map(str, s)) if s else "()"


def _shapes(shapes: list, drop_batch: bool = False) -> str:
    if drop_batch:
        return _shape(tuple(shapes[0][1:])) if shapes else ""
    return ", ".join(_shape(tuple(s)) for s in shapes)


def modelprof_frame(rows: Sequence[Row], timed: bool) -> pd.DataFrame:
    data = {
        "module": [r.module for r in rows],
        "type": [r.type for r in rows],
        "call": count_column([r.call for r in rows]),
        "depth": count_column([r.depth for r in rows]),
        "leaf": [r.leaf for r in rows],
        "input_shape": [_shapes(r.input_shapes) for r in rows],
        "output_shape": [_shapes(r.output_shapes) for r in rows],
    }
    step = any(r.backward_macs is not None for r in rows)
    for k in ADDITIVE + (STEP_ADDITIVE if step else ()):
        data[k] = count_column([int(getattr(r, k) or 0) for r in rows])
    fwd, bwd = has_comm(rows)
    for k in (COMM_COLUMNS if fwd or bwd else ()) + (BACKWARD_COMM_COLUMNS if bwd else ()):
        values = [r.comm_value(k) for r in rows]
        data[k] = values if k == "comm_kind" else count_column(values)
    df = pd.DataFrame(data)
    df["leaf"] = df["leaf"].astype(bool)
    for share, k in zip(SHARE_COLUMNS, ("macs", "flops")):
        total = sum(int(getattr(r, k) or 0) for r in rows if r.leaf)
        df[share] = np.array(
            [100.0 * int(getattr(r, k) or 0) / total if total else float("nan") for r in rows],
            dtype="float64",
        )
    measured_memory = any(not np.isnan(r.peak_memory_bytes) for r in rows)
    for k in TIMING_COLUMNS:
        # peak memory comes from an allocator that keeps one (CUDA's); on the CPU it would be
        # a column of NaNs, so it is left out
        if (timed and k != "peak_memory_bytes") or (k == "peak_memory_bytes" and measured_memory):
            df[k] = np.array([getattr(r, k) for r in rows], dtype="float64")
    if any(not np.isnan(r.backward_latency_ms) for r in rows):
        for k in STEP_TIMING_COLUMNS:
            df[k] = np.array([getattr(r, k) for r in rows], dtype="float64")
    if any(r.kernel for r in rows):
        for k in KERNEL_COLUMNS:
            values = [(r.kernel or {}).get(k) for r in rows]
            if k == "launch_bound":  # missing (a row no call was timed for): False
                df[k] = np.array([bool(v) for v in values], dtype=bool)
            else:
                df[k] = np.array([np.nan if v is None else v for v in values], dtype="float64")
    return df


def torchstat_frame(rows: Sequence[Row], timed: bool) -> pd.DataFrame:
    """torchstat's table: one row per leaf call, batch dropped from shapes, a correct total."""
    leaves = [r for r in rows if r.leaf and r.kind == "module"]
    names = [r.module if r.call == 1 or r.is_self else f"{r.module} ({r.call})" for r in leaves]
    counts = {
        "params": [int(r.params) for r in leaves],
        "MAdd": [int(r.torchstat_madd) for r in leaves],
        "Flops": [int(r.torchstat_flops) for r in leaves],
        # torchstat reads inputs and parameters (not buffers: batch-norm statistics)
        "MemRead(B)": [int(r.read_bytes - r.buffer_read_bytes) for r in leaves],
        "MemWrite(B)": [int(r.write_bytes) for r in leaves],
        "MemR+W(B)": [int(r.read_bytes - r.buffer_read_bytes + r.write_bytes) for r in leaves],
    }
    memory = [r.output_bytes / 2**20 for r in leaves]
    duration = [r.latency_pct if timed else float("nan") for r in leaves]
    # the total row, summed in Python integers (a numpy int64 sum wraps around silently)
    names.append("total")
    for values in counts.values():
        values.append(sum(values))
    memory.append(float(np.nansum(memory)))
    duration.append(float(np.nansum(duration)) if timed else float("nan"))
    df = pd.DataFrame(
        {
            "module name": names,
            "input shape": [_shapes(r.input_shapes, drop_batch=True) for r in leaves] + [""],
            "output shape": [_shapes(r.output_shapes, drop_batch=True) for r in leaves] + [""],
            "memory(MB)": np.array(memory, dtype="float64"),
            "duration[%]": np.array(duration, dtype="float64"),
            **{c: count_column(v) for c, v in counts.items()},
        }
    )
    return df[list(TORCHSTAT_COLUMNS)]
