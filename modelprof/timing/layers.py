"""Per-layer latency without per-layer synchronisation (used by ``profile``).

One *discovery* pass learns the module calls a forward makes; the timed passes then run with hooks
that only write a stamp into pre-allocated storage: ``perf_counter_ns`` on CPU, ``Event.record()``
on CUDA (events allocated after discovery), with ONE synchronize per forward pass and elapsed times
read afterwards. A separate pass, on CUDA, reads the allocator peak of each call.

Keys are ``(qualified module name, call index)``: the root is ``""``, the call index counts from 1
the calls of one module object within one forward (a shared ``relu`` gives ``("relu", 1)``,
``("relu", 2)``). Durations are inclusive (a parent's time contains its children's).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from ..env import collect_env
from ..errors import ModelProfError
from ..hooks import module_hooks, module_names
from ..inputs import ModelInputs
from .clock import clock_for
from .latency import CLOCK_MODES, timing_flags
from .measurement import Measurement
from .modes import grad_context, model_state
from .sampler import (DEFAULT_BUDGET_S, DEFAULT_MAX_SAMPLES, DEFAULT_MIN_SAMPLES,
                      DEFAULT_PRECISION, WARMED, WARMUP_S, StopRule, WarmupPolicy, collect,
                      input_signature, warm_up)

__all__ = ["Key", "LayerTiming", "MemoryStats", "PeakTracker", "is_oom", "time_layers"]

Key = tuple[str, int]


def is_oom(e: BaseException) -> bool:
    """An out-of-memory error: ``torch.OutOfMemoryError`` or a RuntimeError saying so."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    if isinstance(e, RuntimeError):
        msg = str(e).lower()
        return any(s in msg for s in ("out of memory", "can't allocate", "cannot allocate",
                                      "alloc_failed"))
    return False


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Reads and resets the allocator peak; injectable so the nesting logic is testable on CPU."""

    max_allocated: Callable[[], int]
    reset_peak: Callable[[], None]

    @classmethod
    def cuda(cls, device: torch.device) -> MemoryStats:
        return cls(lambda: torch.cuda.max_memory_allocated(device),
                   lambda: torch.cuda.reset_peak_memory_stats(device))


class PeakTracker:
    """Allocator peak of each (nested) call. Entering a call reads the peak so far into the
    enclosing call before resetting it; leaving a call hands its peak up to its parent, so a
    child's reset never loses the parent's peak."""

    def __init__(self, stats: MemoryStats, n_calls: int) -> None:
        self.stats = stats
        self.peak = [0] * n_calls
        self.stack: list[int] = []

    def enter(self, i: int) -> None:
        stats, stack, peak = self.stats, self.stack, self.peak
        if stack:
            top = stack[-1]
            peak[top] = max(peak[top], stats.max_allocated())
        stats.reset_peak()
        peak[i] = stats.max_allocated()      # right after a reset: memory in use at the start
        stack.append(i)

    def exit(self, i: int) -> None:
        stack, peak = self.stack, self.peak
        peak[i] = max(peak[i], self.stats.max_allocated())
        stack.pop()
        if stack:
            top = stack[-1]
            peak[top] = max(peak[top], peak[i])


@dataclasses.dataclass(eq=False)
class LayerTiming:
    """Per-call inclusive durations (ms) of the instrumented passes, aligned by pass."""

    samples: dict[Key, np.ndarray]
    order: list[Key]
    passes_ms: np.ndarray
    parents: dict[Key, Key | None]
    peak_memory_bytes: dict[Key, int] | None = None
    device: str = "cpu"
    batch_size: int = 1
    warmup: int = 0
    stop_reason: str = "repeat"
    env: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.passes_ms.size)

    def median_ms(self) -> dict[Key, float]:
        return {k: float(np.median(v)) for k, v in self.samples.items()}

    def std_ms(self) -> dict[Key, float]:
        return {k: float(v.std(ddof=1)) if v.size > 1 else 0.0 for k, v in self.samples.items()}

    def leaves(self) -> list[Key]:
        """Calls inside which no other hooked call ran, in execution order."""
        inner = {p for p in self.parents.values() if p is not None}
        return [k for k in self.order if k not in inner]

    @property
    def end_to_end(self) -> Measurement:
        """The instrumented end-to-end passes as a Measurement."""
        return Measurement(self.passes_ms, device=self.device, batch_size=self.batch_size,
                           warmup=self.warmup, stop_reason=self.stop_reason,
                           label="instrumented", env=self.env)

    def coverage(self) -> float:
        """Sum of the leaf calls' medians over the median instrumented pass."""
        med = self.median_ms()
        return sum(med[k] for k in self.leaves()) / float(np.median(self.passes_ms))

    def overhead(self, clean: Measurement) -> float:
        """Instrumented / clean end-to-end median (1.02 = hooks cost 2 %)."""
        return float(np.median(self.passes_ms)) / clean.median_ms

    def __repr__(self) -> str:
        med = self.median_ms()
        total = float(np.median(self.passes_ms))
        lines = [f"LayerTiming({self.device}, batch {self.batch_size}): {len(self.order)} calls, "
                 f"{self.n} passes (stop={self.stop_reason}), pass median {total:.3f} ms, "
                 f"coverage {self.coverage():.1%}"]
        for k in self.order[:12]:
            label = (k[0] or "(model)") + (f" #{k[1]}" if k[1] > 1 else "")
            lines.append(f"  {label:<30} {med[k]:10.3f} ms")
        if len(self.order) > 12:
            lines.append(f"  ... {len(self.order) - 12} more")
        return "\n".join(lines)

    def to_dataframe(self) -> Any:
        """One row per call in execution order: name, call, latency_ms (median),
        latency_std_ms, latency_pct (of the median pass), peak_memory_bytes."""
        import pandas as pd
        med, std = self.median_ms(), self.std_ms()
        total = float(np.median(self.passes_ms))
        rows = [{"name": k[0], "call": k[1], "latency_ms": med[k], "latency_std_ms": std[k],
                 "latency_pct": 100.0 * med[k] / total if total > 0 else float("nan"),
                 "peak_memory_bytes": (self.peak_memory_bytes or {}).get(k)}
                for k in self.order]
        return pd.DataFrame(rows)


