"""Give back what the user passes beside the model (inputs, a target, the objects they hold) as
it went in, and let every pass see it as it went in.

A forward may write an input in place, rebind an attribute of an object it was given (a
``DynamicCache`` grows per call) or append to a list. :class:`Snapshot` records once the
contents of every reachable container and object (shallow) and per tensor its version counter,
layout, gradient and values; it puts back only what differs. Between passes only identities and
version counters are compared (:meth:`Snapshot.reset`), and not at all when the first pass
changed nothing (:meth:`Snapshot.between_passes`). With ``copy_on_write=True`` a tensor is
copied just before its first write, as a dispatch watch reports it.

Not kept: modules (the state guard's), objects past ``MAX_OBJECTS``, and what has neither
attributes nor items (a numpy array written in place).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import operator
import types
from collections.abc import Callable, Iterator
from itertools import chain, count, repeat
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.tensors import (
    all_dense,
    fingerprint,
    fingerprints,
    same_items,
    same_values,
    storage_key,
    version_of,
    versions,
)

__all__ = ["Snapshot", "snapshot_of"]

# objects that hold nothing a pass could change (or that are not the user's data: code, classes)
_ATOMS = (
    (str, bytes, int, float, complex, bool, type(None), range, slice, enum.Enum, type)
    + (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)
    + (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)
    + (nn.Module,)  # a module is the state guard's (``modelprof.runtime.guard``)
)
#: the walk stops after this many objects (the rest is neither copied nor put back)
MAX_OBJECTS = 100_000
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_GRAD = operator.attrgetter("grad")
_IS_LEAF = operator.attrgetter("is_leaf")
_T = torch.Tensor
_UntypedStorage = torch.UntypedStorage


def _grad(t: torch.Tensor) -> torch.Tensor | None:
    """A leaf's gradient (a non-leaf has none to keep; reading it warns)."""
    return t.grad if t.is_leaf else None


