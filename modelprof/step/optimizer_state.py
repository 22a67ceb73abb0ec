"""The bytes an optimizer keeps per parameter, read from the shapes of its real state.

The optimizer takes one step on a small float32 probe parameter of each rank the model's
parameters have, with distinct prime dimensions (rank 2: 3 x 5), and each state tensor's shape
is read in terms of the probe's: Adam's ``exp_avg`` of 3 x 5 is one element per parameter
element, Adafactor's ``row_var`` of 3 x 1 one per row, a 0-dimensional ``step`` a few bytes per
tensor; a list of state tensors (LBFGS's ``old_dirs``) counts ``history_size`` of them. The same
rule then sizes the state of any parameter shape, sharded or whole.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from modelprof.errors import ModelProfError, a_type, error_line

__all__ = ["OPTIMIZER_STATES", "OptimizerState", "optimizer_states", "scalar_state_bytes"]

#: optimizer state tensors per parameter element, and bytes of scalar state per tensor
OPTIMIZER_STATES: dict[str, tuple[int, int]] = {
    "adam": (2, 4),
    "adamw": (2, 4),
    "sgd": (0, 0),
    "sgd_momentum": (1, 0),
}
#: probe dimensions: distinct primes, so that each state dimension names the one it copies
_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23)
#: options that choose how a step runs, not what it keeps: the probe runs plainly on the CPU
_EXECUTION = frozenset({"params", "foreach", "fused", "capturable", "differentiable"})
#: a state dimension: an index into the parameter's shape, ALL its elements, or a constant
ALL = "all"


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One state tensor: its shape as factors of the parameter's (``dims``), and whether it
    is floating (held at the state dtype) or not (``itemsize`` bytes an element)."""

    dims: tuple[Any, ...]
    floating: bool
    itemsize: int
    count: int = 1

    def elements(self, shape: tuple[int, ...]) -> int:
        def size(d: Any) -> int:
            if d == ALL:
                return math.prod(shape)
            return shape[d[1]] if isinstance(d, tuple) else int(d)

        return self.count * math.prod(size(d) for d in self.dims)


class OptimizerState:
    """Bytes of state per parameter of a shape: :meth:`nbytes` gives ``(bytes that scale with
    the parameter, fixed bytes per tensor)``; floating state at ``state_size`` bytes an
    element (fp32 under mixed precision), the rest as stored."""

    def __init__(self, name: str, per_element: int = 0, scalar_bytes: int = 0, probe: Any = None):
        self.name = name
        self._fixed = (per_element, scalar_bytes)
        self._probe = probe
        self._rules: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return f"OptimizerState({self.name})"

    def rule(self, ndim: int) -> list[_Entry]:
        if self._probe is None:
            states, scalars = self._fixed
            entries = [_Entry((ALL,), True, 4)] * states
            return [*entries, _Entry((), False, scalars)] if scalars else entries
        if ndim not in self._rules:
            self._rules[ndim] = self._probe(min(ndim, len(_PRIMES)))
        return self._rules[ndim]

    def shared(self) -> bool:
        """Whether the optimizer keeps one state for all its parameters (LBFGS), so that its
        fixed bytes are held once, not once per tensor."""
        if self._probe is None:
            return False
        if "shared" not in self._rules:
            try:
                self._rules["shared"] = self._probe("shared")
            except ModelProfError:  # takes no 1-D parameters (Muon): sized per parameter
                self._rules["shared"] = False
        return bool(self._rules["shared"])

    def nbytes(self, shape: tuple[int, ...], state_size: int) -> tuple[int, int]:
        scaled = fixed = 0
        for e in self.rule(len(shape)):
            if not e.dims or all(isinstance(d, int) for d in e.dims):
                fixed += e.elements(shape) * e.itemsize
            else:
                scaled += e.elements(shape) * (state_size if e.floating else e.itemsize)
        return scaled, fixed


def optimizer_states(optimizer: Any) -> OptimizerState:
    """The state rule of ``optimizer``, taken in the forms ``profile(optimizer=)`` takes: a
    name of :data:`OPTIMIZER_STATES` or of a ``torch.optim`` class (``"adafactor"``), a
    ``torch.optim.Optimizer`` class, an instance (probed with its options) or a factory
    (``lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)``)."""
    if isinstance(optimizer, str):
        if optimizer in OPTIMIZER_STATES:
            return OptimizerState(optimizer, *OPTIMIZER_STATES[optimizer])
        classes = torch_optimizers()
        found = classes.get(optimizer.lower())
        if found is None:
            raise ModelProfError(
                f"optimizer={optimizer!r} is not one of {sorted(OPTIMIZER_STATES)}, nor a "
                f"torch.optim optimizer ({', '.join(sorted(classes))})"
            )
        optimizer = found
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return OptimizerState(optimizer.__name__, probe=lambda n: _probe(optimizer, n))
    if isinstance(optimizer, torch.optim.Optimizer):
        cls, options = type(optimizer), _options(optimizer)
        return OptimizerState(
            cls.__name__, probe=lambda n: _probe(lambda ps: cls(ps, **options), n)
        )
    if callable(optimizer) and not isinstance(optimizer, type):
        name = getattr(optimizer, "__name__", type(optimizer).__name__)
        return OptimizerState(name, probe=lambda n: _probe(optimizer, n))
    raise ModelProfError(
        f"optimizer={optimizer!r} must be a name, a torch.optim optimizer (class or instance) "
        "or a factory (lambda params: ...)"
    )