class _CallPlan:
    """The module calls of one forward: keys, parents and the module object of each call."""

    def __init__(self, names: dict[nn.Module, str]) -> None:
        self.names = names
        self.keys: list[Key] = []
        self.modules: list[nn.Module] = []
        self.parents: dict[Key, Key | None] = {}
        self._counts: dict[nn.Module, int] = {}
        self.stack: list[int] = []

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        c = self._counts.get(module, 0) + 1
        self._counts[module] = c
        key = (self.names[module], c)
        self.parents[key] = self.keys[self.stack[-1]] if self.stack else None
        self.stack.append(len(self.keys))
        self.keys.append(key)
        self.modules.append(module)

    def post(self, module: nn.Module, output: Any) -> None:
        self.stack.pop()


def _running(stack: list[int], keys: list[Key], model: nn.Module) -> str:
    if not stack:
        return f"the model ({type(model).__name__})"
    name, call = keys[stack[-1]] if stack[-1] < len(keys) else ("?", 0)
    return f"module '{name}'" + (f" (call {call})" if call > 1 else "")


def time_layers(
    model: nn.Module,
    model_inputs: ModelInputs,
    *,
    repeat: int | None = None,
    warmup: int | None = None,
    warmup_s: float = WARMUP_S,
    precision: float = DEFAULT_PRECISION,
    budget_s: float = DEFAULT_BUDGET_S,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    modules: dict[nn.Module, str] | None = None,
    memory_stats: MemoryStats | bool | None = None,
    eval_mode: bool = True,
    no_grad: bool = True,
    clock: str = "auto",
) -> LayerTiming:
    """Inclusive latency of every module call, over instrumented forward passes.

    The passes stop like ``measure_latency``'s samples (``repeat`` exactly, else the median of
    the instrumented pass within ``±precision`` inside ``budget_s``). ``warmup`` counts the
    instrumented warm-up passes; one discovery pass (and with memory statistics one memory pass)
    come on top and are counted in ``LayerTiming.warmup``. ``memory_stats``: ``None`` = the CUDA
    allocator on CUDA, none elsewhere; ``False`` = off; or a ``MemoryStats``. The memory pass
    resets the device's peak-memory statistics. ``modules`` (module -> name, as from
    ``modelprof.hooks.module_names``) limits and names the hooked modules.
    """
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module")
    policy = WarmupPolicy.parse(warmup, warmup_s)
    rule = StopRule.parse(repeat, precision, budget_s, min_samples, max_samples)
    if clock not in CLOCK_MODES:
        raise ModelProfError(f"clock={clock!r} must be one of {CLOCK_MODES}")
    dev = model_inputs.device
    if memory_stats is None:
        memory_stats = MemoryStats.cuda(dev) if dev.type == "cuda" else False
    if memory_stats is not False and not isinstance(memory_stats, MemoryStats):
        raise ModelProfError(f"memory_stats={memory_stats!r} must be None, False or a MemoryStats")
    names = module_names(model) if modules is None else modules
    args, kwargs = model_inputs.args, model_inputs.kwargs
    tclock = clock_for(dev, clock)
    signature = input_signature(args, kwargs, device=str(dev),
                                **timing_flags(eval_mode=eval_mode, no_grad=no_grad))
    already_warm = WARMED.seen(model, signature)

    plan = _CallPlan(names)
    keys = plan.keys
    live: list[int] = plan.stack  # the stack of open calls of the pass running now (for errors)

    def forward() -> Any:
        return model(*args, **kwargs)

    with contextlib.ExitStack() as stack:
        if dev.type == "cuda":
            stack.enter_context(torch.cuda.device(dev))
        stack.enter_context(model_state(model, eval_mode))
        stack.enter_context(grad_context(no_grad))
        try:
            with module_hooks(model, plan.pre, plan.post, names):
                forward()
            n = len(keys)
            if n == 0:
                raise ModelProfError(f"no hooked module of {type(model).__name__} ran in a forward "
                                     "pass; nothing to time per layer")
            expected = plan.modules
            root = keys.index(("", 1)) if ("", 1) in keys else None
            stamps = tclock.stamps(2 * n + 2)
            record = stamps.record
            open_calls: list[int] = []
            live = open_calls
            counter = 0

            def pre(module: nn.Module, a: tuple, k: dict) -> None:
                nonlocal counter
                i = counter
                if i >= n or expected[i] is not module:
                    saw = f"module {keys[i][0]!r}" if i < n else f"only {n} calls"
                    raise ModelProfError(
                        f"module '{names.get(module, '?')}' ran as call {i + 1} of the forward, "
                        f"but the discovery pass saw {saw} there; the model's control flow "
                        "changes between passes, so its layers cannot be timed by position")
                counter = i + 1
                open_calls.append(i)
                record(i)

            def post(module: nn.Module, output: Any) -> None:
                record(n + open_calls.pop())

            def instrumented() -> None:
                nonlocal counter
                counter = 0
                open_calls.clear()
                record(2 * n)
                forward()
                record(2 * n + 1)
                if counter != n:
                    raise ModelProfError(f"the forward made {counter} module calls, the discovery "
                                         f"pass {n}; the model's control flow changes between "
                                         "passes")

            starts = list(range(n)) + [2 * n]
            ends = list(range(n, 2 * n)) + [2 * n + 1]
            rows: list[np.ndarray] = []

            def chunk(k: int) -> np.ndarray:
                out = np.empty(k)
                for p in range(k):
                    instrumented()
                    stamps.sync()                      # the one synchronize of this pass
                    d = stamps.elapsed_ms(starts, ends)
                    rows.append(d[:n])
                    out[p] = d[root] if root is not None else d[n]
                return out

            with module_hooks(model, pre, post, names):
                n_warm, est = warm_up(instrumented, policy, already_warm, tclock.sync)
                passes, reason, _ = collect(chunk, rule, est)
            n_warm += 1

            peaks: dict[Key, int] | None = None
            if memory_stats is not False:
                tracker = PeakTracker(memory_stats, n)
                live = tracker.stack
                idx = 0

                def mem_pre(module: nn.Module, a: tuple, k: dict) -> None:
                    nonlocal idx
                    tracker.enter(idx)
                    idx += 1

                def mem_post(module: nn.Module, output: Any) -> None:
                    tracker.exit(tracker.stack[-1])

                with module_hooks(model, mem_pre, mem_post, names):
                    forward()
                n_warm += 1
                peaks = {keys[i]: int(tracker.peak[i]) for i in range(min(idx, n))}
        except ModelProfError:
            raise
        except Exception as e:
            if is_oom(e):
                raise
            raise ModelProfError(f"forward of {type(model).__name__} failed in "
                                 f"{_running(live, keys, model)} while timing layers: "
                                 f"{type(e).__name__}: {e}") from e
    WARMED.add(model, signature)

    table = np.vstack(rows)
    samples = {key: table[:, i].copy() for i, key in enumerate(keys)}
    env = collect_env(dev, dtype=model_inputs.dtype, batch_size=model_inputs.batch_size,
                      clock=tclock.kind, layers=True, eval_mode=eval_mode, no_grad=no_grad)
    return LayerTiming(samples=samples, order=list(keys), passes_ms=np.asarray(passes),
                       parents=dict(plan.parents), peak_memory_bytes=peaks, device=str(dev),
                       batch_size=model_inputs.batch_size, warmup=n_warm, stop_reason=reason,
                       env=env)
