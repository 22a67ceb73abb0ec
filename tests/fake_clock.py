"""A fake clock for timing tests: virtual time that only the model's virtual spins advance, so
a test can make two timing windows read exactly what it wants, with no real load and no spin."""

from __future__ import annotations

import time
import types

from torch import nn

__all__ = ["VirtualSpin", "VirtualTime", "hit_and_spared", "install"]


class VirtualTime:
    """A fake clock: wall and CPU time advance only when a :class:`VirtualSpin` runs, the wall
    by ``factor`` x its ms (what load would do to it), the CPU time by its ms; the calling
    thread's own CPU time by ``thread_share`` x its ms (below 1: other threads did the rest)."""

    def __init__(self) -> None:
        self.wall_ns = 0
        self.cpu_ns = 0
        self.thread_ns = 0
        self.factor = 1.0
        self.thread_share = 1.0

    def __deepcopy__(self, memo: dict) -> VirtualTime:
        return self  # one clock, however a model holding it is copied (a training step's copy)

    def advance(self, ms: float) -> None:
        self.wall_ns += int(ms * 1e6 * self.factor)
        self.cpu_ns += int(ms * 1e6)
        self.thread_ns += int(ms * 1e6 * self.thread_share)

    def module(self) -> types.SimpleNamespace:
        fake = types.SimpleNamespace(
            **{k: getattr(time, k) for k in dir(time) if not k.startswith("_")}
        )
        fake.perf_counter_ns = lambda: self.wall_ns
        fake.thread_time_ns = lambda: self.thread_ns
        fake.process_time_ns = lambda: self.cpu_ns
        return fake


class VirtualSpin(nn.Module):
    def __init__(self, clock: VirtualTime, ms: float) -> None:
        super().__init__()
        self.clock, self.ms = clock, ms

    def forward(self, x):
        self.clock.advance(self.ms)
        return x


class _Hit(VirtualSpin):
    """A spin that "load" hits: its wall time runs ``factor`` x its CPU time."""

    def __init__(self, clock: VirtualTime, ms: float, factor: float) -> None:
        super().__init__(clock, ms)
        self.factor = factor

    def forward(self, x):
        self.clock.factor = self.factor
        try:
            return super().forward(x)
        finally:
            self.clock.factor = 1.0


def hit_and_spared(clock: VirtualTime, ms: float = 1.0, factor: float = 3.0) -> dict:
    """Two identical ``ms`` models, "load" hitting only the first ("hit"): its wall clock
    reads ``factor`` x its CPU time, the other's ("spared") 1x."""
    return {
        "hit": nn.Sequential(_Hit(clock, ms, factor)),
        "spared": nn.Sequential(VirtualSpin(clock, ms)),
    }


def install(monkeypatch) -> VirtualTime:
    """A :class:`VirtualTime` read by modelprof's clocks (wall and CPU time) and per-layer
    passes in place of the real ones."""
    import modelprof.runtime.env as env_module
    import modelprof.timing.clock as clock_module
    import modelprof.timing.layers as layers_module

    clock = VirtualTime()
    fake = clock.module()
    monkeypatch.setattr(clock_module, "time", fake)
    monkeypatch.setattr(layers_module, "time", fake)
    # the machine's real load means nothing beside virtual time: none is read (as off Linux)
    monkeypatch.setattr(env_module, "_PROC_STAT", "/nonexistent/proc/stat")
    return clock
