"""Walk whatever a model takes or returns (tensors nested in tuples, lists, dicts,
namedtuples): map over them, their shapes and their bytes (counted here and nowhere else); and
what the state guard and the snapshot read to tell whether a pass changed a tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Iterator, Mapping
from itertools import repeat
from typing import Any

import torch

from modelprof.runtime import compat

__all__ = [
    "PLAIN_TENSORS",
    "all_dense",
    "brief",
    "fingerprint",
    "fingerprints",
    "holds_tensors",
    "is_dtensor",
    "is_dtensor_type",
    "iter_tensors",
    "map_tensors",
    "nbytes",
    "plain_dense",
    "same_items",
    "same_values",
    "shape_str",
    "storage_key",
    "stored_nbytes",
    "tensor_bytes",
    "tensor_nbytes",
    "tensor_shape",
    "version_of",
    "versions",
]

#: the types of plain tensors (no subclass)
PLAIN_TENSORS = frozenset(compat.PLAIN_TENSOR_TYPES)


def map_tensors(obj: Any, fn) -> Any:
    """``obj`` with every tensor replaced by ``fn(tensor)``."""
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
    elif isinstance(obj, (list, tuple, Mapping)):
        for o in obj.values() if isinstance(obj, Mapping) else obj:
            yield from iter_tensors(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None))


def tensor_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape; a nested tensor's stacked, ragged dimensions summed: ``[(5, 8), (3, 8)] ->
    (2, 8, 8)``."""
    if getattr(t, "is_nested", False):
        parts = [tuple(c.shape) for c in t.unbind()]
        if not parts:
            return (0,)
        return (len(parts), *(sum(d) if len(set(d)) > 1 else d[0] for d in zip(*parts)))
    return tuple(t.shape)


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of the elements (of all components of a nested tensor; a subclass: stored)."""
    if getattr(t, "is_nested", False):
        return sum(c.numel() for c in t.unbind()) * t.element_size()
    if type(t) not in PLAIN_TENSORS:
        return stored_nbytes(t)
    return t.numel() * t.element_size()


@functools.cache
def is_dtensor_type(tp: type) -> bool:
    """Whether ``tp`` is DTensor (or a subclass), found without importing torch.distributed."""
    return any(compat.is_dtensor_class(c) for c in tp.__mro__)


def is_dtensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_dtensor_type(type(t))


_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_affine_float_qparams)


def stored_nbytes(t: torch.Tensor) -> int:
    """Bytes ``t`` keeps in memory: a wrapper subclass (torchao) its inner tensors, a
    per-channel quantized tensor its integers, scales and zero points, a plain tensor its
    elements; a DTensor its global shape (the shard view picks the shard)."""
    if not hasattr(type(t), "__tensor_flatten__") or is_dtensor_type(type(t)):
        data = t.numel() * t.element_size()
        if t.is_quantized and t.qscheme() in _PER_CHANNEL:
            data += sum(
                map(stored_nbytes, (t.q_per_channel_scales(), t.q_per_channel_zero_points()))
            )
        return data
    names = t.__tensor_flatten__()[0]
    return sum(
        stored_nbytes(inner)
        for inner in (getattr(t, n, None) for n in names)
        if isinstance(inner, torch.Tensor)
    )


def nbytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (nested lists and tuples), each time it appears."""
    if isinstance(obj, torch.Tensor):
        return tensor_nbytes(obj)
    if isinstance(obj, (list, tuple)):
        return sum(map(nbytes, obj))
    return 0


#: ``t._version`` (bumped by each in-place write); None for an inference tensor
version_of = compat.tensor_version


def shape_str(obj: Any, dtypes: bool = False) -> str:
    """Shapes of the tensors in ``obj``, ``x``-joined, comma-separated: ``1x3x224x224, 1x10``;
    with ``dtypes``, their distinct dtypes after them: ``1x3x224x224 (uint8)``."""
    tensors = list(iter_tensors(obj))
    text = ", ".join(
        "x".join(str(d) for d in tensor_shape(t)) if t.dim() else "()" for t in tensors
    )
    if not (dtypes and tensors):
        return text
    kinds = dict.fromkeys(str(t.dtype).removeprefix("torch.") for t in tensors)
    return f"{text} ({', '.join(kinds)})"


def tensor_bytes(obj: Any, dtype: torch.dtype | None = None) -> int:
    """Bytes of the distinct tensors in ``obj``; with ``dtype``, floating ones as if of it."""
    flat = type(obj) is list and all(map(isinstance, obj, repeat(torch.Tensor)))  # no walk
    distinct = {id(t): t for t in (obj if flat else iter_tensors(obj))}.values()
    if dtype is None:
        return sum(map(tensor_nbytes, distinct))
    size = dtype.itemsize
    # a quantized weight (a tensor subclass) keeps its stored size, whatever it computes in
    return sum(
        t.numel() * size if t.is_floating_point() and type(t) in PLAIN_TENSORS else tensor_nbytes(t)
        for t in distinct
    )


