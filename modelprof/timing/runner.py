"""One Runner: the skeleton every timed pass shares.

Entered, a :class:`Runner` makes the measured CUDA device current and holds its pass's contexts;
it warms up and samples by the options' rules (``sampler``), holds the sample floor past the
budget, raises a failure of the user's code as ``failure`` says, and gives the fields every
Measurement of its samples shares. What a pass runs is its own (``TimedCall``, ``_LayerRun``,
``StepTimer``, the generations' and the kernel passes' runners).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch

from modelprof.errors import ModelProfError, SamplingPastBudgetWarning, warn_user
from modelprof.runtime.device import MemoryStats
from modelprof.runtime.env import MachineShare, sm_clock_reader
from modelprof.runtime.progress import NoProgress, progress_bar, sampling_bar
from modelprof.timing.clock import CpuClock, Phase, clock_for, thread_share
from modelprof.timing.measurement import Measurement
from modelprof.timing.options import TimingOptions
from modelprof.timing.sampler import (
    WARMED,
    Sampled,
    collect,
    collect_interleaved,
    hold_floor,
    warm_up,
)

__all__ = ["EXTENSION_NOTICE_S", "Runner", "model_label", "sample_interleaved"]

#: a sampling floor expected to take this many seconds or more past the budget is said as it
#: starts, where no progress bar shows it
EXTENSION_NOTICE_S = 5.0


def _say_extension(
    desc: str, sampled: Sampled, need: int, cap: float, cap_name: str = "floor_extend_s"
) -> None:
    """One notice as a long sampling floor begins: the budget is spent and the call goes on (a
    newcomer's profile under load waited 52 s in silence). Expected: the runs still wanting at
    what a sample has cost so far (its wall time: a per-layer sample runs a plain pass too, a
    training step's times its backward alone), within ``cap``; none where not even one run
    would start (:func:`~modelprof.timing.sampler.extend` starts one only if its median sample
    fits in the cap)."""
    if not sampled.n or float(np.median(sampled.samples_ms)) / 1e3 > cap:
        return
    ahead = min(cap, (need - sampled.n) * sampled.wall_s / sampled.n)
    _notice(desc, sampled.n, need, ahead, cap, cap_name)


def _notice(
    desc: str,
    n: int,
    need: int,
    ahead: float,
    cap: float,
    cap_name: str = "floor_extend_s",
    of: str = "",
) -> None:
    """The notice itself, from ``ahead`` seconds expected (said from ``EXTENSION_NOTICE_S``).
    The estimate is no bound (a trial's "up to about 10 s" ran 17 s under a growing load): the
    bound said is the cap, which no run is started past (by its median sample: about)."""
    if ahead >= EXTENSION_NOTICE_S:
        pace = f"about {ahead:.0f} s more at the pace so far, " if ahead < cap else ""
        warn_user(
            f"modelprof: {desc}: the time budget ended at {n} of min_samples={need} runs{of}; "
            f"sampling on for {pace}at most about {cap:g} s more ({cap_name}= caps it; "
            "progress=True with tqdm shows a bar)",
            SamplingPastBudgetWarning,
        )


def model_label(model: Any) -> str:
    """How a timed run names ``model`` in its errors and progress: its class, or the label a
    wrapper of modelprof's own carries (``modelprof_label``: the model it runs)."""
    return getattr(model, "modelprof_label", None) or type(model).__name__


class Runner:
    """A timed run of ``label`` on ``device`` under ``opts``; see the module docstring.

    Hooks for a pass: ``contexts()`` (entered after the device, left in reverse),
    ``setup()`` (after them, still inside the clean-up on error), ``failure(e)``.
    """

    def __init__(
        self, opts: TimingOptions, device: torch.device, label: str, batch_size: int = 1
    ) -> None:
        self.opts, self.dev, self.label, self.batch_size = opts, device, label, batch_size
        self.clock = clock_for(device, opts.clock)
        self.warmup_calls = 0
        self.extended_s = 0.0  # seconds sampled past the budget to hold the sample floor
        self.parts: list[np.ndarray] = []  # each block's per-phase ms (``time_phases``)
        self.cpu_parts: list[np.ndarray] = []  # and, on a CpuClock, their CPU ms
        self.other_parts: list[np.ndarray] = []  # and the other CPU clock's (thread shares)
        #: (callable, input signature) for the warm-up registry, remembered on a clean exit
        self.warm_key: tuple[Any, Hashable] | None = None
        #: beside the CPU's wall clock, what other work took of the cores (``Sampled``)
        self.reads_share = isinstance(self.clock, CpuClock)
        self._stack = contextlib.ExitStack()

    def contexts(self) -> Sequence[contextlib.AbstractContextManager]:
        return ()

    def setup(self) -> None:
        return None

    def failure(self, e: Exception) -> BaseException:
        """What a failure ``e`` of the user's code is raised as (``e`` itself: as it is)."""
        return e

    def __enter__(self) -> Any:
        # a fresh run: blocks of an earlier one (compare's retry without a failed model) gone
        self.parts, self.cpu_parts, self.other_parts = [], [], []
        stack = self._stack
        try:
            if self.dev.type == "cuda":
                stack.enter_context(torch.cuda.device(self.dev))
            for context in self.contexts():
                stack.enter_context(context)
            self.setup()
        except BaseException:
            stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        if exc[0] is None and self.warm_key is not None:
            WARMED.add(*self.warm_key)

    @property
    def already_warm(self) -> bool:
        """Whether this callable was warmed up on these inputs before (a short warm-up)."""
        return self.warm_key is not None and WARMED.seen(*self.warm_key)

    def guarded(self, fn: Callable[[], Any]) -> Any:
        """``fn()``; a failure of the user's code is raised as ``failure`` says."""
        try:
            return fn()
        except ModelProfError:
            raise
        except Exception as e:
            err = self.failure(e)
            if err is e:
                raise
            raise err from e

    def warm_with(
        self, step: Callable[[], Any], already_warm: bool = False, counted: bool = True
    ) -> float | None:
        """Warm ``step`` up by the options' rule (``counted``: in ``warmup_calls``); the median
        wall ms of one call, which sizes the blocks."""
        n, est = warm_up(
            lambda: self.guarded(step), self.opts.warmup, already_warm, self.clock.sync
        )
        self.warmup_calls += n if counted else 0
        return est

    def time_phases(
        self, phases: Sequence[Phase], k: int, between: Phase | None = None
    ) -> np.ndarray:
        """``k`` runs of ``phases`` back to back on the clock, kept in ``parts``: (k, phases) ms."""
        got = self.guarded(lambda: self.clock.time(phases, k, between))
        self.parts.append(got)
        if self.reads_share:  # a CpuClock: that block's CPU time, phase by phase
            self.cpu_parts.append(self.clock.cpu_parts[-1])
            self.other_parts.append(self.clock.other_parts[-1])
        return got

    def cpu_table(self, whole: bool = False) -> tuple[np.ndarray, list[float | None]] | None:
        """The CPU time of the blocks kept (samples x phases, ms; with ``whole``, their sum as
        one more column) and the calling thread's share of each column (:func:`thread_share`);
        None off a CpuClock."""
        if not self.cpu_parts:
            return None
        cpu, other = np.concatenate(self.cpu_parts), np.concatenate(self.other_parts)
        if whole:
            cpu = np.column_stack([cpu, cpu.sum(axis=1)])
            other = np.column_stack([other, other.sum(axis=1)])
        kind = self.clock.cpu_kind
        shares = [thread_share(kind, float(c), float(o)) for c, o in zip(cpu.sum(0), other.sum(0))]
        return cpu, shares

    def sample(
        self,
        block: Callable[[int], np.ndarray],
        est_ms: float | None,
        desc: str,
        floor_cap_s: float | None = None,
    ) -> Sampled:
        """Blocks of ``block(k)`` by the stop rule, then the sample floor held for at most
        ``floor_cap_s`` seconds more (None: the rule's own cap), kept in ``extended_s``."""
        opts, share = self.opts, MachineShare(on=self.reads_share)
        block, read_clocks = clocked(block, self.dev)
        with share, sampling_bar(opts.stop, enabled=opts.progress, desc=desc) as bar:
            sampled = self.guarded(lambda: collect(block, opts.stop, est_ms, on_block=bar))
        need = opts.stop.promised_min
        cap = opts.stop.floor_cap_s if floor_cap_s is None else floor_cap_s
        if need is not None and sampled.n < need and cap > 0:
            extending = f"{desc}: extending to {need} runs (cap {cap:g} s)"
            extend = progress_bar(need, enabled=opts.progress, unit="run", desc=extending)
            if opts.warn and isinstance(extend, NoProgress):  # no bar (off, or no tqdm)
                cap_name = "floor_extend_s" if floor_cap_s is None else "layer_extend_s"
                _say_extension(desc, sampled, need, cap, cap_name)
            with share, extend as bar:
                bar.update(sampled.n)
                sampled = self.guarded(
                    lambda: hold_floor(
                        block, sampled, opts.stop, cap, on_block=lambda n, _: bar.update(n - bar.n)
                    )
                )
            self.extended_s = sampled.extended_s
        return _with_reads(sampled, share, read_clocks)

    def peak_bytes(self, fn: Callable[[], Any], stats: MemoryStats) -> int:
        """The allocator's peak (``stats``, reset just before) over one more ``fn()``."""

        def one() -> int:
            self.clock.sync()
            stats.reset_peak()
            fn()
            self.clock.sync()
            return int(stats.max_allocated())

        return self.guarded(one)

    def phase_measurements(
        self, names: Sequence[str], whole: str | None = None, **common: Any
    ) -> dict[str, Measurement]:
        """One Measurement per phase of the blocks kept in ``parts`` (column ``i``: ``names[i]``),
        and their sum as ``whole`` where named; each with its CPU time where it was read, and
        the calling thread's share of that phase's."""
        table = np.concatenate(self.parts, axis=0)
        columns = list(names)
        if whole is not None:
            table, columns = np.column_stack([table, table.sum(axis=1)]), [*columns, whole]
        read = self.cpu_table(whole is not None)
        out = {}
        for i, name in enumerate(columns):
            cpu = {}
            if read is not None:
                cpu = dict(cpu_ms=read[0][:, i], cpu_clock=self.clock.cpu_kind)
                cpu["cpu_thread_share"] = read[1][i]
            out[name] = Measurement(table[:, i], label=f"{self.label} {name}", **cpu, **common)
        return out

    def fields(self, sampled: Sampled) -> dict[str, Any]:
        """The keywords every Measurement of ``sampled`` shares."""
        return dict(
            device=str(self.dev),
            batch_size=self.batch_size,
            warmup=self.warmup_calls,
            **sampled.fields(self.opts.stop),
        )


def sample_interleaved(runners: Sequence[Any], opts: TimingOptions, desc: str) -> list[Sampled]:
    """Every runner entered and warmed up (its ``warm()``), then their ``sample_block`` in
    interleaved rounds (``sampler.collect_interleaved``, shuffled from ``opts.seed``); all are
    left at the end."""
    rng = np.random.default_rng(opts.seed)
    with contextlib.ExitStack() as stack:
        ests = [stack.enter_context(r).warm() for r in runners]
        blocks, reads = zip(*(clocked(r.sample_block, r.dev) for r in runners), strict=True)
        bar = sampling_bar(opts.stop, enabled=opts.progress, desc=desc, candidates=len(runners))
        share = MachineShare(on=all(r.reads_share for r in runners))  # the rounds' one window
        said = opts.warn and isinstance(bar.bar, NoProgress)  # no bar shows the floor
        need = opts.stop.promised_min or 0

        def on_floor(n: int, ahead: float, cap: float) -> None:  # (a round runs every one)
            if said:
                _notice(desc, n, need, ahead, cap, of=" for the fewest of the candidates")

        with share, bar as on_round:
            got = collect_interleaved(
                blocks, opts.stop, ests, rng, on_round=on_round, on_floor=on_floor
            )
    return [_with_reads(s, share, read) for s, read in zip(got, reads, strict=True)]


def _with_reads(sampled: Sampled, share: MachineShare, clocks: Callable) -> Sampled:
    """``sampled`` with the other work's share of the cores and the SM clocks (:func:`clocked`)."""
    return dataclasses.replace(
        sampled,
        competing_cores=share.competing_cores,
        competing_cores_margin=share.margin,
        sm_clock_mhz=clocks(),
    )


def clocked(
    block: Callable[[int], np.ndarray], device: torch.device
) -> tuple[Callable[[int], np.ndarray], Callable[[], np.ndarray | None]]:
    """``block``, reading the SM clock of ``device`` after each call (outside its timed span:
    the block has synchronized), and what gives the clocks in the order the blocks were taken
    (None without a reader or when one read failed)."""
    reader, mhz = sm_clock_reader(device), []

    def read() -> np.ndarray | None:
        if not mhz or None in mhz:
            return None
        return np.asarray(mhz, dtype=np.float64)

    if reader is None:
        return block, read

    def read_after(k: int) -> np.ndarray:
        got = block(k)
        mhz.append(reader())
        return got

    return read_after, read
