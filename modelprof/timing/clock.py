"""Where time is read: one clock per device kind, and nowhere else in modelprof.

* CUDA: CUDA events on the current stream around each timed part, elapsed times read after a
  synchronize (the ``triton.testing.do_bench`` recipe); never a host timer around async work.
* CPU: ``time.perf_counter_ns``, with the CPU time of each sample read beside it; with
  ``clock="cpu"`` that CPU time is the clock (*CPU work*: waiting for a core cannot
  stretch it).
* Any other device, or CUDA with ``clock="host"`` (work on streams torch does not know, such as
  a TensorRT engine's): the device's synchronize, then the host clock.

Each clock times a *step* of one or more *phases* (a transfer-inclusive run has three: H2D,
compute, D2H), and hands per-layer hooks a ``StampBuffer`` to record points in time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from modelprof.errors import ModelProfError
from modelprof.runtime.device import device_synchronize

__all__ = [
    "Clock",
    "CpuClock",
    "CudaEventClock",
    "HostSyncClock",
    "StampBuffer",
    "CpuTimeClock",
    "check_clock",
    "clock_for",
    "cpu_time_source",
    "device_synchronize",
    "other_cpu_clock",
    "thread_share",
]

Phase = Callable[[], Any]


class StampBuffer:
    """``size`` pre-allocated points in time that hooks ``record(i)``; read after ``sync()``."""

    def record(self, i: int) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        """Wait until every recorded stamp has its value (one synchronize)."""

    def elapsed_ms(self, starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
        """Milliseconds from stamp ``starts[i]`` to stamp ``ends[i]``, for each i."""
        raise NotImplementedError


def cpu_time_source() -> tuple[str, Callable[[], int]]:
    """The CPU clock for the work torch does here: ``("thread_time", time.thread_time_ns)``
    with one intra-op thread (all the work is on this thread), else ``("process_time", ...)``
    (summed over every thread)."""
    if torch.get_num_threads() == 1:
        return "thread_time", time.thread_time_ns
    return "process_time", time.process_time_ns


def other_cpu_clock(cpu_kind: str | None) -> Callable[[], int]:
    """The other CPU clock read beside ``cpu_kind``'s, for :func:`thread_share`: the calling
    thread's own (``time.thread_time_ns``) beside the process's, the process's beside the
    thread's (a callable whose work another thread does leaves the calling thread's idle);
    else a clock that reads 0."""
    other = {"process_time": time.thread_time_ns, "thread_time": time.process_time_ns}
    return other.get(cpu_kind or "", int)


def thread_share(cpu_kind: str | None, cpu_ms: float, other_ms: float) -> float | None:
    """The calling thread's share of the process's CPU time over the same samples, from
    ``cpu_ms`` of ``cpu_kind``'s clock and ``other_ms`` of :func:`other_cpu_clock`'s; None with
    another clock or no time."""
    if cpu_kind == "process_time":
        return other_ms / cpu_ms if cpu_ms > 0 else None
    if cpu_kind == "thread_time":
        return cpu_ms / other_ms if other_ms > 0 else None
    return None


class _HostStamps(StampBuffer):
    def __init__(self, size: int, device: torch.device, clock: Callable[[], int]) -> None:
        self.ns = ns = [0] * size
        if device.type == "cpu":

            def record(i: int) -> None:
                ns[i] = clock()
        else:

            def record(i: int) -> None:
                device_synchronize(device)
                ns[i] = clock()

        self.record = record  # type: ignore[method-assign]

    def elapsed_ms(self, starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
        ns = np.asarray(self.ns, dtype=np.int64)
        return (ns[np.asarray(ends, dtype=np.int64)] - ns[np.asarray(starts, dtype=np.int64)]) / 1e6


class _EventStamps(StampBuffer):
    def __init__(self, size: int, device: torch.device) -> None:
        self.device = device
        self.events = events = [torch.cuda.Event(enable_timing=True) for _ in range(size)]

        def record(i: int) -> None:
            # the measured device's current stream, whichever device is current in the caller
            events[i].record(torch.cuda.current_stream(device))

        self.record = record  # type: ignore[method-assign]

    def sync(self) -> None:
        # the whole device: hooks may record stamps on other streams
        torch.cuda.synchronize(self.device)

    def elapsed_ms(self, starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
        ev = self.events
        return np.array([ev[s].elapsed_time(ev[e]) for s, e in zip(starts, ends)], dtype=np.float64)


class Clock:
    """Times ``n`` samples of a step; returns an ``(n, len(phases))`` array of milliseconds."""

    kind = "abstract"
    sync_reads = False  # the device's synchronize before every clock read (HostSyncClock)

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.now_ns: Callable[[], int] = time.perf_counter_ns  # the host stamps' clock

    def time(self, phases: Sequence[Phase], n: int, between: Phase | None = None) -> np.ndarray:
        """Run ``between`` (untimed) then each phase in turn, ``n`` times; per-phase durations.
        Here ``now_ns`` is read around each phase (synchronous work: ``CpuTimeClock``; or
        synchronized first: ``HostSyncClock``)."""
        p = len(phases)
        ns = np.zeros((n, p + 1), dtype=np.int64)
        clock, sync = self.now_ns, self.sync if self.sync_reads else None
        for i in range(n):
            if between is not None:
                between()
            if sync is not None:
                sync()
            row = ns[i]
            row[0] = clock()
            for k in range(p):
                phases[k]()
                if sync is not None:
                    sync()
                row[k + 1] = clock()
        return np.diff(ns, axis=1) / 1e6

    def stamps(self, size: int) -> StampBuffer:
        """A pre-allocated buffer of ``size`` stamps for hooks (per-layer timing)."""
        return _HostStamps(size, self.device, self.now_ns)

    def sync(self) -> None:
        device_synchronize(self.device)


class CpuClock(Clock):
    """``time.perf_counter_ns`` around synchronous work, and the CPU time of each sample
    (thread or process, :func:`cpu_time_source`) read just outside it: ``cpu_parts`` keeps one
    ``(n, phases)`` array per ``time()`` call, each phase's CPU time (read just before its start
    wall stamp and just after its end one: outside every wall span; a sample's CPU time is
    their sum), ``cpu_kind`` says which clock; ``other_parts`` the other CPU clock over the
    same phases (:func:`other_cpu_clock`, read outside those), for the calling thread's share.

    The reads cost CPU time the wall span does not hold (a ``thread_time_ns`` read is a system
    call: about 0.5 us, against a 30 us call); ``tare`` reads each clock's median excess over
    ``TARE_SAMPLES`` samples of empty phases, taken off every sample: each phase's CPU time
    then spans its wall span, at most that wall time (up to the reads' own variation, a tenth
    of a microsecond or so after real work), as one thread's CPU time over one span is.
    """

    kind = "perf_counter_ns"
    TARE_SAMPLES = 101

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.cpu_kind, self._cpu = cpu_time_source()
        self.cpu_parts: list[np.ndarray] = []
        self.other_parts: list[np.ndarray] = []
        self._tares: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def time(self, phases: Sequence[Phase], n: int, between: Phase | None = None) -> np.ndarray:
        wall, cpu, other = self._read(phases, n, between)
        cpu_tare, other_tare = self.tare(len(phases))
        # (never below 0: a phase shorter than the reads' jitter spent no less than nothing)
        self.cpu_parts.append(np.maximum(cpu - cpu_tare, 0.0))
        self.other_parts.append(np.maximum(other - other_tare, 0.0))
        return wall

    def tare(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``p`` phases' CPU time (and the other clock's) beyond its wall time when the
        phase does nothing: the reads' own cost, medians in ms (one per phase count)."""
        if p not in self._tares:
            wall, cpu, other = self._read([lambda: None] * p, self.TARE_SAMPLES)
            self._tares[p] = np.median(cpu - wall, axis=0), np.median(other - wall, axis=0)
        return self._tares[p]

    def _read(
        self, phases: Sequence[Phase], n: int, between: Phase | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` samples of ``phases``: the wall, CPU and other CPU clock's ms, (n, phases)."""
        p = len(phases)
        # each phase's wall start and end, and each CPU clock's read just outside them
        ns, cpu, others = (np.zeros((n, 2 * p), dtype=np.int64) for _ in range(3))
        clock, cpu_clock = self.now_ns, self._cpu
        other = other_cpu_clock(self.cpu_kind)
        for i in range(n):
            if between is not None:
                between()
            row, c, o = ns[i], cpu[i], others[i]
            for k in range(p):
                o0 = other()
                c0 = cpu_clock()
                w0 = clock()
                phases[k]()
                w1 = clock()
                c1 = cpu_clock()
                o1 = other()
                row[2 * k], row[2 * k + 1], c[2 * k], c[2 * k + 1] = w0, w1, c0, c1
                o[2 * k], o[2 * k + 1] = o0, o1
        return tuple((a[:, 1::2] - a[:, ::2]) / 1e6 for a in (ns, cpu, others))


class CpuTimeClock(Clock):
    """``clock="cpu"``: the CPU time of the work (:func:`cpu_time_source`; ``kind`` says which)
    as the clock. It equals latency only for a single-threaded model on an idle core."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        name, self.now_ns = cpu_time_source()
        self.kind = f"{name}_ns"


class HostSyncClock(Clock):
    """The device's synchronize before every host clock read (mps, xpu, or CUDA with
    ``clock="host"``)."""

    kind = "synchronize+perf_counter_ns"
    sync_reads = True


class CudaEventClock(Clock):
    """CUDA events around each sample.

    ``latency`` (the default): each sample starts on an idle GPU and ends in a synchronize
    (MLPerf SingleStream): the time one request sees. ``pipelined`` (``group`` > 0): samples
    back to back, each an event pair around ``group`` calls, its value the span over ``group``:
    the time per call of a full stream. (An event pair per call in a back-to-back block would
    read the spacing between completions, below either.)
    """

    kind = "cuda_event"

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        #: calls per sample in the pipelined mode; 0: the latency mode
        self.group = 0

    def time(self, phases: Sequence[Phase], n: int, between: Phase | None = None) -> np.ndarray:
        p = len(phases)
        group = self.group
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(p + 1)] for _ in range(n)]
        stream = torch.cuda.current_stream(self.device)
        for i in range(n):
            if between is not None:
                between()  # queued before the start event: outside the timed span
            row = events[i]
            row[0].record(stream)
            for k in range(p):
                for _ in range(max(group, 1)):
                    phases[k]()
                row[k + 1].record(stream)
            if not group:
                torch.cuda.synchronize(self.device)  # the next sample finds the GPU idle
        if group:
            torch.cuda.synchronize(self.device)
        out = np.array(
            [[row[k].elapsed_time(row[k + 1]) for k in range(p)] for row in events],
            dtype=np.float64,
        ).reshape(n, p)
        return out / group if group else out

    def stamps(self, size: int) -> StampBuffer:
        return _EventStamps(size, self.device)


def clock_for(device: torch.device, mode: str = "auto") -> Clock:
    """The clock for ``device`` (module docstring); ``mode`` is ``"auto"``, ``"host"`` or
    ``"cpu"``."""
    check_clock(mode, device)
    if mode == "cpu":
        return CpuTimeClock(device)
    if device.type == "cuda":
        return HostSyncClock(device) if mode == "host" else CudaEventClock(device)
    if device.type == "cpu":
        return CpuClock(device)
    return HostSyncClock(device)


def check_clock(mode: str, device: torch.device) -> None:
    """The CPU clock (``mode="cpu"``) refuses any device but the CPU, naming the option."""
    if mode == "cpu" and device.type != "cpu":
        raise ModelProfError(
            f"clock='cpu' reads the CPU time of the work, but the model "
            f"runs on {device}; use clock='auto' there"
        )
