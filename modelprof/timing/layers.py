"""Per-layer latency without per-layer synchronisation (used by ``profile``).

A *discovery* pass learns the module calls of a forward; the timed passes' hooks only write a
stamp into pre-allocated storage (``perf_counter_ns`` on CPU, ``Event.record()`` on CUDA), with
ONE synchronize per pass. A separate pass, on CUDA, reads the allocator peak of each call.

Keys are ``(qualified module name, call index)``: the root is ``""``; the index counts from 1 the
calls of one module object in one forward (a shared ``relu``: ``("relu", 1)``, ``("relu", 2)``).
Durations are inclusive (a parent's time contains its children's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime.device import MemoryStats, PeakTracker, is_oom
from modelprof.runtime.execution import (
    RunMode,
    completing,
    legacy_eval_mode,
    running,
    to_channels_last,
)
from modelprof.runtime.group import communicates
from modelprof.runtime.hooks import module_names
from modelprof.runtime.inputs import ModelInputs
from modelprof.runtime.placement import moved_model
from modelprof.timing.calls import CallPlan, Calls, Key, TimedInstrument, discover
from modelprof.timing.clock import Clock
from modelprof.timing.comm import CommStamps
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.runner import Runner, model_label
from modelprof.timing.sampler import input_signature

__all__ = [
    "CallPlan",
    "HookCost",
    "carried_names",
    "Key",
    "LayerTiming",
    "MemoryStats",
    "PeakTracker",
    "calibrate_hooks",
    "is_oom",
    "MIN_COST_PASSES",
    "time_layers",
]


@dataclasses.dataclass(eq=False)
class LayerTiming:
    """Per-call inclusive durations (ms) of the instrumented passes, aligned by pass.

    ``samples`` are corrected for the hooks' cost (``hook_cost``, when applied), ``raw_samples``
    as read; ``passes_ms``: each instrumented pass, as read from outside the model call.
    """

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
    raw_samples: dict[Key, np.ndarray] | None = None
    hook_cost: HookCost | None = None
    blocks: np.ndarray | None = None
    timestamps_s: np.ndarray | None = None
    plain_ms: np.ndarray | None = None
    #: per call key, its collectives' time (ms per pass; CPU, under a process group), included
    #: in ``samples``
    comm_samples: dict[Key, np.ndarray] | None = None
    min_samples: int | None = None
    #: seconds the passes were extended by (``layer_extend_s``) to reach ``min_samples``
    extended_s: float = 0.0
    #: each call's start from its pass's start (passes x calls, ms), for ``Report.to_trace``
    start_offsets_ms: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.passes_ms.size)

    @property
    def undersampled(self) -> bool:
        """The time budget stopped the instrumented passes below ``min_samples``."""
        return self.end_to_end.undersampled

    def median_ms(self) -> dict[Key, float]:
        return {k: float(np.median(v)) for k, v in self.samples.items()}

    def std_ms(self) -> dict[Key, float]:
        return {
            k: float(v.std(ddof=1)) if v.size > 1 else math.nan for k, v in self.samples.items()
        }

    def leaves(self) -> list[Key]:
        """Calls inside which no other hooked call ran, in execution order."""
        inner = {p for p in self.parents.values() if p is not None}
        return [k for k in self.order if k not in inner]

    @property
    def end_to_end(self) -> Measurement:
        """The instrumented passes (as read) as a Measurement."""
        return self._measurement(self.passes_ms, "the per-layer (instrumented) passes")

    @property
    def corrected(self) -> Measurement:
        """The corrected passes (the ``(root)`` row's): what the clean runs are judged against."""
        return self._measurement(self.corrected_passes_ms, "the per-layer passes (corrected)")

    def _measurement(self, passes_ms: np.ndarray, label: str) -> Measurement:
        return Measurement(
            passes_ms,
            device=self.device,
            batch_size=self.batch_size,
            warmup=self.warmup,
            stop_reason=self.stop_reason,
            label=label,
            env=self.env,
            blocks=self.blocks,
            timestamps_s=self.timestamps_s,
            min_samples=self.min_samples,
        )

    @property
    def corrected_passes_ms(self) -> np.ndarray:
        """Each instrumented pass less the hooks' calibrated cost (``passes_ms`` if none)."""
        cost = self.hook_cost
        if cost is None or not cost.applied:
            return self.passes_ms
        return np.clip(self.passes_ms - len(self.order) * cost.per_call_ms, 0.0, None)

    def coverage(self) -> float:
        """Sum of the leaf calls' medians over the median (corrected) instrumented pass."""
        med = self.median_ms()
        return sum(med[k] for k in self.leaves()) / float(np.median(self.corrected_passes_ms))

    def overhead(self, clean: Measurement | None = None) -> float:
        """Instrumented / plain pass median (1.02 = hooks cost 2 %), against the interleaved
        plain passes, else ``clean``."""
        plain = self.plain_ms
        if plain is not None and plain.size:
            return float(np.median(self.passes_ms)) / float(np.median(plain))
        if clean is None:
            raise ValueError("overhead() needs the clean Measurement: no plain passes were kept")
        return float(np.median(self.passes_ms)) / clean.median_ms

    def __repr__(self) -> str:
        med = self.median_ms()
        total = float(np.median(self.passes_ms))
        lines = [
            f"LayerTiming({self.device}, batch {self.batch_size}): {len(self.order)} calls, "
            f"{self.n} passes (stop={self.stop_reason}), pass median {total:.3f} ms, "
            f"coverage {self.coverage():.1%}"
        ]
        for k in self.order[:12]:
            label = (k[0] or "(model)") + (f" #{k[1]}" if k[1] > 1 else "")
            lines.append(f"  {label:<30} {med[k]:10.3f} ms")
        if len(self.order) > 12:
            lines.append(f"  ... {len(self.order) - 12} more")
        return "\n".join(lines)

    def to_dataframe(self) -> Any:
        """One row per call in execution order (``latency_pct``: of the median pass)."""
        total = float(np.median(self.passes_ms))
        peaks = self.peak_memory_bytes or {}
        rows = [
            {
                "name": k[0],
                "call": k[1],
                **latency_stats(self.samples[k], total),
                "peak_memory_bytes": peaks.get(k),
            }
            for k in self.order
        ]
        return pd.DataFrame(rows)


def latency_stats(samples: np.ndarray, total: float, prefix: str = "") -> dict[str, float]:
    """``{prefix}latency_ms``/``_std_ms`` (median, std of ``samples``) and ``_pct`` (the
    median's share of ``total``); NaN for one sample's std, or without a total."""
    med = float(np.median(samples))
    return {
        f"{prefix}latency_ms": med,
        f"{prefix}latency_std_ms": float(samples.std(ddof=1)) if samples.size > 1 else math.nan,
        f"{prefix}latency_pct": 100.0 * med / total if total > 0 else math.nan,
    }


def _fit_children(t: np.ndarray, parents: list[int | None]) -> None:
    """In place, pass by pass: scale each call's children down to fit inside it (pre-order: a
    parent is final before its children)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p is not None:
            children.setdefault(p, []).append(i)
    for p in sorted(children):
        kids = children[p]
        total = t[:, kids].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(total > t[:, p], t[:, p] / total, 1.0)
        t[:, kids] *= factor[:, None]


@dataclasses.dataclass(frozen=True)
class HookCost:
    """What the per-layer instrument adds to a pass, measured in this process.

    ``per_call_ms``: a hooked call's whole cost as its enclosing call sees it (from the model's
    passes: ``_measured_hook_cost``); ``self_ms``: the part inside its own span
    (``calibrate_hooks``). A call's corrected time is its span less ``self_ms`` less
    ``per_call_ms`` per nested call, its children then scaled to fit it (no ``(self)`` row < 0).
    """

    per_call_ms: float
    self_ms: float
    applied: bool = True
    #: ``"model"`` (its own passes), ``"chain"`` (``calibrate_hooks``) or ``"given"``
    source: str = "given"
    #: the reading (the model's pairs', or the chain's) held more than the passes show outside
    #: the spans (``_gap_bound``: outside the leaves', or the cheapest parent's outside its
    #: children's) and inside them (a hooked call's chain cost, or the chain's inside part),
    #: and was taken at that bound
    capped: bool = False

    def correct(
        self, raw: np.ndarray, nested: np.ndarray, parents: list[int | None] | None = None
    ) -> np.ndarray:
        """``raw`` (passes x calls, ms) less the cost (``nested[i]``: calls inside i); with
        ``parents`` (each call's parent index) children are fitted into their parent."""
        if not self.applied:
            return raw
        out = np.clip(raw - self.self_ms - nested[None, :] * self.per_call_ms, 0.0, None)
        if parents is not None:
            _fit_children(out, parents)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_call_us": self.per_call_ms * 1e3,
            "self_us": self.self_ms * 1e3,
            "applied": self.applied,
            "source": self.source,
            "capped": self.capped,
        }


