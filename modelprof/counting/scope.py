"""Module scope: which module call is running, from forward pre/post hooks, and one
``CallRecord`` per module *call* (a module run twice gives two records)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import torch
from torch import nn

from modelprof.counting.formulas.registry import REGISTRY, FormulaRegistry
from modelprof.counting.instruments import active
from modelprof.counting.sharding import ShardView, current_view
from modelprof.runtime import compat
from modelprof.runtime.device import MemoryStats, PeakTracker
from modelprof.runtime.tensors import (
    is_dtensor,
    iter_tensors,
    storage_key,
    tensor_nbytes,
    tensor_shape,
)

__all__ = ["NOT_CALLED", "CallRecord", "Tracker"]

_UNKNOWN = object()
#: the name of the record holding the parameters of modules the forward never called
NOT_CALLED = "(not called)"


def _made_outside(module: nn.Module, inputs: Any, output: Any) -> bool:
    """Whether ``output`` holds a tensor whose storage is none of ``inputs``' nor ``module``'s
    own parameters' and buffers' (a view of them is theirs): made outside torch, where an op
    ran none. Meta and fake tensors have no storage to tell by: never."""
    own = (inputs, [*module.parameters(recurse=False)], [*module.buffers(recurse=False)])
    known = {storage_key(t) for t in iter_tensors(own)}
    return any(k is not None and k not in known for k in map(storage_key, iter_tensors(output)))


def _shapes_and_bytes(obj: Any) -> tuple[list[tuple[int, ...]], int]:
    """The shape of every tensor in ``obj`` and the bytes of the distinct ones, in one walk
    (a DTensor's local part in the per-rank view: what this rank holds)."""
    if type(obj) is torch.Tensor and not obj.is_nested:  # the common case, without the walk
        return [tuple(obj.shape)], obj.numel() * obj.element_size()
    tensors = list(iter_tensors(obj))
    if any(is_dtensor(t) for t in tensors) and current_view() is ShardView.RANK:
        tensors = [compat.local_tensor(t) for t in tensors]
    distinct = {id(t): t for t in tensors}
    return ([tensor_shape(t) for t in tensors], sum(tensor_nbytes(t) for t in distinct.values()))


@dataclasses.dataclass(slots=True, eq=False)
class CallRecord:
    """One module call. Cost fields are *exclusive*: ops this call ran itself, not its children."""

    index: int
    name: str
    type: str
    call: int
    depth: int
    parent: int | None
    has_submodules: bool
    input_shapes: list[tuple[int, ...]]
    input_bytes: int
    param_bytes: int  # bytes of the parameters the module owns directly (read per call)
    params: int  # parameters charged to this call: owned directly, first use only
    trainable_params: int = 0  # of ``params``, those with requires_grad (the rest are frozen)
    children: list[int] = dataclasses.field(default_factory=list)
    output_shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    output_bytes: int = 0
    macs: int = 0
    flops: int = 0
    madd: int = 0
    op_read_bytes: int = 0
    op_write_bytes: int = 0
    # bytes of the model's buffers the call's own ops read (batch-norm running statistics, a
    # weight held in a buffer), each buffer once per call; ``buffers_read`` holds their ids
    buffer_bytes: int = 0
    buffers_read: set[int] | None = None
    torchstat: dict[str, int] | None = None  # torchstat-view overrides from a module formula
    peak_memory_bytes: int | None = None
    # FLOPs of the ops this call ran itself, by op name; an op without FLOPs (a concat) has 0.
    # Types a row by what it does (Report.by_layer_type).
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    finished: bool = False
    module_id: int = 0
    comm: dict | None = None  # collectives it ran itself: (kind, group size) -> CommStats
    backward_comm: dict | None = None  # the same, run by the backward of this call's nodes
    values: dict[str, Any] | None = None  # the instruments' readings, by column
    tokens: list | None = None  # what the instruments' ``enter`` gave, while it runs
    # a leaf that ran no op yet returned a tensor torch did not make from its
    # inputs or its own tensors: its work ran outside torch (numpy, a C extension), uncounted
    outside: bool = False

    @property
    def collect_op_bytes(self) -> bool:
        return self.has_submodules

    @property
    def only_aliases(self) -> bool:
        """A leaf call that dispatched no op but views, or none (``nn.Identity``,
        ``nn.Flatten``, an eval ``nn.Dropout``): its outputs alias its inputs, it moves no
        bytes (a view is no entry of ``ops``; work done outside torch is no alias)."""
        return not self.children and not self.ops and not self.outside

    @property
    def working_leaf(self) -> bool:
        """A leaf call that ran ops (or work outside torch): its inputs and outputs are
        tensors it holds at once, the memory views' working set (views only hold none)."""
        return not self.children and not self.only_aliases

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.call)


