"""CUDA stand-ins for ``gpu_evidence.py --dry-run``: the script's CUDA code paths run on the CPU.

What is faked (the same fakes as ``tests/test_timing_clock.py``): ``torch.cuda.Event`` reads the
host clock when recorded, ``current_stream`` hands out a stream object, ``synchronize`` and
``torch.cuda.device(...)`` do nothing, and ``torch.cuda._sleep(cycles)`` busy-waits
``cycles / FAKE_CYCLES_PER_MS`` ms on the host. modelprof's ``clock_for`` then gives the CUDA event
clock for a CPU device, so the event clock, its per-layer stamps and the step's node stamps run
as they would on a GPU, reading host work that the fake events bracket. Everything that needs
real device memory (pinned buffers, transfers, graphs, the allocator) stays out of the dry run.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from modelprof.timing import clock as clock_mod
from modelprof.timing.calibration import spin

__all__ = ["FAKE_CYCLES_PER_MS", "FakeEvent", "FakeStream", "fake_cuda"]

#: ``torch.cuda._sleep`` cycles per millisecond of the fake (a 1 GHz clock)
FAKE_CYCLES_PER_MS = 1.0e6


class FakeStream:
    """Stands in for ``torch.cuda.Stream``: only knows its device."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device


class FakeEvent:
    """Stands in for ``torch.cuda.Event``: ``record()`` reads ``perf_counter_ns``."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.t: int | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        self.t = time.perf_counter_ns()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: FakeEvent) -> float:
        if self.t is None or other.t is None:
            raise RuntimeError("FakeEvent read before it was recorded")
        return (other.t - self.t) / 1e6


def _fake_sleep(cycles: int) -> None:
    spin(cycles / FAKE_CYCLES_PER_MS)


def _event_clock_for(device: torch.device, mode: str = "auto") -> clock_mod.Clock:
    if mode == "host":
        return clock_mod.HostSyncClock(device)
    return clock_mod.CudaEventClock(device)


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Patch the CUDA calls above (and every modelprof module's ``clock_for``) for the block;
    everything is put back in ``finally``."""
    original_clock_for = clock_mod.clock_for
    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "Event", FakeEvent),
        (torch.cuda, "current_stream", lambda device=None: FakeStream(device)),
        (torch.cuda, "synchronize", lambda device=None: None),
        (torch.cuda, "_sleep", _fake_sleep),
        (torch.cuda, "device", lambda device=None: contextlib.nullcontext()),
    ]
    for name, mod in list(sys.modules.items()):
        if (name == "modelprof" or name.startswith("modelprof.")) and getattr(
            mod, "clock_for", None
        ) is original_clock_for:
            patches.append((mod, "clock_for", _event_clock_for))
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)
        # a modelprof module first imported inside the block took the fake as its own
        # ``from ... import clock_for`` (modelprof.step.timing, imported by the first
        # backward=True profile): it would hand the event clock to the CPU ever after
        for name, mod in list(sys.modules.items()):
            if (name == "modelprof" or name.startswith("modelprof.")) and getattr(
                mod, "clock_for", None
            ) is _event_clock_for:
                mod.clock_for = original_clock_for
