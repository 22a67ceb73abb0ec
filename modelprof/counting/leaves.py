"""Known leaf modules counted from their call, with the op counter suspended (speed).

Any dispatch mode costs a CPU forward 5-10 % (the Python it runs after every kernel), most of
it in the leaves: a ``Conv2d``, ``BatchNorm2d`` or ``ReLU`` always runs the same ops, fully
determined by the module's settings and the input's shape. For a call of such a module (exact
type, no hooks, no overridden ``forward``), in the plain case only (CPU, float32/float64,
contiguous input, grad off, no autocast, no inference mode, no other mode on the stack, the
counter not staging), the counter is taken off the dispatch stack for the module's forward and
the ops it would have seen are charged from the call instead: the same ops, in the same order,
through the same formulas (the counter's, with the user's registry) and the same charging code,
with the same arguments (the real input, weights and output; ``tests/test_leaves.py`` compares
whole reports of the torchvision zoo with and without this). Anything else runs under the
counter as before.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

from modelprof.runtime import compat

__all__ = ["LeafCounter"]

aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float64)
_STRIDED = torch.strided
_PLAIN = (torch.Tensor, nn.Parameter)
_pop = torch._C._pop_torch_dispatch_stack
_push = torch._C._push_on_torch_dispatch_stack
_stack_len = torch._C._len_torch_dispatch_stack
_stack_at = torch._C._get_dispatch_stack_at
_function_stack_len = torch._C._len_torch_function_stack

# An op the module runs: (func, args, kwargs, out). ``before`` ops are charged before the
# forward runs (they come before the op that may raise), ``main`` after it, from its output.
Op = tuple[Any, tuple, dict, Any]


def _same_dtype(x: torch.Tensor, *tensors: torch.Tensor | None) -> bool:
    """Plain strided tensors of ``x``'s dtype on the CPU, where ``x`` is (None: no tensor)."""
    dtype = x.dtype
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or t.dtype is not dtype or not t.is_cpu
                              or t.layout is not _STRIDED):
            return False
    return True


def _attr(m: nn.Module, name: str, default: Any = None) -> Any:
    """``getattr(m, name, default)`` for a module of a type in ``_PLANS``, read where
    ``nn.Module`` keeps it without going through ``nn.Module.__getattr__`` (ten times as long,
    and a missing name raises inside it: this runs at every call). Exact because those classes
    define none of the names read here (``weight``, ``bias``, ``running_mean``,
    ``running_var``, ``inplace``; tests/test_leaves.py checks)."""
    d = m.__dict__
    if name in d:
        return d[name]
    for table in (d["_parameters"], d["_buffers"], d["_modules"]):
        if name in table:
            return table[name]
    return getattr(type(m), name, default)


# -- one plan per type: (check(module, x) -> ops before the forward, or None: not this path;
#    funcs(module, x) -> the functions of all the ops run, those before the forward first (a
#    tuple); main(module, x, out) -> the ops after the forward, charged from the output) -----

def _conv2d_check(m: nn.Conv2d, x: torch.Tensor) -> list[Op] | None:
    if m.padding_mode != "zeros" or isinstance(m.padding, str) or x.dim() != 4 or \
            not _same_dtype(x, _attr(m, "weight"), _attr(m, "bias")):
        return None
    return []


def _conv2d_main(m: nn.Conv2d, x: torch.Tensor, out: Any) -> list[Op]:
    return [(aten.convolution.default, (x, _attr(m, "weight"), _attr(m, "bias"), list(m.stride),
                                        list(m.padding),
                                        list(m.dilation), False, [0, 0], m.groups), {}, out)]


def _linear_check(m: nn.Linear, x: torch.Tensor) -> list[Op] | None:
    bias = _attr(m, "bias")
    if not _same_dtype(x, _attr(m, "weight"), bias) or x.dim() not in (2, 3) or \
            (x.dim() == 3 and bias is None):
        return None
    return []


def _linear_main(m: nn.Linear, x: torch.Tensor, out: Any) -> list[Op]:
    wt = _attr(m, "weight").t()
    bias = _attr(m, "bias")
    if x.dim() == 2:
        if bias is None:
            return [(aten.mm.default, (x, wt), {}, out)]
        return [(aten.addmm.default, (bias, x, wt), {}, out)]
    rows = x.shape[0] * x.shape[1]   # a 3-D input is folded to 2-D around one addmm
    return [(aten.addmm.default, (bias, x.view(rows, x.shape[2]), wt), {},
             out.view(rows, out.shape[2]))]


