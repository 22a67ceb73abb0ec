"""Closed-form counts for every formula family, derived by hand beside each assertion."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelprof import profile


def totals(model: nn.Module, *args, **kw):
    inputs = args[0] if len(args) == 1 else tuple(args)
    return profile(model, inputs=inputs, timing=False, **kw).totals


class Fn(nn.Module):
    """Wraps a function so that functional code runs inside a module call."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# -- convolutions -------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [False, True])
def test_conv2d(bias):
    conv = nn.Conv2d(3, 8, kernel_size=3, padding=1, bias=bias)
    t = totals(conv, torch.randn(2, 3, 5, 5))
    # out 2x8x5x5 = 400 outputs, each a dot product of 3*3*3 = 27: 400*27 = 10800 MACs
    assert t["macs"] == 10800
    # flops 2*10800 (+ 400 bias adds); madd = (2*27 - 1)*400 = 21200 (+ 400 for a bias, as
    # torchstat's conv MAdd counts it)
    assert t["flops"] == 21600 + (400 if bias else 0)
    assert t["madd"] == 21200 + (400 if bias else 0)
    assert t["params"] == 8 * 27 + (8 if bias else 0)


def test_conv1d_and_conv3d():
    t1 = totals(nn.Conv1d(4, 6, 3, bias=False), torch.randn(1, 4, 10))
    # out 1x6x8 = 48 outputs x (4*3) = 576
    assert t1["macs"] == 576
    t3 = totals(nn.Conv3d(2, 4, 3, bias=False), torch.randn(1, 2, 5, 5, 5))
    # out 1x4x3x3x3 = 108 outputs x (2*27 = 54) = 5832
    assert t3["macs"] == 5832


def test_grouped_and_depthwise_conv():
    t = totals(nn.Conv2d(8, 16, 3, groups=4, bias=False, padding=1), torch.randn(1, 8, 6, 6))
    # out 16x6x6 = 576 outputs, each over 8/4 = 2 channels x 9 = 18: 10368
    assert t["macs"] == 10368
    t = totals(nn.Conv2d(8, 8, 3, groups=8, bias=False, padding=1), torch.randn(1, 8, 6, 6))
    # depthwise: 8x6x6 = 288 outputs x 9 = 2592
    assert t["macs"] == 2592


def test_transposed_conv():
    t = totals(nn.ConvTranspose2d(4, 6, 3, stride=2, bias=False), torch.randn(1, 4, 5, 5))
    # every input position (4x5x5 = 100) scatters into 6 x 9 = 54 outputs: 5400
    assert t["macs"] == 5400
    t = totals(nn.ConvTranspose1d(4, 6, 3, groups=2, bias=False), torch.randn(2, 4, 7))
    # batch 2 x 4 ch x 7 = 56 positions, each into 6/2 x 3 = 9 outputs: 504
    assert t["macs"] == 504


# -- matrix products ----------------------------------------------------------------------------
def test_linear_on_3d_input():
    t = totals(nn.Linear(4, 5), torch.randn(2, 3, 4))
    # 2*3 = 6 tokens x 4 x 5 = 120 MACs; flops 240 + 30 bias adds; madd (2*4-1)*30 = 210
    assert (t["macs"], t["flops"], t["madd"]) == (120, 270, 210)


def test_matmul_bmm_einsum_in_functional_code():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    assert totals(Fn(lambda x, y: x @ y), a, b)["macs"] == 2 * 3 * 4 * 5  # 120
    assert totals(Fn(torch.bmm), a, b)["macs"] == 120
    assert totals(Fn(lambda x, y: torch.einsum("bij,bjk->bik", x, y)), a, b)["macs"] == 120
    # [3, 4] @ [4] -> [3]: 12
    assert totals(Fn(torch.mv), torch.randn(3, 4), torch.randn(4))["macs"] == 12
    # baddbmm: 120 MACs + 2*3*5 = 30 adds of the input
    t = totals(Fn(lambda c, x, y: torch.baddbmm(c, x, y)), torch.randn(2, 3, 5), a, b)
    assert (t["macs"], t["flops"]) == (120, 270)


# -- attention ----------------------------------------------------------------------------------
def test_sdpa_every_cpu_path():
    b, h, lq, lk, d = 2, 4, 7, 9, 8
    q, k, v = torch.randn(b, h, lq, d), torch.randn(b, h, lk, d), torch.randn(b, h, lk, d)
    t = totals(Fn(F.scaled_dot_product_attention), q, k, v)
    # scores b*h*lq*lk = 504; QK^T 504*8 + AV 504*8 = 8064 MACs
    assert t["macs"] == 8064
    # flops: 2*8064 + per score 1 (scale) + 5 (softmax) = 16128 + 3024 = 19152
    assert t["flops"] == 19152
    mask = torch.randn(lq, lk)
    t = totals(Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), q, k, v)
    assert t["macs"] == 8064
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        t = totals(Fn(F.scaled_dot_product_attention), q, k, v)
    assert t["macs"] == 8064  # the math backend reaches the dispatcher as bmm/softmax ops


