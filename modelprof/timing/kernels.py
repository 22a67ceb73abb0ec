"""Per-layer time from the kernels: ``per_layer="kernels"`` (the default on CUDA, opt-in on CPU).

The passes run under ``torch.profiler`` with a range pushed per module call from the hooks
(``compat.fast_range``): one discarded pass (CUPTI's first-use stall), then K hooked passes, each
ending in a synchronize and followed by a plain pass whose host time prices the instrument. Each
GPU activity is charged through its correlation id to the call that launched it
(``modelprof.timing.attribution``); on the CPU the outermost ops are charged where they start.
A host-cost correction is never subtracted from a GPU time. Per module call:

- ``kernel_ms`` — device time launched inside the call, children included: each call's own
  median summed up the call tree, so leaf and ``(self)`` rows add up to the root exactly;
  ``kernel_self_ms``; ``kernels`` (launches, children included);
- ``idle_ms`` — the device waiting for this call's launches; ``timeline_ms = kernel_ms + idle_ms``;
- ``host_ms`` — the call's host time less the instrument's cost per nested call;
- ``launch_bound`` — on a GPU ``idle_ms > kernel_ms``; on the CPU less than half of the call's
  time inside ops.

The per-layer ``latency_ms`` is ``kernel_ms`` on a GPU and ``host_ms`` on the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

import modelprof.columns as registry
from modelprof.counting.tree import by_parents
from modelprof.errors import ModelProfError
from modelprof.runtime.compat import fast_range, profiler_events, profiler_running
from modelprof.runtime.device import is_oom
from modelprof.runtime.execution import RunMode, completing, running
from modelprof.runtime.inputs import ModelInputs
from modelprof.runtime.tensors import iter_tensors
from modelprof.timing.attribution import (
    Activity,
    PassReading,
    Span,
    attribute,
    innermost,
    outermost,
)
from modelprof.timing.calls import CallPlan, Calls, Key, TimedInstrument, discover
from modelprof.timing.layers import LayerTiming, gc_paused, layer_call
from modelprof.timing.options import TimingOptions
from modelprof.timing.runner import Runner, model_label

__all__ = [
    "KERNEL_COLUMNS",
    "KernelTiming",
    "kernel_columns",
    "kernel_note",
    "with_kernel_columns",
    "read_passes",
    "time_kernels",
]

CALL_RANGE = "modelprof.call:"
PASS_RANGE = "modelprof.pass:"
#: the columns a kernels run adds, in table order
KERNEL_COLUMNS = registry.names("kernels")
#: on the CPU, a call is launch-bound when less than this share of its time is inside ops
CPU_OPS_SHARE = 0.5


@dataclasses.dataclass(eq=False)
class KernelTiming(LayerTiming):
    """``LayerTiming`` of a kernels run (``samples``: each call's headline ms per pass) with
    ``busy_ms``/``idle_ms``/``launches`` (passes x calls + 1, own; the last column: outside every
    call), ``host_ms`` (passes x calls, corrected, inclusive), ``span_ms`` (each pass's)."""

    busy_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 1)))
    idle_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 1)))
    launches: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 1)))
    host_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))
    span_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    parent_index: list = dataclasses.field(default_factory=list)
    #: the instrument's host cost per module call (ms)
    instrument_ms: float = 0.0
    gpu: bool = False
    #: the call each device activity of the first read pass was charged to, in device order
    owners: list = dataclasses.field(default_factory=list)
    #: passes of the model alone, outside the profiler (wall ms, each ending in a synchronize)
    clean_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    #: with ``backward=True``: each pass's backward device time per forward call (as busy_ms)
    backward_busy_ms: np.ndarray | None = None

    def backward_kernel_ms(self) -> dict[Key, float]:
        """Per call, its backward's device time, summed up the call tree like ``kernel_ms``."""
        if self.backward_busy_ms is None:
            raise ModelProfError("no backward was run: time_kernels(..., backward=True)")
        inclusive = self._tree(np.median(self.backward_busy_ms, axis=0))
        return {k: float(inclusive[i]) for i, k in enumerate(self.order)}

    @property
    def corrected_passes_ms(self) -> np.ndarray:
        """Each pass's outermost calls' ``samples`` summed: what the shares divide by (a GPU
        pass's wall time also holds idle waits, which no kernel time does)."""
        top = [k for k in self.order if self.parents.get(k) is None]
        if not self.samples or not top:
            return self.passes_ms
        return np.sum([self.samples[k] for k in top], axis=0)

    def _tree(self, own: np.ndarray) -> np.ndarray:
        """Inclusive values from each call's own (the last axis, calls in pre-order)."""
        return by_parents(own, self.parent_index, _Ranges.reading, "inclusive")

    def medians(self) -> dict[str, np.ndarray]:
        """Per call: the medians of its own busy, idle and launches, their sums up the tree, and
        the host time inclusive and own."""
        own = {
            "kernel": np.median(self.busy_ms, axis=0),
            "idle": np.median(self.idle_ms, axis=0),
            "kernels": np.median(self.launches, axis=0),
        }
        out = {f"{k}_self": v[: len(self.order)] for k, v in own.items()}
        out.update({k: self._tree(v) for k, v in own.items()})
        host = self.host_ms
        out["host"] = np.median(host, axis=0)
        own_host = by_parents(host, self.parent_index, "inclusive", "own")
        out["host_self"] = np.median(np.clip(own_host, 0.0, None), axis=0)
        return out

    @property
    def outside_ms(self) -> float:
        """Median device time launched in a pass outside every call's range."""
        return float(np.median(self.busy_ms[:, -1])) if self.busy_ms.size else 0.0

    def launch_bound_calls(self) -> list[Key]:
        """The leaf calls judged launch-bound, in execution order."""
        m = self.medians()
        inner = {p for p in self.parent_index if p is not None}
        return [
            k
            for i, k in enumerate(self.order)
            if i not in inner and _bound(self.gpu, m["kernel"][i], m["idle"][i], m["host"][i])
        ]


