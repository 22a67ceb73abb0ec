"""A forward that catches its own error takes another branch on meta than on a real device
(issue 38 item 6): the counts there are said to differ, in profile() and in a sweep's row."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from torch import nn

import modelprof
from modelprof.distributed.sweep_config import load_sweep
from modelprof.sweep import measure_config


class Branchy(nn.Module):
    """Two Linear(8, 8) when the input's sum can be read and is positive, one otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            big = x.abs().sum().item() > 0  # no value on meta: raises there
        except RuntimeError:
            big = False
        return self.b(self.a(x)) if big else self.a(x)


def test_profile_on_meta_says_the_forward_caught_an_op_and_took_another_branch():
    cpu = modelprof.profile(Branchy(), inputs=torch.ones(1, 8), timing=False)
    assert cpu.caught_on_meta == ()
    with pytest.warns(modelprof.ModelProfWarning, match="caught") as rec:
        meta = modelprof.profile(Branchy(), (8,), device="meta")
    # batch 1: two Linear(8, 8) are 2 x 64 = 128 MACs on the CPU; the meta branch runs one: 64
    assert cpu.totals["macs"] == 128 and meta.totals["macs"] == 64
    assert len(meta.caught_on_meta) == 1 and "_local_scalar_dense" in meta.caught_on_meta[0]
    assert any("another branch" in n for n in meta.timing_notes)
    assert "caught" in str(rec[0].message)


def test_a_plain_model_on_meta_catches_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", modelprof.ModelProfWarning)
        report = modelprof.profile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (8,), device="meta")
    assert report.caught_on_meta == ()


def test_a_counting_sweep_row_on_meta_says_it_differs_and_why(monkeypatch):
    sweep_module = importlib.import_module("modelprof.sweep")  # the module, not the function
    monkeypatch.setattr(
        sweep_module, "load_model", lambda spec: (Branchy(), None, (8,)), raising=True
    )
    (config,) = load_sweep({"model": "resnet18", "timing": False})  # built as Branchy
    row = measure_config(config, "meta")
    assert row["status"] == "differs" and "_local_scalar_dense" in row["error"]
    assert row["macs"] == 64  # what it counted, kept, beside the reason
    assert "status" not in measure_config(config, "cpu")  # the CPU row is plain: ok
