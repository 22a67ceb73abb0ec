"""Give the user's model back as it went in: every parameter, buffer, gradient, submodule slot,
attribute and ``training`` flag that a profiling pass changed is put back — cheaply.

Timing runs the user's own module thousands of times, so a forward that keeps state
(``self.n += 1``, a batch norm in train mode, an EMA of its weights) would otherwise come back
changed. Copying every tensor up front would double the model's memory, so the guard copies
only what is cheap or known to be written:

- **Structure** (each module's parameter/buffer/submodule/hook slots, its plain attributes and
  its class): shallow copies of a few dicts; a slot a pass *rebound* (``self.n = self.n + 1``)
  gets its original tensor object back, which the pass never touched.
- **Tensor metadata** (``p.data = other`` swaps storage without a version bump): each tensor's
  storage, shape and strides are recorded with a ``detach()`` alias that keeps the original
  storage alive; a swapped tensor is pointed back at it.
- **Tensor values written in place**: detected by the version counter (``t._version``), which
  every in-place aten op bumps. The value from before is taken from one of two snapshots:

  * buffers are cloned up front when they are small in total (``BUFFER_COPY_LIMIT_BYTES``,
    default 64 MiB: batch-norm statistics, counters, masks) — buffers are where forwards keep
    state, and some ops write them without saying so in their schema (``native_batch_norm``);
  * everything else (parameters, large buffers, gradients) is copied *on first write*, by
    :meth:`StateGuard.write_hook`, which the op counter calls before every op of the static
    pass (the first forward of ``profile``; :meth:`StateGuard.watch_writes` is the same as a
    dispatch mode of its own). It sees every op
    whose schema writes an argument (``add_``, ``copy_``, ``out=``, also through ``.data`` or a
    view, matched by storage) and the batch-norm ops that write their running statistics, and
    clones the tensor just before the first write. The timed passes run the same forward on the
    same inputs, so they write the same tensors; a tensor they write that the first pass did not
    cannot be restored and is named in a ``ModelProfWarning``.

Restoring touches only what changed. Nested guards on the same model in the same thread share
the outermost one (``analyze`` inside ``profile``), which restores once, at its end — also when
the block raises or is interrupted (``KeyboardInterrupt``).

Not covered: Python containers mutated in place (a list attribute appended to), writes that
bypass the dispatcher (through ``t.numpy()``) and writes inside the body of a higher-order
operator (``cond``, ``flex_attention``: functional by contract; the write watch passes them
through); state changed by *another thread* meanwhile is overwritten by the restore.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import is_lazy
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["BUFFER_COPY_LIMIT_BYTES", "StateGuard", "preserved_state", "set_training"]

BUFFER_COPY_LIMIT_BYTES = 64 * 2**20
"""Buffers are cloned up front when all of them together take at most this many bytes."""

# nn.Module's own registries: restored by content (they are mutated in place, never rebound)
_SLOTS = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
          "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
          "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
          "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
          "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")

# ops whose schema does not say that they write their running statistics: arguments 3 and 4,
# written when argument 5 (``training`` / ``use_input_stats``) is true
_UNDECLARED_WRITES = frozenset({
    "aten::native_batch_norm", "aten::batch_norm", "aten::_batch_norm_impl_index",
    "aten::cudnn_batch_norm", "aten::miopen_batch_norm", "aten::instance_norm",
})
_RUNNING_STATS = (3, 4)

_active = threading.local()  # id(model) -> the outermost StateGuard of this thread


def _storage_key(t: torch.Tensor, device: torch.device | None = None) -> int | None:
    """The address of ``t``'s storage, or None where there is none to protect (meta and fake
    tensors, wrapper subclasses without a storage)."""
    if (device or t.device).type == "meta" or isinstance(t, FakeTensor):
        return None
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None
    return ptr or None


_PLAIN = (torch.Tensor, nn.Parameter, nn.Buffer) if hasattr(nn, "Buffer") else \
    (torch.Tensor, nn.Parameter)


def _layout(t: torch.Tensor) -> tuple:
    """Storage, shape, strides, offset, dtype, device: what ``p.data = other`` changes."""
    if type(t) in _PLAIN:      # dense tensors, the common case (called twice per tensor): direct
        device = t.device
        if device.type != "meta":
            try:
                return (t.untyped_storage().data_ptr() or None,
                        (t.shape, t.stride(), t.storage_offset()), t.dtype, device)
            except (RuntimeError, NotImplementedError, TypeError):
                pass           # nested tensors (no strides): as below
    try:
        geometry: tuple = (t.shape, t.stride(), t.storage_offset())
    except (RuntimeError, NotImplementedError, TypeError):
        geometry = ()  # nested and wrapper tensors: no strides to compare
    device = t.device
    return (_storage_key(t, device), geometry, t.dtype, device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return bool(torch.equal(a, b))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


@dataclasses.dataclass(eq=False, slots=True)
class _Tracked:
    """One distinct tensor of the model as it was on entry."""

    name: str
    tensor: torch.Tensor
    version: int
    layout: tuple
    alias: torch.Tensor                 # the original storage, kept even if ``.data`` is swapped
    requires_grad: bool
    snapshot: torch.Tensor | None = None
    seen_write: bool = False            # the first-write watch copied it before a write


@dataclasses.dataclass(eq=False, slots=True)
class _ModuleState:
    module: nn.Module
    cls: type
    attrs: dict[str, Any]
    slots: dict[str, Any]          # the registries that held something, copied
    ids: tuple[int, ...] = ()      # id() of every attribute value, in order: the fast check
    empty: tuple[str, ...] = ()    # the registries that were empty


class _WriteHook:
    """Called before every op of the first forward: copies a tracked tensor just before the
    first op that writes it (copy on first write). The op counter calls it from its own
    ``__torch_dispatch__`` (one Python dispatch mode for both, not two stacked: a second mode
    costs about 20 % of a resnet50 static pass); :class:`_WriteWatch` wraps it as a mode of its
    own for use without the counter.

    Higher-order operators (``flex_attention``, ``cond``, ``while_loop``, ...) pass through:
    their bodies are functional (they write none of their inputs)."""

    def __init__(self, guard: StateGuard) -> None:
        self.guard = guard
        self._writes: dict[Any, tuple[int, ...]] = {}

    def _written(self, func: Any) -> tuple[int, ...]:
        found = self._writes.get(func)
        if found is None:
            if isinstance(func, torch._ops.HigherOrderOperator):
                found = ()
            else:
                schema = func._schema
                found = tuple(i for i, a in enumerate(schema.arguments)
                              if a.alias_info is not None and a.alias_info.is_write)
                found = found or (_RUNNING_STATS if schema.name in _UNDECLARED_WRITES else ())
            self._writes[func] = found
        return found

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> None:
        written = self._written(func)
        if written is _RUNNING_STATS and len(args) > 5 and args[5] is False:
            return  # a batch/instance norm using its running statistics: it writes none
        if written:
            schema_args = func._schema.arguments
            for i in written:
                if i < len(args):
                    value = args[i]
                else:
                    value = kwargs.get(schema_args[i].name)
                self.guard._before_write(value)


class _WriteWatch(TorchDispatchMode):
    """:class:`_WriteHook` as a dispatch mode of its own (a mode that refused higher-order
    operators would make any model with parameters that calls one fail under ``profile``)."""

    supports_higher_order_operators = True

    def __init__(self, hook: _WriteHook) -> None:
        super().__init__()
        self.hook = hook

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.hook(func, args, kwargs)
        return func(*args, **kwargs)


class StateGuard:
    """What the model looked like on entry, and how to put it back (see the module docstring)."""

    def __init__(self, model: nn.Module, *,
                 buffer_copy_limit_bytes: int = BUFFER_COPY_LIMIT_BYTES) -> None:
        self.model = model
        self.modules: list[_ModuleState] = []
        self.tracked: list[_Tracked] = []
        self._by_storage: dict[int, list[_Tracked]] = {}
        self._grads: list[tuple[nn.Parameter, torch.Tensor | None]] = []
        self.unrestored: list[str] = []
        self.restored: list[str] = []
        #: what the walk saw on the way, for callers that would otherwise walk the model again:
        #: the lazy (uninitialised) parameters and buffers by name, and the distinct tensors in
        #: parameter slots (as ``model.parameters()``, lazy ones left out)
        self.lazy: list[str] = []
        self.parameters: list[torch.Tensor] = []
        params_seen: set[int] = set()
        seen: dict[int, _Tracked] = {}
        buffers: list[_Tracked] = []
        for prefix, m in model.named_modules(remove_duplicate=True):
            attrs = dict(m.__dict__)
            # the registries' contents (most are empty hook dicts: nothing to copy)
            slots = {}
            empty = []
            for k in _SLOTS:
                v = attrs.get(k)
                if v:
                    slots[k] = v.copy() if isinstance(v, (dict, set)) else v
                elif isinstance(v, (dict, set)):
                    empty.append(k)
            self.modules.append(_ModuleState(m, type(m), attrs, slots,
                                             tuple(map(id, attrs.values())), tuple(empty)))
            for kind, table in (("param", m._parameters), ("buffer", m._buffers)):
                for key, t in table.items():
                    if t is None:
                        continue
                    if is_lazy(t):  # no values yet (the slot itself is restored)
                        self.lazy.append(f"{prefix}.{key}" if prefix else key)
                        continue
                    if kind == "param" and id(t) not in params_seen:
                        params_seen.add(id(t))
                        self.parameters.append(t)
                    if id(t) in seen:
                        continue
                    tr = self._track(f"{prefix}.{key}" if prefix else key, t)
                    seen[id(t)] = tr
                    if kind == "buffer":
                        buffers.append(tr)
                    elif isinstance(t, nn.Parameter):
                        self._grads.append((t, t.grad))
                        if t.grad is not None and id(t.grad) not in seen:
                            seen[id(t.grad)] = self._track(f"{tr.name}.grad", t.grad)
        total = sum(b.tensor.numel() * b.tensor.element_size() for b in buffers
                    if b.layout[0] is not None)
        if total <= buffer_copy_limit_bytes:
            for b in buffers:
                self._snapshot(b)

    def _track(self, name: str, t: torch.Tensor) -> _Tracked:
        tr = _Tracked(name, t, t._version, _layout(t), t.detach(), t.requires_grad)
        self.tracked.append(tr)
        key = tr.layout[0]
        if key is not None:
            self._by_storage.setdefault(key, []).append(tr)
        return tr

    @staticmethod
    def _snapshot(tr: _Tracked) -> None:
        if tr.snapshot is None and tr.layout[0] is not None:  # it had a storage on entry
            tr.snapshot = tr.alias.clone()  # the alias is detached: the clone records no graph

    def _before_write(self, value: Any) -> None:
        if isinstance(value, (list, tuple)):
            for v in value:
                self._before_write(v)
            return
        if not isinstance(value, torch.Tensor):
            return
        key = _storage_key(value)
        if key is None:
            return
        for tr in self._by_storage.get(key, ()):
            self._snapshot(tr)
            tr.seen_write = True

    def write_hook(self) -> _WriteHook | None:
        """Copy-on-first-write as a callable ``hook(func, args, kwargs)`` to call before each op
        of the first forward (the op counter takes it: ``OpCounter(..., before_op=hook)``), or
        None when nothing is tracked."""
        return _WriteHook(self) if self._by_storage else None

    @contextlib.contextmanager
    def watch_writes(self) -> Iterator[None]:
        """Copy-on-first-write for the block, as a dispatch mode of its own (see module doc).
        Enter it *outside* other dispatch modes (before them), so that its copies are not
        counted as the model's ops."""
        hook = self.write_hook()
        if hook is None:
            yield
            return
        with _WriteWatch(hook):
            yield

    # -- checking and restoring ---------------------------------------------------------------
    def changed(self) -> list[str]:
        """Names of tracked tensors written in place or swapped since entry."""
        return [tr.name for tr in self.tracked
                if tr.tensor._version != tr.version or _layout(tr.tensor) != tr.layout]

    def restore(self) -> None:
        """Put back everything that changed. Records ``restored`` and ``unrestored`` names."""
        for ms in self.modules:
            self._restore_module(ms)
        for p, grad in self._grads:
            if p.grad is not grad:
                p.grad = grad
        with torch.no_grad():
            for tr in self.tracked:
                self._restore_tensor(tr)
        if self.unrestored:
            from .profile import ModelProfWarning

            warnings.warn(
                f"modelprof: the model's forward changed {', '.join(self.unrestored[:5])}"
                f"{' and more' if len(self.unrestored) > 5 else ''} in place during timing, "
                "but not in the first (static) pass, so no copy was kept to restore it",
                ModelProfWarning, stacklevel=4)

    @staticmethod
    def _restore_module(ms: _ModuleState) -> None:
        m = ms.module
        if type(m) is not ms.cls:
            m.__class__ = ms.cls
        current, attrs = m.__dict__, ms.attrs
        # the same attribute objects under the same names (the originals are alive in
        # ``attrs``, so their ids cannot have been reused): only the registries' contents to check
        unchanged = tuple(map(id, current.values())) == ms.ids and tuple(current) == tuple(attrs)
        if not unchanged:
            if len(current) != len(attrs) or current.keys() != attrs.keys():
                for k in [k for k in current if k not in attrs]:
                    del current[k]
            for k, v in attrs.items():
                if current.get(k, _MISSING) is not v:
                    current[k] = v
        # the registry objects are the originals now; their contents as on entry
        if any(map(current.get, ms.empty)):
            for k in ms.empty:
                current[k].clear()
        for k, saved in ms.slots.items():
            live = current[k]
            if isinstance(saved, set):
                if live != saved:
                    live.clear()
                    live.update(saved)
            elif isinstance(saved, dict):
                if len(live) != len(saved) or any(live.get(n, _MISSING) is not v
                                                  for n, v in saved.items()):
                    live.clear()
                    live.update(saved)

    def _restore_tensor(self, tr: _Tracked) -> None:
        t = tr.tensor
        if t.requires_grad != tr.requires_grad and t.is_leaf:
            t.requires_grad_(tr.requires_grad)
        swapped = _layout(t) != tr.layout
        # the version counter misses writes through ``.data`` (a fresh counter): the watch saw
        # those, and a small up-front copy is compared by value
        written = (t._version != tr.version or tr.seen_write
                   or (tr.snapshot is not None and not _same(tr.alias, tr.snapshot)))
        if not swapped and not written:
            return
        if swapped:
            t.data = tr.alias
        if written:
            if tr.snapshot is None:
                if tr.layout[0] is not None:
                    self.unrestored.append(tr.name)
                return
            tr.alias.copy_(tr.snapshot)
        self.restored.append(tr.name)


