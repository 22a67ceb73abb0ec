"""Walk whatever a model takes or returns (tensors nested in tuples, lists, dicts,
namedtuples): map over them, their shapes and their bytes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch


__all__ = ["iter_tensors", "map_tensors", "shape_str", "tensor_bytes", "tensor_nbytes", "tensor_shape"]


def map_tensors(obj: Any, fn) -> Any:
    """``obj`` with every tensor replaced by ``fn(tensor)`` (tuples, lists, dicts, namedtuples)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if isinstance(obj, Mapping):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nest of tuples, lists, dicts, dataclasses (``ModelOutput`` too)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from iter_tensors(o)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            yield from iter_tensors(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None))


def tensor_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape; a nested (ragged) tensor's is its components' stacked, the ragged dimension
    summed: ``[(5, 8), (3, 8)] -> (2, 8, 8)``."""
    if getattr(t, "is_nested", False):
        parts = [tuple(c.shape) for c in t.unbind()]
        if not parts:
            return (0,)
        return (len(parts), *(sum(d) if len(set(d)) > 1 else d[0] for d in zip(*parts)))
    return tuple(t.shape)


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of the elements (a nested tensor: of all its components)."""
    if getattr(t, "is_nested", False):
        return sum(c.numel() for c in t.unbind()) * t.element_size()
    return t.numel() * t.element_size()


def shape_str(obj: Any) -> str:
    """Shapes of the tensors in ``obj``, ``x``-joined, comma-separated: ``1x3x224x224, 1x10``."""
    return ", ".join("x".join(str(d) for d in tensor_shape(t)) if t.dim() else "()"
                     for t in iter_tensors(obj))


def tensor_bytes(obj: Any) -> int:
    """Bytes of the distinct tensors in ``obj`` (a tensor returned twice counts once)."""
    seen: set[int] = set()
    total = 0
    for t in iter_tensors(obj):
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_nbytes(t)
    return total
