"""Give the user's model back as it went in: every parameter, buffer, gradient, submodule slot,
attribute and ``training`` flag a profiling pass changed is put back, without copying every
tensor up front (that would double the model's memory).

The guard keeps each module's registries, attributes and class (shallow copies), each tensor's
storage and geometry (``p.data = other`` bumps no version) and, for values written in place
(seen by the version counter), a copy: buffers are cloned up front when small in total
(``BUFFER_COPY_LIMIT_BYTES``: forwards keep state there, and ``native_batch_norm`` writes them
without its schema saying so), anything else on its first write in the counted forward
(:meth:`StateGuard.write_hook`). A tensor only a later pass writes cannot be restored and is
named in a ``ModelProfWarning``, unless that pass puts it back itself (:func:`restored_within`:
the optimizer steps of a model timed in place). The tensors are kept by a
:class:`~modelprof.runtime.snapshot.Snapshot`. Nested guards on one model in one thread share
the outermost, which restores once at its end, also on an exception.

Not covered: Python containers mutated in place; writes no version counter sees to a tensor
without a copy; writes inside a higher-order operator's body (functional by contract); state
another thread changes meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import operator
import threading
from collections.abc import Iterator
from itertools import chain, compress, repeat
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin, is_lazy

from modelprof.errors import ModelProfError, ModelProfWarning, warn_user
from modelprof.runtime import compat
from modelprof.runtime.exclusive import exclusive
from modelprof.runtime.snapshot import Snapshot
from modelprof.runtime.tensors import storage_key, versions

__all__ = [
    "BUFFER_COPY_LIMIT_BYTES",
    "MODULE_REGISTRIES",
    "StateGuard",
    "preserved_state",
    "rescan_active",
    "restored_within",
    "set_training",
    "watching_writes",
]

BUFFER_COPY_LIMIT_BYTES = 64 * 2**20
"""Buffers are cloned up front when all of them together take at most this many bytes."""

#: nn.Module's own registries in its ``__dict__``: restored by content (mutated, never rebound)
MODULE_REGISTRIES = tuple(
    """_parameters _buffers _modules _non_persistent_buffers_set _forward_hooks
    _forward_hooks_with_kwargs _forward_hooks_always_called _forward_pre_hooks
    _forward_pre_hooks_with_kwargs _backward_hooks _backward_pre_hooks _state_dict_hooks
    _state_dict_pre_hooks _load_state_dict_pre_hooks _load_state_dict_post_hooks""".split()
)

# ops whose schema does not say that they write their running statistics: arguments 3 and 4,
# written when argument 5 (``training`` / ``use_input_stats``) is true
_UNDECLARED_WRITES = frozenset(
    """aten::native_batch_norm aten::batch_norm aten::_batch_norm_impl_index aten::cudnn_batch_norm
    aten::miopen_batch_norm aten::instance_norm""".split()
)
_RUNNING_STATS = (3, 4)

_active = threading.local()  # id(model) -> the outermost StateGuard of this thread


@dataclasses.dataclass(frozen=True, slots=True)
class TrackedTensor:
    """One distinct tensor of the model as the guard saw it on entry (see ``tracked``)."""

    name: str
    tensor: torch.Tensor
    snapshot: torch.Tensor | None  # its values on entry, where a copy was taken


class _WriteHook:
    """Called before every op of the first forward: copies a tracked tensor just before the
    first op that writes it. The op counter calls it from its own ``__torch_dispatch__`` (a
    second stacked mode costs about 20 % of a static pass). Higher-order operators pass through:
    their bodies are functional."""

    def __init__(self, *watchers: Any) -> None:
        self.watchers = watchers  # each with ``before_write(value)``: a snapshot
        self._writes: dict[Any, tuple[int, ...]] = {}

    def _written(self, func: Any) -> tuple[int, ...]:
        found = self._writes.get(func)
        if found is None:
            if isinstance(func, compat.HigherOrderOperator):
                found = ()
            else:
                schema = compat.op_schema(func)
                found = tuple(
                    i
                    for i, a in enumerate(schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write
                )
                found = found or (_RUNNING_STATS if schema.name in _UNDECLARED_WRITES else ())
            self._writes[func] = found
        return found

    def watches(self, func: Any) -> bool:
        """Whether ``func`` can write an argument (the op counter calls the hook for these only)."""
        return bool(self._written(func))

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> None:
        written = self._written(func)
        if written is _RUNNING_STATS and len(args) > 5 and args[5] is False:
            return  # a batch/instance norm using its running statistics: it writes none
        for i in written:  # (the schema's arguments are built anew at each read: only if needed)
            value = (
                args[i] if i < len(args) else kwargs.get(compat.op_schema(func).arguments[i].name)
            )
            for watcher in self.watchers:
                watcher.before_write(value)


class _WriteWatch(compat.TorchDispatchMode):
    """:class:`_WriteHook` as a dispatch mode of its own, passing higher-order operators."""

    supports_higher_order_operators = True

    def __init__(self, hook: _WriteHook) -> None:
        super().__init__()
        self.hook = hook

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.hook(func, args, kwargs)
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if any(isinstance(f, compat.HigherOrderOperator) for f in self.hook._writes):
                compat.forget_dynamo_skips()  # torch.cond & co. run eagerly again after the watch


def watching_writes(*watchers: Any) -> contextlib.AbstractContextManager:
    """Tell ``watchers`` (each with ``before_write(value)``) of every tensor an op in the block
    is about to write. Enter it *outside* other dispatch modes, so its copies are not counted."""
    return _WriteWatch(_WriteHook(*watchers))


class StateGuard:
    """What the model looked like on entry, and how to put it back (see the module docstring).
    ``watched``: the pass whose first writes are copied (a warning names it)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        buffer_copy_limit_bytes: int = BUFFER_COPY_LIMIT_BYTES,
        watched: str = "the counted forward",
    ) -> None:
        self.model = model
        self.unrestored: list[tuple[str, str]] = []  # (tensor name, the pass that wrote it)
        self.restored: list[str] = []
        # per module: (module, class, non-empty registries, their copies, prefix)
        self._modules: list[tuple[nn.Module, type, tuple[str, ...], list, str]] = []
        self._kept = Snapshot()  # its attributes and registries, and then its tensors
        ordered, buffer_ids = self._walk(record=True)
        self._grad_params = list(
            compress(self.parameters, map(isinstance, self.parameters, repeat(nn.Parameter)))
        )
        self._grads = list(map(operator.attrgetter("grad"), self._grad_params))
        if any(map(operator.is_not, self._grads, repeat(None))):  # each after its parameter
            grads = {id(p): g for p, g in zip(self._grad_params, self._grads) if g is not None}
            ordered = [x for t in ordered for x in ((t, grads[id(t)]) if id(t) in grads else (t,))]
        by_id = dict(zip(map(id, ordered), ordered))  # distinct, in model order, in C
        ts = list(by_id.values())
        self._names: list[str] | None = None  # found when first needed (see _name)
        # the buffers (with a storage) copied up front where all are small, the rest on write
        params = {id(p) for p in self.parameters}
        copy = {key for key in buffer_ids if key not in params and storage_key(by_id[key])}
        small = sum(by_id[k].numel() * by_id[k].element_size() for k in copy)
        small = small <= buffer_copy_limit_bytes
        self._kept.add_tensors(ts, [id(t) in copy for t in ts] if small and copy else False)
        # (phase, version counters when it began): names the pass of an unrestorable write;
        # the first is the pass whose first writes are watched (``watched``)
        self._phases: list[tuple[str, list[int | None]]] = [(watched, versions(ts))]

    def _walk(self, record: bool) -> tuple[list[torch.Tensor], dict[int, torch.Tensor]]:
        """One walk: sets what callers read so they need not walk the model again and, with
        ``record``, each module's state to restore. Returns the parameters and buffers in model
        order (lazy and None left out) and the buffers by id."""
        self.names: dict[nn.Module, str] = {}
        self.has_children: dict[nn.Module, bool] = {}
        self.script_attrs: list[dict[str, Any]] = []
        self.lazy: list[str] = []
        params: list[Any] = []
        buffers: list[Any] = []
        ordered: list[Any] = []
        attributes: list[dict[str, Any]] = []
        for prefix, m in self.model.named_modules(remove_duplicate=True):
            d = m.__dict__
            if record:  # the attributes and the registries holding some, kept by the restorer
                keys = tuple(compress(MODULE_REGISTRIES, map(d.get, MODULE_REGISTRIES)))
                attrs, *copies = self._kept.add_containers([d, *map(d.__getitem__, keys)])
                self._modules.append((m, type(m), keys, copies, prefix))
            else:
                attrs = d
            self.names[m] = prefix
            children = d.get("_modules")
            if children is None:  # kept elsewhere (a traced TorchScript module): ask the module
                self.has_children[m] = next(iter(m.children()), None) is not None
            else:
                self.has_children[m] = bool(children) and any(
                    map(operator.is_not, children.values(), repeat(None))
                )
            attributes.append(attrs)
            params.extend(m._parameters.values())
            buffers.extend(m._buffers.values())
            ordered.extend(m._parameters.values())
            ordered.extend(m._buffers.values())
        # the modules holding a packed weight: isinstance on torch.ScriptObject (a pybind11 type)
        # is slow, so it runs only where the distinct types of all attributes hold one
        kinds = set(map(type, chain.from_iterable(map(dict.values, attributes))))
        script_object = torch.ScriptObject
        if any(issubclass(kind, script_object) for kind in kinds):
            self.script_attrs = [
                attrs
                for attrs in attributes
                if any(map(isinstance, attrs.values(), repeat(script_object)))
            ]
        by_id = dict(zip(map(id, params), params))  # distinct by identity, in order, in C
        by_id.pop(id(None), None)
        buffer_ids = dict(zip(map(id, buffers), buffers))
        buffer_ids.pop(id(None), None)
        types = {*map(type, by_id.values()), *map(type, buffer_ids.values())}
        if any(issubclass(tp, UninitializedTensorMixin) for tp in types):
            self._drop_lazy(by_id, buffer_ids)
            ordered = [t for t in ordered if t is not None and not is_lazy(t)]
        elif any(map(operator.is_, ordered, repeat(None))):
            ordered = [t for t in ordered if t is not None]
        self.parameters: list[torch.Tensor] = list(by_id.values())
        return ordered, buffer_ids

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The model's distinct parameters and buffers (and their gradients) as on entry."""
        return self._kept.tensors

    @property
    def copies(self) -> list[torch.Tensor | None]:
        """Per tensor of ``tensors``, its values on entry, where a copy was taken."""
        return self._kept.copies

    def rescan(self) -> None:
        """Read what ``_walk`` sets from the model as it is now (not what is restored)."""
        self._walk(record=False)

    def _drop_lazy(self, *tables: dict[int, Any]) -> None:
        """Name the lazy parameters and buffers (``self.lazy``) and leave them out."""
        for prefix, m in self.model.named_modules(remove_duplicate=True):
            for table in (m._parameters, m._buffers):
                for key, t in table.items():
                    if is_lazy(t):
                        self.lazy.append(f"{prefix}.{key}" if prefix else key)
        for table in tables:
            for key in [k for k, t in table.items() if is_lazy(t)]:
                del table[key]

    def _name(self, i: int) -> str:
        """The qualified name of tensor ``i`` on entry (``.grad`` for a gradient)."""
        if self._names is None:
            found: dict[int, str] = {}
            for _, _, keys, copies, prefix in self._modules:
                for key, table in zip(keys, copies):
                    if key in ("_parameters", "_buffers"):
                        for k, t in table.items():
                            if t is not None:
                                found.setdefault(id(t), f"{prefix}.{k}" if prefix else k)
            if any(id(t) not in found for t in self.tensors):  # registries kept elsewhere
                for name, t in (
                    *self.model.named_parameters(remove_duplicate=False),
                    *self.model.named_buffers(remove_duplicate=False),
                ):
                    found.setdefault(id(t), name)  # (a traced TorchScript module)
            for p, grad in zip(self._grad_params, self._grads):
                if grad is not None and id(p) in found:
                    found.setdefault(id(grad), f"{found[id(p)]}.grad")
            self._names = [found.get(id(t), "?") for t in self.tensors]
        return self._names[i]

    @property
    def tracked(self) -> list[TrackedTensor]:
        """The distinct tensors guarded (parameters, buffers, gradients), with their copies."""
        return [
            TrackedTensor(self._name(i), t, c)
            for i, (t, c) in enumerate(zip(self.tensors, self._kept.copies))
        ]

    def write_hook(self, *also: Any) -> _WriteHook | None:
        """Copy-on-first-write for the op counter's ``before_op`` (None if nothing is tracked)."""
        watchers = (self._kept, *also) if self._kept.awaits_writes else also
        return _WriteHook(*watchers) if watchers else None

    def watch_writes(self) -> contextlib.AbstractContextManager:
        """Copy-on-first-write for the block, as a dispatch mode of its own."""
        return watching_writes(self._kept) if self._kept.awaits_writes else contextlib.nullcontext()

    # -- checking and restoring ---------------------------------------------------------------
    def restore(self) -> None:
        """Put back everything that changed. Records ``restored`` and ``unrestored`` names."""
        self._kept.put_back_containers()
        for m, cls, keys, _, _ in self._modules:
            _restore_module(m, cls, keys)
        _, restored, lost = self._kept.put_back(values=True, exact=True)
        self.restored += map(self._name, restored)
        self.unrestored += [(self._name(i), self._phase_of(i)) for i in lost]
        if self.unrestored:
            names = [name for name, _ in self.unrestored]
            order = [p for p, _ in self._phases]
            phases = sorted({p for _, p in self.unrestored}, key=order.index)
            warn_user(
                f"modelprof: the model changed {', '.join(names[:5])}"
                f"{' and more' if len(names) > 5 else ''} in place during "
                f"{' and '.join(phases)}, where the first-write watch of {self._phases[0][0]} "
                "could not see it, so no copy was kept to restore it",
                ModelProfWarning,
            )

    @contextlib.contextmanager
    def put_back_within(self, tensors: list[torch.Tensor]) -> Iterator[None]:
        """A block that writes ``tensors`` in place and puts their values back itself before it
        ends (the optimizer steps of a model timed in place, see :func:`restored_within`).
        Those the guard keeps no copy of and whose version counters had not moved from its
        entry to the block's hold their entry values after the block: their versions then are
        taken as the entry's. A write before the block, or to another tensor, is still named."""
        ids = set(map(id, tensors))
        clean = self._kept.unwritten([i for i, t in enumerate(self.tensors) if id(t) in ids])
        try:
            yield
        finally:  # (the block puts them back on an error too)
            self._kept.put_back_elsewhere(clean)

    def begin(self, phase: str) -> None:
        """Say that ``phase`` runs from now on, to name the phase of an unrestorable write."""
        self._phases.append((phase, versions(self.tensors)))

    def _phase_of(self, i: int) -> str:
        """The phase in which tensor ``i``'s version counter first moved (else the last)."""
        ends = [v for _, v in self._phases[1:]] + [versions(self.tensors)]
        for (phase, start), end in zip(self._phases, ends):
            if start[i] != end[i]:
                return phase
        return self._phases[-1][0]


