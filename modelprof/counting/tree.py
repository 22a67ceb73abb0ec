"""The table rule: per-call readings become per-row values, one way for every column.

A reading per module call is *exclusive* (what the call did itself: its own ops' FLOPs) or
*inclusive* (what happened while it ran, children included: a host stamp pair). A parent's row
is inclusive, its ``(self)`` row its own part (inclusive minus the children's), a leaf's both,
and a ``(communication)`` row (a negative key) has none of a call's readings.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["by_parents", "own_part", "row_values", "subtree_sums"]


def subtree_sums(records: Sequence[Any], own: Any, add: Callable[[Any, Any], Any] = operator.add):
    """Exclusive readings to inclusive ones: each call's ``own`` plus its subtree's.

    ``own`` is a sequence indexed by record (ints stay exact Python ints; ``add`` merges other
    values, collectives' dicts), or an array whose last axis is the record (per pass, per column).
    """
    if isinstance(own, np.ndarray):
        result = np.array(own, dtype=np.float64, copy=True)
        out = np.moveaxis(result, -1, 0)  # out[i]: a view of result[..., i]
    else:
        result = out = list(own)
    for r in reversed(records):
        for c in r.children:
            out[r.index] = add(out[r.index], out[c])
    return result


def by_parents(values: np.ndarray, parents: list[int | None], reading: str, to: str) -> Any:
    """The rule on an array whose last axis is the calls in order (children after their parent;
    ``parents``: each call's parent index, None for a root): ``values`` of kind ``reading``
    (``"own"`` or ``"inclusive"``) as ``to``'s kind, as floats (a copy where already so)."""
    out = values[..., : len(parents)].astype(float).copy()
    if reading == to:
        return out
    if to == "inclusive":  # each call into its parent, from the last call back
        for i in range(len(parents) - 1, -1, -1):
            if parents[i] is not None:
                out[..., parents[i]] += out[..., i]
        return out
    kids = np.zeros_like(out)  # own: less the sum of the children
    for i, p in enumerate(parents):
        if p is not None:
            kids[..., p] += out[..., i]
    return out - kids


def own_part(records: Sequence[Any], inclusive: Any, index: int) -> Any:
    """Inclusive readings to a call's own part: its reading minus its children's (``inclusive``
    unchanged: record index -> reading, or None for not read, which counts as nothing)."""
    value = inclusive[index]
    if value is None:
        return None
    for c in records[index].children:
        child = inclusive[c]
        if child is not None:
            value = value - child
    return value


def row_values(
    keys: Sequence[tuple[int, bool, bool]],
    records: Sequence[Any],
    readings: Sequence[Any],
    inclusive: bool,
) -> list[Any]:
    """One reading per call (``readings``, by record index; ``inclusive`` says which kind) as
    one value per row (``keys``: record index, is a (self) row, is a leaf, in table order); a
    ``(communication)`` row gets None."""
    if inclusive:
        inc, own = list(readings), None
    else:
        own, inc = list(readings), subtree_sums(records, readings)
    out = []
    for index, is_self, _ in keys:
        if index < 0:
            out.append(None)
        elif is_self:
            out.append(own[index] if own is not None else own_part(records, inc, index))
        else:
            out.append(inc[index])
    return out
