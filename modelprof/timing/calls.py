"""Which module call is running in a timed pass: the one service the timed instruments sit on.

A discovery pass records the calls of one forward (:class:`CallPlan`); in every timed pass
:class:`Calls` checks each call against it (the passes are read by position), keeps the calls
open (what a failure names and a collective is charged to) and tells one
:class:`TimedInstrument`: host stamps (``timing/layers.py``), the profiler ranges whose kernels
are read per call (``timing/kernels.py``), the allocator peaks, and the marks that tag the
backward's autograd nodes with the forward call that made them (``step/timing.py``). The
counting pass has a service of its own (``counting.scope.Tracker``): its per-call work (shapes,
bytes, parameters) must not run between two stamps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime.hooks import module_hooks

__all__ = ["CallPlan", "Calls", "Key", "TimedInstrument", "discover"]

Key = tuple[str, int]


class CallPlan:
    """The module calls of one forward: keys, parents and the module object of each call."""

    def __init__(self, names: dict[nn.Module, str]) -> None:
        self.names = names
        self.keys: list[Key] = []
        self.modules: list[nn.Module] = []
        self.parents: dict[Key, Key | None] = {}
        self.parent_index: list[int | None] = []
        self._counts: dict[nn.Module, int] = {}
        self.stack: list[int] = []
        #: the calls open where the last error was raised (innermost last): what a failure names
        self.failed: list[int] = []
        self._unwinding = False

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._unwinding = False
        c = self._counts.get(module, 0) + 1
        self._counts[module] = c
        key = (self.names[module], c)
        parent = self.stack[-1] if self.stack else None
        self.parents[key] = self.keys[parent] if parent is not None else None
        self.parent_index.append(parent)
        self.stack.append(len(self.keys))
        self.keys.append(key)
        self.modules.append(module)

    def post_always(
        self, module: nn.Module, args: Any, kwargs: Any, out: Any, raised: bool
    ) -> None:
        """Also when the call raised (a model may catch it and go on); the calls open where it
        was raised are kept."""
        if raised and not self._unwinding:
            self.failed = list(self.stack)
        self._unwinding = raised
        self.stack.pop()

    def nested_counts(self) -> np.ndarray:
        """For each call, how many calls ran inside it (all depths)."""
        nested = np.zeros(len(self.keys), dtype=np.int64)
        for i, parent in enumerate(self.parent_index):
            while parent is not None:
                nested[parent] += 1
                parent = self.parent_index[parent]
        return nested


def discover(model: nn.Module, forward: Callable[[], Any], plan: CallPlan) -> CallPlan:
    """Run one forward with counting hooks: the calls it makes, in order, into ``plan``."""
    with module_hooks(model, plan.pre, plan.post_always, plan.names, post_with_inputs=True):
        forward()
    if not plan.keys:
        raise ModelProfError(
            f"no hooked module of {type(model).__name__} ran in a forward "
            "pass; nothing to time per layer"
        )
    return plan


class TimedInstrument:
    """What a timed pass reads per call: ``enter(i)`` runs before call ``i`` (its index in the
    plan), ``exit(i)`` after it (also when it raised). ``reading`` says what a call's value
    holds: ``"inclusive"`` (the calls inside it too: a span between two stamps, a peak) or
    ``"own"`` (its part alone: the kernels launched in its range and none of its children's,
    the backward's nodes it made); ``counting.tree.by_parents`` makes an own reading inclusive."""

    reading = "inclusive"

    def enter(self, i: int) -> None:
        return None

    def exit(self, i: int) -> None:
        return None


class Calls:
    """The call running now in the timed passes of ``plan`` (``None``: not checked against a
    discovery pass, only counted, as the training step's forward), telling ``instrument``."""

    def __init__(self, plan: CallPlan | None, instrument: TimedInstrument, n: int = 0) -> None:
        self.plan = plan
        self.n = len(plan.keys) if plan is not None else n
        self.enter, self.exit = instrument.enter, instrument.exit  # bound once: hot path
        self.open: list[int] = []
        self.counter = 0

    def pre(self, module: nn.Module, a: tuple, k: dict) -> None:
        i = self.counter
        if i >= self.n or self.plan.modules[i] is not module:
            raise self._out_of_order(module, i)
        self.counter = i + 1
        self.open.append(i)
        self.enter(i)

    def counted_pre(self, module: nn.Module, a: tuple, k: dict) -> None:
        i = self.counter
        self.counter = i + 1
        self.open.append(i)
        self.enter(i)

    def post(self, module: nn.Module, *_: Any) -> None:
        # (hooked ``always``, also when the call raised: a model that catches it goes on with
        # its calls nested)
        if self.open:
            self.exit(self.open.pop())

    def current(self) -> int:
        """The innermost open call (``n``: outside every call)."""
        return self.open[-1] if self.open else self.n

    def begin(self) -> None:
        """A pass starts: no call made yet."""
        self.counter = 0
        self.open.clear()

    def close_open(self) -> None:
        """Exit what a failing forward left open (innermost first)."""
        while self.open:
            self.exit(self.open.pop())

    def check_complete(self, what: str = "the discovery pass", why: str = "") -> None:
        """The pass made as many calls as ``what`` saw."""
        if self.counter != self.n:
            raise ModelProfError(
                f"the forward made {self.counter} module calls, {what} {self.n}; the model's "
                f"control flow changes between passes{why}"
            )

    @contextlib.contextmanager
    def hooked(
        self, model: nn.Module, names: dict[nn.Module, str], always: bool = False
    ) -> Iterator[None]:
        """The hooks on ``model``'s calls; ``always``: the exit also of a call that raised."""
        pre = self.pre if self.plan is not None else self.counted_pre
        with module_hooks(model, pre, self.post, names, post_with_inputs=always):
            yield

    def _out_of_order(self, module: nn.Module, i: int) -> ModelProfError:
        plan, n = self.plan, self.n
        saw = f"module {plan.keys[i][0]!r}" if i < n else f"only {n} calls"
        return ModelProfError(
            f"module '{plan.names.get(module, '?')}' ran as call {i + 1} of the forward, but "
            f"the discovery pass saw {saw} there; the model's control flow changes between "
            "passes, so its layers cannot be timed by position"
        )
