"""A step modelprof takes before the forward (moving the model, setting its mode) that fails is
named as that step: it was reported as "the forward pass failed before any module ran"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modelprof
from modelprof import ModelProfError


def _meta_model() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: modelprof.profile(m, (4,), device="cpu", timing=False),
        lambda m: modelprof.profile(
            m, (4,), batch_size=2, device="cpu", timing=False, backward=True
        ),
        lambda m: modelprof.measure_latency(m, input_size=(4,), device="cpu", budget_s=0.02),
    ],
    ids=["count", "backward", "latency"],
)
def test_meta_weights_moved_to_a_real_device_are_named(call) -> None:
    with pytest.raises(ModelProfError) as err:
        call(_meta_model())
    text = str(err.value)
    # the first meta tensor of the Sequential is its first child's weight: '0.weight'
    assert "parameters are on meta ('0.weight' among them)" in text
    assert "device='meta'" in text and "to_empty" in text
    assert "forward pass failed" not in text and "torch.export" not in text


def test_meta_weights_still_count_on_meta() -> None:
    report = modelprof.profile(_meta_model(), (4,), batch_size=2, device="meta")
    # parameters: Linear 4x4 + 4, BatchNorm1d weight 4 + bias 4 = 28; MACs: the Linear's
    # 2 rows x 4 x 4 = 32 (batch norm's arithmetic is counted as FLOPs, not MACs)
    assert report.totals["params"] == 28 and report.totals["macs"] == 32


class _NoModeTrain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def train(self):  # the override under test: no mode argument
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@pytest.mark.parametrize("wrap", [lambda m: m, lambda m: nn.Sequential(m, nn.ReLU())])
def test_a_train_override_without_mode_is_named(wrap) -> None:
    # the root's own override, and a child's (nn.Module.train(mode) passes mode to it)
    with pytest.raises(ModelProfError) as err:
        modelprof.profile(wrap(_NoModeTrain()), (4,), timing=False)
    text = str(err.value)
    assert "_NoModeTrain.train() does not take mode" in text
    assert "forward pass failed" not in text
