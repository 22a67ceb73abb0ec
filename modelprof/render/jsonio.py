"""JSON export that reads back to an equal DataFrame (values, column order, dtypes, index).

Document layout (``"format": "modelprof", "version": 1``)::

    {"format": "modelprof", "version": 1,
     "columns": [...], "dtypes": [...],          # str(dtype) per column, e.g. "int64", "str"
     "index": null | {"name": ..., "dtype": ..., "values": [...]},   # null: default RangeIndex
     "data": [[row 0 values], ...],
     "totals": {...} | null, "env": {...} | null}

Strict JSON: NaN is written as ``null`` and infinities as the strings ``"inf"``/``"-inf"``;
float columns turn them back into floats. Floats are written with ``repr`` precision, so they read
back bit for bit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from modelprof.errors import ModelProfError, with_article
from modelprof.render._output import checked_path, emit
from modelprof.render.formats import register_format
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.views import selected_frame
from modelprof.runtime.env import jsonable

__all__ = ["FORMAT", "VERSION", "to_json", "read_json"]

FORMAT = "modelprof"
VERSION = 1


def _encode_column(series: pd.Series, name: str) -> list[Any]:
    """The column's values, missing ones (None, NA, NaN) as null."""
    return [jsonable(v, "text", f"column {name!r} row {i}") for i, v in enumerate(series)]


def _decode_column(values: list[Any], dtype: str, name: str) -> pd.Series:
    try:
        target = pd.api.types.pandas_dtype(dtype)
    except (TypeError, ValueError) as e:
        raise ModelProfError(f"column {name!r} has an unknown dtype {dtype!r}") from e
    try:
        if pd.api.types.is_float_dtype(target):
            values = [float("nan") if v is None else _float(v) for v in values]
        elif pd.api.types.is_bool_dtype(target) or pd.api.types.is_integer_dtype(target):
            flag = pd.api.types.is_bool_dtype(target)  # JSON's true/false: ints, but bools
            nullable = isinstance(target, pd.api.extensions.ExtensionDtype)  # Int64: null = NA
            bad = [
                v
                for v in values
                if not (v is None and nullable)
                and (not isinstance(v, int) or isinstance(v, bool) != flag)
            ]
            if bad:
                raise ValueError(f"{bad[0]!r} is not {'true/false' if flag else 'an integer'}")
        return pd.Series(values, dtype=target, name=name)
    except (TypeError, ValueError, OverflowError) as e:
        raise ModelProfError(f"column {name!r} cannot be read as {dtype!r}: {e}") from e


def _float(v: Any) -> float:
    """A JSON number, or the strings to_json writes for infinities (also "nan")."""
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not number and v not in ("inf", "-inf", "nan"):
        raise ValueError(f"{v!r} is not a number")
    return float(v)


def _is_default_index(index: pd.Index) -> bool:
    return (
        isinstance(index, pd.RangeIndex)
        and index.name is None
        and index.start == 0
        and index.step == 1
    )


@register_format(
    "json",
    suffix="json",
    human=False,
    doc="The table, totals and environment as JSON, read back by ``modelprof.render.read_json``.",
)
def to_json(
    df: pd.DataFrame,
    totals: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    *,
    end_to_end: Mapping[str, Any] | None = None,
    path: str | os.PathLike[str] | None = None,
    view: ViewOptions | None = None,
    **options: Any,
) -> str | Path:
    """The table (raw numbers), the totals and the environment (the end-to-end latency with it)
    as one JSON document; the selected rows keep their index. Returns the text or writes
    ``path`` and returns it."""
    check_read_by("json", options)
    view = ViewOptions.parse(view, **options)
    df = selected_frame(df, view)
    if isinstance(df.columns, pd.MultiIndex):
        raise ModelProfError("to_json cannot write a table with MultiIndex columns")
    names = [str(c) for c in df.columns]
    if len(set(names)) != len(names):
        raise ModelProfError(f"duplicate column names in {names}")
    encoded = [_encode_column(df.iloc[:, i], names[i]) for i in range(len(names))]
    index: dict[str, Any] | None = None
    if not _is_default_index(df.index):
        if isinstance(df.index, pd.MultiIndex):
            raise ModelProfError("to_json cannot write a table with a MultiIndex")
        index = {
            "name": df.index.name,
            "dtype": str(df.index.dtype),
            "values": _encode_column(pd.Series(df.index, dtype=df.index.dtype), "<index>"),
        }
    document = {
        "format": FORMAT,
        "version": VERSION,
        "columns": names,
        "dtypes": [str(df.dtypes.iloc[i]) for i in range(len(names))],
        "index": index,
        "data": [list(row) for row in zip(*encoded)] if names else [[] for _ in range(len(df))],
        "totals": None if totals is None else jsonable(dict(totals), "text", "totals"),
        "env": None if env is None else jsonable(dict(env), "text", "env"),
    }
    return emit(_dumps(document, view.indent) + "\n", path)