def _bound(gpu: bool, kernel: float, idle: float, host: float) -> bool:
    if gpu:
        return bool(idle > kernel)
    return bool(host > 0 and kernel < CPU_OPS_SHARE * host)


def kernel_columns(timing: KernelTiming, keys: Sequence[tuple[Key, bool]]) -> list[dict]:
    """The kernel columns of each row (``keys``: call key, is a ``(self)`` row); an empty dict
    for a call not timed."""
    m = timing.medians()
    where = {k: i for i, k in enumerate(timing.order)}
    out: list[dict] = []
    for key, is_self in keys:
        i = where.get(key)
        if i is None:
            out.append({})
            continue
        part = "_self" if is_self else ""
        kernel, idle = float(m["kernel" + part][i]), float(m["idle" + part][i])
        host = float(m["host" + part][i])
        out.append(
            {
                "kernel_ms": kernel,
                "kernel_self_ms": float(m["kernel_self"][i]),
                "kernels": float(m["kernels" + part][i]),
                "idle_ms": idle,
                "timeline_ms": kernel + idle,
                "host_ms": host,
                "launch_bound": _bound(timing.gpu, kernel, idle, host),
            }
        )
    return out


def with_kernel_columns(
    columns: list[dict], timing: KernelTiming, keys: Sequence[tuple[Key | None, bool]]
) -> None:
    """Into each row's timing columns, the kernel columns and ``latency_ms``/``latency_pct``
    from the headline (``kernel_ms`` on a GPU, ``host_ms`` on the CPU) and the root's."""
    kernel = kernel_columns(timing, keys)
    head = "kernel_ms" if timing.gpu else "host_ms"
    root = next((k[head] for k in kernel if k), float("nan"))
    for col, k in zip(columns, kernel):
        if k:
            share = 100.0 * k[head] / root if root > 0 else float("nan")
            col.update(values=k, latency_ms=k[head], latency_pct=share)


