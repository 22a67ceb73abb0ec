"""The training step, timed: forward, loss, backward and optimizer step end to end, and the
backward per module call without per-layer synchronisation.

* **Clean passes** (no hook anywhere): the clock of the device times each step's phases
  ``[forward, loss, backward, optimizer]`` back to back (``Clock.time``: CUDA events, one
  synchronize per chunk; ``perf_counter_ns`` on CPU); gradients are reset to ``None`` between steps,
  untimed. Warm-up and the adaptive stop are the timer's (``sampler``), the stop judged on the
  backward. With an optimizer, the parameters go back to their first values at the start of every
  chunk (untimed), so that thousands of steps do not drift them anywhere unusual.
* **Instrumented passes**, separate: a forward under module hooks notes autograd's sequence numbers
  (``autograd_scope``); before the backward, every node of the graph gets a pre-hook that records
  one pre-allocated stamp and notes the node's call. The time from one stamp to the next belongs to
  the call of the node that opened it (its function, its hooks, and the engine's sums of the
  gradients it produced). One synchronize per pass; elapsed times read afterwards. The report
  states the instrumentation overhead (instrumented / clean backward).
* **Memory** (CUDA, or any ``MemoryStats``): the allocator's peak over one whole step.

Everything runs on a copy of the model (the user's parameters, buffers, gradients and optimizer
are never touched) and under a forked RNG.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from ..autograd_scope import LOSS, SeqMarks, tag_graph
from ..backward import grad_leaves, move_target, step_guard
from ..env import collect_env
from ..errors import ModelProfError
from ..hooks import module_hooks, module_names
from ..inputs import ModelInputs, iter_tensors, moved_model
from ..step import StepSpec
from .clock import StampBuffer, clock_for
from .layers import MemoryStats
from .measurement import Measurement
from .modes import CacheFlusher, amp_context, to_channels_last
from .sampler import (DEFAULT_BUDGET_S, DEFAULT_MAX_SAMPLES, DEFAULT_MIN_SAMPLES,
                      DEFAULT_PRECISION, WARMUP_S, StopRule, WarmupPolicy, collect, warm_up)

__all__ = ["PHASES", "StepTiming", "time_step"]

PHASES = ("forward", "loss", "backward", "optimizer")
_BACKWARD = PHASES.index("backward")


@dataclasses.dataclass(eq=False)
class StepTiming:
    """Clean phase measurements and the instrumented per-call backward times of one step.

    ``calls_ms[p, c]`` is the exclusive backward time of call record ``c`` in instrumented pass
    ``p``; its last column is the loss's (and the engine's start). ``passes_ms`` is each
    instrumented backward end to end.
    """

    forward: Measurement
    loss: Measurement
    backward: Measurement
    optimizer: Measurement | None
    step: Measurement
    calls_ms: np.ndarray
    passes_ms: np.ndarray
    peak_memory_bytes: int | None = None
    nodes: int = 0
    env: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def overhead(self) -> float:
        """Instrumented / clean backward median (1.03 = the hooks cost 3 %)."""
        return float(np.median(self.passes_ms)) / self.backward.median_ms

    @property
    def coverage(self) -> float:
        """Sum of the per-call medians over the clean backward median."""
        return float(np.median(self.calls_ms, axis=0).sum()) / self.backward.median_ms

    def phases(self) -> dict[str, Measurement]:
        out = {"forward": self.forward, "loss": self.loss, "backward": self.backward}
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer
        out["step"] = self.step
        return out


class _Step:
    """One training step of a copy of the model, in phases that keep what the next one needs."""

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict, target: Any, spec: StepSpec,
                 device: torch.device, amp: torch.dtype | None,
                 optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor],
                 leaves: list[torch.Tensor]) -> None:
        self.model, self.args, self.kwargs, self.target = model, args, kwargs, target
        self.spec, self.device, self.amp = spec, device, amp
        self.optimizer, self.params, self.leaves = optimizer, params, leaves
        self.snapshot = [p.detach().clone() for p in params] if optimizer is not None else None
        self.out: Any = None
        self.loss_value: torch.Tensor | None = None

    def forward(self) -> None:
        with amp_context(self.device, self.amp):
            self.out = self.model(*self.args, **self.kwargs)

    def loss(self) -> None:
        with amp_context(self.device, self.amp):
            self.loss_value = self.spec.compute_loss(self.out, self.target)
        self.out = None

    def backward(self) -> None:
        loss, self.loss_value = self.loss_value, None
        loss.backward()

    def optimize(self) -> None:
        self.optimizer.step()

    def clear(self) -> None:
        for t in self.params:
            t.grad = None
        for t in self.leaves:
            t.grad = None

    def restore(self) -> None:
        if self.snapshot is not None:
            with torch.no_grad():
                for p, s in zip(self.params, self.snapshot):
                    p.copy_(s)

    def phases(self) -> list[Any]:
        parts = [self.forward, self.loss, self.backward]
        if self.optimizer is not None:
            parts.append(self.optimize)
        return parts

    def run(self) -> None:
        self.clear()
        for phase in self.phases():
            phase()


class _Stamper:
    """A node hook: one stamp, and the column (call) that the time from it on belongs to."""

    __slots__ = ("record", "tags", "i")

    def __init__(self, record: Any, size: int, first: int) -> None:
        self.record = record
        self.tags = np.zeros(size, dtype=np.int64)
        self.tags[0] = first
        self.i = 0

    def hit(self, column: int, *_: Any) -> None:
        i = self.i + 1
        self.record(i)
        self.tags[i] = column
        self.i = i


class _Instrumented:
    """Instrumented passes: the forward notes sequence numbers, the backward records stamps."""

    def __init__(self, step: _Step, names: dict[nn.Module, str], n_calls: int, clock: Any) -> None:
        self.step, self.names, self.n_calls, self.clock = step, names, n_calls, clock
        self.marks = SeqMarks()
        self.counter = 0
        self.stack: list[int] = []
        self.stamps: StampBuffer | None = None
        self.size = 0
        self.rows: list[np.ndarray] = []
        self.nodes = 0

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        c = self.counter
        self.counter = c + 1
        self.stack.append(c)
        self.marks.mark(c)

    def _post(self, module: nn.Module, output: Any) -> None:
        if self.stack:
            self.stack.pop()
        self.marks.mark(self.stack[-1] if self.stack else 0)

    def _column(self, call: int) -> int:
        return self.n_calls if call == LOSS or not 0 <= call < self.n_calls else call

    def one(self) -> float:
        step = self.step
        step.clear()
        self.marks, self.counter = SeqMarks(), 0
        self.stack.clear()
        with module_hooks(step.model, self._pre, self._post, self.names):
            step.forward()
        if self.counter != self.n_calls and not (self.counter == 0 and self.n_calls == 1):
            raise ModelProfError(f"the forward made {self.counter} module calls, the counted pass "
                                 f"{self.n_calls}; the model's control flow changes between "
                                 "passes, so its backward cannot be timed per layer")
        self.marks.mark(LOSS)
        step.loss()
        tags = tag_graph([step.loss_value.grad_fn], self.marks)
        self.nodes = len(tags.nodes)
        need = len(tags.nodes) + 2
        if self.stamps is None or need > self.size:
            self.stamps, self.size = self.clock.stamps(need), need
        stamps = self.stamps
        stamper = _Stamper(stamps.record, need, self.n_calls)
        column = self._column
        hit = stamper.hit
        handles = [node.register_prehook(functools.partial(hit, column(tags.call_of(node))))
                   for node in tags.nodes]
        try:
            stamps.record(0)
            step.backward()
            end = stamper.i + 1
            stamps.record(end)
        finally:
            for h in handles:
                h.remove()
        stamps.sync()                                   # the one synchronize of this pass
        d = stamps.elapsed_ms(range(end), range(1, end + 1))
        self.rows.append(np.bincount(stamper.tags[:end], weights=d, minlength=self.n_calls + 1))
        return float(d.sum())

    def chunk(self, k: int) -> np.ndarray:
        return np.array([self.one() for _ in range(k)], dtype=np.float64)


def time_step(
    model: nn.Module,
    inputs: ModelInputs,
    spec: StepSpec,
    n_calls: int,
    *,
    training: bool = True,
    dtype: torch.dtype | None = None,
    amp: torch.dtype | None = None,
    warmup: int | None = None,
    warmup_s: float = WARMUP_S,
    repeat: int | None = None,
    precision: float = DEFAULT_PRECISION,
    budget_s: float = DEFAULT_BUDGET_S,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    clock: str = "auto",
    channels_last: bool = False,
    cold_cache: bool = False,
    memory_stats: MemoryStats | bool | None = None,
) -> StepTiming:
    """Time training steps of (a copy of) ``model`` on ``inputs``; see the module doc.

    ``n_calls`` is the number of module calls the counted pass saw (``count_step``): the
    instrumented passes check they make the same calls, in the same order. The clean and the
    instrumented passes each stop by the timer's rule (``repeat``, or ``precision`` within
    ``budget_s``). ``memory_stats``: ``None`` = the CUDA allocator on CUDA, none elsewhere;
    ``False`` = off; or a ``MemoryStats`` (its peak is reset).
    """
    t_begin = time.perf_counter()
    policy = WarmupPolicy.parse(warmup, warmup_s)
    rule = StopRule.parse(repeat, precision, budget_s, min_samples, max_samples)
    dev = inputs.device
    if dev.type == "meta":
        raise ModelProfError("device='meta' has no clock: pass timing=False to count the step "
                             "from shapes alone, or a real device to time it")
    if memory_stats is None:
        memory_stats = MemoryStats.cuda(dev) if dev.type == "cuda" else False
    if memory_stats is not False and not isinstance(memory_stats, MemoryStats):
        raise ModelProfError(f"memory_stats={memory_stats!r} must be None, False or a MemoryStats")
    base = getattr(model, "_orig_mod", model)
    runner = moved_model(base, dev, dtype,
                         memory_format=torch.channels_last if channels_last else None)
    if runner is base:  # train-mode steps change buffers, .grad and parameters: a copy
        runner = copy.deepcopy(base)
    runner.train(training)
    copy_of = {id(p): q for (_, p), (_, q) in zip(base.named_parameters(remove_duplicate=False),
                                                  runner.named_parameters(remove_duplicate=False))}
    params = list({id(p): p for p in runner.parameters()}.values())
    args, kwargs = grad_leaves(inputs.args), grad_leaves(inputs.kwargs)
    if channels_last:
        args, kwargs = to_channels_last(args), to_channels_last(kwargs)
    leaves = [t for t in iter_tensors((args, kwargs)) if t.requires_grad]
    target = move_target(spec.target, dev, dtype)
    tclock = clock_for(dev, clock)
    flusher = CacheFlusher(dev) if cold_cache else None
    peak: int | None = None

    with contextlib.ExitStack() as stack:
        if dev.type == "cuda":
            stack.enter_context(torch.cuda.device(dev))
        stack.enter_context(step_guard(dev))
        optimizer = spec.make_optimizer(params, copy_of)
        step = _Step(runner, args, kwargs, target, spec, dev, amp, optimizer, params, leaves)
        phases = step.phases()

        def between() -> None:
            step.clear()
            if flusher is not None:
                flusher()

        try:
            n_warm, est = warm_up(step.run, policy, False, tclock.sync)
            parts: list[np.ndarray] = []

            def clean_chunk(k: int) -> np.ndarray:
                step.restore()
                got = tclock.time(phases, k, between)
                parts.append(got)
                return got[:, _BACKWARD]

            _, reason, _ = collect(clean_chunk, rule, est)
            inst = _Instrumented(step, module_names(runner), n_calls, tclock)
            step.restore()
            n_inst, est_inst = warm_up(inst.one, policy, True, tclock.sync)
            inst.rows.clear()
            passes, inst_reason, _ = collect(inst.chunk, rule, est_inst)
            if memory_stats is not False:
                step.restore()
                step.clear()
                tclock.sync()
                memory_stats.reset_peak()
                for phase in phases:
                    phase()
                tclock.sync()
                peak = int(memory_stats.max_allocated())
        except ModelProfError:
            raise
        except Exception as e:
            raise ModelProfError(f"a training step of {type(base).__name__} failed while timing "
                                 f"it: {type(e).__name__}: {e}") from e

    table = np.concatenate(parts, axis=0)
    env = collect_env(dev, dtype=amp or inputs.dtype, batch_size=inputs.batch_size,
                      clock=tclock.kind, backward=True, training=training, loss=spec.loss_name,
                      optimizer=spec.optimizer_name, amp=amp, channels_last=channels_last,
                      cold_cache=cold_cache, instrumented_stop_reason=inst_reason)
    common = dict(device=str(dev), batch_size=inputs.batch_size, warmup=n_warm,
                  stop_reason=reason, precision=None if rule.repeat is not None else rule.precision,
                  env=env)
    names = ["forward", "loss", "backward"] + (["optimizer"] if optimizer is not None else [])
    got = {name: Measurement(table[:, i], label=name, **common) for i, name in enumerate(names)}
    step_m = Measurement(table.sum(axis=1), label="step",
                         wall_s=time.perf_counter() - t_begin, **common)
    return StepTiming(forward=got["forward"], loss=got["loss"], backward=got["backward"],
                      optimizer=got.get("optimizer"), step=step_m,
                      calls_ms=np.vstack(inst.rows), passes_ms=np.asarray(passes, dtype=np.float64),
                      peak_memory_bytes=peak, nodes=inst.nodes, env=env)
