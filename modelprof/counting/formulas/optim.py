"""What one optimizer step costs, per element of every parameter it updates (stated once, here).

Counted in steady state (the first step only initialises the state), as ``torch.optim``'s
single-tensor implementation computes it (foreach and fused kernels do the same arithmetic);
per-tensor scalar bookkeeping is not counted; a parameter without a gradient is skipped. A
sharded parameter counts as the view does (``counting/sharding.py``): this rank's shard, which
its optimizer steps, or the whole.

    SGD     update      p += -lr * g                                  2
            maximize    g = -g                                        +1
            weight decay g += wd * p                                  +2
            momentum    b = mu * b + (1 - dampening) * g              +3   (state: b)
            nesterov    g += mu * b                                   +2
            as torch runs them: an add whose alpha is 1 has no multiply, 1 less (momentum at
            dampening 0, torch's default, +2; weight decay 1, +1; nesterov with mu 1, +1)
    Adam    m = lerp(m, g, 1 - beta1)        sub, mul, add            3
            v = beta2 * v + (1 - beta2) * g * g                       4
            denom = sqrt(v) / bias_correction2 + eps                  3
            p += -step_size * m / denom      div, mul, add            3    = 13   (states: m, v)
            maximize g = -g +1; amsgrad v_max = max(v_max, v) +1 (state: v_max);
            weight decay: L2 (Adam) g += wd * p +2, decoupled (AdamW) p *= 1 - lr * wd +1
    AdamW   Adam with decoupled weight decay (default 0.01): 14

Memory traffic per element: read the parameter, its gradient and every state; write the
parameter and every state. Other optimizers are counted op by op over one steady-state step;
``register_optimizer_formula`` adds a formula.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from modelprof.counting.sharding import held
from modelprof.errors import ModelProfError

__all__ = [
    "OPTIMIZER_FORMULAS",
    "OptimizerCost",
    "optimizer_cost",
    "optimizer_formula",
    "register_optimizer_formula",
]

# group options -> (flops per element, state tensors per parameter)
GroupFormula = Callable[[dict[str, Any]], tuple[int, int]]

OPTIMIZER_FORMULAS: dict[type, GroupFormula] = {}


@dataclasses.dataclass(frozen=True)
class OptimizerCost:
    """One optimizer step: elements updated, flops, bytes read and written."""

    name: str
    elements: int
    flops: int
    read_bytes: int
    write_bytes: int
    counted_by: str  # "formula" (per element, above) or "ops" (counted as it ran)
    state_bytes: int | None = None  # the optimizer's state tensors (m, v, momentum ...)


def register_optimizer_formula(
    *classes: type, replace: bool = False
) -> Callable[[GroupFormula], GroupFormula]:
    """Decorator: ``fn(param_group) -> (flops per element, state tensors per parameter)`` for
    exactly these optimizer classes (a subclass may change ``step``, so it is not matched)."""

    def deco(fn: GroupFormula) -> GroupFormula:
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
                raise ModelProfError(f"{cls!r} is not a torch.optim.Optimizer subclass")
            if cls in OPTIMIZER_FORMULAS and not replace:
                raise ModelProfError(
                    f"an optimizer formula for {cls.__qualname__} is already "
                    "registered; pass replace=True to replace it"
                )
            OPTIMIZER_FORMULAS[cls] = fn
        return fn

    return deco


def optimizer_formula(optimizer_type: type) -> GroupFormula | None:
    return OPTIMIZER_FORMULAS.get(optimizer_type)


def _nonzero(group: dict[str, Any], key: str) -> bool:
    value = group.get(key, 0)
    return bool(float(value) != 0.0) if value is not None else False


def _add_scaled(alpha: Any) -> int:
    """Flops an element of torch's ``x.add(y, alpha=alpha)``: a multiply and an add, the add
    alone where alpha is 1 (as the op counter counts it, ``pointwise.py``)."""
    return 2 if float(alpha) != 1.0 else 1


@register_optimizer_formula(torch.optim.SGD)
def _sgd(group: dict[str, Any]) -> tuple[int, int]:
    # torch's _single_tensor_sgd (its foreach form runs the same ops on lists):
    # [g = -g] [g = g.add(p, alpha=wd)] [b.mul_(mu).add_(g, alpha=1 - dampening)]
    # [g = g.add(b, alpha=mu)] p.add_(g, alpha=-lr)
    flops, states = 2, 0
    if group.get("maximize", False):
        flops += 1
    if _nonzero(group, "weight_decay"):
        flops += _add_scaled(group["weight_decay"])
    if _nonzero(group, "momentum"):
        flops += 1 + _add_scaled(1 - float(group.get("dampening", 0) or 0))
        states = 1
        if group.get("nesterov", False):
            flops += _add_scaled(group["momentum"])
    return flops, states


@register_optimizer_formula(torch.optim.Adam)
def _adam(group: dict[str, Any]) -> tuple[int, int]:
    flops, states = 13, 2
    if group.get("maximize", False):
        flops += 1
    if group.get("amsgrad", False):
        flops += 1
        states += 1
    if _nonzero(group, "weight_decay"):
        flops += 1 if group.get("decoupled_weight_decay", False) else 2
    return flops, states


@register_optimizer_formula(torch.optim.AdamW)
def _adamw(group: dict[str, Any]) -> tuple[int, int]:
    return _adam({"decoupled_weight_decay": True, **group})


def optimizer_cost(
    optimizer: torch.optim.Optimizer, has_grad: Callable[[torch.Tensor], bool]
) -> OptimizerCost | None:
    """The step's cost by formula, or ``None`` when this optimizer class has none."""
    formula = optimizer_formula(type(optimizer))
    if formula is None:
        return None
    elements = flops = read = write = state = 0
    for group in optimizer.param_groups:
        per, states = formula(group)
        for p in {id(p): p for p in group["params"]}.values():  # each tensor once
            if not has_grad(p):
                continue
            n, size = held(p).numel(), p.element_size()  # a shard: this rank's part
            elements += n
            flops += per * n
            read += (2 + states) * n * size
            write += (1 + states) * n * size
            state += states * n * size
    return OptimizerCost(type(optimizer).__name__, elements, flops, read, write, "formula", state)
