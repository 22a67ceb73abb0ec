"""A training step's ``Utilization.rows``: MBU divides the forward's bytes by the forward's
time, and the table prints that time beside them (``forward_time_ms``). It printed only
``time_ms`` (forward + backward) beside an MBU over the forward alone: a ReLU's 262144 B over
14.98 us at 44.36 GB/s read 0.39 from the printed figures, while ``mbu`` said 1.0498."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from modelprof import profile
from modelprof.timing.peaks import Peaks

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.ModelProfWarning")

N = 4 * 1024  # batch 4 x 1024 float32 elements into the ReLU


def test_a_step_rows_mbu_is_its_bytes_over_the_forward_time_printed_beside_them():
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU())
    r = profile(
        model, (1024,), batch_size=4, backward=True, repeat=6, warmup=1, roofline=False, warn=False
    )
    u = r.utilization(peak=Peaks(1e12, 1e9))  # 1 TFLOP/s, 1 GB/s
    rows = u.rows.set_index("module")
    df = r.to_dataframe().set_index("module")
    relu = rows.loc["1"]
    # the ReLU reads N float32 and writes N: 2 x 4 x N bytes, as counted, of the forward
    assert relu["bytes"] == 2 * 4 * N
    # the columns the table prints: the forward's time beside the bytes, then the step's
    cols = list(u.rows.columns)
    assert cols.index("bytes") + 1 == cols.index("forward_time_ms") < cols.index("time_ms")
    np.testing.assert_allclose(rows["forward_time_ms"], df["latency_ms"], rtol=1e-12)
    timed = df["backward_latency_ms"].fillna(0.0)
    np.testing.assert_allclose(rows["time_ms"], df["latency_ms"] + timed, rtol=1e-12)
    # MBU = bytes / (forward_time_ms x 1e-3 s/ms x 1e9 B/s), read from the printed columns
    ok = rows["forward_time_ms"] > 0
    np.testing.assert_allclose(
        rows.loc[ok, "mbu"],
        rows.loc[ok, "bytes"] / (rows.loc[ok, "forward_time_ms"] * 1e-3 * 1e9),
        rtol=1e-12,
    )
    # MFU over the step's time: 2 x MACs / (time_ms x 1e-3 x 1e12) for the Linear (1024 x 1024
    # MACs a sample forward; its backward the weight's gradient alone, as many: the input,
    # first in the model, needs no gradient)
    lin = rows.loc["0"]
    assert lin["model_flops"] == 2 * 4 * 1024 * 1024 * (1 + 1)
    assert lin["mfu"] == pytest.approx(lin["model_flops"] / (lin["time_ms"] * 1e-3 * 1e12))


def test_a_forward_rows_time_is_the_forward_and_no_second_column_repeats_it():
    r = profile(nn.Sequential(nn.ReLU()), (1024,), repeat=6, warmup=1, roofline=False, warn=False)
    rows = r.utilization(peak=Peaks(1e12, 1e9)).rows
    assert "forward_time_ms" not in rows.columns  # time_ms is the forward's already
    ok = rows["time_ms"] > 0
    np.testing.assert_allclose(
        rows.loc[ok, "mbu"], rows.loc[ok, "bytes"] / (rows.loc[ok, "time_ms"] * 1e-3 * 1e9)
    )
