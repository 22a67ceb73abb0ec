"""The one registry of cost formulas, filled by ``register_formula``.

Keys are aten ops (``torch.ops.aten.convolution`` — an overload packet — or one overload such as
``torch.ops.aten.add.Tensor``), a ``torch.Tag`` for a whole family (``torch.Tag.pointwise``), or
an ``nn.Module`` subclass for the torchstat view. Lookup for an op goes overload, then packet,
then tag; an op found nowhere is *unsupported* and reported, never counted as zero silently.

Conventions (stated once, here):
    macs   multiply-accumulates of contractions (conv, linear/matmul, attention, RNN gates);
           bias adds are not MACs.
    flops  2 * macs + every other arithmetic op at its documented per-element cost.
    madd   torchstat's "MAdd": multiplications + additions; a length-k dot product is k
           multiplications and k-1 additions, + 1 for a convolution's bias (a linear layer's
           bias is ignored: torchstat's formulas); for every non-contraction op madd == flops.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Union

import torch
from torch import nn

from ..errors import ModelProfError

__all__ = ["Cost", "FormulaRegistry", "REGISTRY", "ZERO", "register_formula"]

OpKey = Union[torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch.Tag]
OpFormula = Callable[[tuple, dict, Any], "Cost"]
ModuleFormula = Callable[[nn.Module, list, list], dict]

TORCHSTAT_COLUMNS = ("Flops", "MAdd")


@dataclasses.dataclass(frozen=True, slots=True)
class Cost:
    """What one op call costs. ``flops`` defaults to ``2 * macs``; ``madd`` to ``flops``."""

    macs: int = 0
    flops: int | None = None
    madd: int | None = None

    def resolved(self) -> tuple[int, int, int]:
        flops = 2 * self.macs if self.flops is None else self.flops
        madd = flops if self.madd is None else self.madd
        return int(self.macs), int(flops), int(madd)


ZERO = Cost(0, 0, 0)


class FormulaRegistry:
    """Op formulas (keyed by overload, packet or tag) and torchstat module formulas (by type)."""

    def __init__(self) -> None:
        self.ops: dict[Any, OpFormula] = {}
        self.modules: dict[type, ModuleFormula] = {}

    def copy(self) -> FormulaRegistry:
        """An independent registry with the same formulas (to extend without global effect)."""
        new = FormulaRegistry()
        new.ops = dict(self.ops)
        new.modules = dict(self.modules)
        return new

    # -- registration -------------------------------------------------------------------------
    def add(self, keys: tuple, fn: Callable, *, replace: bool = False) -> None:
        if not callable(fn):
            raise ModelProfError(f"formula {fn!r} is not callable")
        if not keys:
            raise ModelProfError("register_formula needs at least one op, tag or module type")
        resolved = [_resolve_key(k) for k in keys]
        for key in resolved:
            table = self.modules if isinstance(key, type) else self.ops
            if key in table and not replace:
                raise ModelProfError(f"a formula for {_key_name(key)} is already registered; "
                                     "pass replace=True to replace it")
        for key in resolved:
            (self.modules if isinstance(key, type) else self.ops)[key] = fn

    # -- lookup --------------------------------------------------------------------------------
    def lookup(self, func: torch._ops.OpOverload) -> OpFormula | None:
        """Formula for one op overload: exact overload, its packet, then its tags."""
        fn = self.ops.get(func)
        if fn is not None:
            return fn
        fn = self.ops.get(func.overloadpacket)
        if fn is not None:
            return fn
        for tag in func.tags:
            fn = self.ops.get(tag)
            if fn is not None:
                return fn
        return None

    def module_formula(self, module_type: type) -> ModuleFormula | None:
        for klass in module_type.__mro__:
            fn = self.modules.get(klass)
            if fn is not None:
                return fn
        return None


def _resolve_key(key: Any) -> Any:
    if isinstance(key, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch.Tag)):
        return key
    if isinstance(key, type) and issubclass(key, nn.Module):
        return key
    if isinstance(key, str):
        return _op_from_name(key)
    raise ModelProfError(f"cannot register a formula for {key!r}: a key is an aten op "
                         "(torch.ops.aten.NAME or torch.ops.aten.NAME.OVERLOAD, or the string "
                         "'aten.NAME'), a torch.Tag, or an nn.Module subclass")


def _op_from_name(name: str) -> Any:
    parts = name.replace("::", ".").split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ModelProfError(f"op name {name!r} is not of the form 'aten.NAME[.OVERLOAD]'")
    try:
        op = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(op, parts[2]) if len(parts) == 3 else op
    except (AttributeError, RuntimeError) as e:
        raise ModelProfError(f"no op named {name!r} exists in this torch") from e


def _key_name(key: Any) -> str:
    return key.__qualname__ if isinstance(key, type) else str(key)


REGISTRY = FormulaRegistry()


def register_formula(*keys: Any, replace: bool = False,
                     registry: FormulaRegistry | None = None) -> Callable[[Callable], Callable]:
    """Decorator adding (or, with ``replace=True``, replacing) the formula for ``keys``.

    An op formula is ``fn(args, kwargs, out) -> Cost``; it sees the op's real arguments (on the
    meta device too, so use shapes only). A module formula (torchstat view) is
    ``fn(module, input_shapes, output_shapes) -> {"Flops": int, "MAdd": int}`` (either key).

    >>> @register_formula(torch.ops.aten.my_op)
    ... def _(args, kwargs, out):
    ...     return Cost(macs=args[0].numel())
    """
    target = REGISTRY if registry is None else registry

    def deco(fn: Callable) -> Callable:
        target.add(keys, fn, replace=replace)
        return fn

    return deco


def optional_ops(*names: str) -> list:
    """The aten ops among ``names`` that exist in the running torch (old and new releases)."""
    return [getattr(torch.ops.aten, n) for n in names if hasattr(torch.ops.aten, n)]
