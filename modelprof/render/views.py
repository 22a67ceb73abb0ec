"""Table options shared by every exporter: which rows, which columns, which units.

:func:`prepare_table` turns a selection of the numeric DataFrame into a :class:`Table` of strings
that the Markdown, LaTeX, HTML and text writers lay out, in one of three unit modes:

- ``"human"``: every cell carries its unit (``1.82 G``, ``3.10 ms``; see :mod:`.units`).
- ``"fixed"``: one unit per column, in the header (``params (M)``), bare numbers with 2 decimals
  (every time column of a table in one unit, chosen from all their values: ``latency (ms)``
  beside ``latency std (ms)``, not ``(µs)``; a byte column in its own: an output of 4 KiB
  beside 52 MiB read would print ``<0.01`` in MiB);
  the unit keeps at most 4 digits before the point and, where possible, two significant digits
  in every non-zero value, else none at ``0.00`` (one that is prints ``<0.01``; zero prints
  ``0``); a median and its interval's bounds share one unit; a ratio to a baseline as its human
  cell shows it, the ``×`` in the header (``0.0439``). The usual choice for a paper.
- ``"raw"``: the stored numbers, full precision, headers are the column names; rows named as
  in the other units (``(root)``, ``relu #2``; CSV and JSON keep the stored ``""``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

import modelprof.columns as registry
from modelprof.counting.scope import NOT_CALLED
from modelprof.errors import ModelProfError, check_flag, nearest_keywords
from modelprof.render.options import UNITS, ViewOptions, check_count
from modelprof.render.units import (
    IEC_PREFIXES,
    MISSING,
    SI_PREFIXES,
    TIME_UNITS,
    format_bytes,
    format_count,
    format_multiple,
    format_percent,
    format_rate,
    format_time_ms,
    pick_scale,
)

__all__ = [
    "UNITS",
    "LOADED_FLAG",
    "ROUGH_MARK",
    "is_rough",
    "is_rough_cell",
    "own_flag",
    "COMPACT_COLUMNS",
    "ROOT_LABEL",
    "TOTAL_LABEL",
    "WHOLE_TOTAL_LABEL",
    "END_TO_END_LABEL",
    "Table",
    "ColumnSpec",
    "column_spec",
    "select_rows",
    "select_columns",
    "require_columns",
    "check_priority",
    "default_priority",
    "call_label",
    "compact_columns",
    "module_labels",
    "default_totals",
    "prepare_table",
    "selected_frame",
    "readable_scale",
]


def _compact() -> tuple[str, ...]:
    marked = [
        (c.compact, n) for n in registry.names() if (c := registry.column(n)).compact is not None
    ]
    return tuple(n for _, n in sorted(marked))


COMPACT_COLUMNS: tuple[str, ...] = _compact()
"""A narrow column set for terminals and notebooks (``repr``, ``_repr_html_``)."""

LOADED_FLAG = "efficiency_loaded"
"""The column that marks an efficiency judged against roofs probed on a busy machine."""
ROUGH_MARK = "~"
"""The prefix of a rough cell in every human-readable view (HTML and LaTeX also grey it)."""

ROOT_LABEL = "(root)"
"""How human-readable tables show the root module, whose qualified name is ``""``."""
TOTAL_LABEL = "total"
"""The footer row of sums over the leaf rows (each shared parameter once)."""
WHOLE_TOTAL_LABEL = "total (whole model)"
""":data:`TOTAL_LABEL` where ``top_k`` shows some rows only: the sums stay the whole model's."""
END_TO_END_LABEL = "end-to-end (clean run)"
"""The footer row of the median of the clean (uninstrumented) runs, which differs from the
``(root)`` row's latency, measured in the instrumented pass."""


@dataclass(frozen=True)
class ColumnSpec:
    """How one column is shown: its human header and formatting kind (:mod:`modelprof.columns`)."""

    header: str
    kind: str


