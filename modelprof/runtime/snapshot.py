"""Give back what the user passes beside the model (inputs, a target, the objects they hold) as
it went in, and let every pass see it as it went in.

A forward may write an input in place (``x.add_(1)``), rebind an attribute of an object it was
given (a HuggingFace ``DynamicCache`` grows by a token per call: ``layer.keys = torch.cat(...)``)
or append to a list; a loss function may write its target. :class:`Snapshot` records, once, what
is cheap to keep: the contents of every mutable container and the attributes of every object
reachable from what was passed (shallow copies: no tensor data), each tensor's version counter,
layout and gradient, and a copy of each tensor's values (the inputs of one call: small beside a
model's weights and activations). :meth:`Snapshot.restore` puts back only what differs.

Between passes, :meth:`Snapshot.reset` puts back what a pass changed (identities and version
counters compared: microseconds, run outside the timed spans). ``profile`` asks
:meth:`Snapshot.between_passes` after its first pass: ``None`` when that pass changed nothing
(ordinary inputs: nothing at all runs between the timed passes, so timing costs what it did);
a later pass that writes what the first did not is still put back at the end. ``compare``, whose
models share the inputs, resets before every pass.

Not kept: modules reachable from the inputs (a module is the state guard's business,
``modelprof.runtime.guard``: ``profile`` guards the model and a loss module), objects beyond the
first ``MAX_OBJECTS`` of the graph, and what has neither attributes nor items to record (a
numpy array written in place). Memory: one copy of the input tensors while ``profile`` runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import operator
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from modelprof.runtime.tensors import version_of

__all__ = ["Snapshot", "snapshot_of"]

# objects that hold nothing a pass could change (or that are not the user's data: code, classes)
_ATOMS = (
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    range,
    slice,
    enum.Enum,
    type,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    torch.Size,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    nn.Module,
)  # a module is the state guard's (``modelprof.runtime.guard``)
#: the walk stops after this many objects (a graph that large is not an input: the rest is
#: neither copied nor put back)
MAX_OBJECTS = 100_000


def _grad(t: torch.Tensor) -> torch.Tensor | None:
    """A leaf's gradient (a non-leaf has none to keep; reading it warns)."""
    return t.grad if t.is_leaf else None