class _HostStamps(TimedInstrument):
    """A stamp as call ``i`` begins (slot ``i``) and as it ends (``n + i``): its span."""

    def __init__(self, stamps: Any, n: int) -> None:
        self.enter = self.record = stamps.record  # the record itself: nothing more in the span
        self.n = n

    def exit(self, i: int) -> None:
        self.record(self.n + i)


class _Peaks(TimedInstrument):
    """The allocator peak of each call, its children's included."""

    def __init__(self, stats: MemoryStats) -> None:
        self.tracker = PeakTracker(stats)
        self.enter = self.tracker.enter

    def exit(self, i: int) -> None:
        self.tracker.exit()


class _Instrument:
    """Hooks that only write a stamp (checking the calls come in the discovery pass's order),
    and the passes that read them back."""

    def __init__(
        self,
        model: nn.Module,
        plan: CallPlan,
        clock: Clock,
        forward: Callable[[], Any],
        reset: Callable[[], Any] | None = None,
    ) -> None:
        n = len(plan.keys)
        self.model, self.plan, self.n, self.forward = model, plan, n, forward
        # run before each pass, outside its timed span (None: nothing)
        self.reset = reset or (lambda: None)
        self.clock = clock
        self.plain: list[np.ndarray] = []  # plain passes, interleaved with the instrumented
        self.stamps = clock.stamps(2 * n + 2)
        self.calls = Calls(plan, _HostStamps(self.stamps, n))
        self.starts = list(range(n)) + [2 * n]
        self.pass_start = [2 * n] * n
        self.ends = list(range(n, 2 * n)) + [2 * n + 1]
        self.rows: list[np.ndarray] = []
        self.offsets: list[np.ndarray] = []  # each call's start from the pass's start (ms)
        # on the CPU, the thread CPU time (ms) of each instrumented and plain pass, which time
        # descheduled does not enter; none where that clock is coarse (its median would be 0)
        self.cpu_ms: tuple[list[float], list[float]] | None = (
            ([], []) if clock.device.type == "cpu" and _THREAD_TIME_FINE else None
        )
        self.comm: CommStamps | None = None
        self.comm_rows: list[np.ndarray] = []
        self.rng = np.random.default_rng(0)  # which pass of each pair comes first

    def run(self) -> None:
        """One instrumented pass (stamps recorded, not read)."""
        n, record = self.n, self.stamps.record
        self.calls.begin()
        if self.comm is not None:
            self.comm.begin()
        record(2 * n)
        self.forward()
        record(2 * n + 1)
        self.calls.check_complete()

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """The stamping hooks, and the collectives' own stamps where they are taken."""
        comm = self.comm if self.comm is not None else contextlib.nullcontext()
        with self.calls.hooked(self.model, self.plan.names), comm:
            yield

    def warm_step(self) -> None:
        """One instrumented and one plain pass (what a block does, untimed)."""
        self.reset()
        with self.hooked():
            self.run()
        self.reset()
        self.forward()

    def sample_block(self, k: int) -> np.ndarray:
        """``k`` pairs of one instrumented and one plain pass in a random order (with a fixed one
        a loaded scheduler's slices made one kind take every wait); the instrumented ms."""
        out, plain = np.empty(k), np.empty(k)
        first = self.rng.random(k) < 0.5
        for p in range(k):
            if first[p]:
                plain[p] = self._plain_pass()
            out[p] = self._instrumented_pass()
            if not first[p]:
                plain[p] = self._plain_pass()
        self.plain.append(plain)
        return out

    def _instrumented_pass(self) -> float:
        """One instrumented pass, its stamps read and kept; its duration (ms)."""
        n, cpu = self.n, time.thread_time_ns
        self.reset()
        with self.hooked():
            c0 = cpu()
            self.run()
            c1 = cpu()
            self.stamps.sync()  # the one synchronize of this pass
        d = self.stamps.elapsed_ms(self.starts, self.ends)
        self.rows.append(d[:n])
        self.offsets.append(self.stamps.elapsed_ms(self.pass_start, self.starts[:n]))
        if self.comm is not None:
            self.comm_rows.append(self.comm.per_column_ms(n + 1)[:n])
        if self.cpu_ms is not None:
            self.cpu_ms[0].append((c1 - c0) / 1e6)
        return float(d[n])

    def _plain_pass(self) -> float:
        """One plain pass (ms); on the CPU its thread CPU time kept beside the instrumented."""
        if self.cpu_ms is None:
            return float(self.clock.time([self.forward], 1, self.reset)[0, 0])
        cpu, perf = time.thread_time_ns, self.clock.now_ns
        self.reset()
        # the clock read inline: the CPU time beside it spans what the instrumented pass's does
        c2 = cpu()
        t0 = perf()
        self.forward()
        t1 = perf()
        c3 = cpu()
        self.cpu_ms[1].append((c3 - c2) / 1e6)
        return (t1 - t0) / 1e6


