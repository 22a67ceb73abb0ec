"""A training step's clean backward (and step) median is marked rough (``~``) by the rule of the
forward's end-to-end median: its own runs read on a loaded machine, or too few. A trial's
footer read ``end-to-end (clean run)  ~48.1 ms ... 82.1 ms``: the forward marked, the backward
not, though both carried a LoadedMachineWarning, and the backward phase's MFU was taken over
that unmarked time; ``compare(backward=True)`` marked ``latency_median_ms`` alone.

The load is forced, never waited for: the report's Measurements are swapped for built ones
(quiet: CPU time equal to the wall time and no other work; loaded: other work took 1.03 cores,
as ``tests/test_machine_load.py`` builds them); compare's backward is its own run's with that
other work written in."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import re

import numpy as np
import pytest
from torch import nn

from modelprof import compare, profile
from modelprof.timing.measurement import Measurement
from modelprof.timing.peaks import Peaks

compare_module = importlib.import_module("modelprof.compare")  # (modelprof.compare: the function)

pytestmark = [
    pytest.mark.filterwarnings("ignore::modelprof.errors.ModelProfWarning"),
    pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning"),
]

END = "end-to-end (clean run)"


def _measured(ms: float, competing: float, blocks: int = 8) -> Measurement:
    """40 samples around ``ms`` (their CPU time the same: wall/CPU 1.00) in ``blocks`` blocks,
    with ``competing`` cores' worth of other work read beside them (1.03: loaded; 0: quiet)."""
    wall = ms + np.random.default_rng(0).normal(0.0, ms * 1e-3, 40)
    block = np.repeat(np.arange(blocks), 40 // blocks)
    return Measurement(
        wall.copy(),
        blocks=block,
        timestamps_s=block * 0.1,
        cpu_ms=wall,
        cpu_clock="thread_time",
        competing_cores=competing,
    )


@pytest.fixture(scope="module")
def timed_step():
    """A ReLU MLP's timed training step (its times replaced in each test)."""
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    return profile(model, (16,), backward=True, repeat=6, warmup=1, roofline=False, warn=False)


def _with(report, *, backward: Measurement, step: Measurement):
    """``report`` whose forward (clean runs and the step's) and loss are quiet (10 and 1 ms),
    its backward and step ``backward`` and ``step``; no window check to mark the forward."""
    quiet = _measured(10.0, 0.0)
    assert not quiet.loaded and not quiet.undersampled
    t = report.training_step.timing
    timing = dataclasses.replace(
        t, forward=quiet, loss=_measured(1.0, 0.0), backward=backward, step=step
    )
    r = copy.copy(report)  # (the module's report, shared: its copy changed)
    r.latency, r.timing_agreement = quiet, None
    r.training_step = dataclasses.replace(report.training_step, timing=timing)
    return r


def _footer(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if END in ln]
    return line


def test_a_loaded_backward_is_marked_in_every_view_and_the_quiet_forward_is_not(timed_step):
    loaded = _measured(20.0, 1.03)
    assert loaded.loaded  # other work took 1.03 cores: the wall clock includes waiting
    r = _with(timed_step, backward=loaded, step=_measured(31.0, 0.0))
    # forward 10.0 ms (its median: 10 + noise of 1e-2 ms), backward 20.0 ms: only the latter ~
    for fmt in ("text", "markdown"):
        row = _footer(str(r.export(fmt)))
        assert "~20.0 ms" in row and "10.0 ms" in row and "~10.0" not in row, row
    tex = _footer(str(r.to_latex(width=None)))
    assert tex.count("\\textasciitilde{}") == 1 and "20.0" in tex.split("textasciitilde")[1]
    html = str(r.to_html())
    assert "~20.0 ms" in html and "~10.0 ms" not in html
    # the caption says whose and why; the summary's step medians mark it too
    title = r._title()
    assert "The end-to-end backward marked ~ is no figure to quote: the machine was loaded" in (
        title
    )
    assert "end-to-end latency marked ~" not in title  # the forward is quotable
    # the reasons, public (a sweep's latency_unquotable columns)
    assert r.backward_latency_unquotable == "the machine was loaded (quote the CPU work)"
    assert r.latency_unquotable is None
    steps = next(ln for ln in r.summary().splitlines() if ln.startswith("step medians"))
    assert re.search(r"backward ~\d+\.\d{3}, step \d", steps) and "forward ~" not in steps
    assert steps.endswith(
        "(~ no figure to quote: backward: the machine was loaded (quote the CPU work))"
    )


def test_the_utilization_phases_over_a_loaded_backward_are_marked(timed_step):
    r = _with(timed_step, backward=_measured(20.0, 1.03), step=_measured(31.0, 1.03))
    u = r.utilization(peak=Peaks(1e12, 1e9))  # a given peak: no probe to mark anything
    ph = u.phases.set_index("phase")
    # forward over its quiet 10 ms; backward and step over their loaded medians: rough
    assert ph["time_rough"].to_dict() == {"forward": False, "backward": True, "step": True}
    assert ph["mfu_rough"].to_dict() == {"forward": False, "backward": True, "step": True}
    assert ph.loc["backward", "time_ms"] == pytest.approx(20.0, rel=1e-2)
    # the summary's MFU is the step's: marked, and why
    assert u.describe().startswith("MFU ~") and "the step's time is no figure to quote" in (
        u.describe()
    )
    # the summary's step medians: both marked, the reason said once for the two
    assert "(~ no figure to quote: backward, step: the machine was loaded (quote the CPU " in (
        r.summary()
    )
    last = repr(u.phases).splitlines()[-1]  # the step's row: its time, MFU and HFU marked
    assert last.count("~") == 3 and "rough" not in repr(u.phases)


def test_a_backward_from_too_few_runs_is_marked_too(timed_step):
    few = _measured(20.0, 0.0, blocks=1)  # one block: no interval, so undersampled
    assert few.undersampled and not few.loaded
    r = _with(timed_step, backward=few, step=_measured(31.0, 0.0))
    assert "~20.0 ms" in _footer(str(r.to_text()))
    assert "backward marked ~ is no figure to quote: too few runs (n=40)" in r._title()


def test_a_quiet_step_marks_nothing(timed_step):
    r = _with(timed_step, backward=_measured(20.0, 0.0), step=_measured(31.0, 0.0))
    assert "~" not in _footer(str(r.to_text()))
    ph = r.utilization(peak=Peaks(1e12, 1e9)).phases
    assert not ph["time_rough"].any() and "mfu_rough" not in ph.columns


def test_compare_flags_a_loaded_backward_and_step_as_it_flags_the_forward(monkeypatch):
    real = compare_module.compare_steps

    def loaded_second(steps, opts):  # the second model's backward and step: other work read
        got, ratios = real(steps, opts)
        for phase in ("backward", "step"):
            m = got[1][phase]  # (no margin: the 5 cores stand whatever the window's ticks)
            got[1][phase] = dataclasses.replace(m, competing_cores=5.0, competing_cores_margin=0.0)
            assert got[1][phase].loaded
        return got, ratios

    monkeypatch.setattr(compare_module, "compare_steps", loaded_second)
    models = {"a": nn.Linear(8, 8), "b": nn.Sequential(nn.Linear(8, 8), nn.ReLU())}
    df = compare(models, (8,), backward=True, repeat=6, warmup=1, roofline=False, warn=False)
    # compare_steps times the baseline first: "b" is the second, its flags set
    assert df.loc["b", "backward_latency_rough"] and df.loc["b", "step_latency_rough"]
    # "a"'s by its own runs' judgement, as the forward's latency_rough is
    a = df.attrs.get("unquotable_step", {})
    assert bool(df.loc["a", "backward_latency_rough"]) == ("a's backward" in a)
    assert "b's backward" in a and "b's step" in a
    cols = ["backward_latency_median_ms", "step_latency_median_ms"]
    text = str(df.render.to_text(columns=cols))
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.split()[:1] in (["a"], ["b"])}
    assert rows["b"].count("~") == 2, text  # b's backward and step medians, marked
    flags = df.loc["a", ["backward_latency_rough", "step_latency_rough"]].astype(bool)
    assert rows["a"].count("~") == int(flags.sum()), text
    assert "training-step medians marked ~ are no figure to quote: " in text
    assert "b's backward (the machine was loaded)" in text and "b's step (the machine" in text
