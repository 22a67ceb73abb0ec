"""Every generation figure that is no figure to quote carries its ``~`` wherever it is shown,
and so does every figure computed from one. A trial's printed report read ``TTFT 2.031 ms
(1.709-3.521)`` under a note saying its wall time "is marked ~"; its tokens/s (1000 / TPOT,
batch x new tokens / the end to end) were never marked beside a rough TPOT. The load is made
up (Measurements built with it), never made."""

from __future__ import annotations

import numpy as np
from helpers import blocked
from torch import nn

from modelprof import profile_generation
from modelprof.generation.timing import GenerationTiming

LOAD = dict(cpu_clock="thread_time", competing_cores=1.5)  # 1.5 cores of other work: loaded


def _report(ttft_loaded: bool = True, tpot_loaded: bool = True, whole_loaded: bool = False):
    """A batch-1 generation of 3 new tokens: TTFT 9 ms, TPOT 3 ms, end to end 15 ms, each read
    on a loaded machine where asked (its CPU work 2/3 of its wall time), else quietly (no CPU
    clock read)."""
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    report = profile_generation(
        model,
        prompt_len=4,
        new_tokens=3,
        step=lambda tokens, cache: (model(tokens), cache),
        timing=False,
    )

    def read(ms: float, loaded: bool):
        if not loaded:  # no CPU clock read: nothing says a load
            return blocked([ms] * 3)
        return blocked([ms] * 3, cpu_ms=np.full(60, ms * 2 / 3), **LOAD)

    ttft, tpot = read(9.0, ttft_loaded), read(3.0, tpot_loaded)
    whole = read(15.0, whole_loaded)
    steps = np.full((60, 2), 3.0)
    report.timings = {1: GenerationTiming(1, 4, 3, whole, ttft, tpot, steps, np.array([4, 5]))}
    return report


def _batch_line(report) -> str:
    return next(line for line in repr(report).splitlines() if line.startswith("  batch 1:"))


def test_the_printed_report_marks_a_rough_ttft_and_tpot_as_its_notes_say():
    report = _report(ttft_loaded=True, tpot_loaded=False)
    row = report.summary().iloc[0]
    assert bool(row["ttft_rough"]) and not bool(row["tpot_rough"])
    assert any("TTFT at batch 1" in n and "marked ~" in n for n in report.timing_notes)
    line = _batch_line(report)
    # TTFT 9 ms, its interval 9-9 (every sample 9.0); TPOT 3 ms, quiet: unmarked
    assert "TTFT ~9.000 ms (9.000-9.000)" in line
    assert "TPOT 3.000 ms (3.000-3.000)" in line
    quiet = _batch_line(_report(ttft_loaded=False, tpot_loaded=False))
    assert "TTFT 9.000 ms" in quiet and "~" not in quiet
