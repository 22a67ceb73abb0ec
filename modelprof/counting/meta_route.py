"""A counting-only CPU forward counted on the meta device: the same report, no kernels run.

``profile(model, inputs=x, timing=False)`` on the CPU spends most of its time in the model's
kernels, which the counts do not need: every count follows from shapes, dtypes, strides and the
ops run. So where it can be trusted, the static pass runs a *meta twin* of the user's module
(``meta_twin``: a structural copy whose parameters and buffers are meta stand-ins, with the same
classes, attributes, hooks and names; nothing of the user's module is changed, so another thread
using it meanwhile sees it as it is) on meta copies of the inputs (same shapes, dtypes and
strides), and counts what the CPU would run:

* ``F.scaled_dot_product_attention`` as the CPU's fused kernel (``counting.meta_sdpa``, also
  inside ``nn.MultiheadAttention``'s slow path), ``t[i:j] = 2.0`` as the CPU sets an item;
* ``nn.MultiheadAttention``'s fast path (``torch._native_multi_head_attention``), which the
  module refuses for meta tensors and under any torch-function mode: for a self-attention call
  the SDPA mode is taken off the stack and meta passes the module's device check
  (``cpu_fast_paths``); a call that then still takes the slow path, or a self-attention slow
  path the route did not see, makes the meta forward untrusted.

It is tried only when nothing in reach could make the meta forward differ: plain CPU tensors
as inputs (nested in lists, tuples and dicts beside plain scalars; none of them the model's
own, none requiring grad, conjugate, negative or an inference tensor), plain strided CPU
parameters and buffers, no other tensor or packed weight among the modules' attributes, no
module with a fast path of its own that checks the device (``nn.TransformerEncoderLayer``,
``nn.TransformerEncoder``), no recurrent layer (oneDNN's kernel on the CPU) nor a subclass of
``nn.MultiheadAttention``, no module of torchvision's detectors (their NMS has no meta kernel:
the attempt would fail late), no forward hook of the user's (it would see meta tensors), no
``__slots__`` (a twin copies the ``__dict__``), no deterministic algorithms (``F.interpolate``
decomposes off the CPU), no inference mode, eval mode under ``no_grad``, no amp,
channels_last, registry, training step, process group, TorchScript or ``torch.compile``.

The meta forward is discarded — everything it made, its warnings included (re-emitted only
when its result is used), the modules' attributes put back — and the real pass runs when it
raises because it is on meta (a data-dependent branch: ``.item()``, boolean-mask indexing,
``nonzero``; an op with no meta kernel), because ``as_cpu`` does not trust it (a CPU tensor of
one dimension or more met inside the forward, e.g. a weight a closure holds; a channels-last
convolution; ``embedding_bag``; the model's own code reading ``x.is_cpu``; a recurrent op; an
``nn.MultiheadAttention`` on its slow path), or because it called a module of the user's model,
not its twin, through a reference the twin does not follow; or when a formula asked for tensor
values (``formulas.values.has_values``: grouped-matmul offsets, a
``cond`` predicate). An exception the model's own code raises (the innermost frame neither
torch's nor modelprof's, no mention of meta) is the model's, and raised as the real pass would
(a second forward could differ: a model counting its calls), with a note on the route. Another
thread calling the model's modules while the twin runs is refused as the real pass refuses it
(``runtime.hooks``). What the attempt stored in mutable objects the twin shares with the
model (a memo in a ``defaultdict``) is taken out again (``_put_back``). Not seen: a forward
that branches on ``x.device.type`` or ``str(x.device)`` (``x.device`` is read everywhere to
make tensors beside ``x``), and a module-level memo the forward fills (it keeps meta tensors):
``MODELPROF_STATIC_ROUTE=real`` counts such a model on the CPU.

It is the default; ``MODELPROF_STATIC_ROUTE=real`` turns it off. ``report.env["static_route"]``
says which ran (``"meta"`` or ``"real"``).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import operator
import os
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import activation as _activation
from torch.nn.modules import module as _module

from modelprof.counting.formulas.values import values_asked
from modelprof.counting.meta_sdpa import FusedMetaSDPA, MetaUntrusted, as_cpu, in_library
from modelprof.runtime.guard import MODULE_REGISTRIES, restore_modules
from modelprof.runtime.hooks import module_hooks
from modelprof.runtime.inputs import ModelInputs

__all__ = ["ROUTE_ENV", "cpu_fast_paths", "forget", "meta_allowed", "meta_inputs", "meta_twin",
           "model_fits", "on_meta"]

#: ``real``: always count with the real kernels (by default a counting-only CPU profile tries
#: the meta route first)
ROUTE_ENV = "MODELPROF_STATIC_ROUTE"
# modules whose own fast path checks the device inline (the meta forward would take another);
# recurrent layers, which the CPU runs as oneDNN's kernel (refused in the forward too)
_UNTRUSTED = (nn.TransformerEncoderLayer, nn.TransformerEncoder, nn.RNNBase)
# modules from packages whose models are known to fall back after most of the forward, where
# the attempt would only add its cost: torchvision's detectors (their non-maximum suppression,
# ``torchvision::nms``, has no meta kernel, and runs after the backbone)
_FALLS_BACK = ("torchvision.models.detection.",)
_SCALARS = (int, float, bool, str, type(None))
_PLAIN = (torch.Tensor, nn.Parameter)
_STRIDED = torch.strided
_META = torch.device("meta")
#: the models whose meta attempt fell back: a data-dependent model (a detector's NMS) would fail
#: again, so their next count goes straight to the real pass (the route is only a speed-up)
_FELL_BACK: weakref.WeakSet = weakref.WeakSet()


def meta_allowed() -> bool:
    """Whether the meta route may be tried: unless ``MODELPROF_STATIC_ROUTE=real``."""
    return os.environ.get(ROUTE_ENV, "").strip().lower() != "real"


def forget(model: nn.Module) -> None:
    """Try the meta route for ``model`` again, though its attempt fell back before."""
    _FELL_BACK.discard(model)


def model_fits(model: nn.Module, guard: Any) -> bool:
    """Whether nothing in ``model`` (as ``guard``'s walk saw it) could make its meta forward
    count other than its CPU forward."""
    if hasattr(model, "_orig_mod") or isinstance(model, torch.jit.ScriptModule) or \
            torch.are_deterministic_algorithms_enabled() or torch.is_inference_mode_enabled() \
            or guard.lazy or guard.script_attrs:
        return False
    for kind in set(map(type, guard.names)):   # (slots: a twin copies only the __dict__)
        if issubclass(kind, _UNTRUSTED) or (issubclass(kind, nn.MultiheadAttention)
                                            and kind is not nn.MultiheadAttention) or \
                kind.__module__.startswith(_FALLS_BACK) or _has_slots(kind):
            return False
    # a tensor (or packed weight) held outside the parameters and buffers stays on the CPU
    if any(issubclass(kind, (torch.Tensor, torch.ScriptObject))
           for kind in guard.attribute_types):
        return False
    # the user's forward hooks would see meta tensors (and keep them)
    if _module._global_forward_hooks or _module._global_forward_pre_hooks or \
            _module._global_buffer_registration_hooks or \
            _module._global_parameter_registration_hooks or \
            _module._global_module_registration_hooks or any(
            m._forward_hooks or m._forward_pre_hooks for m in guard.names):
        return False
    return all(type(t) in _PLAIN and t.is_cpu and t.layout is _STRIDED and not t.is_quantized
               for t in guard.tensors)


def _has_slots(kind: type) -> bool:
    """Whether ``kind`` (or a base) keeps attributes in ``__slots__`` (a twin copies only the
    ``__dict__``)."""
    return any(set(getattr(k, "__slots__", ())) - {"__dict__", "__weakref__"}
               for k in kind.__mro__ if k is not object and "__slots__" in vars(k))


def meta_inputs(mi: ModelInputs, model_tensors: Iterable[torch.Tensor]) -> ModelInputs | None:
    """``mi`` on the meta device (each distinct tensor once, its strides kept), or None where
    an input is no plain CPU tensor, scalar, list, tuple or dict, or is the model's own, or is
    one whose ``requires_grad``, conjugate or negative bit, or inference flag a stand-in would
    not keep."""
    own = set(map(id, model_tensors))
    done: dict[int, torch.Tensor] = {}

    def conv(obj: Any) -> Any:
        kind = type(obj)
        if kind is torch.Tensor:
            new = done.get(id(obj))
            if new is None:
                # (a forward may read what a stand-in would not keep: grad, conj, inference)
                if id(obj) in own or not obj.is_cpu or obj.layout is not _STRIDED or \
                        obj.is_nested or obj.is_quantized or obj.requires_grad or \
                        obj.is_conj() or obj.is_neg() or obj.is_inference():
                    raise MetaUntrusted
                new = done[id(obj)] = torch.empty_strided(obj.shape, obj.stride(),
                                                          dtype=obj.dtype, device=_META)
            return new
        if kind in _SCALARS:
            return obj
        if kind is tuple or kind is list:
            return kind(map(conv, obj))
        if kind is dict:
            return {k: conv(v) for k, v in obj.items()}
        raise MetaUntrusted

    try:
        args, kwargs = conv(mi.args), conv(mi.kwargs)
    except MetaUntrusted:
        return None
    return dataclasses.replace(mi, args=args, kwargs=kwargs, device=_META)


def meta_twin(guard: Any) -> tuple[nn.Module, dict[nn.Module, str]]:
    """A structural copy of the model ``guard`` walked, on meta: (its root, its modules with
    their names, as ``guard.names``). Each module is a new object of the same class whose
    ``__dict__`` is a copy of the original's, with its parameters and buffers meta stand-ins
    (shapes, strides, dtypes, parameter-ness and ``requires_grad`` kept; one per distinct
    tensor, so ties stay tied), its submodules their twins, its registries and its lists,
    tuples, dicts and sets copied (``_copied``: a forward filling a cache there fills the
    twin's). Every other attribute is the original's object: a module of the model reached
    through one is the user's own, which the meta forward must not call (``on_meta``), and
    which another thread holding it sees unchanged. Nothing of the original is changed."""
    twins: dict[int, nn.Module] = {}
    for m in guard.names:
        twin = object.__new__(type(m))
        object.__setattr__(twin, "__dict__", m.__dict__.copy())
        twins[id(m)] = twin
    stand_ins: dict[int, torch.Tensor] = {}

    def tensor(t: Any) -> Any:
        if t is None:
            return None
        new = stand_ins.get(id(t))
        if new is None:
            new = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
            if isinstance(t, nn.Parameter):
                new = nn.Parameter(new, requires_grad=t.requires_grad)
            elif t.requires_grad:
                new.requires_grad_(True)
            stand_ins[id(t)] = new
        return new

    names: dict[nn.Module, str] = {}
    budget = [_COPY_LIMIT]
    for m, name in guard.names.items():
        twin = twins[id(m)]
        names[twin] = name
        d = twin.__dict__
        for key, value in d.items():
            if key == "_parameters" or key == "_buffers":
                d[key] = type(value)((k, tensor(v)) for k, v in value.items())
            elif key == "_modules":
                d[key] = type(value)((k, None if v is None else twins[id(v)])
                                     for k, v in value.items())
            elif type(value) in _CONTAINERS or key in MODULE_REGISTRIES:
                d[key] = _copied(value, budget, 0)
    return twins[id(guard.model)], names


# containers a twin copies (their items as they are), how deep, and how many items in all
_CONTAINERS = (list, tuple, dict, set, collections.OrderedDict)
_COPY_DEPTH = 4
_COPY_LIMIT = 100_000


def _copied(value: Any, budget: list[int], depth: int) -> Any:
    """``value`` with its nested lists, tuples, dicts and sets copied (raises ``MetaUntrusted``
    past ``_COPY_DEPTH`` levels or ``_COPY_LIMIT`` items: the real pass counts then)."""
    kind = type(value)
    if kind not in _CONTAINERS and not isinstance(value, (dict, set)):
        return value
    budget[0] -= len(value)
    if depth > _COPY_DEPTH or budget[0] < 0:
        raise MetaUntrusted("attributes too deep or too large to copy")
    if isinstance(value, dict):
        copy = value.copy()   # (a registry's own dict type kept)
        for k, v in copy.items():
            if type(v) in _CONTAINERS:
                copy[k] = _copied(v, budget, depth + 1)
        return copy
    items = [_copied(v, budget, depth + 1) if type(v) in _CONTAINERS else v for v in value]
    return kind(items)


def on_meta(count: Callable[[nn.Module, ModelInputs], Any], mi: ModelInputs,
            guard: Any) -> Any:
    """``count(the model's meta twin, meta inputs)`` (``meta_twin``) and its warnings
    re-emitted, or None (nothing it made kept) where the meta forward raised or cannot be
    trusted: it called a module of the model itself (a reference the twin does not follow),
    met a CPU tensor of one dimension or more, or anything else ``as_cpu`` refuses. An
    exception the model's own code raised (not torch's, nor modelprof's), whose message does
    not mention meta, is the model's, and raised (with a note on the route). Another
    thread calling the model's modules meanwhile is refused as the real pass refuses it
    (``runtime.hooks``): profiling puts the model's state back at the end. A model whose
    attempt fell back once is not tried again (``_FELL_BACK``)."""
    meta = meta_inputs(mi, guard.tensors) if guard.model not in _FELL_BACK else None
    if meta is None:
        return None
    try:
        twin, names = meta_twin(guard)
    except Exception:   # noqa: BLE001 - a module the copy cannot make: the real pass counts
        _FELL_BACK.add(guard.model)
        return None
    shared = _shared_state(guard)   # what the twin shares with the model, put back after
    if shared is None:
        _FELL_BACK.add(guard.model)
        return None
    state = guard.module_state()   # (what the forward may still reach of the original)
    failure = result = None
    try:
        with _this_threads_warnings() as caught, \
                module_hooks(guard.model, _untrusted, _ignore, guard.names):
            try:
                with as_cpu(), cpu_fast_paths(names), values_asked() as asked:
                    result = count(twin, meta)
                if asked:   # a formula's count depends on values the meta tensors do not have
                    raise MetaUntrusted("a formula asked for tensor values")
            except Exception as e:   # noqa: BLE001 - any failure on meta: the real kernels
                failure = e
    finally:
        _put_back(shared)
    if failure is not None:
        restore_modules(state)
        if not _the_models_own(failure):
            _FELL_BACK.add(guard.model)
            return None
    _reemit(caught)
    if failure is not None:
        failure.add_note("(modelprof counted this forward on a meta copy of the model; if it "
                         "checks its device, MODELPROF_STATIC_ROUTE=real counts it on the CPU)")
        raise failure
    return result


def _the_models_own(e: BaseException) -> bool:
    """Whether ``e`` (or what it wraps) was raised by the model's own code, not because the
    tensors were meta: the real pass would raise it too, and a second forward could differ (a
    model counting its calls), so it is raised."""
    while e.__cause__ is not None:
        e = e.__cause__
    if isinstance(e, (MetaUntrusted, NotImplementedError)) or "meta" in str(e).lower():
        return False
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not in_library(tb.tb_frame.f_code.co_filename)


@contextlib.contextmanager
def _this_threads_warnings() -> Iterator[list]:
    """The warnings this thread raises in the block, kept and not shown; another thread's are
    shown as they come. The filters stay the user's; what the block marks as shown ("default",
    "once") is forgotten when it ends (``catch_warnings`` bumps the filters' version, which
    empties every registry, the "once" one included), so that what is re-emitted, or the real
    pass after a failed attempt, shows it."""
    caught: list = []
    owner = threading.get_ident()
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if threading.get_ident() == owner:
                caught.append(warnings.WarningMessage(message, category, filename, lineno,
                                                      file, line))
            else:
                shown(message, category, filename, lineno, file, line)
        warnings.showwarning = show
        yield caught


def _reemit(caught: list) -> None:
    """Show the warnings a counted attempt kept, each under its module's name (for the user's
    ``module=`` filters), as the forward would have shown them."""
    if not caught:
        return
    by_file = {getattr(m, "__file__", None): name for name, m in list(sys.modules.items())}
    for w in caught:
        module = by_file.get(w.filename) or os.path.splitext(os.path.basename(w.filename))[0]
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module=module,
                               source=w.source)


# what ``_shared_state`` does not walk into: atoms, and what is handled elsewhere
_OPAQUE = (nn.Module, torch.Tensor, type, str, bytes, int, float, complex, bool, type(None),
           torch.dtype, torch.device, torch.memory_format, torch.layout, types.ModuleType,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, range, slice)
_SHARED_LIMIT = 100_000   # items walked, in all: past it, the route is not tried
_GONE = object()


def _shared_state(guard: Any) -> list[tuple[Any, Any]] | None:
    """Each mutable object the twin shares with the model (reached from the modules'
    attributes: dicts, lists, deques and sets of any class, and plain objects' ``__dict__``s,
    however nested) with a copy of its contents, for ``_put_back``; None past ``_SHARED_LIMIT``
    items. A forward that stores a tensor there (a memo in a ``defaultdict``, ``ns.last = y``)
    stores a meta tensor on the meta route, which the user's next forward would meet."""
    seen: set[int] = set()
    found: list[tuple[Any, Any]] = []
    budget = _SHARED_LIMIT
    todo = [v for m in guard.names for k, v in m.__dict__.items()
            if k not in MODULE_REGISTRIES and not isinstance(v, _OPAQUE)]
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, dict):
            items: Any = dict(v)
            found.append((v, items))
            inner: Any = items.values()
        elif isinstance(v, (list, collections.deque, set, frozenset, tuple)):
            items = list(v)
            if not isinstance(v, (tuple, frozenset)):
                found.append((v, items))
            inner = items
        elif isinstance(getattr(v, "__dict__", None), dict):
            items = dict(vars(v))
            found.append((vars(v), items))
            inner = items.values()
        else:
            continue
        budget -= len(items) + 1
        if budget < 0:
            return None
        todo.extend(x for x in inner if not isinstance(x, _OPAQUE))
    return found


