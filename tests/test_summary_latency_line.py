"""The report's summary latency line says what its own runs say about themselves: a trial on a
loaded 2-core machine read "latency median 0.107 ms (95% CI ...)" where the run had drifted
-46 % (only a DriftWarning said it), and n=10 with a +28 % interval where sampling stopped on
"spread" (only the Measurement's own text said it); and its samples/s is the one at the median,
not a throughput point's mean over all its runs (about 2x apart under load)."""

from __future__ import annotations

import numpy as np
from torch import nn

from modelprof import profile
from tests.helpers import blocked


def _report():
    return profile(nn.Linear(8, 8), (8,), repeat=12, warmup=1, roofline=False)


def _latency_line(report) -> str:
    return next(ln for ln in report.summary().splitlines() if ln.startswith("latency median"))


def test_a_drift_and_a_short_stop_are_said_on_the_latency_line():
    r = _report()
    # levels 10 * 1.02^b in blocks 0..9 (tests/test_timing_measurement.py): a trend of
    # 1.02^9 - 1 = +19.5 % beyond the interval's ±8.9 %, so stable is False; the stop rule
    # ended on "spread", ±1 % estimated at 37 s
    r.latency = blocked(
        10.0 * 1.02 ** np.arange(10), stop_reason="spread", precision=0.01, needed_s=37.0
    )
    assert r.latency.stable is False
    line = _latency_line(r)
    assert "drifted +19.5 % over its runs: the median describes that window" in line
    # the Measurement's own words for its stop (stop_text), not a second copy of the rule
    assert f"short of its ±1.0% precision: stop={r.latency.stop_text}" in line
    assert "stop=spread (±1.0% would take ~37 s of sampling)" in line
    # the saved Markdown carries the summary too (its ~ escaped as \~)
    md = r.to_markdown()
    assert "drifted +19.5 % over its runs: the median describes that window" in md
    assert "short of its ±1.0% precision: stop=spread" in md


def test_a_steady_run_that_met_its_precision_says_neither():
    r = _report()
    r.latency = blocked([10.0] * 6, stop_reason="precision", precision=0.01)
    line = _latency_line(r)
    assert r.latency.stable is True and "drifted" not in line and "stop=" not in line
    r.latency = blocked([10.0] * 6, stop_reason="repeat")  # asked for: no precision to miss
    assert "stop=" not in _latency_line(r)


def test_the_summary_says_its_samples_per_s_is_at_the_median():
    # batch 1 at a 10 ms median: 1 / 0.010 s = 100.0 samples/s, named as the median's rate
    r = _report()
    r.latency = blocked([10.0] * 6, stop_reason="precision", precision=0.01)
    assert "100.0 samples/s at that median (clean end-to-end runs)" in _latency_line(r)