def kernel_note(timing: KernelTiming, latency: Any) -> str:
    """What the report says of a kernels run: the source, the instrument's cost, the device's
    busy share and the launch-bound layers."""
    m = timing.medians()
    total = float(m["kernel"][0]) + timing.outside_ms if timing.order else 0.0
    where = (
        "kernel time from torch.profiler, charged to the module call that launched it"
        if timing.gpu
        else "each call's host time, with its op time (kernel_ms) from torch.profiler"
    )
    parts = [
        f"per-layer times are {where} (median of {timing.n} profiled passes; the instrument "
        f"costs {timing.instrument_ms * 1e3:.1f} us of host time per call, taken out of host_ms "
        "only)"
    ]
    clean = getattr(latency, "median_ms", float("nan"))
    if timing.gpu and clean > 0:
        parts.append(
            f"the GPU was busy {total / clean:.0%} of the clean latency ({total:.3f} of "
            f"{clean:.3f} ms)"
        )
    if timing.outside_ms > 0 and total > 0:
        parts.append(f"{timing.outside_ms / total:.1%} of it was launched outside every module")
    bound = timing.launch_bound_calls()
    if bound:
        names = [(k[0] or "(root)") + (f"#{k[1]}" if k[1] > 1 else "") for k in bound]
        shown = ", ".join(names[:8]) + (", ..." if len(bound) > 8 else "")
        what = "the GPU waited on the host" if timing.gpu else "less than half in ops"
        parts.append(f"launch-bound ({what}): {len(bound)} layer(s): {shown}")
        if timing.gpu and clean > 0 and total / clean < 0.5:
            parts.append(
                "the model is launch-bound: CUDA graphs (cuda_graph=True) or torch.compile "
                "(compile='reduce-overhead') remove most of the launch cost"
            )
    return "; ".join(parts)


def _is_gpu(event: Any) -> bool:
    return str(event.device_type()).rsplit(".", 1)[-1] in ("CUDA", "XPU", "PrivateUse1")


ENGINE_EVENT = "autograd::engine::evaluate_function"


def read_passes(
    events: Sequence[Any], n: int, gpu: bool
) -> dict[int, tuple[PassReading, Any, PassReading]]:
    """Per pass number: its forward attribution, its calls' host spans (ms) and its backward
    attribution, from kineto events. Backward work goes to the forward call whose op made its
    autograd node: the engine's event and that op carry one sequence number (pytorch #144778)."""
    passes: dict[int, tuple[int, int, int]] = {}
    spans: list[Span] = []
    ops: dict[int, tuple[int, int, int]] = {}  # correlation id -> (start, end, thread)
    device: list[Any] = []
    range_starts: dict[int, tuple[int, int, int]] = {}
    made: dict[tuple[int, int], tuple[int, int]] = {}  # (thread, seq) -> forward op's start
    engine: list[tuple[Span, tuple[int, int]]] = []  # a node's run, (forward thread, seq)
    annotations: set[int] = set()
    for e in events:
        name = e.name()
        if gpu and _is_gpu(e):
            device.append(e)
            continue
        if _is_gpu(e) or e.linked_correlation_id() != 0:
            continue  # another device's work; the runtime calls (cudaLaunchKernel...)
        start, thread = e.start_ns(), e.start_thread_id()
        end = start + e.duration_ns()
        if name.startswith(CALL_RANGE):
            spans.append(Span(int(name[len(CALL_RANGE) :]), start, end, thread))
            # work launched by the range itself (no op open: a raw kernel): its start
            range_starts[e.correlation_id()] = (start, start, thread)
            continue
        if name.startswith(PASS_RANGE):
            passes[int(name[len(PASS_RANGE) :])] = (start, end, thread)
            continue
        ops[e.correlation_id()] = (start, end, thread)
        if getattr(e, "is_user_annotation", lambda: False)():
            annotations.add(e.correlation_id())  # a range (record_function), not an op
            continue
        seq = getattr(e, "sequence_nr", lambda: -1)()
        if seq is None or seq < 0:
            continue
        fwd = getattr(e, "fwd_thread_id", lambda: 0)()
        if name.startswith(ENGINE_EVENT):
            engine.append((Span(len(engine), start, end, thread), (fwd or thread, seq)))
        elif not fwd:  # a forward op (the backward's own carry their forward thread)
            # every op records the next node's number: the node's maker is the last op with it
            if made.get((thread, seq), (-1,))[0] < start:
                made[(thread, seq)] = (start, thread)
    if gpu:
        acts = [_activity(e, {**range_starts, **ops}) for e in device]
    else:
        acts = _cpu_activities([v for k, v in ops.items() if k not in annotations])
    acts = _to_forward(acts, engine, made)
    return {p: _one_pass(n, window, spans, acts) for p, window in passes.items()}


