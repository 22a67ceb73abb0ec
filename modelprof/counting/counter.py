"""The op-level counter: a dispatch mode that charges every op a forward runs (fused kernels
and functional code alike) to the innermost running module call (``scope.Tracker``). An op is
costed by, in order:

1. its formula (registry lookup: overload, packet, tag, functional form of an in-place op);
2. its decomposition — its CompositeImplicitAutograd kernel (what autograd would have run:
   composite ops reach the dispatcher whole under ``torch.inference_mode()``), else a
   ``torch._decomp`` one — whose ops are counted in its place, in every grad mode;
3. otherwise it is *unsupported*: run as it is, listed with its call count, never a silent 0.

A higher-order operator (``flex_attention``, ``cond``, ...) is costed by its formula, else
through its subgraphs; one whose subgraphs cannot be entered runs uncounted and is listed
unsupported. None of them can make the counter raise.

On the meta device (``meta_sdpa=True``) SDPA runs as the CPU's fused kernel and a few outputs are
shaped as the CPU's (``counting.meta_sdpa``): a model costed from shapes counts what the CPU does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from modelprof.counting.collectives import (
    add_collective,
    collective_kind,
    collective_of,
    is_comm_bookkeeping,
)
from modelprof.counting.formulas.memory import VIEW
from modelprof.counting.formulas.quantized import packed_size
from modelprof.counting.formulas.registry import REGISTRY, ZERO, Cost, FormulaRegistry, total
from modelprof.counting.formulas.values import has_values
from modelprof.counting.meta_sdpa import FusedMetaSDPA, cpu_outputs
from modelprof.counting.scope import (
    SCATTERED_WRITES,
    CallRecord,
    gathered_bytes,
    scattered_bytes,
)
from modelprof.counting.sharding import ShardView, current_view
from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.tensors import is_dtensor_type, nbytes, tensor_nbytes

__all__ = ["FixedScope", "OpCounter", "OpStats", "count_ops", "op_name", "probe_cost"]

HigherOrderOperator = compat.HigherOrderOperator


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _How:
    """How an op without a formula of its own is costed (a sentinel in the formula cache)."""

    kind: str
    fn: Any = None


_UNSUPPORTED = _How("unsupported")
_SUBGRAPHS = _How("subgraphs")
_COMM = _How("collective")  # a collective: no FLOPs, its bytes to the comm columns
_COMM_BOOKKEEPING = _How("comm-bookkeeping")  # waits, FSDP2's buffer copies: nothing counted
_PASS = object()
_ALLOCATIONS = frozenset(
    f"aten.{op}"
    for op in """empty.memory_format empty_strided.default empty_like.default new_empty.default
    new_empty_strided.default""".split()
)


class OpStats:
    """Per-op totals over the whole forward: calls, macs, flops, madd, and the notes of calls
    whose count is not exact (note -> calls)."""

    __slots__ = ("calls", "macs", "flops", "madd", "notes")

    def __init__(self) -> None:
        self.calls = self.macs = self.flops = self.madd = 0
        self.notes: Counter[str] | None = None


def op_name(func: Any) -> str:
    """``namespace.name.overload`` (``aten.convolution.default``, ``torchvision.nms.default``,
    ``higher_order.cond``): op names keep their namespace everywhere."""
    if isinstance(func, HigherOrderOperator):
        return f"{func.namespace}.{func.name()}"
    return str(func)


def _decomposition(func: compat.OpOverload) -> _How | None:
    """The decomposition an op without a formula is counted through, if it has one."""
    if compat.has_composite_kernel(func):
        return _How("composite", func.decompose)
    fn = compat.decomposition_table().get(func)
    return _How("table", fn) if fn is not None else None


def _tensors(*objs: Any) -> Iterator[torch.Tensor]:
    """The tensors among ``objs`` and in the lists and tuples among them."""
    for a in objs:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor):
                yield t


def _has_nested(args: tuple, kwargs: dict) -> bool:
    return any(t.is_nested for t in _tensors(*args, *kwargs.values()))


def _component(obj: Any, i: int, parts: dict[int, list]) -> Any:
    """``obj`` with each nested tensor replaced by its ``i``-th component."""
    if isinstance(obj, torch.Tensor):
        return parts[id(obj)][i] if id(obj) in parts else obj
    if isinstance(obj, (list, tuple)) and any(id(t) in parts for t in obj):
        return type(obj)(_component(t, i, parts) for t in obj)
    return obj


def _components(name: str, args: tuple, kwargs: dict, out: Any = None) -> list[tuple]:
    """``(args, kwargs, out)`` of the op for each component of its nested tensors."""
    parts: dict[int, list] = {}  # each nested tensor's components, by id
    try:
        for t in _tensors(*args, *kwargs.values(), out):
            if t.is_nested and id(t) not in parts:
                parts[id(t)] = list(t.unbind())
    except (RuntimeError, ValueError, TypeError) as e:
        raise ModelProfError(
            f"op {name} on a nested tensor cannot be counted: its components "
            f"cannot be taken apart ({type(e).__name__}: {e})"
        ) from e
    counts = {len(p) for p in parts.values()}
    if len(counts) > 1:
        raise ModelProfError(
            f"op {name} takes nested tensors of different numbers of "
            f"components ({sorted(counts)}): it cannot be counted per component"
        )
    n = counts.pop() if counts else 0
    return [
        (
            tuple(_component(a, i, parts) for a in args),
            {k: _component(v, i, parts) for k, v in kwargs.items()},
            _component(out, i, parts),
        )
        for i in range(n)
    ]


def _nested_cost(
    name: str, formula: Any, args: tuple, kwargs: dict, out: Any, error: BaseException | None = None
) -> Cost:
    """An op on nested (ragged) tensors costs the sum of its cost on each component."""
    try:
        parts = _components(name, args, kwargs, out)
        return total(formula(*part) for part in parts)
    except ModelProfError:
        raise
    except Exception as e:  # noqa: BLE001 - said as the op that cannot be counted
        raise ModelProfError(
            f"op {name} on a nested tensor cannot be counted: its formula "
            f"fails on the components ({type(e).__name__}: {e})"
        ) from (error or e)


class _Subgraph:
    """A subgraph of a higher-order operator, run with the counter active so that its ops are
    counted; attribute reads reach the wrapped callable (``_boxed_call`` and the like)."""

    def __init__(self, fn: Any, counter: OpCounter) -> None:
        self._fn = fn
        self._counter = counter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._counter:
            return self._fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("_fn", "_counter"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._fn, name)


class OpCounter(compat.TorchDispatchMode):
    """Counts every op; ``tracker.current`` is the record the op is charged to."""

    supports_higher_order_operators = True

    def __init__(
        self,
        tracker,
        registry: FormulaRegistry | None = None,
        before_op: Callable[[Any, tuple, dict], None] | None = None,
        meta_sdpa: bool = False,
    ) -> None:
        super().__init__()
        self.tracker = tracker
        # off except on meta: any torch-function mode turns off nn.MultiheadAttention's fast path
        self.meta_sdpa = meta_sdpa
        # on meta: ops that raised out to the model's code; a forward that still returns caught
        # them and took another branch than a real device would (StaticResult.caught)
        self.raised_on_meta: list[str] = []
        self._op_depth = 0
        # called with (func, args, kwargs) before each op runs, uncounted (the state guard's
        # copy on first write)
        self.before_op = before_op
        self.registry = REGISTRY if registry is None else registry
        self.unsupported: Counter[str] = Counter()
        self.decomposed: Counter[str] = Counter()  # ops counted through their decomposition
        self.by_op: dict[str, OpStats] = {}
        # op -> (formula or _How, name, takes packed quantized weights, before_op watches it)
        self._ops: dict[Any, tuple[Any, str, bool, bool, bool]] = {}
        self._packed_seen: dict[int, Any] = {}
        # charges of a tentative run (a decomposition, a subgraph) that may be rolled back
        self._staged: list | None = None
        self._depth = 0
        self._flex_debug: Any = None
        self._outer_modes: Any = None
        self._meta_sdpa: tuple[int, FusedMetaSDPA] | None = None  # (stack depth below, mode)
        # the model's buffers by id, filled by the tracker at the root call (a training step's
        # loss or backward scope has none)
        buffers = getattr(tracker, "buffers", None)
        self._buffers: dict[int, torch.Tensor] = {} if buffers is None else buffers
        # a DTensor op: counted as the local ops this rank runs, or on its global shapes
        self.local_dtensor = current_view() is ShardView.RANK

    # -- entering: flex_attention runs eagerly, meta SDPA fused, under the counter --------------
    def __enter__(self):
        if self._depth == 0:
            # the outermost exit repairs an inner exit that failed before popping (RecursionError)
            self._outer_modes = compat.dispatch_stack_state()
            self._flex_debug = compat.eager_flex_attention(True)
            if self.meta_sdpa:
                mode = FusedMetaSDPA(self.raised_on_meta)
                self._meta_sdpa = (compat.function_stack.length(), mode)
                mode.__enter__()
        try:
            entered = super().__enter__()
        except BaseException:  # (no __exit__ follows: what the outermost entry set goes back)
            if self._depth == 0:
                self._undo_outermost()
            raise
        self._depth += 1
        return entered

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._depth -= 1
            if self._depth == 0:
                if compat.dispatch_stack_state() != self._outer_modes:
                    compat.restore_dispatch_stack(*self._outer_modes)
                self._undo_outermost()
                if any(isinstance(f, HigherOrderOperator) for f in self._ops):
                    compat.forget_dynamo_skips()  # torch.cond & co. run eagerly again after the pass

    def _undo_outermost(self) -> None:
        """Eager flex_attention and the meta SDPA mode back as the outermost entry found them."""
        compat.eager_flex_attention(self._flex_debug)
        if self._meta_sdpa is not None:  # popped, and any function mode the forward left above
            depth, mode = self._meta_sdpa
            stack = compat.function_stack
            if stack.length() == depth + 1 and compat.current_function_mode() is mode:
                mode.__exit__(None, None, None)
            while stack.length() > depth:
                stack.pop()
            self._meta_sdpa = None

    # -- resolution, once per op --------------------------------------------------------------
    def _resolve(self, func) -> tuple[Any, str, bool, bool, bool]:
        name = op_name(func)
        packed = nested = False
        if isinstance(func, HigherOrderOperator):
            formula = self.registry.lookup(func) or _SUBGRAPHS
            if getattr(formula, "wants_probe", False):  # costs a callable it is handed
                formula = functools.partial(formula, probe=probe_cost)
        elif collective_kind(func) is not None:
            formula = _COMM
        elif is_comm_bookkeeping(func):
            formula = _COMM_BOOKKEEPING
        elif func.is_view:
            formula = VIEW
        else:
            formula = self.registry.lookup(func) or _decomposition(func) or _UNSUPPORTED
            packed = any(
                "PackedParams" in str(a.type) or "CellParamsBase" in str(a.type)
                for a in compat.op_schema(func).arguments
            )
            # tensors it reads past its positional ones: a keyword-only attn_mask, a list's
            nested = any(
                "Tensor" in str(a.type) and (a.kwarg_only or str(a.type).startswith("List"))
                for a in compat.op_schema(func).arguments
            )
        # a hook may say which ops it watches (the state guard's: those that write an argument)
        hook = self.before_op
        watches = getattr(hook, "watches", None)
        watch = hook is not None and (watches is None or bool(watches(func)))
        entry = self._ops[func] = (formula, name, packed, watch, nested)
        return entry

    def _charge_params(self, args: tuple) -> None:
        """A parameter read by an op of a call that does not own it (``F.linear`` on another
        module's weight, ``module.forward`` called directly) is charged to that call."""
        pending = self.tracker.pending_params
        record = self.tracker.current
        for a in args:
            if isinstance(a, torch.Tensor) and id(a) in pending:
                charged = self.tracker.charge(a)
                record.params += charged
                if a.requires_grad:
                    record.trainable_params += charged

    def _charge_buffers(self, args: tuple) -> None:
        """A buffer an op reads (batch-norm running statistics, an fp8 weight), or a view of one,
        is read by the running call: its bytes, once per call."""
        buffers = self._buffers
        record = self.tracker.current
        seen = record.buffers_read
        if seen is None:
            seen = record.buffers_read = set()
        for a in args:
            key = id(a)
            if key in buffers and key not in seen:
                seen.add(key)
                record.buffer_bytes += tensor_nbytes(a)

    def _charge_packed(self, args: tuple, name: str) -> None:
        """The packed weights of a quantized op (no ``nn.Parameter``) are the parameters of
        the call that uses them: elements once, bytes read (as stored) at every call."""
        record = self.tracker.current
        # a list of them for a quantized RNN: one CellParamsBase per layer
        objects = [o for a in args for o in (a if isinstance(a, (list, tuple)) else (a,))]
        for a in objects:
            if isinstance(a, torch.ScriptObject):
                elements, stored = packed_size(a, name)
                record.param_bytes += stored
                if id(a) not in self._packed_seen:
                    self._packed_seen[id(a)] = a  # kept alive: its id stays unique meanwhile
                    record.params += elements

    # -- dispatch -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.meta_sdpa:
            return self._dispatch(func, types, args, kwargs)
        self._op_depth += 1  # an op inside another's decomposition may fail and be run whole
        try:
            return self._dispatch(func, types, args, kwargs)
        except Exception as e:
            if self._op_depth == 1:
                self.raised_on_meta.append(f"{func}: {type(e).__name__}: {str(e)[:200]}")
            raise
        finally:
            self._op_depth -= 1

    def _dispatch(self, func, types, args=(), kwargs=None):
        # the hot path: every op of the forward, between the model's own kernels
        if types:  # a tensor subclass takes part (plain tensors give no types)
            handled = self._subclass_op(func, types, args, kwargs)
            if handled is not _PASS:
                return handled
        entry = self._ops.get(func)
        if entry is None:
            entry = self._resolve(func)
        formula, name, packed, watch, nested = entry
        if kwargs is None:
            kwargs = {}
        if watch:
            self.before_op(func, args, kwargs)
        read = args if not nested else tuple(_tensors(*args, *kwargs.values()))
        pending = self.tracker.pending_params
        if pending and not pending.keys().isdisjoint(map(id, read)):
            self._charge_params(read)
        buffers = self._buffers
        if buffers and not buffers.keys().isdisjoint(map(id, read)):
            if formula is VIEW:  # a view reads nothing: the op that uses it reads its bytes
                out = func(*args, **kwargs)
                if isinstance(out, torch.Tensor):
                    buffers[id(out)] = out  # (held until the next pass: its id stays unique)
                return out
            self._charge_buffers(read)
        if formula is VIEW:
            return func(*args, **kwargs)
        if packed:
            self._charge_packed(args, name)
        if type(formula) is _How:
            return self._without_formula(func, formula, name, args, kwargs)
        out = func(*args, **kwargs)
        if self.meta_sdpa:  # on meta: the outputs as the CPU's kernel shapes them
            out = cpu_outputs(func, args, out)
        try:
            cost = formula(args, kwargs, out)
        except Exception as e:  # noqa: BLE001 - a formula meeting a nested tensor: per component
            if not _has_nested(args, kwargs):
                raise
            cost = _nested_cost(name, formula, args, kwargs, out, e)
        else:
            if isinstance(out, torch.Tensor) and out.is_nested:  # shapes of a ragged tensor
                cost = _nested_cost(name, formula, args, kwargs, out)
        self._charge(name, cost, args, kwargs, out)
        return out

    def _subclass_op(self, func, types, args: tuple, kwargs: dict | None) -> Any:
        """DTensor ops in the per-rank view: NotImplemented, so that their local ops (and any
        redistribution's collectives) come back here on local shapes; the ops of DTensor's
        sharding propagation (fake global-shape tensors) run uncounted; else ``_PASS``."""
        if self.local_dtensor and any(map(is_dtensor_type, types)):
            return NotImplemented
        # a fake tensor's metadata (its device) and sharding propagation
        if getattr(func, "namespace", None) == "prim" or (
            any(t.__name__ == "FakeTensor" for t in types) and _in_sharding_propagation()
        ):
            return func(*args, **(kwargs or {}))
        return _PASS

    def _charge(self, name: str, cost: Cost | None, args: tuple, kwargs: dict, out: Any) -> None:
        record = self.tracker.current
        op_bytes = None
        if record.collect_op_bytes and name not in _ALLOCATIONS:
            # ops a parent module runs itself (a residual add): inputs read, outputs written
            # (an allocation writes nothing: FSDP2's gather buffers, a torch.empty)
            read = nbytes(args) + nbytes(list(kwargs.values()))
            if name == "aten.embedding.default":  # (weight, indices)
                read = gathered_bytes(args[0], args[1], read)
            op_bytes = (read, nbytes(out))
            if name in SCATTERED_WRITES:  # an in-place write into part of a tensor
                op_bytes = scattered_bytes(name, args, op_bytes)
            elif out is None and name.startswith("aten._foreach_"):  # in place: its first list
                op_bytes = (read, nbytes(args[0]))
        if self._staged is not None:
            self._staged.append((name, cost, record, op_bytes))
        else:
            self._apply(name, cost, record, op_bytes)

    def _apply(self, name: str, cost: Cost | None, record, op_bytes) -> None:
        stats = self.by_op.get(name)
        if stats is None:
            stats = self.by_op[name] = OpStats()
        stats.calls += 1
        if cost is None:
            self.unsupported[name] += 1
            record.ops.setdefault(name, 0)
        else:
            macs, flops, madd = cost.resolved()
            record.ops[name] = record.ops.get(name, 0) + flops
            stats.macs += macs
            stats.flops += flops
            stats.madd += madd
            record.macs += macs
            record.flops += flops
            record.madd += madd
            if cost.note is not None:
                if stats.notes is None:
                    stats.notes = Counter()
                stats.notes[cost.note] += 1
        if op_bytes is not None:
            record.op_read_bytes += op_bytes[0]
            record.op_write_bytes += op_bytes[1]

    # -- ops without a formula ------------------------------------------------------------------
    def _without_formula(self, func, how: _How, name: str, args: tuple, kwargs: dict) -> Any:
        if how is _COMM or how is _COMM_BOOKKEEPING:
            # a call without FLOPs; a collective's bytes go to the current scope's ``comm``
            # table, not to the row's read/write traffic
            out = func(*args, **kwargs)
            record = self.tracker.current
            self._apply(name, ZERO, record, None)
            c = collective_of(func, args, kwargs, out) if how is _COMM else None
            if c is not None:
                if record.comm is None:
                    record.comm = {}
                add_collective(record.comm, c)
            return out
        if how is _UNSUPPORTED:
            out = func(*args, **kwargs)
            self._charge(name, None, args, kwargs, out)
            return out
        if how is _SUBGRAPHS:
            return self._through_subgraphs(func, name, args, kwargs)
        if _has_nested(args, kwargs):
            return self._nested_decomposition(func, how, name, args, kwargs)
        if how.kind == "composite":  # what the op does when autograd is on: exact
            self.decomposed[name] += 1
            with self:
                return how.fn(*args, **kwargs)
        # a ``torch._decomp`` decomposition is written for plain strided dense tensors
        plain = not any(
            t.layout is not torch.strided or t.is_quantized or t.is_nested
            for t in _tensors(*args, *kwargs.values())
        )
        ok, out = self._tentatively(lambda: how.fn(*args, **kwargs)) if plain else (False, None)
        if not ok:  # the decomposition does not hold for these inputs: run the op itself
            return self._without_formula(func, _UNSUPPORTED, name, args, kwargs)
        self.decomposed[name] += 1
        return out

    def _nested_decomposition(self, func, how: _How, name: str, args: tuple, kwargs: dict) -> Any:
        """An op without a formula on nested tensors runs itself (its decomposition on them
        would dispatch it again, without end); its decomposition is counted per component."""
        parts = _components(name, args, kwargs)
        out = func(*args, **kwargs)
        for part_args, part_kwargs, _ in parts:
            ok, _ = self._tentatively(lambda a=part_args, k=part_kwargs: how.fn(*a, **k))
            if not ok:
                raise ModelProfError(
                    f"op {name} on a nested tensor cannot be counted: its "
                    "decomposition fails on the components; register a "
                    "formula with modelprof.register_formula"
                )
        self.decomposed[name] += 1
        return out

    def _staged_run(self, run, enter: bool = True) -> tuple[list, Any]:
        """``(charges, out)`` of ``run()`` with the counter active (``enter``: entered for it; a
        higher-order operator's subgraphs enter it themselves), its charges staged, not applied;
        the outer charges stay staged as they were, also when it raises."""
        outer, self._staged = self._staged, []
        try:
            with self if enter else contextlib.nullcontext():
                out = run()
            return self._staged, out
        finally:
            self._staged = outer

    def _tentatively(self, run, enter: bool = True) -> tuple[bool, Any]:
        """``_staged_run``, keeping the charges only if ``run()`` succeeds."""
        try:
            staged, out = self._staged_run(run, enter)
        except Exception:  # noqa: BLE001 - the caller falls back to running the op itself
            return False, None
        self._commit(staged)
        return True, out

    def _commit(self, staged: list) -> None:
        if self._staged is not None:
            self._staged.extend(staged)
        else:
            for entry in staged:
                self._apply(*entry)

    # -- higher-order operators -----------------------------------------------------------------
    def _through_subgraphs(self, func, name: str, args: tuple, kwargs: dict) -> Any:
        """Run a higher-order operator with its subgraphs counted; ``cond`` without a predicate
        value (meta) is charged its costlier branch, with a note. One that refuses the wrapped
        subgraphs runs again uncounted, listed unsupported (a genuine error raises there)."""
        pred = args[0] if func is torch.ops.higher_order.cond else None
        if isinstance(pred, torch.Tensor) and not has_values(pred):
            return self._cond_bound(name, args, kwargs)
        wrap = functools.partial(_wrap_subgraphs, counter=self)
        w_args, w_kwargs = wrap(args), {k: wrap(v) for k, v in kwargs.items()}
        if w_args is args and all(w_kwargs[k] is v for k, v in kwargs.items()):  # no subgraph
            return self._without_formula(func, _UNSUPPORTED, name, args, kwargs)
        ok, out = self._tentatively(lambda: func(*w_args, **w_kwargs), enter=False)
        if not ok:  # run it as it is, uncounted, and say so
            return self._without_formula(func, _UNSUPPORTED, name, args, kwargs)
        self._apply_calls(name)
        return out

    def _cond_bound(self, name: str, args: tuple, kwargs: dict) -> Any:
        pred, true_fn, false_fn, operands = args[:4]
        runs = [self._staged_run(lambda b=branch: b(*operands)) for branch in (true_fn, false_fn)]
        costs = [total(c for _, c, _, _ in staged).resolved()[1] for staged, _ in runs]
        staged, _ = runs[0] if costs[0] >= costs[1] else runs[1]
        self._commit(staged)
        self._apply_calls(
            name, note="predicate unknown (no values): charged the costlier branch, an upper bound"
        )
        return runs[0][1]

    def _apply_calls(self, name: str, note: str | None = None) -> None:
        stats = self.by_op.setdefault(name, OpStats())
        stats.calls += 1
        if note is not None:
            if stats.notes is None:
                stats.notes = Counter()
            stats.notes[note] += 1


def _in_sharding_propagation(limit: int = 60) -> bool:
    """Whether DTensor's sharding propagation (fake tensors, no work of this rank) runs the op."""
    frame = sys._getframe(2)
    while frame is not None and limit:
        if frame.f_code.co_name == "_propagate_tensor_meta_non_cached":
            return True
        frame, limit = frame.f_back, limit - 1
    return False


_NOT_SUBGRAPHS = (torch.Tensor, compat.OpOverload, compat.OpOverloadPacket, type, _Subgraph)


def _wrap_subgraphs(obj: Any, counter: OpCounter) -> Any:
    if callable(obj) and not isinstance(obj, _NOT_SUBGRAPHS):
        return _Subgraph(obj, counter)
    if type(obj) in (tuple, list):
        wrapped = [_wrap_subgraphs(o, counter) for o in obj]
        if all(w is o for w, o in zip(wrapped, obj)):
            return obj
        return type(obj)(wrapped)
    return obj


class FixedScope:
    """A stand-in for ``scope.Tracker`` that charges every op to one record, ``current``
    (``count_ops``'s empty root record, a training step's loss or optimizer step); no
    parameter waits to be charged."""

    def __init__(self, current: Any = None) -> None:
        if current is None:
            # (index, name, type, call, depth, parent, has_submodules, input shapes and bytes, ...)
            current = CallRecord(0, "", "", 1, 0, None, False, [], 0, 0, 0)
        self.current = current
        self.pending_params: dict[int, torch.Tensor] = {}


def count_ops(fn: Any, *args: Any, registry: FormulaRegistry | None = None) -> OpCounter:
    """Run ``fn(*args)`` (a ``score_mod``, a training step...) under a counter of its own and
    return it: ``counter.by_op`` per op, ``counter.tracker.current.macs/flops/madd`` in total."""
    counter = OpCounter(FixedScope(), registry)
    with counter:
        fn(*args)
    return counter


def probe_cost(fn: Any, *args: Any, registry: FormulaRegistry | None = None) -> Cost:
    """Total cost of running ``fn(*args)`` once (raises whatever ``fn`` raises)."""
    total = count_ops(fn, *args, registry=registry).tracker.current
    return Cost(total.macs, flops=total.flops, madd=total.madd)
