"""CSV export of the raw numbers, and a reader that gives the same DataFrame back.

:func:`read_csv` reads every field as text (the root module's name is ``""``, not NaN), then
types each column by its declared dtype, else by what its values parse as (int64, float64 with
empty fields as NaN, bool, else text); a declared int64 column with empty fields (a failed
model's row) as nullable Int64, and a sweep's whole numbers (:data:`SWEEP_WHOLE`) with or
without one. In a comparison's table (an ``error`` column and no ``status``)
an empty ``error`` and a failed row's empty text are missing, and its declared whole numbers
and flags are Int64 and True/False/None with or without empty fields, as compare() made them
for a failed model (a table filtered to the models that ran keeps them: a comparison's CSV
keeps its ``error`` column; a frame without one reads by its values, or as ``dtypes=`` says).
Floats are written with ``repr`` precision, so they read back bit for bit. No totals row is
written: a CSV file is data.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

import modelprof.columns as registry
from modelprof.errors import ModelProfError
from modelprof.render._output import checked_path, emit
from modelprof.render.formats import register_format
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.views import selected_frame, with_index

__all__ = ["SWEEP_WHOLE", "to_csv", "read_csv"]

# A sweep's counts, tokens, runs and threads (``distributed.sweep``'s frame): Int64, failed row
# or not
SWEEP_WHOLE = (*registry.names("count"), *registry.names("step"), "tokens", "latency_n", "threads")

# Text columns where an empty field is a missing value (a roofline row without work has no bound);
# elsewhere an empty field is the empty string (the root module's name).
_EMPTY_IS_MISSING = frozenset(registry.names("roofline", kind="text"))

_TRUE, _FALSE = "True", "False"


def _text_series(values: list[str | None], name: str) -> pd.Series:
    # pandas' default inference for Python strings: "str" on pandas >= 3, object before.
    return pd.Series(values, name=name, dtype=pd.Series(["x"]).dtype)


def _as_int(values: list[str], name: str) -> pd.Series:
    """int64; a count column written as float64 (counts above 2**63 - 1) reads back as such."""
    try:
        ints = [int(v) for v in values]
    except ValueError as e:
        if values and _parses(values, float):
            return _as_float(values, name)
        raise ModelProfError(f"column {name!r} should hold integers: {e}") from e
    return pd.Series(registry.count_column(ints), name=name)


def _as_float(values: list[str], name: str) -> pd.Series:
    try:
        return pd.Series(
            [float("nan") if v == "" else float(v) for v in values], name=name, dtype="float64"
        )
    except ValueError as e:
        raise ModelProfError(f"column {name!r} should hold numbers: {e}") from e


def _as_bool(values: list[str], name: str) -> pd.Series:
    bad = [v for v in values if v not in (_TRUE, _FALSE)]
    if bad:
        raise ModelProfError(f"column {name!r} should hold True/False, found {bad[0]!r}")
    return pd.Series([v == _TRUE for v in values], name=name, dtype="bool")


def _parses(values: list[str], kind: type) -> bool:
    try:
        list(map(kind, values))
    except ValueError:
        return False
    return True


def _as_flags(values: list[str], name: str) -> pd.Series:
    """True, False and None (an empty cell: a flag not set, a failed model's)."""
    return pd.Series([None if v == "" else v == _TRUE for v in values], name=name, dtype=object)


def _as_whole(values: list[str], name: str) -> pd.Series:
    """Whole numbers that may have empty cells (a failed model's, an unranked one's): Int64
    with <NA> there, as a comparison with a failed model holds them (a count beyond int64:
    float64, :func:`modelprof.columns.whole_column`), else as their values parse."""
    if not _parses([v for v in values if v != ""], int):
        return _infer(values, name)
    ints = [None if v == "" else int(v) for v in values]
    if all(v is None or -(2**63) <= v < 2**63 for v in ints):
        return pd.Series(pd.array(ints, dtype="Int64"), name=name)
    return pd.Series(registry.whole_column(ints), name=name)


def _infer(values: list[str], name: str) -> pd.Series:
    filled = [v for v in values if v != ""]
    if not filled:
        return _as_float(values, name) if values else _text_series(values, name)
    if all(v in (_TRUE, _FALSE) for v in filled):
        return _as_bool(values, name) if len(filled) == len(values) else _as_flags(values, name)
    if len(filled) == len(values) and _parses(filled, int):
        return _as_int(values, name)
    if _parses(filled, float):
        return _as_float(values, name)
    return _text_series(values, name)


def _typed(values: list[str], dtype: str | None, name: str) -> pd.Series:
    if dtype is None:
        return _infer(values, name)
    if dtype == "str":
        na = name in _EMPTY_IS_MISSING
        return _text_series([None if na and v == "" else v for v in values], name)
    if dtype == "bool":
        return _as_bool(values, name)
    if dtype == "Int64":  # whole numbers, an empty cell missing (a rank withheld)
        try:
            ints = [None if v == "" else int(v) for v in values]
        except ValueError as e:
            raise ModelProfError(f"column {name!r} should hold integers: {e}") from e
        return pd.Series(pd.array(ints, dtype="Int64"), name=name)
    try:
        if dtype.startswith("int"):
            column = _as_int(values, name)
            return column if column.dtype.kind == "f" else column.astype(dtype)
        if dtype.startswith("float"):
            return _as_float(values, name).astype(dtype)
        return pd.Series(values, name=name).astype(dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise ModelProfError(f"column {name!r} cannot be read as {dtype!r}: {e}") from e


def _read_column(
    values: list[str],
    name: str,
    overrides: Mapping[str, str],
    failed: bool = False,
    whole: tuple[str, ...] = (),
) -> pd.Series:
    """A column typed as asked (``overrides``), else as declared, else by its values; a declared
    int64 column with missing cells (a failed model's row) as nullable Int64, a column of flags
    with missing cells (``latency_stable``: None where it cannot be judged) as True, False and
    None. ``failed``: a comparison's table with an ``error`` column (:func:`_has_failed`), whose
    whole numbers and flags are those, missing cells or not, and its ``error`` text. ``whole``:
    the columns read as whole numbers, missing cells or not (a sweep's)."""
    if name in overrides:
        return _typed(values, overrides[name], name)
    declared = registry.column(name)
    gaps = failed or "" in values
    if failed and name == "error":  # (every model in it ran: all empty)
        return _text_series(values, name)
    if name in whole or declared is not None and declared.dtype == "int64" and gaps:
        return _as_whole(values, name)
    if declared is not None and declared.dtype == "bool" and gaps:  # (all empty too)
        flags = set(values) <= {_TRUE, _FALSE, ""}
        return _as_flags(values, name) if flags else _infer(values, name)
    if declared is None:
        flags = failed and name.endswith("_rough") and set(values) <= {_TRUE, _FALSE, ""}
        return _as_flags(values, name) if flags else _infer(values, name)
    return _typed(values, declared.dtype, name)


def _has_failed(raw: pd.DataFrame) -> bool:
    """The CSV is a comparison's table in which a model failed (:func:`_failed_rows_missing`'s
    ``model`` and ``error`` columns, no ``status``; its errors text, not numbers): compare()
    made its whole numbers Int64 and its flags True/False/None for that row, and a table
    filtered to the models that ran (``table[table["error"].isna()]``) keeps those dtypes."""
    names = {_restore(str(c)) for c in raw.columns}
    if not {"model", "error"} <= names or "status" in names:
        return False
    (error,) = [c for c in raw.columns if _restore(str(c)) == "error"][:1]
    written = [str(v) for v in raw[error] if str(v) != ""]
    return not written or not _parses(written, float)


def _failed_rows_missing(columns: dict[str, pd.Series], overrides: Mapping[str, str]) -> None:
    """A comparison's table (a ``model`` and an ``error`` column, no ``status``): an empty
    ``error`` is missing (the model ran), as is an empty text cell of a row with an error (the
    model failed: ``input_shape``). A sweep's (with ``status``): an empty cell of a row of
    status ``error`` is missing in a declared text column its measurement fills
    (``input_shape``, ``latency_unquotable``: an untimed row's too), not in those of every row
    (``error`` "" where a row ran, ``warnings``, the configuration's). Not in a column typed by
    ``dtypes=``, nor in any other table (a user's own ``error`` column keeps its "")."""
    if "model" not in columns or "error" not in columns or not _is_text(columns["error"]):
        return
    sweep = "status" in columns
    failed = [
        v == "error" if sweep else isinstance(v, str) and v != ""
        for v in columns["status" if sweep else "error"]
    ]
    for name, column in columns.items():
        declared = registry.column(name)
        if name in overrides or sweep and (declared is None or declared.group == "sweep"):
            continue
        rows = failed  # (and, in a sweep, an untimed row's reason a median is unquotable)
        if sweep and declared.group == "sweep_timing" and "timing" in columns:
            rows = [f or t is False for f, t in zip(failed, columns["timing"])]
        if _is_text(column) and (name == "error" or any(rows)):
            gaps = rows if name != "error" else [not f for f in failed]
            cells = [None if gap and v == "" else v for v, gap in zip(column, gaps)]
            columns[name] = pd.Series(cells, name=name, dtype=column.dtype)


# A text cell starting with one of these is a formula to a spreadsheet (OWASP "CSV injection"):
# it is written with a leading "'" (shown as text), which read_csv strips again.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")


def _neutral(value: Any) -> Any:
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_START) else value


def _neutralise_text(out: pd.DataFrame) -> pd.DataFrame:
    """Text cells and column names a spreadsheet would evaluate, made inert (numbers stay)."""
    for name in out.columns:
        col = out[name]
        if _is_text(col) and any(isinstance(v, str) and v.startswith(_FORMULA_START) for v in col):
            out[name] = pd.Series([_neutral(v) for v in col], index=col.index, dtype=object)
    return out.rename(columns={c: _neutral(c) for c in out.columns if isinstance(c, str)})


def _is_text(column: pd.Series) -> bool:
    return column.dtype == object or pd.api.types.is_string_dtype(column.dtype)


def _restore(value: str) -> str:
    return value[1:] if value.startswith("'") else value


@register_format(
    "csv",
    suffix="csv",
    human=False,
    doc="CSV with raw numbers (no units, every column), read back exactly by "
    "``modelprof.render.read_csv``: the table's rows only, so a report's end-to-end latency "
    "(its clean run's median, interval and n, which Markdown and LaTeX print) is not in it: "
    "``report.latency``, or ``to_json``'s ``env['latency']``.",
)
def to_csv(
    df: pd.DataFrame,
    totals: Mapping[str, Any] | None = None,
    *,
    end_to_end: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    path: str | os.PathLike[str] | None = None,
    view: ViewOptions | None = None,
    **options: Any,
) -> str | Path:
    """The table as CSV, raw numbers (``totals``, ``end_to_end`` and ``env`` are not written:
    a plain CSV reader would take them for rows), a meaningful index (model names) as the
    first column. Returns the text or writes ``path`` and returns it."""
    check_read_by("csv", options)
    df = selected_frame(df, ViewOptions.parse(view, **options))
    out = _neutralise_text(with_index(df).copy())  # before the floats become text
    for name in out.columns:
        col = out[name]
        if pd.api.types.is_float_dtype(col.dtype):
            out[name] = pd.Series(
                ["" if np.isnan(v) else repr(float(v)) for v in col], index=col.index, dtype=object
            )
    # Python's csv writer quotes a field holding "\n" but not one holding only "\r", which
    # every CSV reader takes for a line break: then every text field is quoted
    cells = [v for name in out.columns if _is_text(out[name]) for v in out[name]]
    bare_cr = any(isinstance(v, str) and "\r" in v for v in [*map(str, out.columns), *cells])
    quoting = csv.QUOTE_NONNUMERIC if bare_cr else csv.QUOTE_MINIMAL
    return emit(out.to_csv(index=False, lineterminator="\n", quoting=quoting), path)


def read_csv(
    source: str | os.PathLike[str] | io.TextIOBase, *, dtypes: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """Read a CSV written by :func:`to_csv` back into an equal DataFrame. ``source`` is a path,
    the CSV text (a string with a newline) or a text buffer (``io.StringIO``, an open file);
    ``dtypes`` overrides named columns' dtypes (``{"my_col": "float64"}``; ``"str"`` for text)."""
    if dtypes is not None and not (
        isinstance(dtypes, Mapping) and all(isinstance(v, str) for v in dtypes.values())
    ):
        raise ModelProfError(
            f"dtypes={dtypes!r} must map column names to dtype names, e.g. {{'my_col': 'float64'}}"
        )
    if isinstance(source, str) and "\n" in source:
        buffer: Any = io.StringIO(source)
        where = "CSV text"
    elif isinstance(source, io.TextIOBase):  # to_csv()'s text in a buffer, an open file
        buffer, where = source, "CSV buffer"
    else:
        buffer = where = checked_path("source", source)
        if not Path(buffer).is_file():
            raise ModelProfError(f"no CSV file at {where!r}")
    try:
        raw = pd.read_csv(buffer, dtype=object, keep_default_na=False, na_filter=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ModelProfError(f"cannot read {where!r} as CSV: {e}") from e
    overrides = dict(dtypes or {})
    unknown = [c for c in overrides if c not in [_restore(str(r)) for r in raw.columns]]
    if unknown:
        raise ModelProfError(f"dtypes names column(s) {unknown} not in {list(raw.columns)}")
    columns = {}
    failed = _has_failed(raw)
    names = {_restore(str(c)) for c in raw.columns}
    whole = SWEEP_WHOLE if {"model", "status", "error"} <= names else ()
    for written in raw.columns:
        name = _restore(str(written))
        values = [str(v) for v in raw[written]]
        column = _read_column(values, name, overrides, failed, whole)
        if _is_text(column):
            column = pd.Series(
                [v if not isinstance(v, str) else _restore(v) for v in column],
                name=name,
                dtype=column.dtype,
            )
        columns[name] = column
    _failed_rows_missing(columns, overrides)
    if not columns:
        return pd.DataFrame(index=pd.RangeIndex(len(raw)))
    return pd.DataFrame(columns)