def _restore_module(m: nn.Module, cls: type, keys: tuple[str, ...]) -> None:
    """Put back a module's class and empty the registries that were empty on entry."""
    if type(m) is not cls:
        m.__class__ = cls
    current = m.__dict__
    if tuple(compress(MODULE_REGISTRIES, map(current.get, MODULE_REGISTRIES))) != keys:
        for k in MODULE_REGISTRIES:
            if k not in keys and current.get(k):
                current[k].clear()


def rescan_active(model: nn.Module) -> None:
    """Read ``model``'s tree again into the guard active on it in this thread, if any (its
    names and parameters, not what it restores): a pass swapped modules in it for the block."""
    guard = getattr(_active, "guards", {}).get(id(model))
    if guard is not None and guard.model is model:
        guard.rescan()


@contextlib.contextmanager
def preserved_state(
    model: Any, rescan: bool = False, **options: Any
) -> Iterator[StateGuard | None]:
    """Restore ``model`` on leaving the block (also on ``KeyboardInterrupt``), one thread at a
    time. Inside an active guard of the model in this thread, yields that one (rescanned with
    ``rescan``) and restores nothing. Yields None for a non-module."""
    if not isinstance(model, nn.Module):
        yield None
        return
    guards: dict[int, StateGuard] = _active.__dict__.setdefault("guards", {})
    outer = guards.get(id(model))
    if outer is not None and outer.model is model:
        if rescan:
            outer.rescan()
        yield outer
        return
    with exclusive(model):
        guard = StateGuard(model, **options)
        guards[id(model)] = guard
        try:
            yield guard
        finally:
            del guards[id(model)]
            guard.restore()


