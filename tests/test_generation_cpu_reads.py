"""A generation's CPU figures on the CPU hold no cost of modelprof's own clock reads: each
token's stamp reads the CPU clock (a system call) outside the wall spans, and that read's cost
(a tare measured over empty steps) is taken off each CPU span, as ``CpuClock`` does for
``measure_latency``; else a step's CPU work read above its wall time, which one thread's
CPU time over one span cannot be."""

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from modelprof.generation.timing import _Run
from modelprof.timing.measurement import CPU_ONE_THREAD_SHARE


class _EmptySteps:
    """A language model whose decode steps do nothing: every figure is the stamps' own."""

    device = torch.device("cpu")

    def generate(self, prompt, new_tokens, stamp):
        for _ in range(new_tokens):
            stamp()


def _read_cost_ms(clock) -> float:
    """One CPU clock read's CPU time, measured here: the median gap between two reads."""
    gaps = []
    for _ in range(201):
        a = clock()
        gaps.append(clock() - a)
    return float(np.median(gaps)) / 1e6


def test_cpu_spans_hold_no_clock_read(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # the thread clock, as 1 thread
    run = _Run(_EmptySteps(), None, 50)
    assert run.cpu_clock == "thread_time"
    read = _read_cost_ms(time.thread_time_ns)
    walls = [run() for _ in range(21)]
    steps_wall, steps_cpu = np.concatenate(run.steps), np.concatenate(run.cpu["steps"])
    # Each empty step's wall span is two list appends; its CPU span held, before the tare, one
    # whole CPU clock read (``read``) more: the median step read ~``read`` above its wall
    # time in every step. Less the tare it is the wall time less a descheduled moment:
    # within half a read of it.
    assert np.median(steps_cpu) <= np.median(steps_wall) + read / 2
    # The end to end's wall time leaves out the 50 stamps' reads; its CPU time held them
    # (50 reads, ~50 x ``read`` above the wall time). Less 50 tares: within 10 reads of it.
    assert np.median(run.cpu["end_to_end"]) <= np.median(walls) + 10 * read
    assert all(v >= 0 for v in run.cpu["ttft"])  # never below nothing (clipped at 0)


class _OneThread:
    """A machine where one thread does everything: the wall time, the thread's CPU time and
    the process's are one clock. A CPU clock read (a system call) costs ``read`` ns, sampled
    at its start; a wall stamp costs nothing; an empty decode step ``step`` ns."""

    def __init__(self, read: int, step: int) -> None:
        self.now, self.read, self.step = 0, read, step

    def wall(self) -> int:
        return self.now

    def cpu(self) -> int:
        at = self.now
        self.now += self.read
        return at

    def generate(self, prompt, new_tokens, stamp):
        for _ in range(new_tokens):
            self.now += self.step
            stamp()


def test_the_thread_share_holds_no_clock_read_either(monkeypatch):
    # One thread does all the work, so its share of the process's CPU time is 1 (cpu_holds
    # asks CPU_ONE_THREAD_SHARE, 0.9). The end to end's thread time had the stamps' reads taken
    # off (the tare) while the process clock's span kept them and the end to end's own reads:
    # with reads of 500 ns and steps of 100 ns, 50 steps read a share of 0.17: the thread's
    # span c0..c1 is 50 x 600 + c0's read = 30,500 ns, less 50 tares of 500 = 5,500; the
    # process's, other0..other1, 30,500 + other0's read = 31,000 + c1's read = 31,500, untared.
    # Tared alike (each span less its own reads: 500 and 1,500 ns) both are the 5,000 ns of
    # work, 50 x 100: a share of 1.
    from modelprof.generation import timing

    world = _OneThread(read=500, step=100)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter_ns=world.wall))
    monkeypatch.setattr(timing, "cpu_time_source", lambda: ("thread_time", world.cpu))
    monkeypatch.setattr(timing, "other_cpu_clock", lambda kind: world.cpu)
    lm = SimpleNamespace(device=torch.device("cpu"), generate=world.generate)
    run = timing._Run(lm, None, 50)
    for _ in range(3):
        run()
    share = run.cpu_fields("end_to_end")["cpu_thread_share"]
    assert share == pytest.approx(1.0)
    assert share >= CPU_ONE_THREAD_SHARE
