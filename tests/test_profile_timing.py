"""Timing joined into profile(): per-row latency from known-duration modules on the CPU."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import ModelProfError, profile
from modelprof.timing.calibration import spin, spin_model


class SpinningParent(nn.Module):
    """Runs an op and spins 3 ms itself between two children that spin 2 and 4 ms."""

    def __init__(self):
        super().__init__()
        self.first = spin_model((2.0,))
        self.second = spin_model((4.0,))

    def forward(self, x):
        x = self.first(x) * 2  # an op of its own: the parent gets a (self) row
        spin(3.0)
        return self.second(x)


def _close(value: float, expected: float, rel: float = 0.03) -> bool:
    return abs(value - expected) <= rel * expected


def test_known_durations_read_back_per_layer_and_end_to_end():
    model = spin_model((2.0, 5.0, 10.0))
    r = profile(model, (4,), repeat=15, warmup=2)
    df = r.to_dataframe().set_index("module")
    for name, ms in (("0", 2.0), ("1", 5.0), ("2", 10.0)):
        assert _close(df.loc[name, "latency_ms"], ms), (name, df.loc[name, "latency_ms"])
    # end to end: 2 + 5 + 10 = 17 ms, both the clean run and the root row
    assert _close(r.latency.median_ms, 17.0)
    assert _close(df.loc["", "latency_ms"], 17.0)
    assert r.instrumentation_overhead < 1.05
    assert 0.97 <= r.coverage <= 1.03  # the leaves account for the whole forward
    shares = df[df["leaf"]]["latency_pct"]
    # 2/17, 5/17, 10/17 of the pass = 11.8 %, 29.4 %, 58.8 %
    assert abs(shares.sum() - 100.0) < 3.0


def test_self_row_gets_the_parents_own_time():
    r = profile(SpinningParent(), (4,), repeat=15, warmup=2)
    df = r.to_dataframe().set_index("module")
    # the root's own spin: 9 ms total - 2 ms - 4 ms children = 3 ms
    assert _close(df.loc["(self)", "latency_ms"], 3.0, rel=0.05)
    assert _close(df.loc["", "latency_ms"], 9.0)
    ts = r.to_dataframe(style="torchstat").set_index("module name")
    # torchstat's duration[%] comes from the same measurement: 3/9 = 33.3 %
    assert abs(ts.loc["(self)", "duration[%]"] - 100 * 3 / 9) < 2.0


def test_timing_options_are_validated():
    with pytest.raises(ModelProfError, match="unknown option"):
        profile(nn.Linear(4, 2), (4,), repeats=3)
    with pytest.raises(ModelProfError, match="timing=False"):
        profile(nn.Linear(4, 2), (4,), device="meta")


def test_timing_a_converted_copy_leaves_the_model_alone():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = profile(model, (8,), batch_size=4, dtype=torch.float64, repeat=5, warmup=1)
    assert r.latency.n == 5
    r = profile(model, (8,), batch_size=4, training=True, repeat=5, warmup=1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(v.dtype == before[k].dtype for k, v in model.state_dict().items())
    assert model.training
