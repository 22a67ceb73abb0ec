"""A generation's CPU figures on the CPU hold no cost of modelprof's own clock reads: each
token's stamp reads the CPU clock (a system call) outside the wall spans, and that read's cost
(a tare measured over empty steps) is taken off each CPU span, as ``CpuClock`` does for
``measure_latency``; else a step's CPU work read above its wall time, which one thread's
CPU time over one span cannot be."""

import time

import numpy as np
import torch

from modelprof.generation.timing import _Run


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
