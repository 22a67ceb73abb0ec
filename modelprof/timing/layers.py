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
from modelprof.runtime.execution import RunMode, legacy_eval_mode, running, to_channels_last
from modelprof.runtime.group import communicates
from modelprof.runtime.hooks import module_hooks, module_names
from modelprof.runtime.inputs import ModelInputs
from modelprof.runtime.placement import moved_model
from modelprof.timing.clock import Clock
from modelprof.timing.comm import CommStamps
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.runner import Runner
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
    "time_layers",
]

Key = tuple[str, int]


@dataclasses.dataclass(eq=False)
class LayerTiming:
    """Per-call inclusive durations (ms) of the instrumented passes, aligned by pass.

    ``samples`` are corrected for the hooks' own cost (``hook_cost``, when applied);
    ``raw_samples`` are the stamps' differences as read. ``passes_ms`` is the instrumented pass,
    as read, from outside the model call. (A call of the model's modules from another thread
    during a hooked pass raises a ``ModelProfError``: ``modelprof.runtime.hooks``.)
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
    #: per call key, the time (ms, per instrumented pass) its collectives took (CPU; models
    #: under a process group), included in ``samples``; None where none was stamped
    comm_samples: dict[Key, np.ndarray] | None = None
    min_samples: int | None = None
    #: seconds the passes were extended by (``layer_extend_s``) after the budget stopped them
    #: below ``min_samples``
    extended_s: float = 0.0
    #: each call's start stamp from its pass's start (passes x calls, ms, as read), for a
    #: timeline of the passes (``Report.to_trace``)
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
        """The instrumented end-to-end passes (as read) as a Measurement."""
        return self._measurement(self.passes_ms, "the per-layer (instrumented) passes")

    @property
    def corrected(self) -> Measurement:
        """The corrected passes (the ``(root)`` row's), which the clean runs are judged against."""
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
        """Instrumented / plain pass median (1.02 = hooks cost 2 %): against the plain passes
        interleaved with the instrumented ones when there are, else against ``clean``."""
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
        """One row per call in execution order: name, call, latency_ms (median),
        latency_std_ms, latency_pct (of the median pass), peak_memory_bytes."""
        med, std = self.median_ms(), self.std_ms()
        total = float(np.median(self.passes_ms))
        rows = [
            {
                "name": k[0],
                "call": k[1],
                "latency_ms": med[k],
                "latency_std_ms": std[k],
                "latency_pct": 100.0 * med[k] / total if total > 0 else float("nan"),
                "peak_memory_bytes": (self.peak_memory_bytes or {}).get(k),
            }
            for k in self.order
        ]
        return pd.DataFrame(rows)


def _fit_children(t: np.ndarray, parents: list[int | None]) -> None:
    """In place, pass by pass: scale the children of each call down to fit inside it (calls in
    pre-order, so a parent is final before its children are looked at)."""
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

    ``per_call_ms``: the whole cost of one hooked call as its enclosing call sees it (both hooks,
    the hooked call path, the stamps, and what they do to the speed of the ops around them):
    in ``time_layers``, from passes of the model itself, each followed by a plain pass:
    (median instrumented - median plain pass) / calls, on the CPU bounded by the same
    difference in thread CPU time. With fewer than ten instrumented passes (a time budget that
    stopped them early, or ``repeat=``/``max_samples=`` below ten) a difference of so few
    passes is mostly noise, and on the CPU the calibration chain's per-call cost stands in
    (``source="chain"``; on CUDA the chain is not run and the model's passes are all there
    is). ``self_ms``: the part inside a call's own span (after its start stamp, before its end
    stamp), calibrated on a chain of empty modules (``calibrate_hooks``).

    A call's corrected time is its span less ``self_ms`` less ``per_call_ms`` for each call
    nested in it; where a parent's children still add up to more than the parent (the
    instrument slows the ops it surrounds), the children are scaled down to fit it, pass by
    pass, so no ``(self)`` row goes negative and the leaf rows add up to the corrected pass.
    """

    per_call_ms: float
    self_ms: float
    applied: bool = True
    #: where ``per_call_ms`` comes from: ``"model"`` (the model's own passes), ``"chain"`` (the
    #: empty-module chain of ``calibrate_hooks``: too few passes of the model to tell), or
    #: ``"given"`` (passed in)
    source: str = "given"

    def correct(
        self, raw: np.ndarray, nested: np.ndarray, parents: list[int | None] | None = None
    ) -> np.ndarray:
        """``raw`` (passes x calls, ms) less the cost, per call: ``nested[i]`` calls inside i;
        with ``parents`` (the parent index of each call, in call order) children are fitted
        into their parent."""
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
        }


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
        #: the calls open where the last error was raised (innermost last), kept while it
        #: unwinds through them: what a failure message names
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

    def post(self, module: nn.Module, output: Any) -> None:
        self.stack.pop()

    def post_always(
        self, module: nn.Module, args: Any, kwargs: Any, out: Any, raised: bool
    ) -> None:
        """``post``, also when the call raised (a model that catches the error goes on: the
        calls after it are not its children); the calls open where it was raised are kept."""
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


class _Instrument:
    """Hooks that only write a stamp (after checking that the calls come in the order the
    discovery pass saw), and one instrumented pass that reads them back."""

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
        self.reset = reset  # run before each pass, outside its timed span (None: nothing)
        self.clock = clock
        self.plain: list[np.ndarray] = []  # plain passes, interleaved with the instrumented
        self.stamps = clock.stamps(2 * n + 2)
        self.open_calls: list[int] = []
        self.counter = 0
        self.starts = list(range(n)) + [2 * n]
        self.pass_start = [2 * n] * n
        self.ends = list(range(n, 2 * n)) + [2 * n + 1]
        self.rows: list[np.ndarray] = []
        self.offsets: list[np.ndarray] = []  # each call's start from the pass's start (ms)
        self.passes: list[float] = []
        # on the CPU, the thread CPU time of each instrumented and each plain pass, in ms: time
        # spent descheduled does not enter it (see time_layers' hook cost). Where that clock
        # ticks coarsely (15.6 ms on Windows) a median of it is 0: no bound from it there
        self.cpu_ms: tuple[list[float], list[float]] | None = (
            ([], []) if clock.device.type == "cpu" and _THREAD_TIME_FINE else None
        )
        # collectives' own time per call and pass (ms), where they are stamped (timing/comm.py)
        self.comm: CommStamps | None = None
        self.comm_rows: list[np.ndarray] = []
        self.rng = np.random.default_rng(0)  # which pass of each pair comes first

    def pre(self, module: nn.Module, a: tuple, k: dict) -> None:
        i, n, expected = self.counter, self.n, self.plan.modules
        if i >= n or expected[i] is not module:
            keys = self.plan.keys
            saw = f"module {keys[i][0]!r}" if i < n else f"only {n} calls"
            raise ModelProfError(
                f"module '{self.plan.names.get(module, '?')}' ran as call {i + 1} of the "
                f"forward, but the discovery pass saw {saw} there; the model's control flow "
                "changes between passes, so its layers cannot be timed by position"
            )
        self.counter = i + 1
        self.open_calls.append(i)
        self.stamps.record(i)

    def post(self, module: nn.Module, output: Any) -> None:
        self.stamps.record(self.n + self.open_calls.pop())

    def comm_column(self) -> int:
        """The call a collective issued now belongs to (``n``: outside every call)."""
        return self.open_calls[-1] if self.open_calls else self.n

    def run(self) -> None:
        """One instrumented pass (stamps recorded, not read)."""
        n, record = self.n, self.stamps.record
        self.counter = 0
        self.open_calls.clear()
        if self.comm is not None:
            self.comm.begin()
        record(2 * n)
        self.forward()
        record(2 * n + 1)
        if self.counter != n:
            raise ModelProfError(
                f"the forward made {self.counter} module calls, the discovery "
                f"pass {n}; the model's control flow changes between passes"
            )

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """The stamping hooks (another thread's calls of the model meanwhile raise), and the
        collectives' own stamps where they are taken."""
        comm = self.comm if self.comm is not None else contextlib.nullcontext()
        with module_hooks(self.model, self.pre, self.post, self.plan.names), comm:
            yield

    def warm_step(self) -> None:
        """One instrumented and one plain pass (what a block does, untimed)."""
        reset = self.reset or _nothing
        reset()
        with self.hooked():
            self.run()
        reset()
        self.forward()

    def sample_block(self, k: int) -> np.ndarray:
        """``k`` pairs of one instrumented pass (ended by its one synchronize) and one plain pass
        of the same model, each pair in an order drawn at random: the instrument's cost is
        measured under the same load, pass beside pass, and no kind of pass always comes first.
        (A loaded scheduler hands out slices of a steady length: with a fixed order a thread's
        slice ran out at the same point of every pair, so one kind of pass took every wait for a
        core: under nine runnable processes on two cores the instrumented passes of a 3.5 ms
        model read a median 31.5 ms, the plain ones beside them 3.6 ms.) Returns the
        instrumented pass durations (ms)."""
        out = np.empty(k)
        plain = np.empty(k)
        first = self.rng.random(k) < 0.5
        for p in range(k):
            if first[p]:
                plain[p] = self._plain_pass()
                out[p] = self._instrumented_pass()
            else:
                out[p] = self._instrumented_pass()
                plain[p] = self._plain_pass()
        self.plain.append(plain)
        return out

    def _instrumented_pass(self) -> float:
        """One instrumented pass, its stamps read and kept; its duration (ms)."""
        n, cpu = self.n, time.thread_time_ns
        if self.reset is not None:
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
        cpu, perf = time.thread_time_ns, getattr(self.clock, "now_ns", time.perf_counter_ns)
        if self.reset is not None:
            self.reset()
        # the CPU clock's reading inline, so that the thread CPU time beside it spans the same
        # work as the instrumented pass's (run(): its two stamps and the forward)
        c2 = cpu()
        t0 = perf()
        self.forward()
        t1 = perf()
        c3 = cpu()
        self.cpu_ms[1].append((c3 - c2) / 1e6)
        return (t1 - t0) / 1e6


def _nothing() -> None:
    return None


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


_CALIBRATION_CALLS = 64
#: Fewer instrumented passes than this and the hooks' cost is taken from the calibration chain
#: rather than from the model's own passes.
_MIN_COST_PASSES = 10
#: Whether the thread CPU clock resolves a microsecond (Linux, macOS: 1 ns; Windows: 15.6 ms).
_THREAD_TIME_FINE = time.get_clock_info("thread_time").resolution <= 1e-6


class _Empty(nn.Module):
    """Returns its input: a call whose body is as short as a module call can be."""

    def forward(self, x: Any) -> Any:
        return x


def _chain() -> nn.Module:
    return nn.Sequential(*(_Empty() for _ in range(_CALIBRATION_CALLS)))


def calibrate_hooks(clock: Clock, passes: int = 200) -> HookCost:
    """Measure the instrument's own cost on a chain of empty modules, in this process.

    ``per_call_ms`` = (instrumented pass - plain pass) / calls, the passes interleaved so that
    load on the machine reaches both alike; ``self_ms`` = an empty call's measured span less
    its plain cost. Medians of ``passes`` passes each. On CUDA this returns zeros, not applied:
    the events time the GPU's work, on which the host-side cost inside a span does not show
    (``time_layers`` still measures the whole per-call cost on the model itself).
    """
    if clock.device.type != "cpu":
        return HookCost(0.0, 0.0, applied=False, source="chain")
    chain = _chain()
    x = torch.zeros(1)
    names = module_names(chain)

    def forward() -> Any:
        return chain(x)

    plan = discover(chain, forward, CallPlan(names))
    inst = _Instrument(chain, plan, clock, forward)
    perf = getattr(clock, "now_ns", time.perf_counter_ns)
    body = []
    empty = nn.Sequential()
    for _ in range(3):
        inst.warm_step()
    inst.rows.clear()
    instrumented = []
    for _ in range(passes):
        t0 = perf()
        chain(x)
        t1 = perf()
        empty(x)
        t2 = perf()
        body.append(((t1 - t0) - (t2 - t1)) / 1e6 / _CALIBRATION_CALLS)
        instrumented.append(float(inst.sample_block(1)[0]))
    plain = np.concatenate(inst.plain)
    raw = np.vstack(inst.rows)
    k = len(plan.keys)
    per_call = (float(np.median(instrumented)) - float(np.median(plain))) / k
    leaf_span = float(np.median(raw[:, 1:]))  # the empty calls (0 is the chain)
    self_ms = leaf_span - max(float(np.median(body)), 0.0)
    per_call = max(per_call, 0.0)
    self_ms = min(max(self_ms, 0.0), per_call)
    return HookCost(per_call, self_ms, applied=True, source="chain")


@contextlib.contextmanager
def gc_paused() -> Iterator[Callable[[], None]]:
    """Python's cyclic collector off while the instrumented and plain passes alternate (as
    ``timeit`` does): the hooks allocate, so its pauses land on the instrumented passes more
    often, and one pause costs more the larger the process's heap (a gen-2 collection in a
    test process holding millions of objects: tens of ms), all of it charged to the layers and
    to the instrument's cost. Reference counting still frees everything acyclic meanwhile; the
    callable it yields collects the youngest generation, where the cycles a block of passes
    made still are (call it between blocks, outside their timing), so that a forward that
    makes reference cycles does not pile them up for the whole budget. Both do nothing when
    the collector was off already (the user's choice)."""
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


def _open_calls(stack: list[int], plan: CallPlan | None) -> list[int]:
    """The calls open where the forward failed: the discovery pass's, kept as the error
    unwound through them (its stack is empty by then), or ``stack`` as it is."""
    if plan is not None and stack is plan.stack and not stack:
        return plan.failed
    return stack


def _running(stack: list[int], keys: list[Key], model: nn.Module) -> str:
    if not stack:
        return f"the model ({type(model).__name__})"
    name, call = keys[stack[-1]] if stack[-1] < len(keys) else ("?", 0)
    return f"module '{name}'" + (f" (call {call})" if call > 1 else "")


def _memory_pass(
    model: nn.Module,
    plan: CallPlan,
    stats: MemoryStats,
    forward: Callable[[], Any],
    names: dict[nn.Module, str],
    live: list[list[int]],
) -> dict[Key, int]:
    """One forward reading the allocator peak of every call (warm: after the timed passes)."""
    tracker = PeakTracker(stats)
    live[0] = tracker.stack
    idx = 0

    def pre(module: nn.Module, a: tuple, k: dict) -> None:
        nonlocal idx
        tracker.enter(idx)
        idx += 1

    def post(module: nn.Module, output: Any) -> None:
        tracker.exit()

    with module_hooks(model, pre, post, names):
        forward()
    keys = plan.keys
    return {keys[i]: int(tracker.peak[i]) for i in range(min(idx, len(keys)))}


def carried_names(
    modules: dict[nn.Module, str], original: nn.Module, moved: nn.Module
) -> dict[nn.Module, str]:
    """``modules`` (module -> name, of ``original``) for ``moved``, a converted copy of it
    (channels_last, another device): the same modules in the same order."""
    if moved is original:
        return modules
    pairs = dict(zip(original.modules(), moved.modules()))
    return {pairs[m]: n for m, n in modules.items() if m in pairs}


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

    The passes stop like ``measure_latency``'s samples and run under the same options (autocast,
    channels_last); ``warmup`` counts the instrumented warm-up passes, and one discovery pass (and
    with memory statistics one memory pass) come on top, counted in ``LayerTiming.warmup``.
    Times are corrected for the hooks' cost (``calibrate_hooks``, or ``hook_cost`` when given)
    unless ``correct_overhead=False``. ``memory_stats``: ``None`` = the CUDA allocator on CUDA,
    none elsewhere; ``False`` = off; or a ``MemoryStats``. ``modules`` (module -> name, as from
    ``modelprof.runtime.hooks.module_names``) limits and names the hooked modules. The model
    runs in eval mode under ``no_grad`` unless ``training``/``no_grad`` say otherwise.
    """
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module")
    training = legacy_eval_mode(training, timing_options, "time_layers")
    opts = TimingOptions.parse(options, **timing_options)
    dev = model_inputs.device
    memory_stats = MemoryStats.parse(memory_stats, dev)
    args, kwargs = model_inputs.args, model_inputs.kwargs
    original = model
    if opts.channels_last:
        model = moved_model(model, dev, None, memory_format=torch.channels_last)
        args, kwargs = to_channels_last(args), to_channels_last(kwargs)
    mode = RunMode(training=training, no_grad=no_grad, amp=opts.amp, device=dev)
    run = _LayerRun(
        model,
        (args, kwargs),
        module_names(model) if modules is None else carried_names(modules, original, model),
        opts,
        mode,
        model_inputs.batch_size,
    )
    run.reset = model_inputs.reset
    calibrated = None
    if hook_cost is None and opts.correct_overhead:
        calibrated = calibrate_hooks(run.clock)
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
        super().__init__(opts, mode.device, type(model).__name__, batch_size)
        self.model, (self.args, self.kwargs) = model, call
        self.names, self.mode = names, mode
        self.flags = opts.flags(eval_mode=not mode.training, no_grad=mode.no_grad)
        self.flags.update(layers=True, transfer=False, cuda_graph=False, compile=None)
        self.warm_key = (model, input_signature(*call, device=str(self.dev), **self.flags))
        self.live: list[list[int]] = [[]]  # the open calls of the pass running now (errors)
        self.plan: CallPlan | None = None
        self.peaks = None
        #: puts back the inputs a pass writes, before each pass (``ModelInputs.reset``; None:
        #: no pass writes them)
        self.reset: Callable[[], Any] | None = None

    def forward(self) -> Any:
        return self.model(*self.args, **self.kwargs)

    def fresh_forward(self) -> Any:
        """An untimed pass, on the inputs every pass sees."""
        if self.reset is not None:
            self.reset()
        return self.model(*self.args, **self.kwargs)

    def contexts(self) -> list[Any]:
        return [running(self.model, self.mode)]

    def failure(self, e: Exception) -> BaseException:
        """The forward's failure, naming the call it was in (out of memory: as it is)."""
        if is_oom(e):
            return e
        keys = self.plan.keys if self.plan is not None else []
        where = _running(_open_calls(self.live[0], self.plan), keys, self.model)
        return ModelProfError(
            f"forward of {self.label} failed in {where} while timing layers: "
            f"{type(e).__name__}: {e}"
        )

    def execute(self, memory_stats: MemoryStats | None) -> None:
        """Discovery, warm-up, the sampled instrumented/plain passes and the memory pass."""
        with self:
            self.guarded(lambda: self._passes(memory_stats))

    def _passes(self, memory_stats: MemoryStats | None) -> None:
        model, live = self.model, self.live
        self.plan = plan = CallPlan(self.names)
        live[0] = plan.stack
        discover(model, self.fresh_forward, plan)
        self.inst = inst = _Instrument(model, plan, self.clock, self.forward, self.reset)
        if communicates(model):
            inst.comm = CommStamps(self.clock, inst.comm_column)
        live[0] = inst.open_calls
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
            self.peaks = _memory_pass(
                model, plan, memory_stats, self.fresh_forward, self.names, live
            )
            self.warmup_calls += 1

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
    """The model's own cost per hooked call, the inside part calibrated.

    Each instrumented pass is followed by its plain pass, so a change of the machine's pace
    reaches both kinds alike; the estimate is the median of the per-pair differences
    (instrumented - its plain pass). Paired, a preemption lengthens the one pass it hits, the
    instrumented as often as the plain, so the differences scatter on both sides of the
    instrument's cost and their median stays on it even when most passes are hit; the
    difference of the two kinds' medians did not: with both cores busy it read 3.8 ms one
    run (the median instrumented pass preempted) and, where the median plain pass was the one
    preempted, nothing, which left the hooks' cost in the corrected pass (the fastest passes'
    leaves covered 0.967 of it). On the CPU the same paired difference of thread CPU time
    (which time spent descheduled does not enter) bounds it (``benchmarks/leaf_sum.py``
    checks the corrected leaf sum; its figures are in docs/timing.md). With fewer than ten
    passes the difference is mostly noise (one preempted pass pair can read many times the
    hooks' cost and zero whole rows): the calibration chain's cost stands in.
    """
    keys, sampled, inst = run.plan.keys, run.sampled, run.inst
    plain = np.concatenate(inst.plain)
    if sampled.n < _MIN_COST_PASSES and calibrated.applied:  # (CUDA: no chain to ask)
        per_call, source = calibrated.per_call_ms * len(keys), "chain"
    else:
        per_call, source = _paired_median(sampled.samples_ms, plain), "model"
        if inst.cpu_ms is not None:
            cpu_inst, cpu_plain = inst.cpu_ms
            per_call = min(per_call, _paired_median(cpu_inst, cpu_plain))
    per_call = max(0.0, per_call) / len(keys)
    return HookCost(per_call, min(calibrated.self_ms, per_call), applied=True, source=source)


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
