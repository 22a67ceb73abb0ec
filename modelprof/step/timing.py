"""The training step, timed: forward, loss, backward and optimizer step end to end, and the
backward per module call without per-layer synchronisation.

* **Clean passes** (no hook anywhere): the device's clock times each step's phases
  ``[forward, loss, backward, optimizer]`` back to back; gradients are reset between steps,
  untimed, and the adaptive stop is judged on the backward. With an optimizer, the parameters go
  back to their first values at the start of every chunk, so that they do not drift.
* **Instrumented passes**, separate: the forward notes autograd's sequence numbers
  (``autograd_scope``); every node of the backward graph gets a pre-hook that records one
  pre-allocated stamp, and the time to the next stamp belongs to the call of the node that opened
  it. One synchronize per pass. On the CPU each runs beside a plain backward (no stamp), and
  the stamps' measured cost is taken off the rows (``_Instrumented.stamp_cost``).
* **Memory** (CUDA, or any ``MemoryStats``): the allocator's peak over one whole step.

Everything runs on a copy of the model and under a forked RNG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.render.html import html_table
from modelprof.render.views import Table
from modelprof.runtime import compat
from modelprof.runtime.compiled import eager_view
from modelprof.runtime.device import MemoryStats, same_device
from modelprof.runtime.execution import (
    RunMode,
    amp_context,
    completing,
    running,
    to_channels_last,
)
from modelprof.runtime.group import communicates, is_ddp
from modelprof.runtime.guard import restored_within
from modelprof.runtime.hooks import module_hooks, module_names
from modelprof.runtime.inputs import ModelInputs
from modelprof.runtime.placement import copy_model, moved_model
from modelprof.runtime.snapshot import Snapshot
from modelprof.runtime.tensors import iter_tensors
from modelprof.step.autograd_scope import LOSS, Recomputed, SeqMarks, tag_graph
from modelprof.step.count import (
    backward_of,
    failing_nodes,
    grad_leaves,
    move_target,
    step_guard,
)
from modelprof.step.spec import StepSpec, refuse_eager_only
from modelprof.timing.calls import Calls, TimedInstrument
from modelprof.timing.clock import StampBuffer
from modelprof.timing.comm import CommStamps
from modelprof.timing.interleave import round_ratio
from modelprof.timing.layers import MIN_COST_PASSES, HookCost
from modelprof.timing.measurement import Measurement, format_ms
from modelprof.timing.modes import CacheFlusher
from modelprof.timing.options import TimingOptions
from modelprof.timing.runner import Runner, sample_interleaved
from modelprof.timing.sampler import Sampled
from modelprof.timing.stats import within_ci

__all__ = ["PHASES", "Phases", "StepTimer", "StepTiming", "compare_steps", "time_step"]

PHASES = ("forward", "loss", "backward", "optimizer")
_BACKWARD = PHASES.index("backward")


@dataclasses.dataclass(eq=False)
class StepTiming:
    """Clean phase measurements and the instrumented per-call backward times of one step:
    ``calls_ms[p, c]``, the exclusive backward time of call record ``c`` in instrumented pass
    ``p`` (the last column: the loss's), and ``passes_ms``, each instrumented backward."""

    forward: Measurement
    loss: Measurement
    backward: Measurement
    optimizer: Measurement | None
    step: Measurement
    calls_ms: np.ndarray
    passes_ms: np.ndarray
    #: ``passes_ms`` less the stamps' cost (``stamp_cost``) as a Measurement with its blocks
    #: (their interval is the blocks')
    passes: Measurement
    peak_memory_bytes: int | None = None
    nodes: int = 0
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: per instrumented pass, the backward in node order: (call column, ms) of each stretch
    #: between two stamps (column ``n_calls`` is the loss's), for a timeline (Report.to_trace)
    segments: list[tuple[np.ndarray, np.ndarray]] | None = None
    #: a model that communicates: ``comm_ms[p, c]``, the part of ``calls_ms[p, c]`` that call
    #: ``c``'s collectives took (``modelprof.timing.comm``); None otherwise
    comm_ms: np.ndarray | None = None
    #: what a stamp cost the stretch it closes (``per_call_ms``), taken off ``calls_ms`` and
    #: ``passes`` where ``applied``; ``passes_ms`` and ``segments`` are as read
    stamp_cost: HookCost | None = None
    #: the plain backward (no stamp) beside each instrumented pass
    plain_ms: np.ndarray | None = None

    @property
    def overhead(self) -> float:
        """Instrumented / clean backward median (1.03 = the hooks cost 3 %)."""
        return float(np.median(self.passes_ms)) / self.backward.median_ms

    @property
    def rows_ms(self) -> float:
        """The per-call medians (the rows' backward times), summed."""
        return float(np.median(self.calls_ms, axis=0).sum())

    @property
    def coverage(self) -> float:
        """Sum of the per-call medians over the clean backward median."""
        return self.rows_ms / self.backward.median_ms

    def phases(self) -> Phases:
        named = {name: getattr(self, name) for name in (*PHASES, "step")}
        return Phases({name: m for name, m in named.items() if m is not None})


class Phases(dict):
    """The training step's phases, name -> ``Measurement``; printed as one line per phase
    (median, 95 % interval, samples, stability), not as the measurements' long reprs, and
    ``note`` under them where the step's median is not what the phases' medians sum to."""

    @property
    def note(self) -> str | None:
        """Where the step's interval lies beyond the phases' medians summed (with the sum of
        their intervals' bounds): each sampled step is its phases summed, but the median of a
        sum is the sum of the medians only on a quiet machine (under load, a different phase
        of most steps is slowed). None where they agree, or a figure has no interval."""
        step, parts = self.get("step"), [m for k, m in self.items() if k != "step"]
        if step is None or not parts or not all(m.has_interval for m in self.values()):
            return None
        low, high = (sum(m.median_ci_ms[i] for m in parts) for i in (0, 1))
        lo, hi = step.median_ci_ms
        if lo <= high and hi >= low:
            return None
        total = format_ms(sum(m.median_ms for m in parts))
        return (
            f"the step's median {format_ms(step.median_ms)} ({format_ms(lo)}..{format_ms(hi)}) "
            f"is not its phases' medians summed, {total} ({format_ms(low)}..{format_ms(high)}), "
            "beyond both intervals: each step is its phases summed, but under load the medians "
            "of parts need not add up"
        )

    def _rows(self) -> list[tuple[str, ...]]:
        rows = [("phase", "median", "95% CI", "n", "stable")]
        for name, m in self.items():
            lo, hi = m.median_ci_ms
            ci = f"{format_ms(lo)}..{format_ms(hi)}" if m.has_interval else "n/a"
            stable = {True: "yes", False: "DRIFTED", None: "n/a"}[m.stable]
            rows.append((name, format_ms(m.median_ms), ci, str(m.n), stable))
        return rows

    def __repr__(self) -> str:
        rows = self._rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            ).rstrip()
            for r in rows
        ]
        note = self.note
        return "\n".join(lines + ([f"note: {note}"] if note else []))

    def _repr_html_(self) -> str:
        """The notebook display: the printed rows in the reports' HTML table (escaped, the
        phase's name as text, its figures as numbers, right-aligned)."""
        head, *body = self._rows()
        kinds = ("text", "time_ms", "time_ms", "int", "text")
        table = Table(head, head, kinds, tuple(body), (), "human", pd.DataFrame())
        return html_table(table, caption=self.note)