_CALIBRATION_CALLS = 64
#: Fewer instrumented passes and the hooks' cost comes from the calibration chain, not the model.
MIN_COST_PASSES = 10
#: Whether the thread CPU clock resolves a microsecond (Linux, macOS: 1 ns; Windows: 15.6 ms).
_THREAD_TIME_FINE = time.get_clock_info("thread_time").resolution <= 1e-6


class _Empty(nn.Module):
    """Returns its input: a call whose body is as short as a module call can be."""

    def forward(self, x: Any) -> Any:
        return x


def calibrate_hooks(clock: Clock, passes: int = 200) -> HookCost:
    """The instrument's own cost on a chain of empty modules: ``per_call_ms`` = (instrumented -
    plain pass) / calls, ``self_ms`` = an empty call's span less its plain cost (medians of
    ``passes``). On CUDA zeros, not applied: host cost does not show in the GPU's time."""
    if clock.device.type != "cpu":
        return HookCost(0.0, 0.0, applied=False, source="chain")
    chain = nn.Sequential(*(_Empty() for _ in range(_CALIBRATION_CALLS)))
    x = torch.zeros(1)
    forward = functools.partial(chain, x)
    plan = discover(chain, forward, CallPlan(module_names(chain)))
    inst = _Instrument(chain, plan, clock, forward)
    perf = clock.now_ns
    empty = nn.Sequential()
    for _ in range(3):
        inst.warm_step()
    body, instrumented = [], []
    for _ in range(passes):
        t0 = perf()
        chain(x)
        t1 = perf()
        empty(x)
        t2 = perf()
        body.append(((t1 - t0) - (t2 - t1)) / 1e6 / _CALIBRATION_CALLS)
        instrumented.append(float(inst.sample_block(1)[0]))
    per_call = float(np.median(instrumented)) - float(np.median(np.concatenate(inst.plain)))
    per_call = max(per_call / len(plan.keys), 0.0)
    leaf_span = float(np.median(np.vstack(inst.rows)[:, 1:]))  # the empty calls (0: the chain)
    self_ms = leaf_span - max(float(np.median(body)), 0.0)
    return HookCost(per_call, min(max(self_ms, 0.0), per_call), applied=True, source="chain")


