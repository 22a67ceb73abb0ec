"""Walk whatever a model takes or returns (tensors nested in tuples, lists, dicts,
namedtuples): map over them, their shapes and their bytes. Tensor bytes are counted here and
nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from modelprof.runtime import compat

__all__ = [
    "PLAIN_TENSORS",
    "brief",
    "holds_tensors",
    "is_dtensor",
    "is_dtensor_type",
    "iter_tensors",
    "map_tensors",
    "nbytes",
    "shape_str",
    "stored_nbytes",
    "tensor_bytes",
    "tensor_nbytes",
    "tensor_shape",
    "version_of",
]

#: the types of plain tensors (no subclass): a parameter and a buffer are tensors
PLAIN_TENSORS = frozenset(compat.PLAIN_TENSOR_TYPES)


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
    """Bytes of the elements (a nested tensor: of all its components; a quantized tensor
    subclass: what it stores, :func:`stored_nbytes`)."""
    if getattr(t, "is_nested", False):
        return sum(c.numel() for c in t.unbind()) * t.element_size()
    if type(t) not in PLAIN_TENSORS:
        return stored_nbytes(t)
    return t.numel() * t.element_size()


_DTENSOR_TYPES: dict[type, bool] = {}


def is_dtensor_type(tp: type) -> bool:
    """Whether ``tp`` is DTensor (or a subclass), found without importing torch.distributed."""
    found = _DTENSOR_TYPES.get(tp)
    if found is None:
        found = _DTENSOR_TYPES[tp] = any(compat.is_dtensor_class(c) for c in tp.__mro__)
    return found


def is_dtensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_dtensor_type(type(t))


_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_affine_float_qparams)


def stored_nbytes(t: torch.Tensor) -> int:
    """Bytes ``t`` keeps in memory. A tensor subclass that wraps others (torchao's quantized
    weights: int8, float8 or packed int4 data with their scales and zero points) keeps its
    inner tensors, named by ``__tensor_flatten__`` and walked down, not ``numel()`` elements of
    the dtype it computes in; a per-channel quantized tensor its integers, scales and zero
    points; a plain tensor its elements. A DTensor counts as its global shape: which shard a
    table shows is the shard view's choice (``counting.sharding``)."""
    if not hasattr(type(t), "__tensor_flatten__") or is_dtensor_type(type(t)):
        data = t.numel() * t.element_size()
        if t.is_quantized and t.qscheme() in _PER_CHANNEL:
            return (
                data
                + stored_nbytes(t.q_per_channel_scales())
                + stored_nbytes(t.q_per_channel_zero_points())
            )
        return data
    names = t.__tensor_flatten__()[0]
    return sum(
        stored_nbytes(inner)
        for inner in (getattr(t, n, None) for n in names)
        if isinstance(inner, torch.Tensor)
    )


def nbytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (a tensor, or lists and tuples of them, nested), each
    time it appears: what an op's arguments read, or its outputs write."""
    if isinstance(obj, torch.Tensor):
        return tensor_nbytes(obj)
    if isinstance(obj, (list, tuple)):
        return sum(map(nbytes, obj))
    return 0


def version_of(t: torch.Tensor) -> int | None:
    """``t._version``, which each in-place write bumps; None for an inference tensor, which has
    no version counter."""
    return None if t.is_inference() else t._version


def shape_str(obj: Any) -> str:
    """Shapes of the tensors in ``obj``, ``x``-joined, comma-separated: ``1x3x224x224, 1x10``."""
    return ", ".join(
        "x".join(str(d) for d in tensor_shape(t)) if t.dim() else "()" for t in iter_tensors(obj)
    )


def tensor_bytes(obj: Any, dtype: torch.dtype | None = None) -> int:
    """Bytes of the distinct tensors in ``obj`` (a tensor returned twice counts once); with
    ``dtype``, floating ones as if of that dtype (a model profiled converted)."""
    distinct = {id(t): t for t in iter_tensors(obj)}.values()
    if dtype is None:
        return sum(map(tensor_nbytes, distinct))
    size = torch.empty((), dtype=dtype).element_size()
    # a quantized weight (a tensor subclass) keeps its stored size, whatever it computes in
    return sum(
        t.numel() * size if t.is_floating_point() and type(t) in PLAIN_TENSORS else tensor_nbytes(t)
        for t in distinct
    )


def holds_tensors(obj: Any) -> bool:
    """``obj`` is a tensor, or a tuple/list/dict with a tensor somewhere inside."""
    return next(iter_tensors(obj), None) is not None


def brief(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` for an error message, with every tensor shown as its shape and dtype
    (``Tensor[2x128, int64]``) instead of its values, cut at ``limit`` characters."""

    def show(o: Any) -> str:
        if isinstance(o, torch.Tensor):
            shape = "x".join(map(str, tensor_shape(o))) if o.dim() else "()"
            return f"Tensor[{shape}, {str(o.dtype).removeprefix('torch.')}]"
        if isinstance(o, tuple) and hasattr(o, "_fields"):
            return f"{type(o).__name__}({', '.join(show(v) for v in o)})"
        if isinstance(o, (list, tuple)):
            inner = ", ".join(show(v) for v in o)
            return f"[{inner}]" if isinstance(o, list) else f"({inner}{',' if len(o) == 1 else ''})"
        if isinstance(o, Mapping):
            return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in o.items()) + "}"
        return repr(o)

    text = show(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."
