"""From call records to table rows, and the two table styles (modelprof, torchstat).

Rows come in execution order, one per module call; a parent's numbers aggregate its subtree. Ops
a parent runs itself (a ResNet block's residual add) go to a pseudo-child row ``<parent>.(self)``
after its last child, and the collectives a call ran itself to a ``<call>.(communication)`` row
(no compute; ``modelprof.counting.collectives``) after its subtree, so that the *leaf* rows add up
to the totals.

Bytes: a leaf call reads its inputs and the parameters it owns and writes its outputs
(torchstat's MemRead/MemWrite), a leaf of views only (``nn.Flatten``) nothing; a ``(self)`` row
reads and writes what its ops read and wrote.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd

import modelprof.columns as registry
from modelprof.columns import count_column
from modelprof.counting.collectives import comm_summary, merge_comm
from modelprof.counting.scope import CallRecord
from modelprof.counting.tree import own_part, row_values, subtree_sums

__all__ = [
    "ADDITIVE",
    "BACKWARD_COMM_COLUMNS",
    "COLUMNS",
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

# every column's facts are declared once in modelprof.columns; these are its groups
ADDITIVE = registry.names("count")
SHARE_COLUMNS = registry.names("share")
COLUMNS = (*registry.names("table"), *ADDITIVE, *SHARE_COLUMNS)
# the timed passes' float columns (latency_passes and latency_rough are the Report's)
TIMING_COLUMNS = registry.names("timing", dtype="float64")
# the training step (profile(..., backward=True); see modelprof/step/table.py)
STEP_ADDITIVE = registry.names("step")
STEP_TIMING_COLUMNS = registry.names("step_timing")
# collectives (under a process group; modelprof.counting.collectives)
COMM_COLUMNS = registry.names("comm")
BACKWARD_COMM_COLUMNS = registry.names("backward_comm")
COMM_SUFFIX = "(communication)"
_COMM_SUMMARY = ("comm_calls", "comm_bytes", "comm_traffic_bytes", "comm_kind", "comm_group_size")
_TS = registry.names("torchstat")  # torchstat's order; its "params" follows the shapes
TORCHSTAT_COLUMNS = (*_TS[:3], "params", *_TS[3:])
SELF_SUFFIX = "(self)"


@dataclasses.dataclass(slots=True, frozen=True, kw_only=True)
class Row:
    """One row of the table, built by name. The counted and timed fields are the table's
    fixed columns; ``values`` holds the columns an instrument fills (``per_layer="kernels"``'s,
    an added instrument's), by declared name (``modelprof.columns``)."""

    module: str
    type: str
    call: int = 1
    depth: int = 0
    leaf: bool = True
    input_shapes: list = dataclasses.field(default_factory=list)
    output_shapes: list = dataclasses.field(default_factory=list)
    params: int = 0
    macs: int = 0
    flops: int = 0
    madd: int = 0
    output_bytes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    torchstat_flops: int = 0
    torchstat_madd: int = 0
    record: int = -1  # index of the call record (-1: a row of its own, the training step's)
    is_self: bool = False  # the (self) pseudo-row of record ``record``
    peak_memory_bytes: float = float("nan")
    latency_ms: float = float("nan")
    latency_std_ms: float = float("nan")
    latency_pct: float = float("nan")
    # the percentiles of the samples ``latency_ms`` is the median of (``Report.plot_latency``'s
    # error bars; not a table column)
    latency_p10_ms: float = float("nan")
    latency_p90_ms: float = float("nan")
    # the median of the call's spans as read, the hooks' cost in them: what a layer proves of
    # the device's roofs (``roofline.roof_proofs``; not a table column)
    latency_read_ms: float = float("nan")
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
    # declared columns an instrument filled, by name (missing: not measured for this row)
    values: dict | None = None

    def comm_value(self, column: str) -> int | str:
        """One of ``COMM_COLUMNS`` / ``BACKWARD_COMM_COLUMNS`` for this row."""
        table = self.backward_comm if column.startswith("backward_") else self.comm
        return comm_summary(table)[_COMM_SUMMARY.index(column.removeprefix("backward_"))]


def build_rows(records: Sequence[CallRecord], force_self: Collection[int] = ()) -> list[Row]:
    """Rows from records; ``force_self``: parents that get a ``(self)`` row even when their own
    forward ops cost nothing (their autograd nodes do)."""
    readings = _readings(records)
    force_self = {*force_self, *_own_readings(records, readings)}
    inc, ts, own = _inclusive_costs(records)
    # buffer bytes the leaves under each call read (torchstat's MemRead leaves them out)
    buffers = subtree_sums(records, [0 if r.children else r.buffer_bytes for r in records])
    inc_comm = _inclusive_comm(records)
    end = list(range(len(records)))  # last descendant index of each record's subtree
    for r in reversed(records):
        if r.parent is not None:
            end[r.parent] = max(end[r.parent], end[r.index])

    trainable = subtree_sums(records, [r.trainable_params for r in records])
    rows: list[Row] = []
    for r in records:
        i = r.index
        params, macs, flops, madd, read, write = inc[i]  # (COUNTED: no dict per row)
        ts_flops, ts_madd = ts[i]
        peak = r.peak_memory_bytes
        fwd, bwd = inc_comm[i] if r.children else (None, None)
        rows.append(
            Row(
                module=r.name,
                type=r.type,
                call=r.call,
                depth=r.depth,
                leaf=not r.children,
                input_shapes=r.input_shapes,
                output_shapes=r.output_shapes,
                params=params,
                macs=macs,
                flops=flops,
                madd=madd,
                read_bytes=read,
                write_bytes=write,
                output_bytes=r.output_bytes,
                torchstat_flops=ts_flops,
                torchstat_madd=ts_madd,
                record=i,
                peak_memory_bytes=float("nan") if peak is None else float(peak),
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
    return _with_readings(rows, records, readings)


def _readings(records: Sequence[CallRecord]) -> dict[str, list]:
    """The instruments' per-call readings by declared column; a reading a call did not give
    (it raised) is 0 if own, None if inclusive."""
    present = {k for r in records if r.values for k in r.values}
    out = {}
    for name in registry.names():
        if name in present:
            missing = 0 if registry.column(name).reading == "own" else None
            out[name] = [(r.values or {}).get(name, missing) for r in records]
    return out


def _own_readings(records: Sequence[CallRecord], readings: dict[str, list]) -> set[int]:
    """Parents with an own part in some instrument's reading: they get a ``(self)`` row."""
    out = set()
    for name, values in readings.items():
        inclusive = registry.column(name).reading == "inclusive"
        for r in records:
            if r.children:
                part = own_part(records, values, r.index) if inclusive else values[r.index]
                if part:
                    out.add(r.index)
    return out


def _with_readings(rows: list[Row], records: Sequence[CallRecord], readings: dict) -> list[Row]:
    """The rows with the instruments' columns, by the table rule (``counting.tree``)."""
    if not readings:
        return rows
    keys = row_keys(rows)
    by_column = {
        name: row_values(keys, records, values, registry.column(name).reading == "inclusive")
        for name, values in readings.items()
    }
    return [
        dataclasses.replace(row, values={n: v[i] for n, v in by_column.items() if v[i] is not None})
        for i, row in enumerate(rows)
    ]


#: the counted fields a row sums over its subtree, in the order of ``_inclusive_costs``' tuples
#: (``Report.by_module_type``/``by_layer_type`` sum them by type)
COUNTED = ("params", "macs", "flops", "madd", "read_bytes", "write_bytes")


def _inclusive_costs(records: Sequence[CallRecord]) -> tuple[list, list, list]:
    """Per record: (params, macs, flops, madd, read, write) of its subtree, torchstat's (flops,
    madd) of its subtree, and the (self) part of a parent (None for a leaf)."""
    own: list[tuple | None] = []  # the (self) part of non-leaf calls
    mine = []  # each call's own part and torchstat's (flops, madd), summed in one pass
    for r in records:
        if r.children:
            own.append((r.params, r.macs, r.flops, r.madd, r.op_read_bytes, r.op_write_bytes))
            mine.append((*own[-1], r.flops - r.macs, r.madd))
            continue
        own.append(None)
        # read: inputs, parameters (an Embedding's gathered rows), buffers its ops touch; a
        # call of views only (an nn.Flatten) touches no memory
        read = r.input_bytes + r.param_bytes + r.buffer_bytes
        read, write = (0, 0) if r.only_aliases else (read, r.output_bytes)
        over = r.torchstat or {}
        ts = (over.get("Flops", r.flops - r.macs), over.get("MAdd", r.madd))
        mine.append((r.params, r.macs, r.flops, r.madd, read, write, *ts))
    sums = subtree_sums(records, mine, _column_sums)
    return [s[:6] for s in sums], [s[6:] for s in sums], own


def _column_sums(a: tuple, b: tuple) -> tuple:
    return tuple(map(operator.add, a, b))


def _pseudo_rows(pr: CallRecord, part: tuple | None, force: bool) -> list[Row]:
    """The ``(self)`` row (where it has own ops or is forced) and the ``(communication)`` row
    (its own collectives, no compute) of call ``pr``."""
    out = []
    at = {"call": pr.call, "depth": pr.depth + 1, "record": pr.index}
    if part is not None and (any(part) or force):
        params, macs, flops, madd, read, write = part
        out.append(
            Row(
                module=_pseudo_name(pr.name, SELF_SUFFIX),
                type=pr.type,
                **at,
                **dict(zip(COUNTED, part)),
                output_bytes=write,
                torchstat_flops=flops - macs,
                torchstat_madd=madd,
                is_self=True,
                ops=dict(pr.ops),
                trainable_params=pr.trainable_params,
            )
        )
    if pr.comm or pr.backward_comm:
        out.append(
            Row(
                module=_pseudo_name(pr.name, COMM_SUFFIX),
                type=COMM_SUFFIX,
                **at,
                kind="communication",
                comm=pr.comm,
                backward_comm=pr.backward_comm,
            )
        )
    return out


def _pseudo_name(name: str, suffix: str) -> str:
    return f"{name}.{suffix}" if name else suffix


def _inclusive_comm(records: Sequence[CallRecord]) -> list[tuple[dict | None, dict | None]]:
    """Each record's collectives with its subtree's (forward, backward); None where none."""
    if not any(r.comm or r.backward_comm for r in records):
        return [(None, None)] * len(records)

    def merged(a: tuple, b: tuple) -> tuple:
        out = []
        for x, y in zip(a, b):  # fresh tables: the records' stay as they are
            table: dict = {}
            merge_comm(table, x or {})
            merge_comm(table, y or {})
            out.append(table or None)
        return tuple(out)

    return subtree_sums(records, [(r.comm, r.backward_comm) for r in records], merged)


def has_comm(rows: Sequence[Row]) -> tuple[bool, bool]:
    """Whether any row carries collectives (forward, backward)."""
    return any(r.comm for r in rows), any(r.backward_comm for r in rows)


def comm_columns(rows: Sequence[Row], step: bool) -> tuple[str, ...]:
    """The collective columns of a table: none where no collective ran, else the forward's and,
    in a training ``step``'s table, the backward's (zeros where its backward ran none)."""
    fwd, bwd = has_comm(rows)
    return (COMM_COLUMNS + (BACKWARD_COMM_COLUMNS if step or bwd else ())) if fwd or bwd else ()


def row_keys(rows: Sequence[Row]) -> list[tuple[int, bool, bool]]:
    """(record index, is a (self) row, is a leaf) of each row, for a pass that produces columns;
    a ``(communication)`` row's index is ``-1 - index`` (no pass's per-call columns are its)."""
    return [
        (-1 - r.record if r.kind == "communication" else r.record, r.is_self, r.leaf) for r in rows
    ]


def join_rows(
    rows: Sequence[Row], column_sets: Sequence[Sequence[dict]] = (), extra: Sequence[dict] = ()
) -> list[Row]:
    """The counted ``rows`` with each pass's columns (one dict per row, in row order), then the
    ``extra`` rows (the training step's, given as fields)."""
    for columns in column_sets:
        if len(columns) != len(rows):
            raise ValueError(f"{len(columns)} column dicts for {len(rows)} rows")
    joined = []
    for i, row in enumerate(rows):
        update: dict = {}
        for columns in column_sets:
            update.update(columns[i])
        if "values" in update:
            unknown = [k for k in update["values"] if registry.column(k) is None]
            if unknown:
                raise ValueError(f"columns {unknown} are not declared (modelprof.columns.declare)")
            update["values"] = {**(row.values or {}), **update["values"]}
        joined.append(dataclasses.replace(row, **update) if update else row)
    return joined + [Row(**fields) for fields in extra]


def totals_of(rows: Sequence[Row], step: bool) -> dict[str, int]:
    """Sums over the leaf rows: each parameter, op and byte counted exactly once (a training
    ``step``'s backward's too); but ``output_bytes`` is the model's output (the root's row: a
    sum of every leaf's output means nothing, and the table's total leaves it blank)."""
    keys = ADDITIVE + (STEP_ADDITIVE if step else ())
    out = {k: int(sum(getattr(r, k) or 0 for r in rows if r.leaf)) for k in keys}
    out["output_bytes"] = sum(r.output_bytes for r in rows if r.depth == 0 and r.kind == "module")
    for k in comm_columns(rows, step):
        if registry.column(k).counted:
            out[k] = int(sum(r.comm_value(k) for r in rows if r.leaf))
    counted = set(registry.names(counted=True))
    for k in {k for r in rows if r.values for k in r.values} & counted:
        out[k] = int(sum((r.values or {}).get(k) or 0 for r in rows if r.leaf))
    return out


def _shapes(shapes: list, drop_batch: bool = False) -> str:
    if drop_batch:  # torchstat's: the first input's, without its batch
        shapes = [shapes[0][1:]] if shapes else []
    return ", ".join("x".join(map(str, s)) or "()" for s in shapes)


def modelprof_frame(rows: Sequence[Row], timed: bool, step: bool) -> pd.DataFrame:
    data = {
        "module": [r.module for r in rows],
        "type": [r.type for r in rows],
        "call": count_column([r.call for r in rows]),
        "depth": count_column([r.depth for r in rows]),
        "leaf": [r.leaf for r in rows],
        "input_shape": [_shapes(r.input_shapes) for r in rows],
        "output_shape": [_shapes(r.output_shapes) for r in rows],
    }
    for k in ADDITIVE + (STEP_ADDITIVE if step else ()):
        data[k] = count_column([int(getattr(r, k) or 0) for r in rows])
    for k in comm_columns(rows, step):
        values = [r.comm_value(k) for r in rows]
        data[k] = values if registry.column(k).kind == "text" else count_column(values)
    df = pd.DataFrame(data)
    df["leaf"] = df["leaf"].astype(bool)
    for share, k in zip(SHARE_COLUMNS, ("macs", "flops")):
        total = sum(int(getattr(r, k) or 0) for r in rows if r.leaf)
        df[share] = np.array(
            [100.0 * int(getattr(r, k) or 0) / total if total else float("nan") for r in rows],
            dtype="float64",
        )
    measured_memory = any(not np.isnan(r.peak_memory_bytes) for r in rows)
    for k in TIMING_COLUMNS:  # peak memory only where an allocator kept one (CUDA's)
        if (timed and k != "peak_memory_bytes") or (k == "peak_memory_bytes" and measured_memory):
            df[k] = np.array([getattr(r, k) for r in rows], dtype="float64")
    if any(not np.isnan(r.backward_latency_ms) for r in rows):
        for k in STEP_TIMING_COLUMNS:
            df[k] = np.array([getattr(r, k) for r in rows], dtype="float64")
    for name, values in _instrument_columns(rows).items():
        df[name] = values
    return df


def _instrument_columns(rows: Sequence[Row]) -> dict[str, object]:
    """The declared columns instruments filled (``Row.values``), in declaration order; a
    missing cell is False, "" or NaN (a count column stays exact where every row has one)."""
    present = {k for r in rows if r.values for k in r.values}
    out: dict[str, object] = {}
    for name in registry.names():
        if name not in present:
            continue
        values = [(r.values or {}).get(name) for r in rows]
        dtype = registry.column(name).dtype
        if dtype == "bool":
            out[name] = np.array([bool(v) for v in values], dtype=bool)
        elif dtype == "int64" and None not in values:
            out[name] = count_column(values)
        elif dtype == "str":
            out[name] = ["" if v is None else str(v) for v in values]
        else:
            out[name] = np.array([np.nan if v is None else v for v in values], dtype="float64")
    return out


def subtree_leaves(rows: Sequence[Row], i: int) -> list[int]:
    """The indices of the module leaves in row ``i``'s subtree (``i`` itself where it is one):
    in execution order, the rows after it deeper than it."""
    end = i + 1
    while end < len(rows) and rows[end].depth > rows[i].depth:
        end += 1
    return [j for j in range(i, end) if rows[j].leaf and rows[j].kind == "module"]


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