@contextlib.contextmanager
def gc_paused() -> Iterator[Callable[[], None]]:
    """Python's cyclic collector off while the passes run (as ``timeit`` does: its pauses would
    land on the allocating hooks); the callable it yields collects the youngest generation
    between blocks. Both do nothing when the collector was off already."""
    was = gc.isenabled()
    gc.disable()

    def between_blocks() -> None:
        if was:
            gc.collect(0)

    try:
        yield between_blocks
    finally:
        if was:
            gc.enable()


def carried_names(
    modules: dict[nn.Module, str], original: nn.Module, moved: nn.Module
) -> dict[nn.Module, str]:
    """``modules`` (module -> name, of ``original``) for ``moved``, a converted copy of it."""
    if moved is original:
        return modules
    pairs = dict(zip(original.modules(), moved.modules()))
    return {pairs[m]: n for m, n in modules.items() if m in pairs}


def layer_call(
    model: nn.Module,
    model_inputs: ModelInputs,
    opts: TimingOptions,
    modules: dict[nn.Module, str] | None,
) -> tuple[nn.Module, tuple, dict, dict[nn.Module, str]]:
    """What the per-layer passes run: the model (a channels_last copy where ``opts`` asks), its
    inputs (converted alike) and the hooked modules' names (``modules``, else every module)."""
    moved, args, kwargs = model, model_inputs.args, model_inputs.kwargs
    if opts.channels_last:
        moved = moved_model(model, model_inputs.device, None, memory_format=torch.channels_last)
        args, kwargs = to_channels_last(args), to_channels_last(kwargs)
    names = module_names(moved) if modules is None else carried_names(modules, model, moved)
    return moved, args, kwargs, names