def holds_tensors(obj: Any) -> bool:
    """``obj`` is a tensor, or a tuple/list/dict with a tensor somewhere inside."""
    return next(iter_tensors(obj), None) is not None


def brief(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` for an error message, tensors as ``Tensor[2x128, int64]``, a module by its
    class (``<MyNet module>``: its repr lists every layer), cut at ``limit``."""

    def show(o: Any) -> str:
        if isinstance(o, torch.Tensor):
            shape = "x".join(map(str, tensor_shape(o))) if o.dim() else "()"
            return f"Tensor[{shape}, {str(o.dtype).removeprefix('torch.')}]"
        if isinstance(o, torch.nn.Module):
            return f"<{type(o).__name__} module>"
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


# -- what a pass may change in a tensor -------------------------------------------------------


def storage_key(t: torch.Tensor, device: torch.device | None = None) -> int | None:
    """The address of ``t``'s storage (what a write can reach), or None where there is none
    (meta, fake, wrapper subclasses); ``compat.storage_identity`` keys memory kept alive."""
    if type(t) not in PLAIN_TENSORS or t.is_meta:  # (a plain tensor makes no device object)
        if (device or t.device).type == "meta" or isinstance(t, compat.FakeTensor):
            return None
    try:
        return t.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


_STRIDED = frozenset({torch.strided})
_T = torch.Tensor
_DTYPE = operator.attrgetter("dtype")
_LAYOUT = operator.attrgetter("layout")
_NESTED = operator.attrgetter("is_nested")
_META = operator.attrgetter("is_meta")
_QUANTIZED = operator.attrgetter("is_quantized")
_NOT_DENSE = (_NESTED, _META, _QUANTIZED, _T.is_conj, _T.is_neg)  # none holds in a dense tensor
#: what ``t.data = other`` changes in a dense tensor: the tuple ``fingerprint`` builds
_DENSE_FINGERPRINT = (_T.data_ptr, _T.size, _T.stride, _DTYPE, _T.get_device)


#: :func:`version_of` of each tensor, read all at once where none is an inference tensor
versions = compat.tensor_versions


# For dense tensors (nearly all) each attribute is read for all at once with ``map`` over the C
# getters: a tenth of a Python loop's cost.


def all_dense(ts: list[torch.Tensor]) -> bool:
    """:func:`plain_dense` of every tensor of ``ts`` (a plain type, strided, and not nested,
    meta, quantized, conjugated or negated), read for all at once."""
    return (
        set(map(type, ts)) <= PLAIN_TENSORS
        and set(map(_LAYOUT, ts)) <= _STRIDED
        and not any(any(map(flag, ts)) for flag in _NOT_DENSE)
    )


def plain_dense(t: torch.Tensor) -> bool:
    """A plain strided tensor with memory: one rebuilt from its storage after a ``.data`` swap."""
    return all_dense([t])


def fingerprint(t: torch.Tensor) -> tuple:
    """What ``t.data = other`` changes (dense: the tuple :func:`fingerprints` builds)."""
    if plain_dense(t):
        return (t.data_ptr(), t.size(), t.stride(), t.dtype, t.get_device())
    try:
        geometry: tuple = (t.shape, t.stride(), t.storage_offset())
    except (RuntimeError, NotImplementedError, TypeError):  # nested, wrapper tensors: no strides
        geometry = tuple(tuple(c.shape) for c in t.unbind()) if t.is_nested else ()
    device = t.device
    return (storage_key(t, device), geometry, t.dtype, device, t.is_conj(), t.is_neg())


def fingerprints(ts: list[torch.Tensor], dense: bool | None = None) -> list[tuple]:
    """:func:`fingerprint` of each tensor, read all at once where ``dense`` (:func:`all_dense`)."""
    if all_dense(ts) if dense is None else dense:
        return list(zip(*(map(read, ts) for read in _DENSE_FINGERPRINT)))
    return [fingerprint(t) for t in ts]


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN; a nested tensor component by component."""
    try:
        if a.is_nested or b.is_nested:
            parts_a, parts_b = a.unbind(), b.unbind()
            return len(parts_a) == len(parts_b) and all(map(same_values, parts_a, parts_b))
        if torch.equal(a, b):
            return True
        return (
            (a.is_floating_point() or a.is_complex())
            and a.shape == b.shape
            and bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        )
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return False


def same_items(live: dict, saved: dict) -> bool:
    """The same keys, in order, bound to the same objects (identity, never ``==``: tensors)."""
    return (
        len(live) == len(saved)
        and all(map(operator.is_, live.values(), saved.values()))
        and all(map(operator.eq, live, saved))
    )