def _to_forward(
    acts: list[Activity],
    engine: list[tuple[Span, tuple[int, int]]],
    made: dict[tuple[int, int], tuple[int, int]],
) -> list[Activity]:
    """Activities launched inside an autograd node's run, moved to the forward op that made
    the node; the rest as they are."""
    if not engine:
        return acts
    inside = innermost([s for s, _ in engine], [(a.launch_ns, a.thread) for a in acts])
    out = list(acts)
    for i, (a, k) in enumerate(zip(acts, inside)):
        point = made.get(engine[k][1]) if k >= 0 else None
        if point is not None:
            out[i] = dataclasses.replace(a, launch_ns=point[0], thread=point[1], backward=True)
    return out


def _activity(e: Any, ops: dict[int, tuple[int, int, int]]) -> Activity:
    start = e.start_ns()
    launch = ops.get(e.linked_correlation_id())
    at, thread = (launch[0], launch[2]) if launch else (-1, -1)
    name = str(e.name()).lower()
    kind = "memcpy" if "memcpy" in name else "memset" if "memset" in name else "kernel"
    return Activity(start, start + e.duration_ns(), at, thread, int(e.device_resource_id()), kind)


def _cpu_activities(ops: list[tuple[int, int, int]]) -> list[Activity]:
    by_thread: dict[int, list[tuple[int, int]]] = {}
    for s, e, t in ops:
        by_thread.setdefault(t, []).append((s, e))
    out = []
    for t, intervals in by_thread.items():
        for i in outermost(intervals):
            s, e = intervals[i]
            out.append(Activity(s, e, s, t, t, "op"))
    return out


def _one_pass(
    n: int, window: tuple[int, int, int], spans: list[Span], acts: list[Activity]
) -> tuple[PassReading, np.ndarray, PassReading]:
    start, end, thread = window
    inside = [s for s in spans if s.thread == thread and start <= s.start_ns <= end]
    mine = [a for a in acts if a.thread == thread and start <= a.launch_ns <= end]
    host = np.zeros(n)
    for s in inside:
        if 0 <= s.call < n:
            host[s.call] = (s.end_ns - s.start_ns) / 1e6
    forward = attribute(n, inside, [a for a in mine if not a.backward])
    return forward, host, attribute(n, inside, [a for a in mine if a.backward])


class _Ranges(TimedInstrument):
    """A profiler range around each call: the kernels launched in it are the call's own."""

    reading = "own"

    def __init__(self, n: int) -> None:
        self.names = [f"{CALL_RANGE}{i}" for i in range(n)]
        self.open: list[Any] = [None] * n

    def enter(self, i: int) -> None:
        r = self.open[i] = fast_range(self.names[i])
        r.__enter__()

    def exit(self, i: int) -> None:
        self.open[i].__exit__(None, None, None)


