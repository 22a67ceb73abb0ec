"""A fake clock for timing tests: virtual time that only the model's virtual spins advance, so
a test can make two timing windows read exactly what it wants, with no real load and no spin."""

from __future__ import annotations

import time
import types

from torch import nn

__all__ = ["VirtualSpin", "VirtualTime", "install"]


class VirtualTime:
    """A fake clock: wall and CPU time advance only when a :class:`VirtualSpin` runs, the wall
    by ``factor`` x its ms (what load would do to it), the CPU time by its ms."""

    def __init__(self) -> None:
        self.wall_ns = 0
        self.cpu_ns = 0
        self.factor = 1.0

    def advance(self, ms: float) -> None:
        self.wall_ns += int(ms * 1e6 * self.factor)
        self.cpu_ns += int(ms * 1e6)

    def module(self) -> types.SimpleNamespace:
        fake = types.SimpleNamespace(
            **{k: getattr(time, k) for k in dir(time) if not k.startswith("_")}
        )
        fake.perf_counter_ns = lambda: self.wall_ns
        fake.thread_time_ns = lambda: self.cpu_ns
        fake.process_time_ns = lambda: self.cpu_ns
        return fake


class VirtualSpin(nn.Module):
    def __init__(self, clock: VirtualTime, ms: float) -> None:
        super().__init__()
        self.clock, self.ms = clock, ms

    def forward(self, x):
        self.clock.advance(self.ms)
        return x


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
