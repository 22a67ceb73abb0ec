"""Input sizes from the user: numpy integers accepted, impossible sizes refused (named) before
anything is allocated, devices the machine lacks refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelprof import ModelProfError, profile
from modelprof.runtime.inputs import check_input_bytes, make_inputs, parse_device, parse_input_size


def test_numpy_integers_are_input_sizes() -> None:
    assert parse_input_size((np.int64(3), np.int32(8))) == [(3, 8)]
    assert parse_input_size(np.array([3, 8])) == [(3, 8)]
    assert parse_input_size([np.array([3, 8]), (np.int16(5),)]) == [(3, 8), (5,)]
    report = profile(nn.Linear(8, 2), np.array([8]), batch_size=np.int64(4), timing=False)
    assert report.batch_size == 4 and report.totals["macs"] == 64  # 4*8*2
    with pytest.raises(ModelProfError, match="input_size"):
        parse_input_size((np.bool_(True), 3))


def test_inputs_larger_than_memory_are_refused_before_allocating() -> None:
    model = nn.Conv2d(3, 8, 3)
    with pytest.raises(ModelProfError) as e:
        profile(model, (3, 100000, 100000), timing=False)
    # 3 * 100000 * 100000 float32 values = 1.2e11 bytes, far above this machine's memory
    assert "input_size=(3, 100000, 100000) at batch_size 1 needs 120.0 GB" in str(e.value)
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)  # a batch search steps back
    with pytest.raises(ModelProfError, match="more elements than a tensor can hold"):
        make_inputs(model, (3, 2**40, 2**40), device="meta")  # 3 * 2**80 elements
    # on the meta device nothing is allocated, so a shape-only analysis of a huge input is fine
    assert make_inputs(model, (3, 100000, 100000), device="meta").shapes() == "1x3x100000x100000"


def test_input_bytes_estimate() -> None:
    # batch 2 of (3, 4) and (5,) in float16: 2 * (12 + 5) * 2 bytes = 68
    assert check_input_bytes("x", [(3, 4), (5,)], 2, torch.float16, torch.device("cpu")) == 68


@pytest.mark.parametrize("device", ["mps", "xpu", "hpu"])
def test_backends_this_machine_lacks_are_refused(device: str) -> None:
    module = getattr(torch, device, None)
    if module is not None and getattr(module, "is_available", lambda: False)():
        pytest.skip(f"{device} is available here")
    with pytest.raises(ModelProfError, match=f"device='{device}': the '{device}' backend is not "
                                             "available"):
        parse_device(device)
    with pytest.raises(ModelProfError, match=f"device='{device}'"):
        profile(nn.Linear(2, 2), (2,), device=device, timing=False)
