"""Counts of a dynamically quantized LSTM, bytes read (buffers, gathers, slices), histc, FFTs, a
DynamicCache on the meta device, and the docs' cost examples. Every expected value is a closed
form."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
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
    layer1 = 4 * hidden * (inp + hidden) + 2 * 4 * hidden  # 24,576 + 512 = 25,088
    layer2 = 4 * hidden * (hidden + hidden) + 2 * 4 * hidden  # 32,768 + 512 = 33,280
    params = layer1 + layer2  # 58,368
    # every step and batch element multiplies by both layers' gate matrices
    macs = steps * batch * (4 * hidden * (inp + hidden) + 4 * hidden * 2 * hidden)  # 2,293,760
    assert (params, macs) == (58_368, 2_293_760)
    twin = profile(float_model, inputs=x, timing=False)
    assert twin.totals["macs"] == macs and twin.totals["params"] == params

    report = profile(_quantized(float_model, dtype), inputs=x, timing=False)
    assert report.totals["macs"] == macs
    assert report.totals["params"] == params  # the packed weights are its parameters
    assert report.model_params == params
    assert report.totals["flops"] == twin.totals["flops"]
    assert not report.unsupported
    if dtype is torch.qint8:
        # bytes read: the input, the int8 weights and the float32 biases
        weights = 4 * hidden * (inp + hidden) + 4 * hidden * 2 * hidden  # 57,344 int8
        biases = 4 * (4 * hidden) * 4  # 4 vectors of fp32
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
    assert ts["MemRead(B)"].iloc[0] == n * c * h * w * 4 + 2 * c * 4  # 504


class _Fp8Linear(nn.Module):
    """An fp8 linear layer whose weight and scales are buffers, as fp8 inference code holds
    them (no gradient)."""

    def __init__(self, k: int = 32, n: int = 16) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(n, k).to(torch.float8_e4m3fn))
        self.register_buffer("scale_w", torch.tensor(1.0))
        self.register_buffer("scale_x", torch.tensor(1.0))

    def forward(self, x):
        return torch._scaled_mm(
            x.to(torch.float8_e4m3fn),
            self.weight.t(),
            self.scale_x,
            self.scale_w,
            out_dtype=torch.float32,
        )


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
    expected = m * k * 4 + n * k * 1 + 2 * 4  # 2048 + 512 + 8 = 2568
    assert report.totals["read_bytes"] == expected
    assert report.totals["macs"] == m * k * n  # 8192


def test_embedding_is_charged_per_row_gathered():
    vocab, dim, lookups = 50_000, 64, 48
    model = nn.Sequential(nn.Embedding(vocab, dim))
    ids = torch.randint(0, vocab, (4, lookups // 4))
    report = profile(model, inputs=ids, timing=False)
    # 48 int64 indices and 48 rows of 64 float32: 384 + 12,288 = 12,672 bytes, not the
    # 12.8 MB table
    assert report.totals["read_bytes"] == lookups * 8 + lookups * dim * 4
    assert report.totals["params"] == vocab * dim  # all of it is still a parameter


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


# --- histc, FFTs --------------------------------------------------------------------------------------


class _Router(nn.Module):
    """A mixture-of-experts router: top-2 of 4 experts, tokens per expert by histc."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        chosen = self.gate(x).topk(2, dim=-1).indices
        return torch.histc(chosen.float(), bins=4, min=0, max=3)


def test_histc_is_counted_and_not_unsupported_on_a_moe_router():
    from modelprof.errors import ModelProfWarning

    tokens = 6
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)  # no "op(s) have no formula" warning
        report = profile(_Router(), inputs=torch.randn(tokens, 8), timing=False)
    assert not report.unsupported
    # 12 routed indices (6 tokens x top-2), 2 flops each with the range given: 24
    expected = 2 * tokens * 2
    ops = report.by_operator().set_index("op")
    assert ops.loc["aten.histc.default", "flops"] == expected
    assert ops.loc["aten.histc.default", "calls"] == 1


def test_histc_without_a_range_also_finds_min_and_max():
    from modelprof.counting.counter import count_ops

    x = torch.randn(5, 7)
    counter = count_ops(lambda: torch.histc(x, bins=10))
    assert counter.by_op["aten.histc.default"].flops == (2 + 2) * 35  # 140


@pytest.mark.parametrize(
    "name, fn, flops",
    [
        # rfft of 4 signals of 16: 4 * 16 * log2(16) = 256
        ("rfft", lambda: torch.fft.rfft(torch.randn(4, 16)), 4 * 16 * 4),
        # fft (complex) of 4 signals of 16: the same transforms, 256
        ("fft", lambda: torch.fft.fft(torch.randn(4, 16, dtype=torch.complex64)), 4 * 16 * 4),
        # irfft back to 16 real samples: the real output is the signal, 256
        ("irfft", lambda: torch.fft.irfft(torch.randn(4, 9, dtype=torch.complex64)), 4 * 16 * 4),
        # fft2 over 8x16 on a batch of 2: N * (log2 8 + log2 16) = 256 * 7 = 1792
        ("fft2", lambda: torch.fft.fft2(torch.randn(2, 8, 16, dtype=torch.complex64)), 256 * 7),
    ],
)
def test_fft_counts_n_log2_n_per_transform(name, fn, flops):
    from modelprof.counting.counter import count_ops

    counter = count_ops(fn)
    fft_ops = {k: v for k, v in counter.by_op.items() if "_fft_" in k}
    assert fft_ops and not counter.unsupported, counter.by_op.keys()
    assert sum(v.flops for v in fft_ops.values()) == flops
    assert sum(v.macs for v in fft_ops.values()) == 0