@contextlib.contextmanager
def _profiler(gpu: bool) -> Iterator[Any]:
    if profiler_running():
        raise ModelProfError(
            "per_layer='kernels' runs torch.profiler, and a profiler session is already on in "
            "this process (starting another would cancel yours); stop it first, or pass "
            "per_layer='stamps'"
        )
    activities = [torch.profiler.ProfilerActivity.CPU]
    if gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        yield prof


def time_kernels(
    model: nn.Module,
    model_inputs: ModelInputs,
    *,
    training: bool = False,
    no_grad: bool = True,
    options: TimingOptions | None = None,
    modules: dict[nn.Module, str] | None = None,
    backward: bool = False,
    **timing_options: Any,
) -> KernelTiming:
    """Per-layer kernel time over ``repeat`` (else ``min_samples``) profiled passes, in eval
    mode under ``no_grad`` unless ``training``/``no_grad`` say otherwise. ``backward=True`` also
    runs the backward of the summed floating outputs (``KernelTiming.backward_kernel_ms()``);
    the parameters' gradients are put back after."""
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module")
    opts = TimingOptions.parse(options, **timing_options)
    dev = model_inputs.device
    model, args, kwargs, names = layer_call(model, model_inputs, opts, modules)
    mode = RunMode(training=training, no_grad=no_grad and not backward, amp=opts.amp, device=dev)
    reset = model_inputs.reset or (lambda: None)
    # a pass ends when the collectives it started have
    forward = functools.partial(completing(model), *args, **kwargs)
    passes = opts.stop.repeat or opts.stop.min_samples
    run = _KernelRun(model, forward, reset, names, opts, mode)
    run.backward = bool(backward)
    grads = [(p, p.grad) for p in run.params]
    try:
        with run:
            run.plan = run.guarded(
                lambda: discover(model, lambda: (reset(), forward())[1], CallPlan(names))
            )
            run.warm_with(lambda: (reset(), forward()))
            readings = run.guarded(lambda: run.profiled(passes))
    finally:
        if run.calls is not None:  # a range a failed call left open
            run.calls.close_open()
        for p, g in grads:
            p.grad = g
    return run.result(readings, model_inputs)