def time_layers(
    model: nn.Module,
    model_inputs: ModelInputs,
    *,
    modules: dict[nn.Module, str] | None = None,
    memory_stats: MemoryStats | bool | None = None,
    training: bool = False,
    no_grad: bool = True,
    hook_cost: HookCost | None = None,
    options: TimingOptions | None = None,
    **timing_options: Any,
) -> LayerTiming:
    """Inclusive latency of every module call, over instrumented forward passes.

    The passes stop like ``measure_latency``'s samples, under the same options; the discovery
    (and memory) pass are counted in ``LayerTiming.warmup`` besides ``warmup``. Times are
    corrected for the hooks' cost (measured, or ``hook_cost``) unless ``correct_overhead=False``.
    ``memory_stats``: ``None`` = the CUDA allocator on CUDA, none elsewhere; ``False`` = off; or a
    ``MemoryStats``. ``modules`` (module -> name) limits and names the hooked modules. Eval mode
    under ``no_grad`` unless ``training``/``no_grad`` say otherwise.
    """
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module")
    training = legacy_eval_mode(training, timing_options, "time_layers")
    opts = TimingOptions.parse(options, **timing_options)
    dev = model_inputs.device
    memory_stats = MemoryStats.parse(memory_stats, dev)
    model, args, kwargs, names = layer_call(model, model_inputs, opts, modules)
    mode = RunMode(training=training, no_grad=no_grad, amp=opts.amp, device=dev)
    run = _LayerRun(model, (args, kwargs), names, opts, mode, model_inputs.batch_size)
    run.reset = model_inputs.reset
    calibrated = calibrate_hooks(run.clock) if hook_cost is None and opts.correct_overhead else None
    run.execute(memory_stats)
    if calibrated is not None:
        hook_cost = _measured_hook_cost(run, calibrated)
    return run.result(model_inputs, hook_cost)


