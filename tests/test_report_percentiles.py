"""The error bars of ``Report.plot_latency`` (p10-p90 of the instrumented passes) come from the
samples whose median is the row's ``latency_ms``: a ``(self)`` row's p10 <= latency_ms <= p90,
its call's collectives taken out of both alike."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from modelprof import profile
from modelprof.counting.collectives import CommStats
from modelprof.counting.scope import CallRecord
from modelprof.report.report import Counts, Report, RunInfo, TimingResult
from modelprof.report.rows import build_rows, join_rows, row_keys
from modelprof.timing.calibration import Spin, spin
from modelprof.timing.columns import layer_columns
from modelprof.timing.layers import LayerTiming
from modelprof.timing.measurement import Measurement

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def _bands(report: Report):
    return report._with_percentiles(report.to_dataframe()).set_index("module")


def test_a_self_rows_bars_take_out_its_collectives_as_its_median_does():
    # a root that runs a child and a collective of its own, and an add (its (self) row)
    stats = CommStats()
    stats.calls, stats.payload_bytes = 1, 64
    common = dict(call=1, input_shapes=[(4,)], input_bytes=16, param_bytes=0, params=0)
    records = [
        CallRecord(
            0, "", "Net", depth=0, parent=None, has_submodules=True, children=[1], flops=4, **common
        ),
        CallRecord(1, "a", "Linear", depth=1, parent=0, has_submodules=False, flops=8, **common),
    ]
    records[0].comm = {("all_reduce", 2): stats}
    rows = build_rows(records)
    passes = np.array([10.0, 11.0, 12.0, 13.0, 14.0])
    layers = LayerTiming(
        samples={("", 1): passes, ("a", 1): np.full(5, 2.0)},
        order=[("", 1), ("a", 1)],
        passes_ms=passes,
        parents={("", 1): None, ("a", 1): ("", 1)},
        comm_samples={("", 1): np.full(5, 5.0)},
    )
    latency = Measurement(passes)
    columns, _, _ = layer_columns(row_keys(rows), records, latency, layers)
    run = RunInfo("Net", "4", 1, "cpu", "float32")
    report = Report(
        join_rows(rows, [columns]), run, Counts({}, {}, 0), TimingResult(latency, layers)
    )
    df = _bands(report)
    own = df.loc["(self)"]
    # the (self) row's passes: 10..14 less the collective's 5 less the child's 2 = 3..7
    assert own["latency_ms"] == 5.0
    # linear percentiles at q*(n-1) of 3..7: p10 -> 3.4, p90 -> 6.6 (without the collective
    # taken out they read 8.4 and 11.6, both above the median)
    assert own["latency_p10_ms"] == pytest.approx(3.4)
    assert own["latency_p90_ms"] == pytest.approx(6.6)
    # the (communication) row: the collective's own samples, 5 ms in every pass
    comm = df.loc["(communication)"]
    assert comm["latency_ms"] == comm["latency_p10_ms"] == comm["latency_p90_ms"] == 5.0


class _Parent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Spin(0.5)
        self.second = Spin(0.3)

    def forward(self, x):
        x = self.first(x)
        spin(0.4)  # the parent's own time, and an op of its own: its (self) row
        return self.second(x * 2)


def test_every_timed_rows_median_lies_within_its_bars():
    r = profile(nn.Sequential(_Parent(), Spin(0.2)), (4,), repeat=20, roofline=False, warmup=1)
    df = _bands(r)
    timed = df[df["latency_ms"].notna()]
    assert timed.index.str.endswith("(self)").sum() == 1
    assert (timed["latency_p10_ms"] <= timed["latency_ms"]).all()
    assert (timed["latency_ms"] <= timed["latency_p90_ms"]).all()