def _mha_macs(batch, lq, lkv, e):
    # in-projection (lq + 2*lkv)*e*e, attention lq*lkv*e*2 (all heads), out-projection lq*e*e
    return batch * ((lq + 2 * lkv) * e * e + 2 * lq * lkv * e + lq * e * e)


def test_multihead_attention_fast_and_slow_path_agree():
    e, heads, batch, length = 16, 4, 2, 5
    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(e, heads, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    model = SelfAttention()
    mha = model.mha
    x = torch.randn(batch, length, e)
    fast = profile(model, inputs=x, timing=False)  # eval + no_grad: the fused fast path
    assert "_native_multi_head_attention.default" in {o.split("aten.")[1]
                                                      for o in fast.by_operator()["op"]}
    # 2 * (15*256 + 2*5*5*16 + 5*256) = 2 * (3840 + 800 + 1280) = 11840
    assert fast.totals["macs"] == _mha_macs(batch, length, length, e) == 11840
    slow = profile(mha, inputs=(x, x, x), timing=False, no_grad=False)  # grad on: slow path
    assert slow.totals["macs"] == 11840


def test_transformer_encoder_layer_fast_path():
    e, heads, ff, batch, length = 16, 4, 32, 2, 5
    layer = nn.TransformerEncoderLayer(e, heads, ff, batch_first=True, dropout=0.0)
    x = torch.randn(batch, length, e)
    fast = profile(layer, inputs=x, timing=False)
    assert "aten._transformer_encoder_layer_fwd.default" in set(fast.by_operator()["op"])
    # attention 11840 + feed-forward 2 tokens-sets: 2*5 tokens x (16*32 + 32*16) = 10240
    expected = _mha_macs(batch, length, length, e) + batch * length * 2 * e * ff
    assert expected == 22080
    assert fast.totals["macs"] == expected
    slow = profile(layer, inputs=x, timing=False, no_grad=False)
    assert slow.totals["macs"] == expected


# -- recurrent ----------------------------------------------------------------------------------
def test_lstm_gate_matmuls():
    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    t = totals(lstm, torch.randn(3, 5, 8))
    # per step and batch element: layer 1 4*16*(8+16) = 1536, layer 2 4*16*(16+16) = 2048;
    # 3 x 5 = 15 tokens: 15 * 3584 = 53760
    assert t["macs"] == 53760


def test_bidirectional_lstm():
    t = totals(nn.LSTM(8, 16, bidirectional=True), torch.randn(5, 3, 8))
    # two directions, each 4*16*(8+16) = 1536 per token, 15 tokens: 46080
    assert t["macs"] == 46080


def test_gru_and_rnn():
    t = totals(nn.GRU(8, 16), torch.randn(5, 2, 8))
    # 3*16*(8+16) = 1152 per token, 10 tokens: 11520
    assert t["macs"] == 11520
    t = totals(nn.RNN(8, 16), torch.randn(5, 2, 8))
    # 16*(8+16) = 384 per token, 10 tokens: 3840
    assert t["macs"] == 3840


# -- everything else ----------------------------------------------------------------------------
def test_embedding_is_a_gather():
    t = totals(nn.Embedding(10, 4), torch.tensor([[1, 2, 3]]))
    # no arithmetic; reads the indices (3 int64 = 24 B) and the 40-float table (160 B),
    # writes 3x4 floats (48 B)
    assert (t["macs"], t["flops"]) == (0, 0)
    assert (t["read_bytes"], t["write_bytes"]) == (24 + 160, 48)


def test_normalisations():
    x = torch.randn(2, 4, 3, 3)  # 72 elements
    assert totals(nn.BatchNorm2d(4), x)["flops"] == 4 * 72  # eval: normalise 2 + affine 2
    assert totals(nn.BatchNorm2d(4, affine=False), x)["flops"] == 2 * 72
    # train mode: + statistics 3 per element, + the num_batches_tracked += 1 add
    assert totals(nn.BatchNorm2d(4), x, training=True)["flops"] == 7 * 72 + 1
    assert totals(nn.GroupNorm(2, 4), x)["flops"] == 7 * 72
    assert totals(nn.LayerNorm([3, 3]), x)["flops"] == 7 * 72
    assert totals(nn.InstanceNorm2d(4), x)["flops"] == 5 * 72  # statistics, no affine


def test_pooling():
    x = torch.randn(1, 2, 6, 6)
    # max 2x2 stride 2: out 2x3x3 = 18 outputs x 3 comparisons = 54
    assert totals(nn.MaxPool2d(2), x)["flops"] == 54
    # avg 3x3 stride 3: out 2x2x2 = 8 outputs x 9 (8 adds + 1 divide) = 72
    assert totals(nn.AvgPool2d(3), x)["flops"] == 72
    # adaptive avg to 1x1: a 36-element window per channel: 2 * 36 = 72
    assert totals(nn.AdaptiveAvgPool2d(1), x)["flops"] == 72
    # adaptive avg 5 -> 3 along each dim: windows [0,2),[1,4),[3,5) -> lengths 2+3+2 = 7;
    # 7 * 7 per channel = 49, 2 channels: 98
    assert totals(nn.AdaptiveAvgPool2d(3), torch.randn(1, 2, 5, 5))["flops"] == 98
    # adaptive max: 98 window elements - 18 outputs = 80 comparisons
    assert totals(nn.AdaptiveMaxPool2d(3), torch.randn(1, 2, 5, 5))["flops"] == 80


def test_pointwise_softmax_interpolation():
    x = torch.randn(2, 3, 4)  # 24 elements
    assert totals(nn.ReLU(), x)["flops"] == 24
    assert totals(nn.GELU(), x)["flops"] == 24
    assert totals(nn.Hardswish(), x)["flops"] == 24
    assert totals(nn.Softmax(-1), x)["flops"] == 5 * 24
    img = torch.randn(1, 2, 4, 4)
    up = nn.Upsample(scale_factor=2, mode="bilinear")
    # output 2x8x8 = 128, bilinear 4 neighbours: 2*4 - 1 = 7 per output: 896
    assert totals(up, img)["flops"] == 896
    assert totals(nn.Upsample(scale_factor=2, mode="nearest"), img)["flops"] == 0


def test_residual_add_is_charged_to_the_parent():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return self.fc(x) + x  # the add runs in Block itself

    r = profile(Block(), inputs=torch.randn(3, 4), timing=False)
    df = r.to_dataframe()
    self_row = df[df["module"] == "(self)"].iloc[0]
    # the add: 12 output elements, 1 flop each; reads 2x12 floats (96 B), writes 48 B
    assert (self_row["flops"], self_row["read_bytes"], self_row["write_bytes"]) == (12, 96, 48)
    assert bool(self_row["leaf"])
    # fc: 3*4*4 = 48 MACs -> 96 flops, plus the add's 12
    assert r.totals["flops"] == 96 + 12


def test_lstm_flops_do_not_depend_on_the_kernel():
    lstm = nn.LSTM(4, 6)
    x = torch.randn(5, 3, 4)
    fused = profile(lstm, inputs=x, timing=False)          # oneDNN: one op per layer
    shapes = profile(lstm, inputs=x, timing=False, device="meta")  # per-step addmm path
    assert fused.totals["macs"] == shapes.totals["macs"] == 15 * 4 * 6 * (4 + 6)  # 3600
    assert fused.totals["flops"] == shapes.totals["flops"]


def test_bilinear_and_addbmm():
    # nn.Bilinear(3, 4, 5) on 2 samples: 2 * 5 * 3 * 4 = 120 MACs
    t = totals(nn.Bilinear(3, 4, 5, bias=False), torch.randn(2, 3), torch.randn(2, 4))
    assert t["macs"] == 120
    b, m, k, n = 3, 2, 4, 5
    t = totals(Fn(torch.addbmm), torch.randn(m, n), torch.randn(b, m, k), torch.randn(b, k, n))
    # one dot product of length b*k = 12 per output, 10 outputs: 120 MACs; madd (2*12 - 1)*10
    assert (t["macs"], t["madd"]) == (120, 230)


def test_padded_transformer_encoder_runs_as_ragged_sequences():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2).eval()
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True  # the second sequence has 3 real tokens
    r = profile(enc, inputs={"src": torch.randn(2, 5, 8), "src_key_padding_mask": mask},
                timing=False)
    # the fast path drops padding: sequences of 5 and 3 tokens, per layer
    #   projections 4*L*8*8 = 256 L, attention 2*L*L*8 = 16 L^2, feed-forward 2*L*8*16 = 256 L
    #   L=5: 1280 + 400 + 1280 = 2960; L=3: 768 + 144 + 768 = 1680; two layers: 9280
    assert r.totals["macs"] == 9280