class _LayerRun(Runner):
    """One ``time_layers`` call: the passes under the run's modes, then their result."""

    def __init__(
        self,
        model: nn.Module,
        call: tuple[tuple, dict],
        names: dict[nn.Module, str],
        opts: TimingOptions,
        mode: RunMode,
        batch_size: int = 1,
    ) -> None:
        super().__init__(opts, mode.device, model_label(model), batch_size)
        self.model = model
        # a pass ends when the collectives it started have
        self.forward = functools.partial(completing(model), *call[0], **call[1])
        self.names, self.mode = names, mode
        self.flags = opts.flags(eval_mode=not mode.training, no_grad=mode.no_grad)
        self.flags.update(layers=True, transfer=False, cuda_graph=False, compile=None)
        self.warm_key = (model, input_signature(*call, device=str(self.dev), **self.flags))
        self.live: list[int] = []  # the open calls of the pass running now (errors)
        self.plan: CallPlan | None = None
        self.peaks = None
        self.reset: Callable[[], Any] | None = None

    def fresh_forward(self) -> Any:
        """An untimed pass, on the inputs every pass sees."""
        if self.reset is not None:
            self.reset()
        return self.forward()

    def contexts(self) -> list[Any]:
        return [running(self.model, self.mode)]

    def failure(self, e: Exception) -> BaseException:
        """The forward's failure, naming the call it was in (out of memory: as it is)."""
        if is_oom(e):
            return e
        return ModelProfError(
            f"forward of {self.label} failed in {self._where()} while timing layers: "
            f"{type(e).__name__}: {e}"
        )

    def _where(self) -> str:
        """The call open where the forward failed (the discovery pass's stack is empty by
        then: the calls it kept)."""
        plan, stack = self.plan, self.live
        if plan is not None and stack is plan.stack and not stack:
            stack = plan.failed
        if not stack:  # (no plan yet: no call open either)
            return f"the model ({self.label})"
        name, call = plan.keys[stack[-1]]
        return f"module '{name}'" + (f" (call {call})" if call > 1 else "")

    def execute(self, memory_stats: MemoryStats | None) -> None:
        """Discovery, warm-up, the sampled instrumented/plain passes and the memory pass."""
        with self:
            self.guarded(lambda: self._passes(memory_stats))

    def _passes(self, memory_stats: MemoryStats | None) -> None:
        model = self.model
        self.plan = plan = CallPlan(self.names)
        self.live = plan.stack
        discover(model, self.fresh_forward, plan)
        self.inst = inst = _Instrument(model, plan, self.clock, self.forward, self.reset)
        if communicates(model):
            inst.comm = CommStamps(self.clock, inst.calls.current)
        self.live = inst.calls.open
        est = self.warm_with(inst.warm_step, self.already_warm)
        with gc_paused() as between_blocks:

            def block(k: int) -> np.ndarray:
                out = inst.sample_block(k)
                between_blocks()
                return out

            desc = f"per-layer {self.label}"
            self.sampled = self.sample(block, est, desc, self.opts.layer_extend_s)
        self.warmup_calls += 1  # the discovery pass
        if memory_stats is not None:
            self.peaks = self._memory_pass(memory_stats)
            self.warmup_calls += 1

    def _memory_pass(self, stats: MemoryStats) -> dict[Key, int]:
        """One forward reading the allocator peak of every call (warm: after the timed passes)."""
        peaks = _Peaks(stats)
        calls = Calls(self.plan, peaks)
        self.live = calls.open
        with calls.hooked(self.model, self.names):
            self.fresh_forward()
        keys, peak = self.plan.keys, peaks.tracker.peak
        return {keys[i]: int(peak[i]) for i in range(calls.counter)}

    def result(self, model_inputs: ModelInputs, hook_cost: HookCost | None) -> LayerTiming:
        plan, inst, sampled, opts = self.plan, self.inst, self.sampled, self.opts
        keys = plan.keys
        raw = np.vstack(inst.rows)
        corrected = (
            raw
            if hook_cost is None
            else hook_cost.correct(raw, plan.nested_counts(), plan.parent_index)
        )
        env = opts.env(model_inputs, self.clock.kind, **self.flags)
        if hook_cost is not None:
            env["hook_cost"] = hook_cost.to_dict()
        timing = LayerTiming(
            samples={k: corrected[:, i].copy() for i, k in enumerate(keys)},
            order=list(keys),
            passes_ms=np.asarray(sampled.samples_ms),
            parents=dict(plan.parents),
            peak_memory_bytes=self.peaks,
            device=str(self.dev),
            batch_size=model_inputs.batch_size,
            warmup=self.warmup_calls,
            stop_reason=sampled.stop_reason,
            env=env,
            raw_samples={k: raw[:, i].copy() for i, k in enumerate(keys)},
            hook_cost=hook_cost,
            blocks=sampled.blocks,
            timestamps_s=sampled.timestamps_s,
            plain_ms=np.concatenate(inst.plain),
            min_samples=opts.stop.promised_min,
            extended_s=self.extended_s,
            start_offsets_ms=np.vstack(inst.offsets) if inst.offsets else None,
            comm_samples=_comm_samples(inst, keys),
        )
        if opts.warn and timing.undersampled:
            timing.end_to_end.warn_if_noisy()  # names n and min_samples
        return timing