# --- device="meta" with a DynamicCache input ------------------------------------------------------


def test_meta_with_a_dynamic_cache_says_the_cache_was_not_moved():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=64,
        eos_token_id=0,
        bos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 100, (1, 4)), use_cache=True).past_key_values
    inputs = {"input_ids": torch.randint(0, 100, (1, 1)), "past_key_values": cache}
    with pytest.raises(
        ModelProfError,
        match=r"inputs\['past_key_values'\] \(DynamicCache\) "
        r"holds tensors on cpu.*was not moved",
    ):
        profile(model, inputs=inputs, device="meta", timing=False)
    # on the cache's own device it is profiled
    report = profile(model, inputs=inputs, timing=False)
    assert report.totals["macs"] > 0


# --- the docs say what the code charges ------------------------------------------------------------


def test_readme_norm_cost_is_what_the_code_charges():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    x = torch.randn(2, 5, 16)
    per_element = profile(nn.LayerNorm(16), inputs=x, timing=False).totals["flops"] // x.numel()
    assert per_element == 7  # statistics 3 + normalise 2 + affine 2
    assert (
        f"layer/group norm (and train batch norm) {per_element} in all: 3 for the "
        "statistics, 2 to normalise, 2 for the affine" in readme
    )
    assert "(+3 for the statistics)" not in readme  # read as 10 per element


def test_counting_doc_has_one_adding_a_formula_section_and_its_example_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "counting.md").read_text(
        encoding="utf-8"
    )
    assert text.count("## Adding a formula") == 1
    assert "## Bytes read are the bytes the op touches" in text
    import modelprof
    from modelprof.counting.formulas import REGISTRY

    # the example runs as written (its imports, its copy of the registry: a trial found the
    # text's REGISTRY importable from nowhere it said) and leaves the global registry alone
    block = re.search(r"## Adding a formula\n\n```python\n(.*?)```", text, re.S).group(1)
    before = REGISTRY.lookup(torch.ops.aten._fft_r2c.default)
    scope: dict = {}
    exec(compile(block, "counting.md", "exec"), scope)  # noqa: S102 - the project's own docs
    assert REGISTRY.lookup(torch.ops.aten._fft_r2c.default) is before
    assert "registry=mine" in text.split("## Adding a formula")[1].split("\n## ")[0]
    x = torch.randn(3, 16)
    report = modelprof.profile(_Rfft(), inputs=x, timing=False, registry=scope["mine"])
    ops = report.by_operator().set_index("op")
    assert ops.loc["aten._fft_r2c.default", "flops"] == int(5 * 16 * math.log2(16)) * 3  # 960


class _Rfft(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


def test_a_slice_of_a_buffer_reads_the_slice_not_the_buffer():
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mask", torch.ones(1024, 1024))  # 4 MiB, of which 4x4 is used

        def forward(self, x):
            n = x.shape[-1]
            return x * self.mask[:n, :n]

    x = torch.randn(4, 4)
    report = profile(nn.Sequential(Masked()), inputs=x, timing=False)
    # the input (16 floats) and the 4x4 slice of the mask (16 floats), not the 4 MiB mask
    assert report.totals["read_bytes"] == 16 * 4 + 16 * 4


def test_a_buffer_read_as_a_keyword_or_in_a_list_is_read():
    # a leaf's read bytes saw only an op's positional tensors: SDPA's keyword-only attn_mask
    # and the index list of x[idx] went uncounted (a parent's own ops counted them)
    class Attend(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("bias", torch.randn(64, 64))

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)

    q, k, v = (torch.randn(1, 2, 64, 8) for _ in range(3))
    # q, k, v: 3 x 1*2*64*8 floats = 12,288 B; the mask 64*64 floats = 16,384 B: 28,672
    assert profile(Attend(), inputs=(q, k, v), timing=False).totals["read_bytes"] == 28_672

    class Gather(nn.Module):  # a relative-position table looked up by an index buffer
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.randn(225, 2))
            self.register_buffer("index", torch.randint(0, 225, (64, 64)))

        def forward(self, x):
            return x + self.table[self.index.view(-1)].view(64, 64, 2).sum(-1)

    r = profile(Gather(), inputs=torch.randn(64, 64), timing=False)
    # the input 64*64 floats (16,384 B), the table 225*2 floats (1,800 B) and the int64 index
    # 64*64*8 = 32,768 B: 50,952
    assert r.totals["read_bytes"] == 16_384 + 1_800 + 32_768
