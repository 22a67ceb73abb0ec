"""The one registry of cost formulas, filled by ``register_formula``.

Keys are ops of any namespace (an overload packet such as ``torch.ops.aten.convolution`` or one
overload), a higher-order operator, a ``torch.Tag`` for a whole family (``torch.Tag.pointwise``),
or an ``nn.Module`` subclass for the torchstat view. An op found nowhere is counted through its
decomposition where it has one (``counter.py``), else reported *unsupported*, never a silent 0.

Conventions (stated once, here):
    macs   multiply-accumulates of contractions (conv, linear/matmul, attention, RNN gates);
           bias adds are not MACs.
    flops  2 * macs + every other arithmetic op at its documented per-element cost.
    madd   torchstat's "MAdd": multiplications + additions; a length-k dot product is k
           multiplications and k-1 additions (none where k = 0: ``dot_madd``), + 1 for a
           convolution's bias (a linear layer's bias is ignored: torchstat's formulas); for
           every non-contraction op madd == flops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.compat import optional_ops

__all__ = [
    "Cost",
    "FormulaRegistry",
    "REGISTRY",
    "ZERO",
    "dot_madd",
    "register_formula",
    "wants_probe",
]

HigherOrderOperator = compat.HigherOrderOperator
OpFormula = Callable[[tuple, dict, Any], "Cost"]
ModuleFormula = Callable[[nn.Module, list, list], dict]


@dataclasses.dataclass(frozen=True, slots=True)
class Cost:
    """What one op call costs. ``flops`` defaults to ``2 * macs``; ``madd`` to ``flops``.
    ``note`` says when the count is not exact (an upper bound where the values it needs are
    unknown, on meta); the report lists every note with its call count (``Report.notes``)."""

    macs: int = 0
    flops: int | None = None
    madd: int | None = None
    note: str | None = None

    def resolved(self) -> tuple[int, int, int]:
        flops = 2 * self.macs if self.flops is None else self.flops
        madd = flops if self.madd is None else self.madd
        return int(self.macs), int(flops), int(madd)


ZERO = Cost(0, 0, 0)


def dot_madd(macs: int, outputs: int) -> int:
    """torchstat's MAdd of one product's ``outputs`` dot products, ``macs`` multiplications in
    all: (2k - 1) an output of length k, i.e. 2 * macs - outputs; 0, not negative, where k = 0
    (a zero-length contraction: an ``nn.Linear(0, n)``, a 3x0 @ 0x4 matmul) does no
    arithmetic at all."""
    return max(2 * macs - outputs, 0)


def total(costs: Iterable[Cost | None]) -> Cost:
    """The sum of ``costs`` (None, an unsupported op's, skipped) as one cost, without notes."""
    resolved = [c.resolved() for c in costs if c is not None]
    return Cost(*map(sum, zip(*resolved))) if resolved else ZERO


def arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    """A formula's argument ``name``: positional at ``pos`` or by keyword, else ``default``."""
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def first(out: Any) -> Any:
    """An op's first output (of a tuple or list of them)."""
    return out[0] if isinstance(out, (tuple, list)) else out


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
                raise ModelProfError(
                    f"a formula for {key.__qualname__ if isinstance(key, type) else key} is "
                    "already registered; pass replace=True to replace it"
                )
        for key in resolved:
            (self.modules if isinstance(key, type) else self.ops)[key] = fn

    # -- lookup --------------------------------------------------------------------------------
    def lookup(self, func: Any) -> OpFormula | None:
        """Formula for one op overload: exact overload, its packet (``out=`` overloads share
        it), its tags, then (for an in-place op such as ``addmm_``) its functional form's. A
        higher-order operator is looked up by itself only."""
        fn = self.ops.get(func)
        if fn is not None or isinstance(func, HigherOrderOperator):
            return fn
        fn = self.ops.get(func.overloadpacket)
        if fn is None:
            fn = next((self.ops[tag] for tag in func.tags if tag in self.ops), None)
        if fn is not None:
            return fn
        functional = functional_form(func)
        return self.lookup(functional) if functional is not None else None

    def module_formula(self, module_type: type) -> ModuleFormula | None:
        return next((self.modules[k] for k in module_type.__mro__ if k in self.modules), None)


def functional_form(func: compat.OpOverload) -> compat.OpOverload | None:
    """The out-of-place op of an in-place one (``aten.addmm_.default`` -> ``aten.addmm.default``):
    same arguments, same arithmetic; None for an op that is not in-place."""
    name = compat.op_schema(func).name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, func.namespace), name[:-1], None)
    if not isinstance(packet, compat.OpOverloadPacket):
        return None
    overload = getattr(packet, compat.overload_name(func), None)
    return overload if overload is not None else getattr(packet, "default", None)