_MISSING = object()


@contextlib.contextmanager
def preserved_state(model: Any, **options: Any) -> Iterator[StateGuard | None]:
    """Restore ``model`` on leaving the block (also on an exception or ``KeyboardInterrupt``).

    Re-entrant: inside an active guard for the same model in the same thread, yields that guard
    and restores nothing (the outermost one does). Yields None for a non-module.
    """
    if not isinstance(model, nn.Module):
        yield None
        return
    guards: dict[int, StateGuard] = _active.__dict__.setdefault("guards", {})
    outer = guards.get(id(model))
    if outer is not None and outer.model is model:
        yield outer
        return
    guard = StateGuard(model, **options)
    guards[id(model)] = guard
    try:
        yield guard
    finally:
        del guards[id(model)]
        guard.restore()


_MODULE_TRAIN = nn.Module.train


def set_training(model: nn.Module, mode: bool) -> None:
    """``model.train(mode)``; where the model refuses it (a ``torch.export`` module raises
    NotImplementedError: its graph is fixed, the flag changes nothing it computes), the flags
    are set directly, as ``nn.Module.train`` would. Nothing is called when every module is
    in that mode already and none overrides ``train`` (the common eval case; ``train()``
    recurses in Python, and an override may do more than set flags: freeze a batch norm)."""
    if all(m.training is mode and type(m).train is _MODULE_TRAIN for m in model.modules()):
        return
    try:
        model.train(mode)
    except NotImplementedError:
        for m in model.modules():
            m.training = mode