@dataclasses.dataclass(eq=False)
class _Step:
    """One training step of a copy of the model, in phases that keep what the next one needs.
    ``model`` is the eager module the hooks see; ``clean``, where the user's model is
    ``torch.compile``'d, the copy compiled as it is, which the clean steps run (its compiled
    forward and backward: what a training loop with the user's model runs)."""

    model: nn.Module
    args: tuple
    kwargs: dict
    target: Any
    spec: StepSpec
    device: torch.device
    amp: torch.dtype | None
    params: list[torch.Tensor]
    leaves: list[torch.Tensor]
    reset: Any = None  # puts back the inputs and target a step writes (None: none does)
    clean: nn.Module | None = None  # the compiled copy the clean steps run (None: ``model``)
    optimizer: torch.optim.Optimizer | None = None
    snapshot: Snapshot | None = None  # with an optimizer: the parameters each block starts from
    out: Any = None
    loss_value: torch.Tensor | None = None
    seq0: int = 0  # the autograd node number this step's forward starts from (``clear``)

    def __post_init__(self) -> None:
        # the forward phase ends when the collectives it started have (not in the loss's)
        self.eager_call = completing(self.model)
        self.call = self.eager_call if self.clean is None else completing(self.clean)

    def forward(self, eager: bool = False) -> None:
        """The forward of a clean step, or (``eager``) of the eager module, as hooks see it
        (inside ``eager_view``: compiled modules under it run their eager code)."""
        call = self.eager_call if eager else self.call
        with amp_context(self.device, self.amp):
            self.out = call(*self.args, **self.kwargs)

    def loss(self) -> None:
        with amp_context(self.device, self.amp):
            self.loss_value = self.spec.compute_loss(self.out, self.target)
        self.out = None

    def backward(self) -> None:
        loss, self.loss_value = self.loss_value, None
        loss.backward()

    def optimize(self) -> None:  # a phase of its own: a failure in it is named (``failure``)
        self.optimizer.step()  # type: ignore[union-attr]  # (phases: only with one)

    def clear(self) -> None:
        if self.reset is not None:
            self.reset()
        for t in (*self.params, *self.leaves):
            t.grad = None
        self.seq0 = compat.next_sequence_nr()

    def restore(self) -> None:
        if self.snapshot is not None:
            self.snapshot.restore()

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