def _bn2d_check(m: nn.BatchNorm2d, x: torch.Tensor) -> list[Op] | None:
    mean, var = _attr(m, "running_mean"), _attr(m, "running_var")
    if m.training or mean is None or var is None or x.dim() != 4 or \
            not _same_dtype(x, _attr(m, "weight"), _attr(m, "bias"), mean, var):
        return None
    return [(aten.empty.memory_format, ([0],),
             {"dtype": torch.uint8, "layout": torch.strided, "device": x.device},
             _EMPTY_BYTES)]


def _bn2d_main(m: nn.BatchNorm2d, x: torch.Tensor, out: Any) -> list[Op]:
    momentum = 0.0 if m.momentum is None else m.momentum
    saved = _NO_STATS[x.dtype]   # what eval-mode batch norm returns beside its output
    return [(aten.native_batch_norm.default, (x, _attr(m, "weight"), _attr(m, "bias"),
                                              _attr(m, "running_mean"), _attr(m, "running_var"),
                                              False, momentum, m.eps), {},
             (out, saved, saved))]


def _layer_norm_check(m: nn.LayerNorm, x: torch.Tensor) -> list[Op] | None:
    k = len(m.normalized_shape)
    if x.dim() <= k or tuple(x.shape[-k:]) != tuple(m.normalized_shape) or \
            not _same_dtype(x, _attr(m, "weight"), _attr(m, "bias")):
        return None
    return []


def _layer_norm_main(m: nn.LayerNorm, x: torch.Tensor, out: Any) -> list[Op]:
    k = len(m.normalized_shape)
    stats = torch.empty((*x.shape[:-k], *(1,) * k), dtype=x.dtype)
    return [(aten.native_layer_norm.default, (x, list(m.normalized_shape), _attr(m, "weight"),
                                              _attr(m, "bias"), m.eps), {}, (out, stats, stats))]


def _avgpool_check(m: nn.AdaptiveAvgPool2d, x: torch.Tensor) -> list[Op] | None:
    return [] if m.output_size in (1, (1, 1)) and x.dim() == 4 else None


def _avgpool_main(m: nn.Module, x: torch.Tensor, out: Any) -> list[Op]:
    return [(aten.mean.dim, (x, [-1, -2], True), {}, out)]


def _pointwise(out_of_place: Any, in_place: Any = None) -> tuple[Callable, Callable, Callable]:
    """An activation: one op on the input, in place (``inplace=True``) or not."""
    funcs_out, funcs_in = (out_of_place,), (in_place,)

    def check(m: nn.Module, x: torch.Tensor) -> list[Op] | None:
        return [] if in_place is not None or not _attr(m, "inplace", False) else None

    def funcs(m: nn.Module, x: torch.Tensor) -> tuple:
        return funcs_in if _attr(m, "inplace", False) else funcs_out

    def main(m: nn.Module, x: torch.Tensor, out: Any) -> list[Op]:
        if _attr(m, "inplace", False):
            return [(in_place, (x,), {}, out)]
        return [(out_of_place, (x,), {}, out)]

    return check, funcs, main


def _gelu_main(m: nn.GELU, x: torch.Tensor, out: Any) -> list[Op]:
    kwargs = {} if m.approximate == "none" else {"approximate": m.approximate}
    return [(aten.gelu.default, (x,), kwargs, out)]


_NO = object()
_EMPTY_BYTES = torch.empty(0, dtype=torch.uint8)
_NO_STATS = {dtype: torch.empty(0, dtype=dtype) for dtype in _FLOATS}

def _funcs(*funcs: Any) -> Callable:
    return lambda m, x: funcs


_MM, _ADDMM = (aten.mm.default,), (aten.addmm.default,)


def _linear_funcs(m: nn.Linear, x: torch.Tensor) -> list:
    return _MM if _attr(m, "bias") is None else _ADDMM


_PLANS: dict[type, tuple[Callable, Callable, Callable]] = {
    nn.Conv2d: (_conv2d_check, _funcs(aten.convolution.default), _conv2d_main),
    nn.Linear: (_linear_check, _linear_funcs, _linear_main),
    # (its check returns the allocation charged before the forward: its func comes first)
    nn.BatchNorm2d: (_bn2d_check, _funcs(aten.empty.memory_format,
                                         aten.native_batch_norm.default), _bn2d_main),
    nn.LayerNorm: (_layer_norm_check, _funcs(aten.native_layer_norm.default),
                   _layer_norm_main),
    nn.AdaptiveAvgPool2d: (_avgpool_check, _funcs(aten.mean.dim), _avgpool_main),
    nn.ReLU: _pointwise(aten.relu.default, aten.relu_.default),
    nn.SiLU: _pointwise(aten.silu.default, aten.silu_.default),
    nn.Hardswish: _pointwise(aten.hardswish.default, aten.hardswish_.default),
    nn.Sigmoid: _pointwise(aten.sigmoid.default),
    nn.Tanh: _pointwise(aten.tanh.default),
    nn.GELU: (lambda m, x: [], _funcs(aten.gelu.default), _gelu_main),
}
# the types whose ops read a weight and a bias (the others read their input alone)
_WEIGHTED = frozenset({nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.LayerNorm})
# the ops the state guard's write watch may see here (in-place activations; batch norm, which
# writes its running statistics in train mode): their plans make no tensor (no op under the
# counter) when called before the forward, with the input as a stand-in output
_WATCHED = frozenset({aten.relu_.default, aten.silu_.default, aten.hardswish_.default,
                      aten.native_batch_norm.default})