def _clone(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s values, where it has any (not meta, fake)."""
    if t.is_meta or type(t).__name__ == "FakeTensor":
        return None
    try:
        with torch.no_grad():
            return t.detach().clone()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class Snapshot:
    """What ``objs`` hold now, to put back later. Per tensor (index ``i`` in every list) what a
    check reads is kept in flat lists, read for all tensors at once."""

    def __init__(self, *objs: Any, copy_on_write: bool = False) -> None:
        self._lists: list[tuple[list, list]] = []
        self._dicts: list[tuple[dict, dict]] = []
        # the live dicts and the saved ones' lengths, keys and values, flat (at the first check)
        self._flat: tuple[list, list[int], list, list] | None = None
        self._sets: list[tuple[set, set]] = []
        self._slots: list[tuple[Any, tuple[str, ...], tuple]] = []
        self._tensors: list[torch.Tensor] = []
        self._aliases: list[torch.Tensor] = []  # detached: the original storage and geometry
        self._copies: list[torch.Tensor | None] = []
        self._versions: list[int | None] = []
        self._layouts: list[tuple] = []
        self._grads: list[torch.Tensor | None] = []
        self._requires_grad: list[bool] = []
        self._dense = True  # every tensor plain and dense: fingerprints read all at once
        # copy on write: tensors not copied yet, by storage, and by index
        self._copy_on_write = copy_on_write
        self._pending: dict[int, list[int]] = {}
        self._uncopied: set[int] = set()
        self._unseen: set[int] = set()  # tensors found written with no version bump (by index)
        self._seen: set[int] = set()
        self.add(*objs)

    # -- recording ----------------------------------------------------------------------------
    def add(self, *objs: Any) -> None:
        """Record ``objs`` too (what was recorded already is kept as it was then)."""
        found: list[torch.Tensor] = []
        seen = self._seen
        todo = list(objs)
        while todo:
            o = todo.pop()
            if (isinstance(o, _ATOMS) and not compat.is_module_cache(o)) or id(o) in seen:
                continue
            if len(seen) >= MAX_OBJECTS:
                break
            seen.add(id(o))
            if isinstance(o, torch.Tensor):
                found.append(o)
            else:
                todo.extend(self._record(o))
        self.add_tensors(found)

    def _record(self, o: Any) -> list[Any]:
        """Record the contents of container or object ``o``; returns what it holds."""
        held: list[Any] = []
        if isinstance(o, list):
            self._lists.append((o, o.copy()))
            held.extend(o)
        elif isinstance(o, dict):
            self._dict(o)
            held.extend(o.values())
        elif isinstance(o, set):
            self._set(o)
            held.extend(o)
        elif isinstance(o, (tuple, frozenset)):
            held.extend(o)
        d = getattr(o, "__dict__", None)
        if isinstance(d, dict) and id(d) not in self._seen:
            self._seen.add(id(d))
            self._dict(d)
            held.extend(d.values())
        slots = _slot_names(type(o))
        if slots:
            values = tuple(getattr(o, s, _MISSING) for s in slots)
            self._slots.append((o, slots, values))
            held.extend(v for v in values if v is not _MISSING)
        return held

    def _dict(self, d: dict) -> dict:
        saved = dict(d)
        self._dicts.append((d, saved))
        self._flat = None
        return saved

    def _set(self, s: set) -> set:
        saved = set(s)
        self._sets.append((s, saved))
        return saved

    def add_containers(self, objs: list[Any]) -> list[Any]:
        """Keep the contents of each dict and set of ``objs`` (shallow); returns the copies."""
        return [
            self._dict(o) if isinstance(o, dict) else self._set(o) if isinstance(o, set) else o
            for o in objs
        ]

    def add_tensors(self, ts: list[torch.Tensor], copy: bool | list[bool] | None = None) -> None:
        """Keep ``ts`` (distinct tensors) as they are now. ``copy``: whether (for all, or per
        tensor) values are copied now (default: unless copying on write), else on first write."""
        dense = all_dense(ts)
        self._dense = self._dense and dense
        start = len(self._tensors)
        self._tensors += ts
        self._aliases += map(torch.Tensor.detach, ts)
        if copy is None:
            copy = not self._copy_on_write
        wanted = repeat(copy) if isinstance(copy, bool) else copy
        clone = _T.clone if dense else _clone  # dense: no meta or fake tensor, nothing to catch
        with torch.no_grad():
            self._copies += [clone(t) if c else None for t, c in zip(ts, wanted)]
        if copy is not True:  # the others with values (not meta, fake): copied on write
            keys = map(_UntypedStorage.data_ptr, map(_T.untyped_storage, ts)) if dense else None
            for i, t, key in zip(count(start), ts, keys or map(storage_key, ts)):
                if key and self._copies[i] is None:
                    self._pending.setdefault(key, []).append(i)
                    self._uncopied.add(i)
        self._versions += versions(ts)
        self._layouts += fingerprints(ts, dense)
        self._grads += map(_GRAD if all(map(_IS_LEAF, ts)) else _grad, ts)
        self._requires_grad += map(_REQUIRES_GRAD, ts)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The tensors kept, in the order recorded (an index names one in every answer)."""
        return self._tensors

    @property
    def copies(self) -> list[torch.Tensor | None]:
        """Per tensor, its values when recorded, where a copy was taken (up front or on write)."""
        return self._copies

    @property
    def awaits_writes(self) -> bool:
        """Whether some tensor is to be copied on its first write (a watch has work to do)."""
        return bool(self._pending)

    def before_write(self, value: Any) -> None:
        """Copy the uncopied tensors sharing a storage with ``value`` (about to be written)."""
        if isinstance(value, (list, tuple)):
            for v in value:
                self.before_write(v)
        elif isinstance(value, torch.Tensor) and self._pending:
            for i in self._pending.pop(storage_key(value), ()):
                self._copies[i] = _clone(self._aliases[i])
                self._uncopied.discard(i)

    @property
    def copied_bytes(self) -> int:
        """Bytes of the tensor values the snapshot holds (taken up front, or on first write)."""
        return sum(c.untyped_storage().nbytes() for c in self._copies if c is not None)

    # -- checking and putting back ------------------------------------------------------------
    def _suspects(self, values: bool) -> tuple[set[int], set[int]]:
        """Indices of the tensors (written in place, moved or with a changed gradient or flag).
        Written: by version counter, by value (``values``), or found so unseen before."""
        ts = self._tensors
        written, moved = set(self._unseen), set()
        flags = list(map(_REQUIRES_GRAD, ts))
        for found, now, entry in (
            (written, versions(ts), self._versions),
            (moved, fingerprints(ts, self._dense), self._layouts),
            (moved, flags, self._requires_grad),
        ):
            if now != entry:
                found.update(i for i, (a, b) in enumerate(zip(now, entry)) if a != b)
        # a tensor that does not require grad is a leaf: its ``.grad`` read all at once
        grads = map(_grad if any(flags) and not all(map(_IS_LEAF, ts)) else _GRAD, ts)
        if not all(map(operator.is_, grads, self._grads)):
            moved.update(i for i, g in enumerate(self._grads) if _grad(ts[i]) is not g)
        if values:
            copies = self._copies
            unseen = [
                i
                for i in range(len(ts))
                if i not in written
                and i not in moved
                and copies[i] is not None
                and not same_values(ts[i], copies[i])
            ]
            self._unseen.update(unseen)  # the quick check between passes copies them back
            written.update(unseen)
        return written, moved

    def _dicts_same(self) -> bool:
        """Every recorded dict holds the saved keys, in order, bound to the saved objects."""
        if self._flat is None:
            saved = [c for _, c in self._dicts]
            self._flat = (
                [o for o, _ in self._dicts],
                list(map(len, saved)),
                list(chain.from_iterable(saved)),
                list(chain.from_iterable(map(dict.values, saved))),
            )
        live, lens, keys, values = self._flat
        return (
            list(map(len, live)) == lens
            and all(map(operator.is_, chain.from_iterable(map(dict.values, live)), values))
            and all(map(operator.eq, chain.from_iterable(live), keys))
        )

    def changed(self) -> bool:
        """Whether anything differs from the snapshot (values compared too)."""
        return self.put_back_containers(False) or any(self._suspects(True))

    def put_back(self, values: bool = True, exact: bool = False) -> tuple[list[int], ...]:
        """Put back every tensor that differs; indices (that differed, put back, lost: written
        and never copied). ``exact``: values written back only where they differ."""
        written, moved = self._suspects(values)
        touched = sorted(written | moved)
        with torch.no_grad():
            restored = [i for i in touched if self._put_back(i, i in moved, exact)]
            for i in moved:  # each gradient after the tensors: it fits its tensor's entry shape
                if _grad(self._tensors[i]) is not self._grads[i]:
                    self._tensors[i].grad = self._grads[i]
        return touched, restored, sorted(self._uncopied.intersection(written))

    def restore(self, values: bool = True) -> bool:
        """Put back what differs; whether any did. ``values=False``: trust version counters."""
        changed = self.put_back_containers()
        touched, _, lost = self.put_back(values)
        if lost:  # everything else is back
            raise ModelProfError(
                f"{len(lost)} tensor(s) (the first of shape {tuple(self._tensors[lost[0]].shape)}) "
                "written in place by a pass after the watched one, which did not write them: "
                "their values from before were not kept and cannot be put back (the passes "
                "must write the same tensors)"
            )
        return changed or bool(touched)

    def put_back_containers(self, put_back: bool = True) -> bool:
        """Whether a container or slot differs (each put back with ``put_back``)."""
        changed = False
        for o, c in self._lists:
            if len(o) != len(c) or not all(map(operator.is_, o, c)):
                changed = True
                if put_back:
                    o[:] = c
        if not self._dicts_same():
            changed = True
            for o, c in self._dicts if put_back else ():
                if not same_items(o, c):
                    o.clear()
                    o.update(c)
        for o, c in self._sets:
            if o != c:
                changed = True
                if put_back:
                    o.clear()
                    o.update(c)
        for o, names, values_ in self._slots:
            for name, v in zip(names, values_):
                if getattr(o, name, _MISSING) is not v:
                    changed = True
                    if put_back and v is _MISSING:
                        delattr(o, name)
                    elif put_back:
                        setattr(o, name, v)
        return changed

    def _put_back(self, i: int, moved: bool, exact: bool) -> bool:
        """Put back tensor ``i`` (its values, all of it where ``moved``); whether anything was."""
        t, alias, copy = self._tensors[i], self._aliases[i], self._copies[i]
        swapped = moved and fingerprint(t) != self._layouts[i]
        with torch.inference_mode() if t.is_inference() else contextlib.nullcontext():
            if swapped:  # first: the values and the flag apply to the entry dtype and shape
                t.data = alias
            # ``exact``: views share a version counter, and it misses writes through ``.data``
            written = copy is not None and not (exact and same_values(alias, copy))
            if written:
                alias.copy_(copy)
        if moved and t.is_leaf and t.requires_grad != self._requires_grad[i]:
            t.requires_grad_(self._requires_grad[i])
        # the copy bumped the version counter: this is the entry state now
        self._versions[i] = version_of(t)
        return swapped or written

    def unwritten(self, indices: list[int]) -> list[int]:
        """Those of tensors ``indices`` whose version counter has not moved since recorded."""
        now = versions([self._tensors[i] for i in indices])
        return [i for i, v in zip(indices, now) if v == self._versions[i]]

    def put_back_elsewhere(self, indices: list[int]) -> None:
        """Tensors ``indices`` hold their recorded values again, put back by another restorer
        (whose copy bumped their version counters): their versions now are the recorded ones."""
        for i, v in zip(indices, versions([self._tensors[i] for i in indices])):
            self._versions[i] = v

    def reset(self) -> None:
        """The quick :meth:`restore` between passes (``values=False``)."""
        self.restore(values=False)

    def between_passes(self) -> Callable[[], Any] | None:
        """After the first pass: put back what it changed; :meth:`reset` or None if nothing."""
        return self.reset if self.restore(values=True) else None


@functools.cache
def _slot_names(cls: type) -> tuple[str, ...]:
    """The ``__slots__`` of ``cls`` and its bases (``__dict__``/``__weakref__`` left out)."""
    if cls.__module__ == "builtins" or cls.__module__.startswith("torch"):
        return ()  # a builtin's or torch's slots are not the user's data
    names: list[str] = []
    for base in cls.__mro__:
        slots = base.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return tuple(dict.fromkeys(names))


_MISSING = object()


@contextlib.contextmanager
def snapshot_of(*objs: Any) -> Iterator[Snapshot]:
    """A :class:`Snapshot` of ``objs``, put back at the end of the block (also on error)."""
    snap = Snapshot(*objs)
    try:
        yield snap
    finally:
        snap.restore()