def _declared(name: str) -> ColumnSpec | None:
    c = registry.column(name)
    return None if c is None else ColumnSpec(c.header, c.kind)


_SUFFIX_KINDS = (("_ms", "time_ms"), ("_bytes", "bytes"), ("_pct", "percent"), ("_x", "multiple"))
_NUMERIC_KINDS = registry.KINDS - {"text", "bool"}


def column_spec(name: str, series: pd.Series | None = None) -> ColumnSpec:
    """The display spec of a column: known names first, then unit suffixes, then the dtype."""
    known = _declared(name)
    if known is not None:
        return known
    stem, bound, side = name.rpartition("_x_ci_")
    if bound and stem and side in ("low", "high"):  # ttft_x_ci_low: a ratio's bound, as the ratio
        return ColumnSpec(f"{column_spec(stem + '_x').header} CI {side}", "multiple")
    for suffix, kind in _SUFFIX_KINDS:
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)]
            if kind == "multiple":  # macs_x -> "MACs ratio"; latency_x -> "latency ratio"
                known = _declared(stem) or _declared(stem + "_bytes")
                return ColumnSpec(
                    f"{known.header if known else stem.replace('_', ' ')} ratio", kind
                )
            return ColumnSpec(stem.replace("_", " "), kind)
    stem, _, last = str(name).rpartition("_")
    counted = _declared(last) if stem else None
    if counted is not None and counted.kind == "count":  # prefill_macs: "prefill MACs", 1.70 M
        return ColumnSpec(f"{stem.replace('_', ' ')} {counted.header}", "count")
    header = str(name).replace("_", " ")
    if series is not None:
        if pd.api.types.is_bool_dtype(series.dtype):
            return ColumnSpec(header, "bool")
        if pd.api.types.is_integer_dtype(series.dtype):
            return ColumnSpec(header, "int")
        if pd.api.types.is_float_dtype(series.dtype):
            return ColumnSpec(header, "float")
    return ColumnSpec(header, "text")


# ---------------------------------------------------------------------------------- selection