@contextlib.contextmanager
def restored_within(tensors: list[torch.Tensor]) -> Iterator[None]:
    """A block that writes ``tensors`` (a model's own) in place and puts their values back
    itself before it ends: the training steps of a model that cannot be copied (DDP, FSDP2,
    DTensor), whose optimizer steps the step timer undoes by its own copy. Every state guard
    active in this thread is told (:meth:`StateGuard.put_back_within`), so that the version
    counters the restore moved are not taken for writes it has no copy to undo."""
    with contextlib.ExitStack() as stack:
        for guard in list(_active.__dict__.get("guards", {}).values()):
            stack.enter_context(guard.put_back_within(tensors))
        yield


_MODULE_TRAIN = nn.Module.train


def set_training(model: nn.Module, mode: bool, modules: list[nn.Module] | None = None) -> None:
    """``model.train(mode)``, the flags set directly where the model refuses it (a
    ``torch.export`` module); skipped when every module is in that mode and none overrides
    ``train``. ``modules``: ``list(model.modules())`` where the caller has it."""
    if all(
        m.training is mode and type(m).train is _MODULE_TRAIN
        for m in (model.modules() if modules is None else modules)
    ):
        return
    try:
        model.train(mode)
    except NotImplementedError:
        for m in model.modules():
            m.training = mode
    except TypeError as e:
        odd = next((m for m in model.modules() if _refuses_mode(m)), None)
        if odd is None:  # a TypeError from inside an override that takes mode: its own
            raise
        name = type(odd).__name__
        raise ModelProfError(
            f"{name}.train() does not take mode (its override has no mode argument), and "
            f"profiling sets eval or train mode with model.train(mode), which passes mode to "
            f"every submodule's train: give the override one (def train(self, mode=True))"
        ) from e


def _refuses_mode(module: nn.Module) -> bool:
    """``module.train`` cannot be called with a mode (an override ``def train(self)``)."""
    try:
        inspect.signature(module.train).bind(False)
    except TypeError:
        return True
    except ValueError:  # no signature to read (a builtin): taken to accept it
        return False
    return False