def _put_back(shared: list[tuple[Any, Any]]) -> None:
    """Take out of each object ``_shared_state`` read what the attempt put there: a meta tensor
    (alone, or in a container) it did not hold before, the value before put back where there
    was one. Nothing else is touched: another thread may be changing these objects."""
    for obj, items in shared:
        if isinstance(obj, dict):
            for k in [k for k, v in list(obj.items()) if v is not items.get(k, _GONE) and
                      _meta_in(v)]:
                if k in items:
                    obj[k] = items[k]
                else:
                    del obj[k]
            continue
        before = set(map(id, items))
        stale = [x for x in obj if id(x) not in before and _meta_in(x)]
        if not stale:
            continue
        gone = set(map(id, stale))
        kept = [x for x in obj if id(x) not in gone]
        if isinstance(obj, list):
            obj[:] = kept
        else:   # a deque or a set
            obj.clear()
            obj.update(kept) if isinstance(obj, set) else obj.extend(kept)


def _meta_in(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is a meta tensor, or a container holding one (four levels down)."""
    if isinstance(value, torch.Tensor):
        return value.is_meta
    if depth > 4:
        return False
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (tuple, list, set, collections.deque)):
        return False
    return any(_meta_in(x, depth + 1) for x in value)


def _untrusted(module: nn.Module, *_: Any) -> None:
    """A module of the model itself, not its twin, called by the meta forward in this thread."""
    raise MetaUntrusted(f"the meta forward called the model's own {type(module).__name__}")


def _ignore(*_: Any) -> None:
    return None


@contextlib.contextmanager
def cpu_fast_paths(modules: Iterable[nn.Module]) -> Iterator[None]:
    """``nn.MultiheadAttention`` self-attention calls of ``modules`` (query, key and value one
    positional tensor) take the fast path on meta as on the CPU: the SDPA mode off the stack
    for the call, meta passing the device check; a call that still takes the slow path raises
    ``MetaUntrusted`` when it returns."""
    attention = {id(m) for m in modules if type(m) is nn.MultiheadAttention}
    if not attention:
        yield
        return
    original = _activation._check_arg_device
    calls: list[list] = []    # per running call: [module, the popped mode, the check ran]
    owner, get_ident = threading.get_ident(), threading.get_ident

    def check(x: Any) -> bool:   # (patched for every thread: another's calls pass through)
        if get_ident() != owner:
            return original(x)
        if calls:
            calls[-1][2] = True
        return original(x) or (x is not None and x.device.type == "meta")

    def pre(module: nn.Module, args: tuple) -> None:
        if id(module) in attention and len(args) >= 3 and args[0] is args[1] is args[2] and \
                get_ident() == owner:
            mode = torch.overrides._get_current_function_mode()
            if not isinstance(mode, FusedMetaSDPA) or torch.is_grad_enabled():
                raise MetaUntrusted("another torch-function mode, or grad, is on")
            calls.append([module, torch._C._pop_torch_function_stack(), False])

    def post(module: nn.Module, args: tuple, output: Any) -> Any:
        if not calls or calls[-1][0] is not module:
            return None
        _, mode, checked = calls.pop()
        torch._C._push_on_torch_function_stack(mode)
        # the fast path: the device check reached, and both projections' biases there
        if not checked or module.in_proj_bias is None:
            raise MetaUntrusted("nn.MultiheadAttention took its slow path on meta")
        weights = output[1]
        if isinstance(weights, torch.Tensor) and weights.shape == (0,):
            # no weights asked for: the CPU kernel returns None, its meta kernel an empty tensor
            return (output[0], None)
        return None

    handles = [_module.register_module_forward_pre_hook(pre),
               _module.register_module_forward_hook(post, always_call=True)]
    _activation._check_arg_device = check
    try:
        yield
    finally:
        _activation._check_arg_device = original
        for handle in handles:
            handle.remove()
