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


# --- bytes read are the bytes the op touches --------------------------------------------------------

def _leaf(report, name: str):
    df = report.to_dataframe()
    return df[df["module"] == name].iloc[0]


def test_eval_batchnorm_reads_its_running_statistics():
    n, c, h, w = 2, 3, 4, 5
    model = nn.Sequential(nn.BatchNorm2d(c)).eval()
    report = profile(model, (c, h, w), batch_size=n, timing=False)
    row = _leaf(report, "0")
    # input, weight and bias, running_mean and running_var (num_batches_tracked is not read)
    assert row["read_bytes"] == n * c * h * w * 4 + 2 * c * 4 + 2 * c * 4  # 480 + 24 + 24 = 528
    # torchstat's MemRead stays torchstat's: inputs and parameters
    ts = report.to_dataframe(style="torchstat")
    assert ts["MemRead(B)"].iloc[0] == n * c * h * w * 4 + 2 * c * 4       # 504


class _Fp8Linear(nn.Module):
    """An fp8 linear layer whose weight and scales are buffers, as fp8 inference code holds
    them (no gradient)."""

    def __init__(self, k: int = 32, n: int = 16) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(n, k).to(torch.float8_e4m3fn))
        self.register_buffer("scale_w", torch.tensor(1.0))
        self.register_buffer("scale_x", torch.tensor(1.0))

    def forward(self, x):
        return torch._scaled_mm(x.to(torch.float8_e4m3fn), self.weight.t(), self.scale_x,
                                self.scale_w, out_dtype=torch.float32)


def test_fp8_scaled_mm_reads_a_weight_held_in_a_buffer():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8 dtype")
    m, k, n = 16, 32, 16
    model = _Fp8Linear(k, n)
    try:
        model(torch.randn(m, k))
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"_scaled_mm does not run on this CPU build: {e}")
    report = profile(model, inputs=torch.randn(m, k), timing=False)
    # the input (float32), the fp8 weight (1 byte each) and the two float32 scales; the
    # transposed weight is a view of the buffer: the bytes read are the buffer's
    expected = m * k * 4 + n * k * 1 + 2 * 4                # 2048 + 512 + 8 = 2568
    assert report.totals["read_bytes"] == expected
    assert report.totals["macs"] == m * k * n                # 8192


def test_embedding_is_charged_per_row_gathered():
    vocab, dim, lookups = 50_000, 64, 48
    model = nn.Sequential(nn.Embedding(vocab, dim))
    ids = torch.randint(0, vocab, (4, lookups // 4))
    report = profile(model, inputs=ids, timing=False)
    # 48 int64 indices and 48 rows of 64 float32: 384 + 12,288 = 12,672 bytes, not the
    # 12.8 MB table
    assert report.totals["read_bytes"] == lookups * 8 + lookups * dim * 4
    assert report.totals["params"] == vocab * dim               # all of it is still a parameter


def test_a_functional_gather_in_a_parent_is_charged_per_row():
    class Lookup(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.randn(1000, 16))
            self.out = nn.Linear(16, 2)

        def forward(self, ids):
            return self.out(torch.nn.functional.embedding(ids, self.table))

    ids = torch.randint(0, 1000, (1, 10))
    report = profile(Lookup(), inputs=ids, timing=False)
    df = report.to_dataframe()
    own = df[df["module"] == "(self)"].iloc[0]
    # the parent's own op: 10 int64 indices and 10 rows of 16 float32 = 80 + 640
    assert own["read_bytes"] == 10 * 8 + 10 * 16 * 4