class LeafCounter:
    """Module hooks around ``Tracker.pre/post`` that run known leaf calls with ``counter`` off
    the dispatch stack and charge their ops from the call (see the module doc)."""

    def __init__(self, tracker: Any, counter: Any, enabled: bool = True) -> None:
        self.tracker = tracker
        self.counter = counter
        self.enabled = enabled and _plain_state()
        self._suspended: tuple[nn.Module, torch.Tensor, Callable] | None = None
        self._checked: dict[tuple, Any] = {}   # the ops' functions -> what _check says

    def __enter__(self) -> LeafCounter:
        return self

    def __exit__(self, *exc: Any) -> None:
        """The counter goes back on the stack also when a leaf's forward was left without its
        post hook (an interrupt), before the counter itself exits."""
        if self._suspended is not None:
            self._suspended = None
            _push(self.counter)

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        # called at every module call, between the model's kernels: the cheapest refusals first
        self.tracker.pre(module, args, kwargs)
        plan = _PLANS.get(type(module)) if self.enabled else None
        if plan is None or self._suspended is not None or len(args) != 1:
            return
        x = args[0]
        if type(x) is not torch.Tensor or not x.is_cpu or x.dtype not in _FLOATS or \
                x.layout is not _STRIDED or x.is_nested or not x.is_contiguous() or \
                not self._quiet(module):
            return
        counter = self.counter
        if not counter.direct() or not _stack_len() or \
                _stack_at(_stack_len() - 1) is not counter or _function_stack_len() or \
                torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return
        before = plan[0](module, x)
        if before is None:
            return
        funcs = plan[1](module, x)     # (those of ``before`` first)
        watch = self._checked.get(funcs)
        if watch is None:
            watch = self._checked[funcs] = self._check(funcs)
        if watch is _NO:               # an op without a formula of its own, or a write unplanned
            return
        if self.tracker.param_view is not None or counter.is_buffer(x) or (
                type(module) in _WEIGHTED and (counter.is_buffer(_attr(module, "weight")) or
                                               counter.is_buffer(_attr(module, "bias")))):
            return                     # a sharded model; a buffer a view op would rename
        counter.charge_inputs((x,))    # another module's parameter as the input
        for op in before:
            counter.charge_call(*op)
        if watch:                      # the write watch sees the op before it runs
            for func, args, kwargs, _ in plan[2](module, x, x):
                counter.before_op(func, args, kwargs)
        _pop(None)
        self._suspended = (module, x, plan[2])

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any,
             raised: bool = False) -> None:
        suspended = self._suspended
        if suspended is not None and suspended[0] is module:
            self._suspended = None
            # (the stand-in tensors are made before the counter is back; an op that raised is
            # not charged on the per-op path either)
            ops = () if raised else suspended[2](module, suspended[1], output)
            _push(self.counter)
            for op in ops:
                self.counter.charge_call(*op)
        self.tracker.post(module, args, kwargs, output, raised)

    def _check(self, funcs: tuple) -> Any:
        """Whether the write watch wants to see any of ``funcs`` (True/False), or ``_NO`` where
        one of them has no plain formula or is a write no plan makes."""
        watch = False
        for func in funcs:
            found = self.counter.formula_of(func)
            if found is None or (found[1] and func not in _WATCHED):
                return _NO
            watch = watch or found[1]
        return watch

    def _quiet(self, module: nn.Module) -> bool:
        """No hook of the module's own or of anyone else's would run with the counter off."""
        return not (module._forward_pre_hooks or module._forward_hooks or
                    module._backward_hooks or module._backward_pre_hooks or
                    "forward" in module.__dict__ or
                    len(_module._global_forward_pre_hooks) != 1 or
                    len(_module._global_forward_hooks) != 1 or
                    _module._global_backward_hooks or _module._global_backward_pre_hooks)


def _plain_state() -> bool:
    """No autocast: it would insert casts before the leaves' ops."""
    return not any(compat.autocast_enabled(d) for d in ("cpu", "cuda"))