class _Marks(TimedInstrument):
    """At each call's boundaries, the call that the autograd nodes made from then on belong to
    (``open``: the calls open); each node's backward stamps are that call's own."""

    reading = "own"

    def __init__(self) -> None:
        self.marks = SeqMarks()
        self.open: list[int] = []

    def enter(self, i: int) -> None:
        self.marks.mark(i)

    def exit(self, i: int) -> None:
        self.marks.mark(self.open[-1] if self.open else 0)


class _Instrumented:
    """Instrumented passes: the forward notes sequence numbers, the backward records stamps."""

    def __init__(self, step: _Step, names: dict[nn.Module, str], n_calls: int, clock: Any) -> None:
        self.step, self.names, self.n_calls, self.clock = step, names, n_calls, clock
        self.fwd = _Marks()
        self.calls = Calls(None, self.fwd, n_calls)
        self.fwd.open = self.calls.open
        self.stamps: StampBuffer | None = None
        self.size = 0
        self.rows: list[np.ndarray] = []
        self.segments: list[tuple[np.ndarray, np.ndarray]] = []  # per pass: (columns, ms)
        self.nodes = 0
        self.rerun_nodes = 0  # the most nodes a reentrant checkpoint made in one backward
        # a model that communicates: its collectives' own stamps (timing/comm.py), per pass
        self.comm = CommStamps(clock, self._comm_column) if communicates(step.model) else None
        self.ddp = is_ddp(step.model)
        self.comm_rows: list[np.ndarray] = []
        self._stamper: _Stamper | None = None
        #: on the CPU, a plain backward (no stamp) beside each instrumented one, for the
        #: stamps' cost (elsewhere none: it is not taken off a GPU's time)
        self.pairs = clock.device.type == "cpu"
        self.plain: list[float] = []
        self._pair: StampBuffer | None = None

    def _column(self, call: int) -> int:
        return self.n_calls if call == LOSS or not 0 <= call < self.n_calls else call

    def _comm_column(self) -> int:
        st = self._stamper
        return int(st.tags[st.i]) if st is not None else self.n_calls

    def _queue_final(self, hit: Any) -> Any:
        """A pre-hook for the backward's first node: queues a callback that stamps the start
        of the engine's final callbacks (queued first, it runs before DDP's and FSDP2's)."""
        final = functools.partial(hit, self.n_calls + 1)
        return lambda *_: compat.queue_backward_callback(final)

    def _split(self, tags: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The pass's per-column ms, the stretch after the engine's last node (the final
        callbacks: DDP's and FSDP2's waits) folded into the root's; the collectives' ms per
        column into ``comm_rows``."""
        n = self.n_calls
        row = np.bincount(tags, weights=d, minlength=n + 2)
        row, final = row[: n + 1], row[n + 1]
        row[0] += final
        if self.comm is None:
            return row
        comm = self.comm.per_column_ms(n + 2)
        if not self.ddp:
            comm[0] += comm[n + 1]
            self.comm_rows.append(comm[: n + 1])
            return row
        # DDP's bucket all-reduces are the root's (a bucket spans modules), and so is the final
        # stretch (the reducer's finalize, which waits for them)
        moved = comm[1 : n + 1]
        row[1:] -= moved
        row[0] += moved.sum()
        root = np.zeros(n + 1)
        root[0] = comm[0] + moved.sum() + final
        self.comm_rows.append(root)
        return row

    def one(self) -> float:
        step = self.step
        step.clear()
        fwd, calls = self.fwd, self.calls
        fwd.marks = SeqMarks()
        calls.begin()
        quiet: dict[tuple[int, int], list[int]] = {}
        with calls.hooked(step.model, self.names), self._noting_quiet(quiet):
            step.forward(eager=True)
        if not (calls.counter == 0 and self.n_calls == 1):
            calls.check_complete("the counted pass", ", so its backward cannot be timed per layer")
        fwd.marks.mark(LOSS)
        step.loss()
        tags = tag_graph([step.loss_value.grad_fn], fwd.marks)
        self.nodes = len(tags.nodes) + self.rerun_nodes  # (those given stamps)
        # + the start, the end, the final callbacks and the nodes a reentrant checkpoint makes
        need = len(tags.nodes) + 3 + self.rerun_nodes
        if self.stamps is None or need > self.size:
            self.stamps, self.size = self.clock.stamps(need), need
        stamps = self.stamps
        stamper = _Stamper(stamps.record, need, self.n_calls)
        handles = [
            node.register_prehook(functools.partial(stamper.hit, self._column(tags.call_of(node))))
            for node in tags.nodes
        ]
        comm = self.comm if self.comm is not None else contextlib.nullcontext()
        if self.comm is not None:
            handles.append(step.loss_value.grad_fn.register_prehook(self._queue_final(stamper.hit)))
            self.comm.begin()
        self._stamper = stamper
        rerun = self._rerun(tags, quiet, stamper, handles)
        try:
            with comm, rerun:
                stamps.record(0)
                step.backward()
                end = stamper.i + 1
                stamps.record(end)
        finally:
            self._stamper = None
            for h in handles:
                h.remove()
        stamps.sync()  # the one synchronize of this pass
        d = stamps.elapsed_ms(range(end), range(1, end + 1))
        tags = stamper.tags[:end]
        self.rows.append(self._split(tags, d))
        self.segments.append(
            (np.where(tags > self.n_calls, 0, tags), np.asarray(d, dtype=np.float64))
        )
        return float(d.sum())

    def _noting_quiet(self, quiet: dict[tuple[int, int], list[int]]) -> Any:
        """Hooks noting the forward's calls run with grad off, by the autograd number they
        started at (``Recomputed``: a reentrant checkpoint's); after ``calls``'s own."""
        open_calls = self.calls.open

        def pre(module: nn.Module, *_: Any) -> None:
            if open_calls:
                Recomputed.note(quiet, module, open_calls[-1])

        return module_hooks(self.step.model, pre, lambda *_: None, self.names)

    def _rerun(self, tags: Any, quiet: dict, stamper: _Stamper, handles: list) -> Any:
        """For a forward that ran calls with grad off: hooks that tag the nodes a reentrant
        checkpoint makes in the backward with the calls it reran and give them stamps (as many
        as the last pass made room for: ``rerun_nodes``, learnt pass by pass)."""
        if not quiet:
            return contextlib.nullcontext()
        room, tagged = self.rerun_nodes, [0]

        def on_tag(node: Any, call: int) -> None:
            tagged[0] += 1
            self.rerun_nodes = max(self.rerun_nodes, tagged[0])
            if tagged[0] <= room:
                hit = functools.partial(stamper.hit, self._column(call))
                handles.append(node.register_prehook(hit))

        return Recomputed(tags, quiet, on_tag).hooked(self.step.model, self.names)

    def stretches(self) -> np.ndarray:
        """Per pass, per column (``n_calls + 1``): the stretches between stamps it holds, from
        ``segments`` (the final callbacks' stretch already the root's there)."""
        return np.vstack([np.bincount(c, minlength=self.n_calls + 1) for c, _ in self.segments])

    def plain_one(self) -> float:
        """One step's backward with no stamp (ms), the pair of an instrumented one."""
        step = self.step
        step.clear()
        step.forward(eager=True)
        step.loss()
        if self._pair is None:
            self._pair = self.clock.stamps(2)
        self._pair.record(0)
        step.backward()
        self._pair.record(1)
        self._pair.sync()
        return float(self._pair.elapsed_ms([0], [1])[0])

    def chunk(self, k: int) -> np.ndarray:
        """``k`` instrumented passes, on the CPU each beside a plain one: the plain one second,
        then first, in turn over the whole sampling."""
        out = np.empty(k)
        for i in range(k):
            plain_first = self.pairs and len(self.plain) % 2 == 1
            if plain_first:
                self.plain.append(self.plain_one())
            out[i] = self.one()
            if self.pairs and not plain_first:
                self.plain.append(self.plain_one())
        return out

    def stamp_cost(self, instrumented: np.ndarray) -> HookCost | None:
        """What a stamp costs the stretch it closes (ms): the median over pairs of (instrumented
        - its plain backward) / the pass's stretches, at most the cheapest stretch's median (a
        stretch holds at least its stamp; ``capped``); ``applied`` where that median's 95 %
        interval lies above 0 (else it is noise). None without ``MIN_COST_PASSES`` pairs."""
        plain = np.asarray(self.plain)
        if len(plain) < MIN_COST_PASSES or len(plain) != len(instrumented):
            return None
        per_pass = np.array([len(ms) for _, ms in self.segments])
        excess = np.sort((np.asarray(instrumented) - plain) / per_pass)
        low, _ = within_ci(excess, 0.95)
        per = max(float(np.median(excess)), 0.0)
        cheapest = (
            float(np.median(np.vstack([ms for _, ms in self.segments]), axis=0).min())
            if len(set(per_pass)) == 1
            else math.inf
        )
        capped = per > cheapest
        return HookCost(min(per, cheapest), 0.0, applied=low > 0, source="model", capped=capped)


def device_bytes(tensors: list[torch.Tensor | None], device: torch.device) -> int:
    """Bytes that ``tensors`` keep on ``device``, this rank's part of each (a DTensor's shard),
    each storage once."""
    storages = {}
    for t in tensors:
        if t is None:
            continue
        t = compat.local_tensor(t)
        if not same_device(t.device, device):
            continue
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a subclass without one: not subtracted
            continue
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _local_values(model: nn.Module) -> Snapshot:
    """This rank's part of each parameter, its values kept by a snapshot (the one restorer):
    what an optimizer step on the model itself changes."""
    params = {id(p): p for p in model.parameters()}.values()
    return Snapshot([compat.local_tensor(p).detach() for p in params])


class StepTimer(Runner):
    """Training steps of one model (on a copy), sampled block by block alone (``time_step``) or
    interleaved with other models' (``compare_steps``); a context manager."""

    def __init__(
        self,
        model: nn.Module,
        inputs: ModelInputs,
        spec: StepSpec,
        mode: RunMode = RunMode(training=True, no_grad=False),
        *,
        options: TimingOptions | None = None,
        label: str | None = None,
    ) -> None:
        opts = TimingOptions.parse(options)
        refuse_eager_only(opts)  # (it would time eager steps under their names)
        dev = inputs.device
        if dev.type == "meta":
            raise ModelProfError(
                "device='meta' has no clock: pass timing=False to count the "
                "step from shapes alone, or a real device to time it"
            )
        spec = spec.isolated()  # the loss's own parameters and buffers: a copy's
        # grad on; autocast only around the forward and the loss (``_Step``), not the backward
        self.mode = dataclasses.replace(mode.on(dev), no_grad=False, amp=None)
        self.inputs, self.spec, self.training = inputs, spec, mode.training
        dtype = mode.dtype
        original = compat.compiled_original(model)
        self.base = model if original is None else original
        super().__init__(opts, dev, label or type(self.base).__name__, inputs.batch_size)
        layout = torch.channels_last if opts.channels_last else None
        runner = moved_model(self.base, dev, dtype, memory_format=layout)
        self._saved: Snapshot | None = None
        if runner is self.base and communicates(self.base):
            # never copied (DDP, FSDP2, DTensor): its values are put back on exit
            self._saved = _local_values(self.base) if spec.optimizer is not None else None
        elif runner is self.base:  # train-mode steps change buffers, .grad and parameters
            runner = copy_model(self.base, "time its training step", own_parameters=True)
        #: the user's model left on the device beside the one the steps run (a copy, or one
        #: converted there): the peak's part that a step in the user's own loop does not hold
        self.left_bytes = (
            0
            if runner is self.base
            else device_bytes([*self.base.parameters(), *self.base.buffers()], dev)
        )
        self.runner = runner
        self.copy_of = {
            id(p): q
            for (_, p), (_, q) in zip(
                self.base.named_parameters(remove_duplicate=False),
                runner.named_parameters(remove_duplicate=False),
            )
        }
        params = list({id(p): p for p in runner.parameters()}.values())
        args, kwargs = grad_leaves(inputs.args), grad_leaves(inputs.kwargs)
        if opts.channels_last:
            args, kwargs = to_channels_last(args), to_channels_last(kwargs)
        leaves = [t for t in iter_tensors((args, kwargs)) if t.requires_grad]
        target = move_target(spec.target, dev, dtype)
        self.flusher = CacheFlusher(dev) if opts.cold_cache else None
        # a torch.compile'd model: the clean steps run compiled, as the user's model does (the
        # model itself where they run on its original, else ``runner`` compiled as it is)
        clean = None
        if original is not None:
            clean = model if runner is original else compat.compiled_like(model, runner)
        self.step = _Step(
            runner, args, kwargs, target, spec, dev, opts.amp, params, leaves, inputs.reset, clean
        )

    def contexts(self) -> list[Any]:
        put_back = [self._put_back(self._saved)] if self._saved is not None else []
        return [*put_back, step_guard(self.dev), running(self.runner, self.mode)]

    @contextlib.contextmanager
    def _put_back(self, saved: Snapshot) -> Iterator[None]:
        """The model's own parameters, which its optimizer steps write, put back at the end
        (outermost), and the state guards around (profile()'s) told so: their version counters
        moved, which a guard would otherwise take for writes it kept no copy to undo."""
        with restored_within(list(self.base.parameters())):
            try:
                yield
            finally:
                saved.restore()

    def setup(self) -> None:
        step = self.step
        step.optimizer = self.spec.make_optimizer(step.params, self.copy_of)
        step.snapshot = Snapshot(step.params) if step.optimizer is not None else None

    def failure(self, e: Exception) -> BaseException:
        # the phase that raised, read off the traceback (a loss or optimizer can fail on a later
        # call than the checked first one)
        spec, s = self.spec, _Step
        phases = {
            s.forward.__code__: "the forward",
            s.loss.__code__: f"loss_fn={spec.loss_name}",
            s.backward.__code__: "the backward",
            s.optimize.__code__: f"optimizer.step() (optimizer={spec.optimizer_name})",
        }
        ran = [
            phases[f.f_code] for f, _ in traceback.walk_tb(e.__traceback__) if f.f_code in phases
        ]
        where = f" in {ran[0]}" if ran else ""
        if ran and ran[0] == "the backward":
            where = self._backward_of(e) or where
        error = ModelProfError(
            f"a training step of {self.label} failed{where} while timing it: "
            f"{type(e).__name__}: {e}"
        )
        error.candidate = self.label  # type: ignore[attr-defined]  # compare() drops that one
        return error

    def _backward_of(self, e: Exception) -> str:
        """The module whose backward raised ``e`` in a step, where a node is known
        (:func:`failing_nodes`): that node's number from the step's forward start read on one
        more eager forward, marked at each module call; "" where none is (or the clean steps
        run compiled, numbering their nodes otherwise)."""
        step, nodes = self.step, failing_nodes(e)
        if not nodes or step.clean is not None:
            return ""
        names, marks, open_calls, calls = module_names(step.model), SeqMarks(LOSS), [], []

        def pre(module: nn.Module, *_: Any) -> None:
            open_calls.append(len(calls))
            calls.append(module)
            marks.mark(open_calls[-1])

        def post(*_: Any) -> None:
            open_calls.pop()
            marks.mark(open_calls[-1] if open_calls else LOSS)

        start = compat.next_sequence_nr()
        try:
            with module_hooks(step.model, pre, post, names):
                step.forward(eager=True)
        except Exception:  # noqa: BLE001 - not found: the phase alone is said
            return ""
        finally:
            step.out = None
        call = marks.call_of(start + compat.node_sequence_nr(nodes[-1]) - step.seq0)
        module = calls[call] if call != LOSS else None
        return "" if module is None else backward_of(names[module], type(module).__name__)

    def _between(self) -> None:
        self.step.clear()
        if self.flusher is not None:
            self.flusher()

    # -- clean passes ---------------------------------------------------------------------
    def warm(self) -> float | None:
        """The warm-up (whole steps); the median wall ms of one, to size the blocks."""
        return self.warm_with(self.step.run)

    def sample_block(self, k: int) -> np.ndarray:
        """``k`` clean steps back to back (parameters reset first); their backward ms."""
        step = self.step
        step.restore()
        return self.time_phases(step.phases(), k, self._between)[:, _BACKWARD]

    def measurements(self, sampled: Sampled, t_begin: float) -> dict[str, Measurement]:
        """forward, loss, backward, (optimizer) and step Measurements of the clean passes."""
        opts, mi = self.opts, self.inputs
        env = opts.env(
            mi,
            self.clock.kind,
            backward=True,
            training=self.training,
            loss=self.spec.loss_name,
            optimizer=self.spec.optimizer_name,
            **opts.flags(eval_mode=not self.training, no_grad=False),
        )
        common = dict(**self.fields(sampled), env=env)
        out = self.phase_measurements(PHASES[: self.parts[0].shape[1]], "step", **common)
        out["step"].wall_s = time.perf_counter() - t_begin
        return out

    # -- instrumented passes and memory ---------------------------------------------------
    def instrumented(self, n_calls: int) -> tuple[_Instrumented, Sampled]:
        """Per-call backward times over separate instrumented passes (same stop rule), on the
        eager modules (``eager_view``: a compiled module's original in its place)."""
        with eager_view(self.runner):
            inst = _Instrumented(self.step, module_names(self.runner), n_calls, self.clock)
            self.step.restore()
            est = self.warm_with(inst.one, already_warm=True, counted=False)
            for warm_up in (inst.rows, inst.segments, inst.comm_rows, inst.plain):
                warm_up.clear()
            # the instrumented passes stop by the rule alone: no floor held past the budget
            return inst, self.sample(inst.chunk, est, "per-layer training step", floor_cap_s=0.0)

    def peak_memory(self, stats: MemoryStats) -> int:
        """The allocator peak over one whole step (its statistics reset just before), less what
        only modelprof holds on the device (:meth:`held_bytes`; on an H200, resnet18 at batch 8:
        447.1 MB with it, 100.6 MB more than a plain step's 346.0 MB; the step's own peak above
        the memory in use when it began, 226.7 against 226.1 MB)."""
        step = self.step
        step.restore()
        step.clear()
        peak = self.peak_bytes(lambda: [phase() for phase in step.phases()], stats)
        return max(0, peak - self.held_bytes())

    def held_bytes(self) -> int:
        """What only modelprof holds on the device: the copy of the model beside the user's
        own and the parameters' snapshot each block starts from."""
        step = self.step
        held = [c for s in (step.snapshot, self._saved) if s is not None for c in s.copies]
        return self.left_bytes + device_bytes(held, self.dev)


def time_step(
    model: nn.Module,
    inputs: ModelInputs,
    spec: StepSpec,
    n_calls: int,
    mode: RunMode = RunMode(training=True, no_grad=False),
    *,
    options: TimingOptions | None = None,
    memory_stats: MemoryStats | bool | None = None,
    **timing_options: Any,
) -> StepTiming:
    """Time training steps of (a copy of) ``model`` on ``inputs``.

    ``n_calls``: the module calls the counted pass saw, which the instrumented passes must
    repeat. ``options``/keywords as ``modelprof.timing.options``. ``memory_stats``: ``None`` =
    the CUDA allocator on CUDA, none elsewhere; ``False`` = off; or a ``MemoryStats``."""
    t_begin = time.perf_counter()
    opts = TimingOptions.parse(options, **timing_options)
    memory_stats = MemoryStats.parse(memory_stats, inputs.device)
    with StepTimer(model, inputs, spec, mode, options=opts) as timer:
        sampled = timer.sample(timer.sample_block, timer.warm(), "training step")
        inst, inst_sampled = timer.instrumented(n_calls)
        peak = timer.peak_memory(memory_stats) if memory_stats is not None else None
    got = timer.measurements(sampled, t_begin)
    if opts.warn:
        got["backward"].warn_if_noisy()
    cost = inst.stamp_cost(inst_sampled.samples_ms)
    if cost is not None and not opts.correct_overhead:  # measured, said, not taken off
        cost = dataclasses.replace(cost, applied=False)
    raw = np.vstack(inst.rows)
    applied = cost is not None and cost.applied
    taken = inst.stretches() * (cost.per_call_ms if applied else 0.0)
    return StepTiming(
        **{"optimizer": None, **got},  # the phases' Measurements, by name
        calls_ms=np.clip(raw - taken, 0.0, None),
        passes_ms=inst_sampled.samples_ms,
        peak_memory_bytes=peak,
        nodes=inst.nodes,
        env=got["step"].env,
        segments=list(inst.segments),
        comm_ms=np.vstack(inst.comm_rows) if inst.comm_rows else None,
        passes=Measurement(
            inst_sampled.samples_ms - taken.sum(axis=1), **timer.fields(inst_sampled)
        ),
        stamp_cost=cost,
        plain_ms=np.asarray(inst.plain) if inst.pairs else None,
    )


def compare_steps(
    timers: Sequence[StepTimer], opts: TimingOptions
) -> tuple[list[dict[str, Measurement]], list[tuple[float, float, float]]]:
    """Clean steps of several models, interleaved in rounds (the first is the baseline): every
    model's phase Measurements, and each one's paired backward ratio to it with its interval."""
    t_begin = time.perf_counter()
    sampled = sample_interleaved(timers, opts, "interleaved training steps")
    got = [t.measurements(s, t_begin) for t, s in zip(timers, sampled)]
    base = got[0]["backward"]
    ratios = [(1.0, 1.0, 1.0)]
    for m in got[1:]:
        b = m["backward"]
        if b.undersampled or base.undersampled:  # too few runs to rank: no ratio stated
            ratios.append((math.nan, math.nan, math.nan))
        else:  # over the rounds both took
            ratios.append(round_ratio(b, base, b.confidence))
    if opts.warn:
        for m in got:
            m["backward"].warn_if_noisy()
    return got, ratios