def _backward(out: Any, params: list[torch.Tensor]) -> None:
    """The backward of the summed floating outputs; the gradients dropped after (each pass
    starts as the first did)."""
    leaves = [t for t in iter_tensors(out) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise ModelProfError(
            "backward=True: no floating output of the model requires a gradient (is it in "
            "eval mode under no_grad, or are its parameters frozen?)"
        )
    torch.autograd.backward([t.float().sum() for t in leaves])
    for p in params:
        p.grad = None


class _KernelRun(Runner):
    """The profiled passes of one ``time_kernels`` call, and their result."""

    def __init__(
        self,
        model: nn.Module,
        forward: Callable[[], Any],
        reset: Callable[[], Any],
        names: dict[nn.Module, str],
        opts: TimingOptions,
        mode: RunMode,
    ) -> None:
        super().__init__(opts, mode.device, model_label(model))
        self.model, self.forward, self.reset = model, forward, reset
        self.names, self.mode = names, mode
        self.gpu = self.dev.type == "cuda"
        self.plan: CallPlan | None = None
        self.calls: Calls | None = None
        self.hooked_issue: list[float] = []
        self.plain_issue: list[float] = []
        self.walls: list[float] = []
        self.plain_walls: list[float] = []
        self.clean_walls: list[float] = []
        self.backward = False
        self.params = [p for p in model.parameters() if p.requires_grad]

    def contexts(self) -> Sequence[contextlib.AbstractContextManager]:
        return (running(self.model, self.mode),)

    def failure(self, e: Exception) -> BaseException:
        """The forward's failure naming the model (out of memory: as it is)."""
        if is_oom(e):
            return e
        return ModelProfError(
            f"forward of {self.label} failed while timing layers from "
            f"their kernels: {type(e).__name__}: {e}"
        )

    def _pass(self, p: int) -> None:
        """Hooked pass ``p`` (in its pass range), then a plain one; host times of both."""
        calls = self.calls
        calls.begin()
        with calls.hooked(self.model, self.names, always=True):
            hooked_issue, wall = self._plain(fast_range(f"{PASS_RANGE}{p}"))
        calls.check_complete()
        issue, plain_wall = self._plain()
        if p > 0:
            self.hooked_issue.append(hooked_issue)
            self.walls.append(wall)
            self.plain_issue.append(issue)
            self.plain_walls.append(plain_wall)

    def _plain(
        self, scope: contextlib.AbstractContextManager = contextlib.nullcontext()
    ) -> tuple[float, float]:
        """A pass of the model (its forward inside ``scope``: a hooked pass's range): (ms to
        issue it, ms to its end on the device)."""
        perf = time.perf_counter_ns
        self.reset()
        t0 = perf()
        with scope:
            out = self.forward()
        if self.backward:  # the engine's work, mapped back to the forward calls later
            _backward(out, self.params)
        t1 = perf()
        self.clock.sync()
        return (t1 - t0) / 1e6, (perf() - t0) / 1e6

    def profiled(self, passes: int) -> dict[int, tuple[PassReading, np.ndarray, PassReading]]:
        """One discarded profiled pass (0), then ``passes`` read."""
        self.calls = Calls(self.plan, _Ranges(len(self.plan.keys)))
        with gc_paused(), _profiler(self.gpu) as prof:
            for p in range(passes + 1):
                self._pass(p)
        # outside the profiler, whose host work slows every pass
        self.clean_walls = [self._plain()[1] for _ in range(passes)]
        readings = read_passes(profiler_events(prof), len(self.plan.keys), self.gpu)
        readings.pop(0, None)
        if len(readings) != passes:
            raise ModelProfError(
                f"the profiler returned {len(readings)} of {passes} per-layer passes; "
                "another profiler running in this process takes its events"
            )
        return readings

    def result(
        self, readings: dict[int, tuple[PassReading, np.ndarray, PassReading]], mi: ModelInputs
    ) -> KernelTiming:
        plan, n = self.plan, len(self.plan.keys)
        ordered = [readings[p] for p in sorted(readings)]
        per_call = max(0.0, float(np.median(self.hooked_issue) - np.median(self.plain_issue))) / n
        host_raw = np.vstack([h for _, h, _ in ordered])
        host = np.clip(host_raw - plan.nested_counts()[None, :] * per_call, 0.0, None)
        timing = KernelTiming(
            samples={},
            order=list(plan.keys),
            passes_ms=np.asarray(self.walls),
            parents=dict(plan.parents),
            device=str(self.dev),
            batch_size=mi.batch_size,
            warmup=self.warmup_calls + 2,  # and the discovery and the discarded pass
            stop_reason="repeat",
            env=self.opts.env(mi, "torch.profiler", per_layer="kernels"),
            plain_ms=np.asarray(self.plain_walls),
            min_samples=None,
            busy_ms=np.vstack([r.busy_ms for r, _, _ in ordered]),
            idle_ms=np.vstack([r.idle_ms for r, _, _ in ordered]),
            launches=np.vstack([r.launches for r, _, _ in ordered]),
            host_ms=host,
            span_ms=np.asarray([r.span_ms for r, _, _ in ordered]),
            parent_index=list(plan.parent_index),
            instrument_ms=per_call,
            gpu=self.gpu,
            owners=list(ordered[0][0].owners),
            clean_ms=np.asarray(self.clean_walls),
            backward_busy_ms=(
                np.vstack([b.busy_ms for _, _, b in ordered]) if self.backward else None
            ),
        )
        headline = timing._tree(timing.busy_ms) if self.gpu else host
        timing.samples = {k: headline[:, i].copy() for i, k in enumerate(plan.keys)}
        timing.raw_samples = {k: host_raw[:, i].copy() for i, k in enumerate(plan.keys)}
        timing.env["instrument_us_per_call"] = per_call * 1e3
        return timing