def _layout(t: torch.Tensor) -> tuple:
    """What ``t.data = other`` or ``t.set_(...)`` changes."""
    try:
        return (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            t.size(),
            t.stride(),
            t.dtype,
            t.device,
        )
    except (RuntimeError, NotImplementedError, TypeError):  # meta, nested, sparse, subclasses
        if t.is_nested:  # a strided nested tensor has no sizes: its components' shapes
            return (tuple(tuple(c.shape) for c in t.unbind()), t.dtype, t.device)
        return (t.shape, t.dtype, t.device)


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (an untouched NaN input is unchanged); a nested tensor
    component by component (``torch.equal`` refuses a jagged one)."""
    try:
        if a.is_nested or b.is_nested:
            parts_a, parts_b = a.unbind(), b.unbind()
            return len(parts_a) == len(parts_b) and all(map(_equal, parts_a, parts_b))
        if torch.equal(a, b):
            return True
        return (
            (a.is_floating_point() or a.is_complex())
            and a.shape == b.shape
            and bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        )
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return False


@dataclasses.dataclass(eq=False, slots=True)
class _Tensor:
    tensor: torch.Tensor
    alias: torch.Tensor  # a detached alias: keeps the original storage, sizes and strides
    copy: torch.Tensor | None  # its values, where it has any (not meta, fake)
    version: int | None
    layout: tuple
    grad: torch.Tensor | None
    requires_grad: bool


def _clone(t: torch.Tensor) -> torch.Tensor | None:
    if t.is_meta or type(t).__name__ == "FakeTensor":
        return None
    try:
        with torch.no_grad():
            return t.detach().clone()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class Snapshot:
    """What ``objs`` hold now, to put back later (see the module doc)."""

    def __init__(self, *objs: Any) -> None:
        self._lists: list[tuple[list, list]] = []
        self._dicts: list[tuple[dict, dict]] = []
        self._sets: list[tuple[set, set]] = []
        self._slots: list[tuple[Any, tuple[str, ...], tuple]] = []
        self._tensors: list[_Tensor] = []
        self._unseen: set[int] = set()  # tensors found written with no version bump (by index)
        self._seen: set[int] = set()
        self.truncated = False
        self.add(*objs)

    # -- recording ----------------------------------------------------------------------------
    def add(self, *objs: Any) -> None:
        """Record ``objs`` too (what was recorded already is kept as it was then)."""
        seen = self._seen
        todo = list(objs)
        while todo:
            o = todo.pop()
            if isinstance(o, _ATOMS) or id(o) in seen:
                continue
            if len(seen) >= MAX_OBJECTS:
                self.truncated = True
                return
            seen.add(id(o))
            if isinstance(o, torch.Tensor):
                self._tensor(o)
                continue
            if isinstance(o, list):
                self._lists.append((o, o.copy()))
                todo.extend(o)
            elif isinstance(o, dict):
                self._dicts.append((o, dict(o)))
                todo.extend(o.values())
            elif isinstance(o, set):
                self._sets.append((o, set(o)))
                todo.extend(o)
            elif isinstance(o, (tuple, frozenset)):
                todo.extend(o)
            d = getattr(o, "__dict__", None)
            if isinstance(d, dict) and id(d) not in seen:
                seen.add(id(d))
                self._dicts.append((d, dict(d)))
                todo.extend(d.values())
            slots = _slot_names(type(o))
            if slots:
                values = tuple(getattr(o, s, _MISSING) for s in slots)
                self._slots.append((o, slots, values))
                todo.extend(v for v in values if v is not _MISSING)

    def _tensor(self, t: torch.Tensor) -> None:
        self._tensors.append(
            _Tensor(t, t.detach(), _clone(t), version_of(t), _layout(t), _grad(t), t.requires_grad)
        )

    # -- checking and putting back ------------------------------------------------------------
    def _tensor_changed(self, i: int, values: bool) -> bool:
        """Whether tensor ``i`` differs from its entry: by its flags, layout and version
        counter, and by value (``values``) or else by having been found written unseen."""
        s = self._tensors[i]
        t = s.tensor
        if _grad(t) is not s.grad or t.requires_grad != s.requires_grad or _layout(t) != s.layout:
            return True
        version = version_of(t)
        if version is not None and version != s.version:
            return True
        if not values:
            return i in self._unseen
        # a write no version counter sees (through ``.data``, an inference tensor)
        unseen = s.copy is not None and not _equal(t, s.copy)
        if unseen:
            self._unseen.add(i)  # the quick check between passes copies it back always
        return unseen

    def _structure_changed(self) -> bool:
        is_ = operator.is_
        return (
            any(len(o) != len(c) or not all(map(is_, o, c)) for o, c in self._lists)
            or any(not _same_items(o, c) for o, c in self._dicts)
            or any(o != c for o, c in self._sets)
            or any(
                not all(map(is_, (getattr(o, s, _MISSING) for s in names), values))
                for o, names, values in self._slots
            )
        )

    def changed(self) -> bool:
        """Whether anything differs from the snapshot (values compared too)."""
        return self._structure_changed() or any(
            self._tensor_changed(i, True) for i in range(len(self._tensors))
        )

    def restore(self, values: bool = True) -> bool:
        """Put back everything that differs; True when something did. ``values=False`` trusts
        the version counters (and what an earlier check found written) instead of comparing
        every value: the cheap check between passes."""
        changed = False
        for o, c in self._lists:
            if len(o) != len(c) or not all(map(operator.is_, o, c)):
                o[:] = c
                changed = True
        for o, c in self._dicts:
            if not _same_items(o, c):
                o.clear()
                o.update(c)
                changed = True
        for o, c in self._sets:
            if o != c:
                o.clear()
                o.update(c)
                changed = True
        for o, names, values_ in self._slots:
            for name, v in zip(names, values_):
                if getattr(o, name, _MISSING) is not v:
                    if v is _MISSING:
                        delattr(o, name)
                    else:
                        setattr(o, name, v)
                    changed = True
        for i in range(len(self._tensors)):
            if self._tensor_changed(i, values):
                self._put_back(self._tensors[i])
                changed = True
        return changed

    def _put_back(self, s: _Tensor) -> None:
        t = s.tensor
        inference = t.is_inference()
        ctx = torch.inference_mode() if inference else torch.no_grad()
        with ctx:
            if _layout(t) != s.layout:
                t.data = s.alias
            if s.copy is not None:
                t.copy_(s.copy)
        if t.is_leaf and t.requires_grad != s.requires_grad:
            t.requires_grad_(s.requires_grad)
        if _grad(t) is not s.grad:
            t.grad = s.grad
        s.version = version_of(t)  # the copy bumped it: this is the entry state now

    def reset(self) -> None:
        """The quick :meth:`restore` to run between passes: version counters and identities
        are compared, values only of tensors found written without a version bump before."""
        self.restore(values=False)

    def between_passes(self) -> Callable[[], Any] | None:
        """Call after the first pass: puts back what it changed and returns what to run before
        each further pass (:meth:`reset`), or None when it changed nothing here (ordinary
        inputs: nothing needs to run between passes)."""
        return self.reset if self.restore(values=True) else None


def _same_items(live: dict, saved: dict) -> bool:
    return (
        len(live) == len(saved)
        and all(map(operator.is_, live.values(), saved.values()))
        and all(map(operator.eq, live, saved))
    )


_slot_cache: dict[type, tuple[str, ...]] = {}


def _slot_names(cls: type) -> tuple[str, ...]:
    """The ``__slots__`` of ``cls`` and its bases (``__dict__``/``__weakref__`` left out)."""
    found = _slot_cache.get(cls)
    if found is None:
        names: list[str] = []
        for base in cls.__mro__:
            slots = base.__dict__.get("__slots__", ())
            if isinstance(slots, str):
                slots = (slots,)
            names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
        if cls.__module__ == "builtins" or cls.__module__.startswith("torch"):
            names = []  # a builtin's or torch's slots are not the user's data
        found = _slot_cache[cls] = tuple(dict.fromkeys(names))
    return found


_MISSING = object()


@contextlib.contextmanager
def snapshot_of(*objs: Any) -> Iterator[Snapshot]:
    """A :class:`Snapshot` of ``objs`` for the block; everything it holds is put back at the
    end, also when the block raises or is interrupted."""
    snap = Snapshot(*objs)
    try:
        yield snap
    finally:
        snap.restore()
