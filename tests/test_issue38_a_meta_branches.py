"""A forward that catches an error raised on meta before any op runs (a meta tensor's
``numpy()``) is said to take another branch there, as one that catches an op's error is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modelprof


class _Numpyish(nn.Module):
    """Two Linear(8, 8) when the input can be read as numpy and is positive, one otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            big = x.detach().numpy().sum() > 0  # a TypeError on meta, before any op
        except TypeError:
            big = False
        return self.b(self.a(x)) if big else self.a(x)


def test_an_error_raised_before_any_op_and_caught_is_said_on_meta():
    cpu = modelprof.profile(_Numpyish(), inputs=torch.ones(1, 8), timing=False)
    with pytest.warns(modelprof.ModelProfWarning, match="caught"):
        meta = modelprof.profile(_Numpyish(), (8,), device="meta")
    # two Linear(8, 8) at batch 1: 128 MACs on the CPU; meta took the one-layer branch: 64
    assert cpu.totals["macs"] == 128 and meta.totals["macs"] == 64
    assert len(meta.caught_on_meta) == 1 and "numpy" in meta.caught_on_meta[0]
    assert cpu.caught_on_meta == ()
