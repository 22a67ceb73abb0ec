"""Two reports layer by layer (``Report.diff``): the same model before and after a change (a
dtype, channels_last, a pruned block), its rows matched by module name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from modelprof.errors import ModelProfError, ModelProfWarning, warn_user

__all__ = ["diff_frames"]

#: compared when ``columns`` is not given, those both tables have (latency: when both are timed)
DEFAULT_COLUMNS = (
    "params", "macs", "flops", "read_bytes", "write_bytes", "backward_macs", "backward_flops",
    "latency_ms", "backward_latency_ms",
)  # fmt: skip


def diff_frames(
    a: pd.DataFrame,
    b: pd.DataFrame,
    columns: Sequence[str] | None = None,
    names: tuple[str, str] = ("a", "b"),
    prefixes: Any = ("", ""),
) -> pd.DataFrame:
    """One row per module call in either table (``a``'s order, each row only ``b`` has after
    the row it follows in ``b``): each column's two values and ``<column>_ratio`` (b / a; NaN
    where a is 0 or a row is missing), ``in`` (both, or which alone) and, for a timing column
    with a rough flag (``latency_rough``, ``backward_latency_rough``), that flag where either
    side's is set. ``prefixes``: a start of the module names each side drops before its rows
    are matched (a wrapper's ``"module."``, ``torch.compile``'s ``"_orig_mod."``); the rows
    show the names so matched. Where they share fewer than half the layers of the smaller (the
    root aside), a warning and ``attrs["notes"]`` say so, with the prefix that would match
    more where one would."""
    first, second = _names(names)
    cols = _columns(a, b, columns)
    given = _prefixes(prefixes)
    a, b = (_stripped(df, p, n) for df, p, n in zip((a, b), given, (first, second)))
    key = ["module", "call"]  # (a module called twice has a row per call)
    sides = []
    for df, name in ((a, first), (b, second)):
        indexed = df.set_index(key)
        if indexed.index.has_duplicates:
            module, call = indexed.index[indexed.index.duplicated()][0]
            raise ModelProfError(f"report {name!r} has two rows for module {module!r} call {call}")
        for c in cols:  # whole numbers stay exact past 2**53 where a row is missing
            if pd.api.types.is_integer_dtype(indexed[c]):
                indexed[c] = indexed[c].astype("Int64")
        sides.append(indexed)
    order = pd.MultiIndex.from_tuples(_merged(list(sides[0].index), list(sides[1].index)))
    order.names = key
    left, right = (s.reindex(order) for s in sides)
    out = order.to_frame(index=False)
    kinds = left["type"].fillna(right["type"])
    changed = left["type"].notna() & right["type"].notna() & (left["type"] != right["type"])
    out["type"] = kinds.where(~changed, left["type"] + " -> " + right["type"]).to_numpy()
    out["in"] = np.select(
        [left["type"].notna() & right["type"].notna(), left["type"].notna()],
        ["both", first],
        second,
    )
    _few_shared(out, first, second, (sides[0].index, sides[1].index), given)
    for c in cols:
        x, y = (side[c].to_numpy(dtype=float, na_value=np.nan) for side in (left, right))
        for name, side in ((first, left), (second, right)):
            out[f"{c}_{name}"] = side[c].array
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"{c}_ratio"] = np.where(x > 0, y / x, np.nan)
        flag = c.removesuffix("_ms") + "_rough"  # latency_rough, backward_latency_rough
        flags = [s[flag].eq(True).to_numpy() for s in (left, right) if flag in s.columns]
        if flags:  # set on either side (a row one side lacks: no ratio)
            out[flag] = np.logical_or.reduce(flags)
    return out


def _merged(a: list[Any], b: list[Any]) -> list[Any]:
    """``a``'s keys in order, each key only ``b`` has placed after the key before it in ``b``
    (a layer inserted in the middle stays in the middle)."""
    common, follows = set(a), {}
    before = None  # b's last key that a has too
    for k in b:
        if k in common:
            before = k
        else:
            follows.setdefault(before, []).append(k)
    out = list(follows.get(None, []))
    for k in a:
        out.append(k)
        out.extend(follows.get(k, []))
    return out


def _few_shared(
    out: pd.DataFrame, first: str, second: str, indexes: Any, prefixes: tuple[str, str]
) -> None:
    """Two tables that share few layers by name: a different model, or modules renamed (a
    wrapper adds a prefix); the rows compared would be few, the rest one-sided."""
    inner = out.loc[out["module"] != "", "in"]
    shared = int((inner == "both").sum())
    sizes = [shared + int((inner == name).sum()) for name in (first, second)]
    if min(sizes) >= 2 and shared < min(sizes) / 2:
        note = (
            f"diff(): besides the root, only {shared} layer(s) match by module name and call "
            f"({sizes[0]} in {first!r}, {sizes[1]} in {second!r}); are these the same model, "
            "its modules named alike (a wrapper adds a prefix to every name), called alike (a "
            "mixture of experts routes other tokens to other experts)?"
        )
        better = _better_prefixes(*(set(i.get_level_values(0)) - {""} for i in indexes))
        if better is not None:
            extra, matched = better
            given = tuple(p + e for p, e in zip(prefixes, extra))
            note += f" With prefixes={given!r}, {matched} layer name(s) match."
        out.attrs["notes"] = [note]
        warn_user(f"modelprof: {note}", ModelProfWarning)


def _prefixes(prefixes: Any) -> tuple[str, str]:
    if not (
        isinstance(prefixes, (tuple, list))
        and len(prefixes) == 2
        and all(isinstance(p, str) for p in prefixes)
    ):
        raise ModelProfError(
            f"prefixes={prefixes!r} must be two strings: the start of the module names each "
            "side drops (\"\" for none), e.g. ('', 'module.')"
        )
    return prefixes[0], prefixes[1]


def _stripped(df: pd.DataFrame, prefix: str, name: str) -> pd.DataFrame:
    """``df`` with ``prefix`` taken off the module names that start with it (all of them
    unchanged where it is empty); a prefix that starts no name is refused."""
    if not prefix:
        return df
    modules = df["module"].astype(str)
    starts = modules.str.startswith(prefix)
    if not starts.any():
        raise ModelProfError(
            f"prefix {prefix!r} starts no module name of {name!r} (its names start like "
            f"{sorted(set(modules) - {''})[:3]!r})"
        )
    out = df.copy()
    out["module"] = modules.where(~starts, modules.str.slice(len(prefix)))
    return out


def _better_prefixes(a: set[str], b: set[str]) -> tuple[tuple[str, str], int] | None:
    """The prefix one side could drop (``("", "body.")``) for the most module names to match,
    and how many would; None where none matches half the names of the smaller side or
    more."""
    best: tuple[tuple[str, str], int] | None = None
    for names, other, side in ((a, b, 0), (b, a, 1)):
        for top in {n.split(".", 1)[0] for n in names if "." in n}:
            start = top + "."
            under = {n[len(start) :] for n in names if n.startswith(start)}
            matched = len(under & other)
            if matched >= max(2, min(len(under), len(other)) / 2) and (
                best is None or matched > best[1]
            ):
                best = ((start, "") if side == 0 else ("", start), matched)
    return best


def _names(names: Any) -> tuple[str, str]:
    if (
        not isinstance(names, (tuple, list))
        or len(names) != 2
        or not all(isinstance(n, str) and n for n in names)
        or names[0] == names[1]
        or "ratio" in names
        or "both" in names  # (the ``in`` column's word for a row on either side)
    ):
        raise ModelProfError(
            f"names={names!r} must be two different non-empty strings other than 'ratio' and 'both'"
        )
    return names[0], names[1]


def _columns(a: pd.DataFrame, b: pd.DataFrame, columns: Any) -> list[str]:
    if columns is None:
        both = [c for c in DEFAULT_COLUMNS if c in a.columns and c in b.columns]
        return [c for c in both if a[c].notna().any() and b[c].notna().any()]
    if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns:
        raise ModelProfError(f"columns={columns!r} must be a non-empty list of column names")
    for c in columns:
        missing = [n for n, df in (("first", a), ("second", b)) if c not in df.columns]
        if missing:
            timed = (
                " (was it profiled without backward=True, or with timing=False?)"
                if c.startswith("backward")
                else " (a timing column: was it profiled with timing=False?)"
                if "latency" in c
                else ""
            )
            raise ModelProfError(
                f"columns: {c!r} is not a column of the {' and '.join(missing)} report's "
                f"table{timed}"
            )
        if not pd.api.types.is_numeric_dtype(a[c]) or not pd.api.types.is_numeric_dtype(b[c]):
            raise ModelProfError(f"columns: {c!r} is not a number to compare")
    return list(columns)
