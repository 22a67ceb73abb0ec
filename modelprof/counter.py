"""The op-level counter: a dispatch mode that sees every aten op a forward runs and charges its
cost to the innermost module call that is running (the scope, kept by ``scope.Tracker``).

Fused kernels (``scaled_dot_product_attention``, the ``nn.MultiheadAttention`` fast path) and
functional code (``x + identity``, ``torch.matmul`` inside a custom block) are counted like any
other op, because they all reach the dispatcher.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .formulas.memory import VIEW
from .formulas.registry import REGISTRY, FormulaRegistry
from .inputs import tensor_nbytes

__all__ = ["OpCounter", "OpStats"]

_UNSUPPORTED = object()


class OpStats:
    """Per-op totals over the whole forward: calls, macs, flops, madd."""

    __slots__ = ("calls", "macs", "flops", "madd")

    def __init__(self) -> None:
        self.calls = self.macs = self.flops = self.madd = 0


def _bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return tensor_nbytes(obj) if obj.is_nested else obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(o) for o in obj)
    return 0


class OpCounter(TorchDispatchMode):
    """Counts every op; ``tracker.current`` is the record the op is charged to."""

    def __init__(self, tracker, registry: FormulaRegistry | None = None) -> None:
        super().__init__()
        self.tracker = tracker
        self.registry = REGISTRY if registry is None else registry
        self.unsupported: Counter[str] = Counter()
        self.by_op: dict[str, OpStats] = {}
        self._formulas: dict[Any, Any] = {}

    def _resolve(self, func) -> Any:
        if func.is_view:
            formula = VIEW
        else:
            formula = self.registry.lookup(func)
            if formula is None:
                formula = _UNSUPPORTED
        self._formulas[func] = formula
        return formula

    def _charge_params(self, args: tuple) -> None:
        """A parameter read by an op of a call that does not own it (``F.linear`` on another
        module's weight, ``module.forward`` called directly) is charged to that call."""
        pending = self.tracker.pending_params
        record = self.tracker.current
        for a in args:
            if isinstance(a, torch.Tensor) and id(a) in pending:
                record.params += self.tracker.charge(a)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self._formulas.get(func)
        if formula is None:
            formula = self._resolve(func)
        if self.tracker.pending_params:
            self._charge_params(args)
        if formula is VIEW:
            return out
        name = func.__name__  # e.g. "convolution.default"
        stats = self.by_op.get(name)
        if stats is None:
            stats = self.by_op[name] = OpStats()
        stats.calls += 1
        record = self.tracker.current
        if formula is _UNSUPPORTED:
            self.unsupported[f"aten.{name}"] += 1
            record.ops.setdefault(name, 0)
        else:
            macs, flops, madd = formula(args, kwargs, out).resolved()
            record.ops[name] = record.ops.get(name, 0) + flops
            stats.macs += macs
            stats.flops += flops
            stats.madd += madd
            record.macs += macs
            record.flops += flops
            record.madd += madd
        if record.collect_op_bytes:
            # ops a parent module runs itself (a residual add): inputs read, outputs written
            record.op_read_bytes += _bytes(args) + _bytes(list(kwargs.values()))
            record.op_write_bytes += _bytes(out)
        return out
