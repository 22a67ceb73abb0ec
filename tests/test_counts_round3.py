"""Counts that were wrong or missing: a dynamically quantized LSTM, bytes read (buffers, gathers),
histc, FFTs, and a DynamicCache on the meta device. Every expected value is a closed form."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.errors import ModelProfError


# --- a dynamically quantized LSTM counts as its float twin -----------------------------------------

class _Recurrent(nn.Module):
    """LSTM(32 -> 64, 2 layers): 58,368 parameters; on 10 steps x batch 4, 2,293,760 MACs."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(32, 64, num_layers=2)

    def forward(self, x):
        return self.lstm(x)[0]


def _quantized(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(model, {nn.LSTM}, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.qint8, torch.float16], ids=["qint8", "float16"])
def test_dynamically_quantized_lstm_counts_as_its_float_twin(dtype):
    steps, batch, inp, hidden = 10, 4, 32, 64
    float_model = _Recurrent().eval()
    x = torch.randn(steps, batch, inp)
    # per layer: 4 gates of (in + hidden) x hidden weights, two bias vectors of 4*hidden
    layer1 = 4 * hidden * (inp + hidden) + 2 * 4 * hidden        # 24,576 + 512 = 25,088
    layer2 = 4 * hidden * (hidden + hidden) + 2 * 4 * hidden     # 32,768 + 512 = 33,280
    params = layer1 + layer2                                     # 58,368
    # every step and batch element multiplies by both layers' gate matrices
    macs = steps * batch * (4 * hidden * (inp + hidden) + 4 * hidden * 2 * hidden)  # 2,293,760
    assert (params, macs) == (58_368, 2_293_760)
    twin = profile(float_model, inputs=x, timing=False)
    assert twin.totals["macs"] == macs and twin.totals["params"] == params

    report = profile(_quantized(float_model, dtype), inputs=x, timing=False)
    assert report.totals["macs"] == macs
    assert report.totals["params"] == params       # the packed weights are its parameters
    assert report.model_params == params
    assert report.totals["flops"] == twin.totals["flops"]
    assert not report.unsupported
    if dtype is torch.qint8:
        # bytes read: the input, the int8 weights and the float32 biases
        weights = 4 * hidden * (inp + hidden) + 4 * hidden * 2 * hidden  # 57,344 int8
        biases = 4 * (4 * hidden) * 4                                    # 4 vectors of fp32
        assert report.totals["read_bytes"] == x.numel() * 4 + weights + biases  # 66,560
