"""Ops on the meta device run once per signature: the outputs of a repeat are made, not computed.

Many meta kernels are Python (``torch._meta_registrations``, ``torch._refs``: PyTorch prefers
them to the C++ ones for symbolic shapes), and a few hundred of them cost a counted meta forward
more than the CPU's kernels cost a small model. But a meta kernel's output is a function of its
arguments' metadata alone: a transformer's twelve identical blocks ask the same question twelve
times. ``run_meta(func, args, kwargs)`` answers a repeat from a table: a fresh
``torch.empty_strided`` with the shape, strides and dtype the kernel gave the first time.

Only where that is exact:

* every tensor argument a plain strided meta tensor (no subclass, conjugate or negative bit;
  ``requires_grad`` is autograd's, above the kernel), every other argument a number, bool, string, None, dtype, device,
  layout or memory format (keyed with its type: ``1``, ``1.0`` and ``True`` differ), or a list
  or tuple of these (the table is keyed on all of it);
* an op that writes none of its arguments and returns no alias of one (no view, no in-place or
  ``out=`` op: the schema says so), nor a data-dependent output
  (``torch.Tag.dynamic_output_shape``, ``data_dependent_output``) or nondeterministic one;
* its outputs plain meta tensors (or None) at storage offset 0, in a tensor or a tuple.

Everything else runs as it is, every time. The table is process-wide (sweeps and repeated
profiles reuse it), holds no tensor, and is emptied when it reaches ``LIMIT`` entries.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["LIMIT", "clear", "run_meta"]

#: entries kept before the table is emptied (each a few hundred bytes)
LIMIT = 8192

_META = torch.device("meta")
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_ATOMS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                    torch.memory_format})
_UNCACHED = object()
_empty = torch.empty_strided
_default_dtype = torch.get_default_dtype
_table: dict[tuple, Any] = {}
_cacheable: dict[Any, bool] = {}   # op -> whether its outputs may be made from the table


def run_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``, from the table where the same op on the same metadata ran
    before (see the module doc)."""
    ok = _cacheable.get(func)
    if ok is None:
        ok = _cacheable[func] = _may_cache(func)
    if not ok:
        return func(*args, **kwargs)
    key = _key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    made = _table.get(key)
    if made is not None:
        return _make(made)
    out = func(*args, **kwargs)
    made = _shape_of(out)
    if made is not _UNCACHED:
        if len(_table) >= LIMIT:
            _table.clear()
        _table[key] = made
    return out


def clear() -> None:
    """Empty the table (a benchmark timing a first profile; tests)."""
    _table.clear()


def _may_cache(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "namespace", None) == "prim":
        return False
    tags = getattr(func, "tags", ())
    if any(tag in tags for tag in (torch.Tag.dynamic_output_shape,
                                   torch.Tag.data_dependent_output,
                                   torch.Tag.nondeterministic_seeded,
                                   torch.Tag.inplace_view)):
        return False
    if any(a.alias_info is not None for a in schema.arguments) or \
            any(r.alias_info is not None for r in schema.returns):
        return False   # writes an argument, or returns a view of one
    return all(str(r.type) in ("Tensor", "Optional[Tensor]", "Tensor?") for r in schema.returns) \
        and len(schema.returns) > 0


def _arg(a: Any) -> Any:
    kind = type(a)
    if kind in _PLAIN:
        if not a.is_meta or a.is_conj() or a.is_neg() or a.layout is not torch.strided:
            return _UNCACHED
        return (a.shape, a.stride(), a.dtype, a.storage_offset())
    if kind in _ATOMS:
        return (kind, a)
    if kind is list or kind is tuple:
        items = tuple(map(_arg, a))
        return _UNCACHED if _UNCACHED in items else (kind, items)
    return _UNCACHED


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    parts = tuple(map(_arg, args))
    if _UNCACHED in parts:
        return None
    # (a factory op without a dtype makes the default one)
    if kwargs:
        named = tuple((k, _arg(v)) for k, v in kwargs.items())
        if any(v is _UNCACHED for _, v in named):
            return None
        return (func, _default_dtype(), parts, named)
    return (func, _default_dtype(), parts)


def _shape_of(out: Any) -> Any:
    """What ``_make`` needs to make ``out`` again, or ``_UNCACHED``."""
    if type(out) is torch.Tensor:
        if not out.is_meta or out.storage_offset() or out.requires_grad or out.is_conj() or \
                out.is_neg() or out.layout is not torch.strided:
            return _UNCACHED
        return (tuple(out.shape), out.stride(), out.dtype)
    if type(out) is tuple:
        parts = tuple(None if o is None else _shape_of(o) for o in out)
        return _UNCACHED if _UNCACHED in parts else (parts,)
    return _UNCACHED


def _make(made: tuple) -> Any:
    if len(made) == 1:   # a tuple of outputs
        return tuple(None if m is None else _make(m) for m in made[0])
    shape, stride, dtype = made
    return _empty(shape, stride, dtype=dtype, device=_META)