def _dumps(document: dict[str, Any], indent: int | None) -> str:
    """JSON text with the column lists on one line and one line per table row."""
    dump = lambda v: json.dumps(v, ensure_ascii=False, allow_nan=False)  # noqa: E731
    if indent is None:
        return dump(document)
    compact = ("columns", "dtypes")
    marks = {key: f"\x00{key}\x00" for key in (*compact, "data")}
    text = json.dumps({**document, **marks}, indent=indent, ensure_ascii=False, allow_nan=False)
    pad = " " * indent
    for key in compact:
        text = text.replace(dump(marks[key]), dump(document[key]), 1)
    rows = ",\n".join(f"{pad}{pad}{dump(row)}" for row in document["data"])
    table = f"[\n{rows}\n{pad}]" if rows else "[]"
    return text.replace(dump(marks["data"]), table, 1)


def read_json(
    source: str | os.PathLike[str],
) -> tuple[pd.DataFrame, dict[str, Any] | None, dict[str, Any] | None]:
    """Read what :func:`to_json` wrote: ``(df, totals, env)``. ``source`` is a path, or the JSON
    text itself (a string starting with ``{``)."""
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        text, where = source, "JSON text"
    else:
        where = checked_path("source", source)
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            raise ModelProfError(f"cannot read {where!r}: {e}") from e
        except UnicodeDecodeError as e:  # a binary file
            raise ModelProfError(
                f"{where!r} is not a modelprof JSON document (not UTF-8 text: "
                f"{e.reason} at byte {e.start})"
            ) from e
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelProfError(f"{where!r} is not valid JSON: {e}") from e
    except RecursionError as e:  # nested deeper than the parser goes
        raise ModelProfError(
            f"{where!r} is not a modelprof JSON document (nested too deeply)"
        ) from e
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ModelProfError(f"{where!r} is not a modelprof JSON document")
    if document.get("version") != VERSION:
        raise ModelProfError(
            f"{where!r} has modelprof JSON version {document.get('version')!r}; "
            f"this modelprof reads version {VERSION}"
        )
    try:
        return _decode_document(document, where)
    except ModelProfError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise ModelProfError(
            f"{where!r} is a malformed modelprof JSON document ({type(e).__name__}: {e})"
        ) from e


def _field(document: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in document:
        raise ModelProfError(f"{where!r} has no {key!r} field")
    value = document[key]
    if not isinstance(value, kind):
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ModelProfError(
            f"{where!r}: {key!r} must be {with_article(names)}, got {type(value).__name__}"
        )
    return value


def _decode_document(
    document: dict[str, Any], where: str
) -> tuple[pd.DataFrame, dict[str, Any] | None, dict[str, Any] | None]:
    names: list[str] = _field(document, "columns", list, where)
    dtypes: list[str] = _field(document, "dtypes", list, where)
    rows: list[list[Any]] = _field(document, "data", list, where)
    if not all(isinstance(n, str) for n in names) or not all(isinstance(d, str) for d in dtypes):
        raise ModelProfError(f"{where!r}: column names and dtypes must be strings")
    if not all(isinstance(r, list) for r in rows):
        raise ModelProfError(f"{where!r}: every row of 'data' must be a list")
    if len(dtypes) != len(names) or any(len(r) != len(names) for r in rows):
        raise ModelProfError(f"{where!r}: rows, columns and dtypes have different lengths")
    columns = {
        name: _decode_column([r[i] for r in rows], dtypes[i], name) for i, name in enumerate(names)
    }
    for key in ("index", "totals", "env"):
        if document.get(key) is not None and not isinstance(document[key], dict):
            raise ModelProfError(f"{where!r}: {key!r} must be null or an object")
    index_doc = document.get("index")
    if index_doc is None:
        index: pd.Index = pd.RangeIndex(len(rows))
    else:
        values = _field(index_doc, "values", list, f"{where} index")
        if len(values) != len(rows):
            raise ModelProfError(
                f"{where!r}: the index has {len(values)} values for {len(rows)} rows"
            )
        decoded = _decode_column(
            values, _field(index_doc, "dtype", str, f"{where} index"), "<index>"
        )
        index = pd.Index(decoded, dtype=decoded.dtype)
        index.name = index_doc.get("name")  # (given None, pd.Index keeps the series' name)
    df = pd.DataFrame(columns) if names else pd.DataFrame(index=pd.RangeIndex(len(rows)))
    df.index = index
    return df, document.get("totals"), document.get("env")