def gathered_bytes(weight: Any, indices: Any, whole: int) -> int:
    """``whole`` bytes read, with the 2-D table ``weight`` counted as the rows ``indices``
    gather (an embedding lookup), not in full."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return whole
    if not isinstance(indices, torch.Tensor):
        return whole
    size = weight.element_size()
    return whole - weight.numel() * size + indices.numel() * weight.shape[1] * size


#: in-place writes into part of a tensor (:func:`scattered_bytes`); a static KV cache's
#: ``index_copy_`` writes one token, not the cache
SCATTERED_WRITES = frozenset(
    {
        "aten.index_copy_.default",  # (self, dim, index, source)
        "aten.index_put_.default",  # (self, indices, values, accumulate)
        "aten._index_put_impl_.default",
    }
)


def scattered_bytes(name: str, args: tuple, whole: tuple[int, int]) -> tuple[int, int]:
    """(read, written) bytes of an in-place write of ``SCATTERED_WRITES``: the indices and the
    values read, the elements written (with ``accumulate``, read too); ``whole``, the inputs
    read and outputs written in full, where the count of elements written is unknown (a boolean
    mask's, which only its values tell)."""
    dest = args[0]
    if not isinstance(dest, torch.Tensor):
        return whole
    size = dest.element_size()
    if name == "aten.index_copy_.default":
        source, index = args[3], args[2]
        written = source.numel() * size
        return index.numel() * index.element_size() + written, written
    indices = [i for i in args[1] if i is not None]
    if not indices or any(i.dtype in (torch.bool, torch.uint8) for i in indices):
        return whole
    picked = torch.broadcast_shapes(*(i.shape for i in indices)).numel()
    rest = math.prod(d for d, i in zip(dest.shape, args[1]) if i is None)
    rest *= math.prod(dest.shape[len(args[1]) :])
    written = picked * rest * size
    accumulate = len(args) > 3 and bool(args[3])
    read = sum(i.numel() * i.element_size() for i in indices) + tensor_nbytes(args[2])
    return read + (written if accumulate else 0), written


def _modules_of(name: str) -> list[str]:
    """``"a.b.weight"`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _outermost(names: list[str], unused: set[str]) -> list[str]:
    """The modules (or parameters) that hold the ``unused`` parameters, outermost first: a
    module all of whose parameters are unused stands for them."""
    total = Counter(m for n in names for m in _modules_of(n))
    idle = Counter(m for n in names if n in unused for m in _modules_of(n))
    shown: list[str] = []
    for n in names:
        if n in unused and not any(n.startswith(s + ".") for s in shown):
            shown.append(next((m for m in _modules_of(n) if idle[m] == total[m]), n))
    return shown


class Tracker:
    """Keeps the stack of running module calls and the list of finished and running records."""

    def __init__(
        self,
        names: dict[nn.Module, str],
        registry: FormulaRegistry | None = None,
        memory_stats: MemoryStats | None = None,
        has_children: dict[nn.Module, bool] | None = None,
        parameters: list[torch.Tensor] | None = None,
        root: nn.Module | None = None,
    ) -> None:
        self.names = names
        self.registry = REGISTRY if registry is None else registry
        self.records: list[CallRecord] = []
        self.stack: list[CallRecord] = []
        self.finished: list[CallRecord] = []  # in completion order
        # where the innermost raising call was, kept until execution goes on (caught) or fails
        self.failure: tuple[list[CallRecord], list[CallRecord]] | None = None
        self.pending_params: dict[int, torch.Tensor] = {}  # not yet charged to any call, by id
        # the model's buffers as the forward sees them (after any functional_call swap), by id
        self.buffers: dict[int, torch.Tensor] = {}
        self._gathers: dict[type, bool] = {}  # whether a module type gathers rows (Embedding)
        self._calls: dict[nn.Module, int] = {}
        self._has_children = (
            has_children
            if has_children is not None
            else {m: next(iter(m.children()), None) is not None for m in names}
        )
        self._memory = PeakTracker(memory_stats) if memory_stats is not None else None
        self._outside: CallRecord | None = None
        self._module_formulas: dict[type, Any] = {}  # torchstat module formula by type, or None
        #: the distinct parameters of ``root`` as the forward will see them, else None (read
        #: from the first call's module)
        self.root_parameters = parameters
        self._root = root
        #: how a sharded model's parameters are charged (``sharding.ParamView``); None if plain
        self.param_view = None
        self._root_order: list[int] = []  # ids of the root's parameters, in parameters() order
        self.instruments = active()  # what else is read per call (none unless asked for)

    @property
    def current(self) -> CallRecord:
        """The innermost running call; ops before any call (a TorchScript module, whose calls
        fire no Python hooks) go to a root record kept aside for that case."""
        if self.stack:
            return self.stack[-1]
        if self.records:  # after the root returned: the user's forward hooks on the root
            return self.records[0]
        if self._outside is None:  # (index, name, type, call, depth, parent, ...): an empty root
            self._outside = CallRecord(0, "", "", 1, 0, None, False, [], 0, 0, 0)
        return self._outside

    def opaque_root(self, model: nn.Module, args: tuple, kwargs: dict, output: Any) -> CallRecord:
        """The one record of a model whose inner calls could not be seen: its ops, inputs,
        outputs and all of its parameters."""
        record = self.current
        record.type = type(model).__name__
        record.input_shapes, record.input_bytes = _shapes_and_bytes((args, kwargs))
        record.output_shapes, record.output_bytes = _shapes_and_bytes(output)
        distinct = {id(p): p for p in model.parameters()}
        record.params = sum(p.numel() for p in distinct.values())
        record.trainable_params = sum(p.numel() for p in distinct.values() if p.requires_grad)
        record.param_bytes = sum(map(tensor_nbytes, distinct.values()))
        record.finished = True
        return record

    def _begin_root(self, module: nn.Module) -> None:
        """At the root call: every parameter and buffer as the forward will see them."""
        given = self.root_parameters if module is self._root else None
        self.pending_params = {id(p): p for p in (module.parameters() if given is None else given)}
        self._root_order = list(self.pending_params)
        self.buffers.clear()  # in place: the counter holds this dict
        self.buffers.update((id(b), b) for b in module.buffers())

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # called at every module call, between the model's kernels: kept lean
        records, stack = self.records, self.stack
        if not records:
            self._begin_root(module)
        self.failure = None  # running on: an exception inside an earlier call was caught
        call = self._calls[module] = self._calls.get(module, 0) + 1
        params = param_bytes = trainable = 0
        view = self.param_view
        pending = self.pending_params
        for p in module._parameters.values():
            if p is None:
                continue
            if view is None:  # (charge(p), inlined: this runs at every call)
                numel = p.numel()
                param_bytes += (
                    numel * p.element_size() if type(p) is nn.Parameter else tensor_nbytes(p)
                )  # a quantized weight: what it stores
                charged = numel if pending.pop(id(p), None) is not None else 0
            else:
                param_bytes += view.read_bytes(p)
                charged = self.charge(p)
            params += charged
            if p.requires_grad:
                trainable += charged
        kind = type(module)
        gathers = self._gathers.get(kind)
        if gathers is None:
            gathers = self._gathers[kind] = issubclass(kind, (nn.Embedding, nn.EmbeddingBag))
        if gathers:  # the rows it gathers, not the whole table
            indices = args[0] if args else kwargs.get("input")
            param_bytes = gathered_bytes(getattr(module, "weight", None), indices, param_bytes)
        parent = stack[-1] if stack else None
        inputs = (args, kwargs) if kwargs else (args[0] if len(args) == 1 else args)
        shapes, nbytes = _shapes_and_bytes(inputs)
        index = len(records)
        kind = kind.__name__
        record = CallRecord(
            index,
            self.names.get(module, kind),
            kind,
            call,
            len(stack),
            parent.index if parent is not None else None,
            self._has_children.get(module, False),
            shapes,
            nbytes,
            param_bytes,
            params,
            trainable,
            module_id=id(module),
        )
        if parent is not None:
            parent.children.append(index)
        if self._memory is not None:
            self._memory.enter(index)
        records.append(record)
        stack.append(record)
        if self.instruments:
            record.tokens = [i.enter(module, args, kwargs) for i in self.instruments]

    def final_records(
        self, model: nn.Module, args: tuple, kwargs: dict, output: Any
    ) -> list[CallRecord]:
        """After the forward: the records with the ``(not called)`` one; where no Python hook
        fired (a TorchScript module), one record for the whole call."""
        self.add_not_called(model)
        return self.records or [self.opaque_root(model, args, kwargs, output)]

    def add_not_called(self, model: nn.Module) -> None:
        """After the forward: the parameters no call used (inception_v3's auxiliary head in
        eval) go to one leaf record ``(not called)`` naming their modules, so that the leaf rows
        add up to the model's parameters."""
        pending = self.pending_params
        if not pending or not self.records:
            return
        view = self.param_view
        named = list(model.named_parameters())
        names = {id(p): n for n, p in named}
        if not all(i in names for i in pending):
            # the forward saw converted copies (functional_call): the same walk, by position
            names = (
                dict(zip(self._root_order, (n for n, _ in named)))
                if len(named) == len(self._root_order)
                else {}
            )
        left = list(pending.values())
        count = [p.numel() if view is None else view.count(p) for p in left]
        trainable = sum(c for c, p in zip(count, left) if p.requires_grad)
        unused = {names[i] for i in pending if i in names}
        kind = ", ".join(_outermost([n for n, _ in named], unused) or ["(unnamed)"])
        # (index, name, type, call, depth, parent, has_submodules, input shapes and bytes, ...)
        record = CallRecord(
            len(self.records), NOT_CALLED, kind, 1, 1, None, False, [], 0, 0, sum(count), trainable
        )
        record.finished = True
        self.records.append(record)

    def charge(self, p: torch.Tensor) -> int:
        """Elements of ``p`` to charge to the call that uses it: all of them the first time
        (of a sharded model: as its ``param_view`` counts them)."""
        view = self.param_view
        if view is None:
            return p.numel() if self.pending_params.pop(id(p), None) is not None else 0
        p = view.canonical(p)
        return view.count(p) if self.pending_params.pop(id(p), None) is not None else 0

    def post(
        self, module: nn.Module, args: tuple, kwargs: dict, output: Any, raised: bool = False
    ) -> None:
        stack = self.stack
        key = id(module)
        if (not stack or stack[-1].module_id != key) and not any(
            r.module_id == key for r in stack
        ):  # (the innermost call: no search)
            return
        if raised and self.failure is None:
            self.failure = (list(stack), list(self.finished))
        while stack[-1].module_id != key:  # calls that raised inside it
            stack.pop()
        record = stack.pop()
        if raised:
            return
        if kwargs:  # global pre-hooks never see kwargs: complete the inputs now
            record.input_shapes, record.input_bytes = _shapes_and_bytes((args, kwargs))
        record.output_shapes, record.output_bytes = _shapes_and_bytes(output)
        if not record.ops and not record.has_submodules:  # (with parameters or without)
            record.outside = _made_outside(module, (args, kwargs), output)
        record.finished = True
        self.finished.append(record)
        if record.tokens is not None:
            record.values = {}
            for instrument, token in zip(self.instruments, record.tokens):
                record.values.update(instrument.exit(token, module, output))
            record.tokens = None
        if not record.children and record.has_submodules:
            self._charge_subtree(module, record)
        kind = type(module)
        formula = self._module_formulas.get(kind, _UNKNOWN)
        if formula is _UNKNOWN:
            formula = self._module_formulas[kind] = self.registry.module_formula(kind)
        if formula is not None:
            record.torchstat = formula(module, record.input_shapes, record.output_shapes)
        memory = self._memory
        if memory is not None:
            while memory.stack and memory.stack[-1] != record.index:
                memory.exit()  # calls that raised inside this one
            if memory.stack:
                memory.exit()
                record.peak_memory_bytes = memory.peak[record.index]

    def _charge_subtree(self, module: nn.Module, record: CallRecord) -> None:
        """A fused kernel ran the children's work without calling them (the
        ``nn.TransformerEncoderLayer`` fast path): the call read the whole subtree's weights."""
        own = {id(p) for p in module._parameters.values() if p is not None}
        view = self.param_view
        for p in module.parameters():  # (each once)
            if id(p) in own:
                continue
            record.param_bytes += tensor_nbytes(p) if view is None else view.read_bytes(p)
            charged = self.charge(p)
            record.params += charged
            if p.requires_grad:
                record.trainable_params += charged