def scalar_state_bytes(optimizer: Any, shapes: Iterable[tuple[int, ...]]) -> int:
    """The state bytes of ``optimizer`` (any form :func:`optimizer_states` takes) that do not
    scale with the parameters of ``shapes``: Adam's 4-byte ``step`` once per tensor, a shared
    state's (LBFGS) once in all. ``fit`` counts them so; so does ``memory_estimate()``."""
    rule = optimizer_states(optimizer)
    fixed = [rule.nbytes(tuple(s), 4)[1] for s in shapes]
    return max(fixed, default=0) if rule.shared() else sum(fixed)


def torch_optimizers() -> dict[str, type]:
    """torch.optim's optimizer classes by lower-case name (as ``profile`` takes them)."""
    return {
        k.lower(): v
        for k, v in vars(torch.optim).items()
        if isinstance(v, type)
        and issubclass(v, torch.optim.Optimizer)
        and v is not torch.optim.Optimizer
    }


def _options(optimizer: Any) -> dict[str, Any]:
    """The instance's options its class's constructor takes (not a scheduler's ``initial_lr``,
    nor execution switches)."""
    params = inspect.signature(type(optimizer).__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {
        k: v
        for k, v in optimizer.param_groups[0].items()
        if k not in _EXECUTION and (takes_any or k in params)
    }


def _probe(make: Any, ndim: int | str) -> Any:
    """The state of one step of the optimizer ``make([param])`` builds, as :class:`_Entry`:
    stepped on parameters of ``ndim`` prime dimensions and of twice those, so that a state
    dimension follows the parameter's only where it moved with it; ``ndim="shared"``: whether,
    stepping two parameters, it kept state for one only (as LBFGS)."""
    if ndim == "shared":
        return _stepped(make, [(3,), (5,)], shared=True)
    small = _PRIMES[: int(ndim)]
    large = tuple(2 * d for d in small)
    (first, history), (second, _) = _stepped(make, [small]), _stepped(make, [large])
    if len(first) != len(second):
        second = first  # a state that changes its layout with the shape: read as the first
    return [
        _entry(t, u, small, large, history, listed) for (t, listed), (u, _) in zip(first, second)
    ]


def _stepped(make: Any, shapes: list[tuple[int, ...]], shared: bool = False) -> Any:
    """One step of ``make(params)`` on float32 parameters of ``shapes`` (sparse gradients where
    the optimizer takes only those): the first parameter's state tensors with their list
    lengths, and the history size; with ``shared``, whether only one parameter got state."""
    errors = []
    for sparse in (False, True):
        params = [torch.zeros(s, requires_grad=True) for s in shapes]
        try:
            probe = make(params)
            if not isinstance(probe, torch.optim.Optimizer):
                raise ModelProfError(
                    f"optimizer factory returned {a_type(probe)}, not a torch.optim.Optimizer"
                )
            closure = functools.partial(_closure, params, sparse)
            closure()
            takes = "closure" in inspect.signature(probe.step).parameters
            probe.step(closure) if takes else probe.step()
        except ModelProfError:
            raise
        except Exception as e:  # noqa: BLE001 - the optimizer's own refusal, named below
            errors.append(e)
            continue
        if shared:
            return sum(1 for q in params if probe.state.get(q)) == 1
        history = int(probe.param_groups[0].get("history_size", 1) or 1)
        return list(_state_tensors(probe.state[params[0]])), history
    name = getattr(make, "__name__", type(make).__name__)
    raise ModelProfError(
        f"optimizer {name} cannot step a float32 parameter of shape {shapes[0]} on the CPU to "
        f"be sized: {error_line(errors[0], 200)}"
    )


def _closure(params: list[torch.Tensor], sparse: bool) -> torch.Tensor:
    """A loss of ``params`` whose gradient is ``p - 1`` for each (not zero: LBFGS keeps its
    history only while it moves), set dense or sparse."""
    loss = torch.zeros(())
    for p in params:
        p.grad = None
        loss = loss + ((p.detach() - 1) ** 2).sum() / 2
        grad = p.detach() - 1
        p.grad = grad.to_sparse() if sparse else grad
    return loss


def _state_tensors(state: dict[str, Any]) -> Iterator[tuple[torch.Tensor, int | None]]:
    """Each state tensor, with None, or the tensors of a list with its length."""
    for value in state.values():
        if isinstance(value, torch.Tensor):
            yield value, None
        elif isinstance(value, (list, tuple)):
            tensors = [v for v in value if isinstance(v, torch.Tensor)]
            if tensors:
                yield tensors[0], len(value)


def _entry(
    t: torch.Tensor,
    u: torch.Tensor,
    small: tuple[int, ...],
    large: tuple[int, ...],
    history: int,
    listed: int | None,
) -> _Entry:
    """A state tensor's shape as factors of the probe's, from ``t`` and ``u`` on the probes of
    dimensions ``small`` and ``large`` (twice those): a probe dimension both times is that one,
    all its elements both times ``ALL``, anything else a constant, as read on the first."""
    dims: list[Any] = []
    grow = len(t.shape) == len(u.shape)
    for j, d in enumerate(t.shape):
        e = u.shape[j] if grow else d
        if d != 1 and d in small and e == large[small.index(d)]:
            dims.append(("dim", small.index(d)))
        elif d == math.prod(small) > 1 and e == math.prod(large):
            dims.append(ALL)
        else:
            dims.append(d)
    count = 1 if listed is None else max(history, listed)
    return _Entry(tuple(dims), t.is_floating_point(), t.element_size(), count)