def _resolve_key(key: Any) -> Any:
    ops = (compat.OpOverload, compat.OpOverloadPacket, torch.Tag, HigherOrderOperator)
    if isinstance(key, ops) or (isinstance(key, type) and issubclass(key, nn.Module)):
        return key
    if isinstance(key, str):
        return _op_from_name(key)
    raise ModelProfError(
        f"cannot register a formula for {key!r}: a key is an op "
        "(torch.ops.aten.NAME or torch.ops.aten.NAME.OVERLOAD, any namespace, "
        "or the string 'aten.NAME'), a higher-order operator, a torch.Tag, or "
        "an nn.Module subclass"
    )


def _op_from_name(name: str) -> Any:
    parts = name.replace("::", ".").split(".")
    if len(parts) not in (2, 3) or not all(parts):
        raise ModelProfError(f"op name {name!r} is not of the form 'aten.NAME[.OVERLOAD]'")
    try:
        op = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(op, parts[2]) if len(parts) == 3 else op
    except (AttributeError, RuntimeError) as e:
        raise ModelProfError(f"no op named {name!r} exists in this torch") from e


REGISTRY = FormulaRegistry()


def register_formula(
    *keys: Any, replace: bool = False, registry: FormulaRegistry | None = None
) -> Callable[[Callable], Callable]:
    """Decorator adding (or, with ``replace=True``, replacing) the formula for ``keys``.

    An op formula is ``fn(args, kwargs, out) -> Cost`` on the op's real arguments (on meta too:
    use shapes only). A module formula (torchstat view) is ``fn(module, input_shapes,
    output_shapes) -> {"Flops": int, "MAdd": int}`` (either key).

    >>> @register_formula(torch.ops.aten.my_op)
    ... def _(args, kwargs, out):
    ...     return Cost(macs=args[0].numel())
    """
    target = REGISTRY if registry is None else registry

    def deco(fn: Callable) -> Callable:
        target.add(keys, fn, replace=replace)
        return fn

    return deco


def wants_probe(fn: Callable) -> Callable:
    """Mark an op formula that costs a callable it is handed (``score_mod``): the counter calls
    it as ``fn(args, kwargs, out, probe=...)``, ``probe(callable, *args)`` the :class:`Cost` of
    one call (so the formula never imports the counter)."""
    fn.wants_probe = True
    return fn


def register_present(*keys: Any) -> Callable[[Callable], Callable]:
    """``register_formula`` for keys that may not exist in the running torch (``optional_ops``):
    registers nothing when none does, so the package imports on old and new releases alike."""
    if keys:
        return register_formula(*keys)
    return lambda fn: fn


def register_ops(*names: str, namespace: str = "aten") -> Callable[[Callable], Callable]:
    """``register_present`` for the ops of ``namespace`` that ``names`` (each one name or a word
    list) name and the running torch has."""
    return register_present(*optional_ops(*" ".join(names).split(), namespace=namespace))


def zero(args: tuple, kwargs: dict, out: Any) -> Cost:
    """The formula of an op that computes nothing (its bytes still count: not ``VIEW``)."""
    return ZERO