def _measured_hook_cost(run: _LayerRun, calibrated: HookCost) -> HookCost:
    """The model's own cost per hooked call: the median of the per-pair differences
    (instrumented - its plain pass), which preemption moves less than a difference of medians
    (docs/timing.md), on the CPU bounded by the same in thread CPU time; the chain's cost below
    ``MIN_COST_PASSES`` passes (mostly noise), and where the model's read nothing (a loaded
    machine's pass pairs differed by more than the hooks cost; they cost no less in a model
    than on the chain of empty modules, their cheapest context). Never above what the passes
    show of it outside the spans (``_gap_bound``: the time outside the leaves' spans, and the
    cheapest parent's time outside its children's) and the part inside a span: the chain's,
    or where the model's pairs read more, what they read more, up to the chain's whole cost
    of a hooked call (more is a wait for intra-op threads under load, not the hooks)."""
    keys, sampled, inst = run.plan.keys, run.sampled, run.inst
    plain = np.concatenate(inst.plain)
    per_call, source, capped = calibrated.per_call_ms, "chain", False
    inside = calibrated.self_ms
    if sampled.n >= MIN_COST_PASSES or not calibrated.applied:  # (CUDA: no chain to ask)
        paired = _paired_median(sampled.samples_ms, plain)
        if inst.cpu_ms is not None:  # (instrumented, plain) thread CPU times
            paired = min(paired, _paired_median(*inst.cpu_ms))
        if paired > 0 or not calibrated.applied:
            per_call, source = max(0.0, paired) / len(keys), "model"
    if inst.rows:
        passes = np.asarray(sampled.samples_ms, dtype=float)
        bound = _gap_bound(passes, np.vstack(inst.rows), run.plan.parent_index)
        if source == "model" and per_call > bound + inside:  # the rest lies inside the spans:
            # the hooks slow the ops they surround, by at most a whole hooked call's cost
            # between empty modules
            inside = min(per_call - bound, max(calibrated.per_call_ms, inside))
        capped = per_call > bound + inside
        per_call = min(per_call, bound + inside)
    return HookCost(per_call, min(inside, per_call), applied=True, source=source, capped=capped)


def _gap_bound(passes: np.ndarray, raw: np.ndarray, parents: list[int | None]) -> float:
    """The most of a hooked call's cost (ms) that falls outside its own span, given the
    instrumented passes (ms) and their spans ``raw`` (passes x calls): that part lands in its
    parent's own time, or the pass's outside every call, which no leaf's span holds; so it is at
    most the median of (pass - the leaves' spans) / calls, and, for each call with calls inside
    it, the median of (its span - its children's spans) / children: the cheapest such parent
    bounds them all (one correction serves every parent; more would take the children's time in
    that one, and fitting them in would cut them). Under load with intra-op threads an
    instrumented pass can wait longer for them inside its ops than its plain pass does: a paired
    difference then reads that wait, not the hooks; and waits and preemptions land somewhere
    among a pass's gaps in most passes, where one parent's few microseconds between its
    children are seldom hit (a loaded resnet18: 730 us per call from the pass, 11.4 us from
    ``layer4``'s two blocks). No bound (inf) from time that the spans inside it add up to or
    exceed: they overlap (CUDA streams), and time outside them is not theirs."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p is not None:
            children.setdefault(p, []).append(i)
    bounds = [
        float(np.median(raw[:, p] - raw[:, kids].sum(axis=1))) / len(kids)
        for p, kids in children.items()
    ]
    if raw.shape[0] == len(passes):  # pass by pass: the time outside every leaf
        leaves = [i for i in range(len(parents)) if i not in children]
        bounds.append(float(np.median(passes - raw[:, leaves].sum(axis=1))) / len(parents))
    return min((b for b in bounds if b > 0), default=float("inf"))


def _paired_median(instrumented: Any, plain: Any) -> float:
    """Median of ``instrumented[i] - plain[i]`` (pass ``i`` and its plain pass)."""
    a, b = np.asarray(instrumented, dtype=float), np.asarray(plain, dtype=float)
    if a.size != b.size:  # not paired pass by pass: the difference of the medians
        return float(np.median(a) - np.median(b))
    return float(np.median(a - b))


def _comm_samples(inst: _Instrument, keys: list) -> dict | None:
    """Per call key with any, its collectives' time per instrumented pass (ms)."""
    if not inst.comm_rows:
        return None
    stamped = np.vstack(inst.comm_rows)
    return {k: stamped[:, i].copy() for i, k in enumerate(keys) if stamped[:, i].any()}