def require_columns(df: Any, columns: Sequence[str], what: str, hint: str = "") -> None:
    """Refuse a ``df`` that is no DataFrame or lacks one of ``columns`` (``what`` needs them,
    ``hint`` says how to get them)."""
    if not isinstance(df, pd.DataFrame):
        raise ModelProfError(f"{what} expects a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        has = list(map(str, df.columns))
        near = nearest_keywords(list(map(str, missing)), has, mark="")
        raise ModelProfError(f"{what} needs column(s) {missing}{near}{hint}; the table has {has}")


#: the names modelprof's own ``priority`` defaults give (:func:`default_priority`)
_DEFAULT_PRIORITY_NAMES: set[str] = set()
PAPER_COLUMNS: set[str] = set()
"""The columns a paper keeps (a report's module, type, params, MACs, latency and output shape;
a comparison's params, MACs and medians): those before a ``|`` in a :func:`default_priority`."""


def default_priority(names: str) -> tuple[str, ...]:
    """A caller's default ``priority=`` (names split on white space; those before a ``|``, or
    all without one, are :data:`PAPER_COLUMNS`), registered: its tables may lack some of them
    (an untimed report its latency), which :func:`check_priority` then does not take for a
    misspelling."""
    kept, _, rest = names.partition("|")
    PAPER_COLUMNS.update(kept.split())
    out = (*kept.split(), *rest.split())
    _DEFAULT_PRIORITY_NAMES.update(out)
    return out


def check_priority(df: pd.DataFrame, priority: Sequence[str]) -> None:
    """``priority=`` names columns of ``df`` (its meaningful index's name counts, as
    :func:`with_index` shows it) or of a default's: a misspelt name would keep nothing, silently."""
    unknown = [c for c in priority if c not in _DEFAULT_PRIORITY_NAMES]
    shown = [str(c) for c in with_index(df.iloc[:0]).columns] if unknown else []
    unknown = [c for c in unknown if c not in shown]
    if unknown:
        near = nearest_keywords(list(map(str, unknown)), shown, mark="")
        raise ModelProfError(f"priority: unknown column(s) {unknown}{near}; available: {shown}")


def _default_sort_column(df: pd.DataFrame) -> str:
    if "latency_ms" in df.columns and df["latency_ms"].notna().any():
        return "latency_ms"
    for name in ("flops", "Flops", "macs"):
        if name in df.columns:
            return name
    raise ModelProfError(
        f"top_k needs sort_by= (no latency_ms or flops column in {list(map(str, df.columns))})"
    )


#: the registry's groups of columns a timed run fills (none in an untimed table)
_MEASURED_GROUPS = frozenset({"timing", "step_timing", "roofline", "utilization"})


def select_rows(
    df: pd.DataFrame,
    depth: int | None = None,
    leaf_only: bool = False,
    top_k: int | None = None,
    sort_by: str | None = None,
    *,
    ascending: bool = False,
) -> pd.DataFrame:
    """Rows to show, in execution order unless sorting is asked for.

    ``depth=k`` collapses the tree to modules at depth <= k (parents aggregate their children;
    the ``(not called)`` row of unused parameters, the root's sibling, stays at every depth).
    ``leaf_only=True`` keeps the leaves, of the collapsed tree with ``depth`` (rows at depth k and
    true leaves above it), so they still add up to the totals. ``sort_by=col`` sorts largest
    first (``ascending=True``: smallest), missing values last; ``top_k=n`` keeps the first n,
    ranked by ``latency_ms`` when measured, else ``flops``, without ``sort_by``. With
    ``leaf_only=True``: "the n most expensive layers" (else the root ranks first).
    """
    require_columns(df, (), "select_rows")
    check_flag("leaf_only", leaf_only)  # "false" would read as True
    check_flag("ascending", ascending)
    out = df
    check_count("depth", depth, 0)
    check_count("top_k", top_k, 1)
    if depth is not None:
        require_columns(df, ["depth"], "depth=")
        if leaf_only:
            require_columns(df, ["leaf"], "leaf_only=True")
            keep = (out["depth"] == depth) | (out["leaf"].astype(bool) & (out["depth"] < depth))
        else:
            keep = out["depth"] <= depth
        if "module" in out.columns:  # the root's sibling (at depth 1): shown at every depth
            keep |= out["module"] == NOT_CALLED
        out = out[keep]
    elif leaf_only:
        require_columns(df, ["leaf"], "leaf_only=True")
        out = out[out["leaf"].astype(bool)]
    if top_k is not None and sort_by is None:
        sort_by = _default_sort_column(out)
    if sort_by is not None:
        col = registry.column(sort_by)
        timed = col is not None and col.group in _MEASURED_GROUPS  # missing: not timed
        hint = " (a measured column: profile with timing=True)" if timed else ""
        require_columns(df, [sort_by], f"sort_by={sort_by!r}", hint)
        out = out.sort_values(sort_by, ascending=ascending, kind="stable", na_position="last")
    if top_k is not None:
        out = out.head(int(top_k))
    return out.copy()


def select_columns(df: pd.DataFrame, columns: Iterable[str] | str | None) -> pd.DataFrame:
    """The given columns in the given order; ``None`` or ``"all"`` keeps them all,
    ``"compact"`` a per-layer table's :data:`COMPACT_COLUMNS` after the keys that tell its
    rows apart (a generation report's phase, context and batch size; ranks), another table
    (grouped, torchstat's) whole."""
    require_columns(df, (), "select_columns")
    compact = isinstance(columns, str) and columns == "compact"
    if columns is None or (isinstance(columns, str) and columns == "all"):
        return df
    if compact:
        if "module" not in df.columns:
            return df
        columns = [*(c for c in _ROW_KEYS if c in df.columns), *compact_columns(df)]
    wanted = [columns] if isinstance(columns, str) else list(columns)
    unknown = [c for c in wanted if c not in df.columns]
    if unknown:
        has = list(map(str, df.columns))
        near = nearest_keywords(list(map(str, unknown)), has, mark="")
        raise ModelProfError(f"unknown column(s) {unknown}{near}; available: {has}")
    if len(set(wanted)) != len(wanted):
        dupes = sorted({c for c in wanted if wanted.count(c) > 1})
        raise ModelProfError(f"column(s) {dupes} asked for more than once")
    return df[wanted]


def compact_columns(df: pd.DataFrame) -> list[str]:
    """The :data:`COMPACT_COLUMNS` that ``df`` has (an untimed report has no latency columns)."""
    return [c for c in _compact() if c in df.columns]


def default_totals(df: pd.DataFrame) -> dict[str, float] | None:
    """The leaf rows' sums of the additive columns (None without ``leaf``): only a fallback, as
    the Report's own totals count shared parameters once."""
    if "leaf" not in df.columns:
        return None
    leaves = df[df["leaf"].astype(bool)]
    return {c: leaves[c].sum().item() for c in registry.names(additive=True) if c in df.columns}


# ---------------------------------------------------------------------------------- formatting


@dataclass(frozen=True)
class Table:
    """A selection of a report rendered to strings, ready for a layout. ``frame`` keeps the
    selected rows with *all* their columns (for bars and indentation); ``cells`` one tuple of
    strings per row, in ``columns`` order."""

    columns: tuple[str, ...]
    headers: tuple[str, ...]
    kinds: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    footer: tuple[tuple[str, ...], ...]
    units: str
    frame: pd.DataFrame = field(repr=False, compare=False)

    @property
    def totals(self) -> tuple[str, ...] | None:
        """The first footer row (the sums), or None without a footer."""
        return self.footer[0] if self.footer else None

    @property
    def numeric(self) -> tuple[bool, ...]:
        """Per column: right-align it (numbers) or not (text)."""
        return tuple(k in _NUMERIC_KINDS for k in self.kinds)


# fractions of a peak (MFU, HFU, MBU, roofline efficiency): above 1, the peak reads low
_AT_MOST_ONE = frozenset(registry.names(kind="ratio"))


#: a figure's statistics, which share its flag (``latency_median_ms``: ``latency_rough``)
_FIGURE_SUFFIXES = ("_median_ms", "_p90_ms", "_std_ms", "_ms")


def own_flag(name: str) -> str:
    """The flag column that marks column ``name`` rough itself: ``<name>_rough`` (a
    comparison's ratio, ``latency_x_rough``), a ratio's or figure's interval bounds sharing its
    flag (``latency_x_ci_low``: ``latency_x_rough``; ``latency_ci_low_ms``: ``latency_rough``)
    as its median, p90 and std do (``ttft_ms``, ``latency_median_ms``: ``ttft_rough``,
    ``latency_rough``)."""
    stem = name.split("_ci_")[0]
    suffix = next((s for s in _FIGURE_SUFFIXES if stem.endswith(s) and stem != s[1:]), "")
    return f"{stem.removesuffix(suffix)}_rough"


def is_rough_cell(frame: pd.DataFrame, r: int, name: str) -> bool:
    """Cell (row ``r`` by position, column ``name``) of ``frame`` is rough, as
    :func:`is_rough` judges a table's (a figure drawn from a frame marks it so too)."""
    if _flagged(frame, r, own_flag(name)):  # its own flag: a comparison's rough ratio
        return True
    if not ((c := registry.column(name)) and c.rough):
        return False
    if name in _AT_MOST_ONE and frame[name].iloc[r] > 1:
        return True
    if name.startswith("backward_latency"):  # a training step's backward: its own check
        return _flagged(frame, r, "backward_latency_rough")
    flags = ["latency_rough", LOADED_FLAG] if name == "efficiency" else ["latency_rough"]
    return any(_flagged(frame, r, f) for f in flags)


def _flagged(frame: pd.DataFrame, r: int, flag: str) -> bool:
    return flag in frame.columns and not _is_missing(v := frame[flag].iloc[r]) and bool(v)


def is_rough(table: Table, r: int, name: str) -> bool:
    """Cell (row ``r``, column ``name``) is rough: a per-layer time on fewer passes than the stop
    rule promises (``latency_rough``), an efficiency against roofs probed on a busy machine
    (``efficiency_loaded``), an efficiency, MFU, HFU or MBU above 1 (the peak reads low), or a
    cell whose own ``<name>_rough`` flag is set (a comparison's ratio that its rounds dispute)."""
    return table.units != "raw" and is_rough_cell(table.frame, r, name)


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _missing_as(text: str, fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    def cell(v: Any) -> str:
        return text if _is_missing(v) else fmt(v)

    return cell


def _raw_cell(value: Any) -> str:
    if _is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def _integer(v: Any) -> str:
    f = float(v)
    return str(int(f)) if f.is_integer() else f"{f:.2f}"


# each takes a present value: _human_formatter shows a missing one as MISSING
_HUMAN: dict[str, Callable[[Any], str]] = {
    "text": str,
    "int": _integer,
    "bool": lambda v: "yes" if bool(v) else "no",
    "count": format_count,
    "bytes": format_bytes,
    "time_ms": format_time_ms,
    "percent": format_percent,
    "ratio": lambda v: format_percent(float(v) * 100.0),
    "float": lambda v: _float(float(v)),
    "gflops": lambda v: format_rate(float(v) * 1e9, "FLOP/s"),
    "gbps": lambda v: format_rate(float(v) * 1e9, "B/s"),
    "multiple": format_multiple,
}


def _float(v: float) -> str:
    """A number of no known kind: two decimals, a large one in SI units (``29.03 G``)."""
    return format_count(v) if abs(v) >= 1e6 else f"{v:.2f}"


def _human_formatter(kind: str) -> Callable[[Any], str]:
    fmt = _HUMAN[kind]  # a word among numbers (a fit's verdict, "yes") is shown as it is
    return _missing_as(MISSING, lambda v: v if isinstance(v, str) else fmt(v))


TINY = "<0.01"
"""What a fixed-unit cell shows for a non-zero value that rounds to 0.00 in its column's unit."""
_MAX_FIXED = 1e4  # a fixed-unit column keeps at most 4 digits before the decimal point


def _scaled_cell(scale: float) -> Callable[[Any], str]:
    """A bare number in units of ``scale``, 2 decimals (``0``, ``<0.01``: see the module doc)."""

    def fmt(v: Any) -> str:
        x = float(v) / scale
        if x == 0:
            return "0"
        text = f"{x:.2f}"
        if float(text) == 0:
            return TINY if x > 0 else "-" + TINY
        return text

    return _missing_as(MISSING, fmt)


def readable_scale(
    values: Sequence[float], prefixes: Sequence[tuple[float, str]], max_mantissa: float = _MAX_FIXED
) -> tuple[float, str]:
    """One unit for a column: of the units keeping the largest value below ``max_mantissa`` (and
    at or above 1 where possible), the largest that shows every non-zero value with two
    significant digits (at least 0.10), else the largest that shows it at all (0.01), else the
    smallest. SI: ``[11_689_512, 128]`` -> M (K would need ``11689.51``); times from 31 ms to
    1.2 s -> ms (s would show 31 ms as ``0.03``)."""
    finite = [abs(float(v)) for v in values if v is not None and math.isfinite(float(v))]
    nonzero = [v for v in finite if v > 0]
    ordered = sorted(prefixes, key=lambda p: p[0])
    if not nonzero:
        return pick_scale(finite, prefixes)
    top, low = max(nonzero), min(nonzero)
    top_scale = pick_scale([top], prefixes)[0]  # largest unit with the top value >= 1
    fitting = [p for p in ordered if p[0] <= top_scale and top / p[0] < max_mantissa]
    if not fitting:  # even the smallest unit leaves > 4 digits: take the largest one not above top
        return pick_scale([top], prefixes)
    for least in (0.1, 0.01):  # two significant digits where a unit gives them, else one
        for scale, symbol in reversed(fitting):  # largest unit first
            if round(low / scale, 2) >= least:
                return scale, symbol
    return fitting[0]


# kinds whose fixed unit is chosen from the values, and those where it is not: (unit, scale)
_FIXED_PREFIXES = {"count": SI_PREFIXES, "bytes": IEC_PREFIXES, "time_ms": TIME_UNITS}
_FIXED_SCALES = {"percent": ("%", 1.0), "ratio": ("%", 0.01)}


def _bare_multiple(v: Any) -> str:
    """:func:`format_multiple` without its ``×``: a fixed-unit column's cell (``0.0439``)."""
    return format_multiple(v).removesuffix("×")


def _fixed_formatter(
    kind: str, header: str, values: Sequence[Any]
) -> tuple[str, Callable[[Any], str]]:
    """The header with the column's unit, and a formatter of bare numbers in it."""
    if kind not in _NUMERIC_KINDS:
        return header, _human_formatter(kind)
    numbers = [float(v) for v in values if not _is_missing(v)]
    if kind in _FIXED_PREFIXES:
        scale, unit = readable_scale(numbers, _FIXED_PREFIXES[kind])
        if scale == 1.0 and kind != "time_ms":  # whole numbers of a count or of bytes as they are
            return header + (" (B)" if kind == "bytes" else ""), _human_formatter("int")
        return f"{header} ({unit})", _scaled_cell(scale)
    if kind == "multiple":  # as the human cells show it (0.0439, not 0.04), the × in the header
        return f"{header} (×)", _missing_as(MISSING, _bare_multiple)
    if kind in _FIXED_SCALES:
        unit, scale = _FIXED_SCALES[kind]
        return f"{header} ({unit})", _scaled_cell(scale)
    if kind in ("gflops", "gbps"):
        base = header.replace("FLOP/s", "").replace("B/s", "").strip() or "achieved"
        unit = "FLOP/s" if kind == "gflops" else "B/s"
        scale, prefix = readable_scale([v * 1e9 for v in numbers], SI_PREFIXES)
        return f"{base} ({prefix}{unit})", _scaled_cell(scale / 1e9)
    return header, _human_formatter(kind)


def with_index(df: pd.DataFrame) -> pd.DataFrame:
    """Show a meaningful index (compare results keyed by model name) as the first column."""
    index = df.index
    if (
        index.name is None
        and not isinstance(index, pd.MultiIndex)
        and pd.api.types.is_integer_dtype(index.dtype)
    ):
        return df  # a RangeIndex, filtered or sorted or not: just row labels
    return df.reset_index()


def call_label(module: str, call: int | None = None) -> str:
    """A call's display name: the root as ``(root)``, a repeated call as ``relu #2``."""
    name = ROOT_LABEL if module == "" else str(module)
    return f"{name} #{int(call)}" if call is not None and int(call) > 1 else name


def module_labels(modules: Iterable[str], calls: Iterable[int] | None = None) -> list[str]:
    """:func:`call_label` of each row, numbered where ``calls`` are given."""
    if calls is None:
        return [call_label(m) for m in modules]
    return [call_label(m, c) for m, c in zip(modules, calls)]


def selected_frame(df: Any, view: ViewOptions) -> pd.DataFrame:
    """The rows and columns of ``df`` that ``view`` selects, numbers untouched (CSV, JSON); the
    compact columns with ``call`` after ``module`` (a table shows a repeated call in its label:
    ``fc #2``; a file needs the column, as ``Report.diff`` does to match rows)."""
    require_columns(df, (), "selected_frame")
    if view.selects_rows():
        df = select_rows(df, **view.selection)
    out = select_columns(df, view.columns)
    if view.columns == "compact" and "call" in df.columns and "module" in out.columns:
        at = list(out.columns).index("module") + 1
        out = df[[*out.columns[:at], "call", *out.columns[at:]]]
    return out


def prepare_table(
    df: pd.DataFrame,
    totals: Mapping[str, Any] | None = None,
    *,
    end_to_end: Mapping[str, Any] | None = None,
    view: ViewOptions | None = None,
    default_units: str = "human",
    **options: Any,
) -> Table:
    """Select rows and columns of ``df`` and render the cells, plus footer rows.

    The ``total`` row comes from ``totals`` (``Report.totals``), else from the leaf rows of the
    *whole* table (none without a ``leaf`` column), labelled :data:`WHOLE_TOTAL_LABEL` where
    ``top_k`` keeps some rows only; ``end_to_end`` (``{"latency_ms": ...}``)
    adds the :data:`END_TO_END_LABEL` row; ``show_totals=False`` drops both. The view options
    (``view=`` or keywords) select rows, columns and units (``default_units`` where none).
    """
    view = ViewOptions.parse(view, **options)
    require_columns(df, (), "prepare_table")
    units = view.units_or(default_units)
    totals = default_totals(df) if totals is None else totals
    totals = dict(totals) if (totals is not None and view.show_totals) else None
    end_to_end = dict(end_to_end) if (end_to_end and view.show_totals) else None
    picked = select_rows(df, **view.selection)
    rows = with_index(picked)
    shown = _labelled(select_columns(rows, view.columns), rows, picked, view.columns)
    names = [str(c) for c in shown.columns]
    kinds = [column_spec(n, shown[n]).kind for n in names]
    headers, formatters = _formatters(shown, names, units, (totals, end_to_end))
    columns_data = [list(shown[n]) for n in names]
    if "module" in names:  # (raw too: a name is no stored number; a file keeps "" to read back)
        columns_data[names.index("module")] = module_labels(
            shown["module"],
            rows["call"] if "call" in rows.columns and "call" not in names else None,
        )
    cells = tuple(
        tuple(fmt(col[i]) for fmt, col in zip(formatters, columns_data)) for i in range(len(shown))
    )
    own = {own_flag(n) for n in names}  # a ratio's or a figure's, its bounds' too
    flags = {"latency_rough", "backward_latency_rough", LOADED_FLAG, *_AT_MOST_ONE, *own}
    if units != "raw" and flags & set(rows.columns):
        cells = tuple(
            tuple(
                ROUGH_MARK + c if c != MISSING and is_rough_cell(rows, i, n) else c
                for c, n in zip(row, names)
            )
            for i, row in enumerate(cells)
        )
    # with top_k the sums stay the whole model's, not the k rows': the label says so
    label = WHOLE_TOTAL_LABEL if view.top_k is not None else TOTAL_LABEL
    footer = _footer(names, kinds, formatters, (label, totals), end_to_end, units != "raw")
    return Table(
        columns=tuple(names),
        headers=tuple(headers),
        kinds=tuple(kinds),
        cells=cells,
        footer=tuple(footer),
        units=units,
        frame=rows,
    )


_ROW_KEYS = ("rank", "phase", "context", "batch_size")
_ROW_NAMES = ("module", "module name", "layer_type", "type")


def _labelled(
    shown: pd.DataFrame, rows: pd.DataFrame, picked: pd.DataFrame, columns: Any
) -> pd.DataFrame:
    """``shown`` with the columns that name each row in front where ``columns=`` left them out:
    the index :func:`with_index` showed (a comparison's ``model``), else the keys that tell
    rows apart (as the compact view keeps them: a generation's phase and context, ranks) and
    the row's name (``module``; a grouped table's type, torchstat's ``module name``), unless
    ``columns=`` names one of them (it chose the names). A table whose rows (and total) have
    no names cannot be read."""
    if columns is None or (isinstance(columns, str) and columns in ("all", "compact")):
        return shown
    named = list(rows.columns[: len(rows.columns) - len(picked.columns)])
    if not named:
        names = [c for c in _ROW_NAMES if c in rows.columns][:1]
        named = [c for c in _ROW_KEYS if c in rows.columns] + names
    missing = [c for c in named if c not in shown.columns]
    if len(missing) < len(named):  # some asked for by name: the caller's choice of names
        return shown
    return pd.concat([rows[missing], shown], axis=1) if missing else shown


def _formatters(
    shown: pd.DataFrame, names: list[str], units: str, extras: Sequence[Mapping[str, Any] | None]
) -> tuple[list[str], list[Callable]]:
    """The header and cell formatter of each column; fixed units fit ``extras`` (footer) too."""
    headers: list[str] = []
    formatters: list[Callable[[Any], str]] = []
    for name in names:
        spec = column_spec(name, shown[name])
        if units == "raw":
            header, fmt = name, _raw_cell
        elif units == "human":
            header, fmt = spec.header, _human_formatter(spec.kind)
        else:  # one unit for all of a table's times, read from all their values
            family = [n for n in names if _unit_family(n, shown) == _unit_family(name, shown)]
            values = [v for n in family for v in shown[n]]
            values += [e[n] for n in family for e in extras if e is not None and n in e]
            header, fmt = _fixed_formatter(spec.kind, spec.header, values)
        if name == "error" and units != "raw":  # a model that ran: no error, not "n/a"
            fmt = _missing_as("", fmt)
        headers.append(header)
        formatters.append(fmt)
    return headers, formatters


#: kinds whose fixed unit one table shares across its columns (``latency (ms)`` beside
#: ``latency std (ms)``, never ``(µs)``: one quantity and its spreads, read against each other);
#: a count's stays its column's (params M, MACs G), and so does a byte count's: an output, the
#: bytes read with the weights and a peak differ by orders of magnitude, and a unit shared with
#: the largest printed a 4 KiB output as ``<0.01`` MiB
_SHARED_UNIT_KINDS = frozenset({"time_ms"})


def _unit_family(name: str, shown: pd.DataFrame) -> tuple[str, str]:
    """The columns that show one fixed unit: every time of the table, else a quantity and its
    interval (:func:`_interval_stem`)."""
    kind = column_spec(name, shown[name]).kind
    return ("kind", kind) if kind in _SHARED_UNIT_KINDS else ("stem", _interval_stem(name))


def _interval_stem(name: str) -> str:
    """``latency_ci_low_ms``, ``latency_median_ms`` and ``latency_ms`` -> ``latency_ms``: the
    columns that show one quantity and its interval."""
    for part in ("_ci_low", "_ci_high", "_median"):
        name = name.replace(part, "")
    return name


def _footer(
    names: list[str],
    kinds: list[str],
    formatters: list[Callable],
    total: tuple[str, Mapping[str, Any] | None],
    end_to_end: Mapping[str, Any] | None,
    marks: bool = True,
) -> list[tuple[str, ...]]:
    """The total (``(label, totals)``) and end-to-end rows, each labelled in the first text
    column that has no value in either, else the first column that has none; a value whose
    ``<name>_rough`` is set (the run said it is no figure to quote) marked rough (``marks``)."""
    total_label, totals = total
    filled = {*(totals or {}), *(end_to_end or {})}
    free = [i for i, name in enumerate(names) if name not in filled]
    label_at = next((i for i in free if kinds[i] == "text"), free[0] if free else None)
    footer: list[tuple[str, ...]] = []
    for label, values in ((total_label, totals), (END_TO_END_LABEL, end_to_end)):
        if values is None or not set(values) & set(names):
            continue  # a footer row with none of its columns shown would be a bare label
        footer.append(
            tuple(
                label
                if i == label_at
                else (ROUGH_MARK if marks and values.get(f"{name}_rough") else "")
                + fmt(values[name])
                if name in values
                else ""
                for i, (name, fmt) in enumerate(zip(names, formatters))
            )
        )
    return footer
