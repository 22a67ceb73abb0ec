"""Closed-form counts for every formula family, derived by hand beside each assertion."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision
from helpers import Fn
from torch import nn

from modelprof import ModelProfWarning, profile
from modelprof.counting.formulas.attention import attention_cost
from modelprof.counting.formulas.conv import conv_cost
from modelprof.counting.formulas.pointwise import _filter_taps, _scale


def totals(model: nn.Module, *args, **kw):
    inputs = args[0] if len(args) == 1 else tuple(args)
    return profile(model, inputs=inputs, timing=False, **kw).totals


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


def test_transposed_conv_madd_sums_only_the_outputs_reached():
    # a stride past the kernel leaves outputs that no product reaches: MAdd read 2*macs - n_out,
    # -17 for this one. 1x1 kernel, stride 2, 4x4 in, 7x7 out: 16 outputs of one product
    # each, (2*1 - 1) * 16 = 16
    one = nn.ConvTranspose2d(1, 1, 1, stride=2, bias=False)
    assert totals(one, torch.randn(1, 1, 4, 4))["madd"] == 16
    # output_padding=2 with stride 3: 12x12 out, still the 16 reached: 16
    pad = nn.ConvTranspose2d(1, 1, 1, stride=3, output_padding=2, bias=False)
    assert totals(pad, torch.randn(1, 1, 4, 4))["madd"] == 16
    # 8 -> 8 channels, kernel 2, stride 4, 4x4 in: 8 x 8x8 = 512 outputs reached, each a dot
    # of 8 channels x 1 tap: 512 * (2*8 - 1) = 7,680 (the 14x14 output has 196 positions)
    far = nn.ConvTranspose2d(8, 8, 2, stride=4, bias=False)
    assert totals(far, torch.randn(1, 8, 4, 4))["madd"] == 7680
    # the usual stride <= kernel: every output reached, 2*macs - n_out as before. 6 x 11x11 =
    # 726 outputs, 5,400 macs (above): 10,800 - 726 = 10,074; with padding=1 (9x9 out, 486
    # outputs): 10,800 - 486 = 10,314
    usual = nn.ConvTranspose2d(4, 6, 3, stride=2, bias=False)
    assert totals(usual, torch.randn(1, 4, 5, 5))["madd"] == 10_074
    padded = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, bias=False)
    assert totals(padded, torch.randn(1, 4, 5, 5))["madd"] == 10_314
    # a dilated one (dilation 2, kernel 2, stride 1, 3 in): taps {0,1,2} + {2,3,4}, all 5 of 5
    dil = nn.ConvTranspose1d(1, 1, 2, dilation=2, bias=False)
    assert totals(dil, torch.randn(1, 1, 3))["madd"] == 2 * 6 - 5

    class Backend(nn.Module):  # a backend op, its stride where its own schema puts it
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = torch.ones(1, 1, 1, 1)
            return torch.ops.aten.slow_conv_transpose2d(x, w, [1, 1], None, [2, 2])

    assert totals(Backend(), torch.randn(1, 1, 4, 4))["madd"] == 16  # as the first one


# -- matrix products ----------------------------------------------------------------------------
def test_linear_on_3d_input():
    t = totals(nn.Linear(4, 5), torch.randn(2, 3, 4))
    # 2*3 = 6 tokens x 4 x 5 = 120 MACs; flops 240 + 30 bias adds; madd (2*4-1)*30 = 210
    assert (t["macs"], t["flops"], t["madd"]) == (120, 270, 210)


def test_a_zero_length_contraction_has_no_madd():
    # MAdd is (2k - 1) per output of a length-k dot product: with k = 0 there is no arithmetic
    # at all, so 0 (2k - 1 = -1 an output gave -8, -12 and -24 below)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # init's "empty tensor" warning
        empty = nn.Linear(0, 4)
    t = totals(empty, torch.randn(2, 0))
    # 2x4 outputs of length 0: no MACs, madd 0; flops the 8 bias adds alone
    assert (t["macs"], t["flops"], t["madd"]) == (0, 8, 0)
    assert totals(Fn(torch.mm), torch.randn(3, 0), torch.randn(0, 4))["madd"] == 0  # 3x4 outputs
    assert totals(Fn(torch.bmm), torch.randn(2, 3, 0), torch.randn(2, 0, 4))["madd"] == 0
    # cdist over 0 features: 3x4 = 12 pairs, no products; one square root a pair, 12 flops,
    # and madd the same 12 (the product's -12 cancelled them)
    t = totals(Fn(torch.cdist), torch.randn(3, 0), torch.randn(4, 0))
    assert (t["macs"], t["flops"], t["madd"]) == (0, 12, 12)
    # a convolution of 0 input channels: 2x4x3 = 24 outputs of length 0 x 3 = 0
    x, w, out = (torch.empty(s, device="meta") for s in ((2, 0, 5), (4, 0, 3), (2, 4, 3)))
    assert conv_cost(x, w, None, out, transposed=False).madd == 0  # not -24
    # attention with 0-wide queries and keys (2 heads, 3 queries, 4 keys, values 5 wide): the
    # 24 scores are dots of length 0 (madd 0, not -24); the 2x3x5 = 30 outputs dots of length
    # 4, (2*4 - 1)*30 = 210; + the 24 scores' scale and softmax, 24 * (1 + 5) = 144
    assert attention_cost(2, 3, 4, 0, 5).madd == 210 + 144


def test_torchstat_softmax_over_an_empty_dimension():
    # torchstat's MAdd of nn.Softmax is (3n - 1) a softmax of length n, over numel / n of them:
    # with n = 0 it divided by zero inside the module hook, reported as the forward failing
    def madd(x: torch.Tensor) -> int:
        report = profile(nn.Softmax(dim=1), x, timing=False)
        return int(report.to_dataframe(style="torchstat")["MAdd"].iloc[0])  # the Softmax's row

    assert madd(torch.randn(2, 3)) == 16  # 2 softmaxes of length 3: 2 * (3*3 - 1)
    assert madd(torch.randn(2, 0)) == 0  # 2 of length 0: no work


def test_torchstat_linear_madd_ignores_the_bias_on_a_non_contiguous_input():
    class Projection(nn.Module):
        def __init__(self, transpose: bool):
            super().__init__()
            self.lin, self.transpose = nn.Linear(8, 6), transpose

        def forward(self, x):  # a transposed 3-D input: torch runs mm, then the bias add
            return self.lin(x.transpose(0, 1) if self.transpose else x)

    for transpose, shape in ((False, (2, 5, 8)), (True, (5, 2, 8))):
        report = profile(Projection(transpose), torch.randn(shape), timing=False)
        ts = report.to_dataframe(style="torchstat").set_index("module name")
        # torchstat's Linear: 10 tokens x 6 outputs, each (2*8 - 1) = 15, bias ignored: 900
        # on both paths (the op-by-op 960 is 900 + the 60 bias adds torch runs on its own)
        assert ts.loc["lin", "MAdd"] == 10 * 6 * (2 * 8 - 1) == 900
        assert ts.loc["lin", "Flops"] == 10 * 8 * 6  # 480, as before


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
    assert "_native_multi_head_attention.default" in {
        o.split("aten.")[1] for o in fast.by_operator()["op"]
    }
    # 2 * (15*256 + 2*5*5*16 + 5*256) = 2 * (3840 + 800 + 1280) = 11840
    assert fast.totals["macs"] == _mha_macs(batch, length, length, e) == 11840
    slow = profile(mha, inputs=(x, x, x), timing=False, no_grad=False)  # grad on: slow path
    assert slow.totals["macs"] == 11840


@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_fast_path_averages_the_weights_it_returns(average):
    # need_weights=True: the kernel scales q (1 x 50 x 64 = 3,200) where the fused attention
    # scales each score (4 x 50 x 50 = 10,000), as the slow path does, and returns the weights
    # averaged over the heads: 1 flop per score = 10,000 more (the slow path's mean.dim);
    # average_attn_weights=False returns them per head. Fast and slow paths agree
    class Weights(nn.Module):
        def __init__(self, need):
            super().__init__()
            self.mha, self.need = nn.MultiheadAttention(64, 4, batch_first=True), need

        def forward(self, x):
            return self.mha(x, x, x, need_weights=self.need, average_attn_weights=average)

    x = torch.randn(1, 50, 64)
    flops = [
        profile(Weights(need), inputs=x, timing=False).totals["flops"] for need in (False, True)
    ]
    assert flops[1] - flops[0] == 3200 - 10_000 + (10_000 if average else 0)
    slow = profile(Weights(True), inputs=x, timing=False, no_grad=False)  # grad on: slow path
    assert "aten._native_multi_head_attention.default" not in set(slow.by_operator()["op"])
    assert slow.totals["flops"] == flops[1]


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


def _cudnn_rnn_args(lstm: nn.LSTM, x: torch.Tensor, columns: bool) -> tuple:
    """``aten._cudnn_rnn``'s arguments for ``lstm`` on ``x``, its weights as the module holds
    them or, ``columns``, as autocast passes them on CUDA: re-flattened into one buffer and
    viewed as ``(numel, 1)`` columns, biases too (torch's cudnn/RNN.cpp, ``get_parameters``:
    ``size = {mat_numel * num_linear_layers / 2, 1}``)."""
    weights = [w.reshape(-1, 1) if columns else w for w in lstm._flat_weights]
    stride0 = len(weights) // (lstm.num_layers * (2 if lstm.bidirectional else 1))
    # (input, weight[], weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size,
    #  num_layers, batch_first, dropout, train, bidirectional, batch_sizes, dropout_state)
    return (
        x,
        weights,
        stride0,
        None,
        None,
        None,
        2,
        lstm.hidden_size,
        lstm.proj_size,
        lstm.num_layers,
        lstm.batch_first,
        0.0,
        False,
        lstm.bidirectional,
        [],
        None,
    )


def test_cudnn_lstm_counts_the_same_whatever_the_weight_layout():
    # under CUDA bf16 autocast the weights come as (numel, 1) columns of one flat buffer; read
    # as matrices they would raise MACs by the biases and FLOPs by every weight element taken
    # for a gate unit
    from modelprof.counting.formulas.registry import REGISTRY

    formula = REGISTRY.lookup(torch.ops.aten._cudnn_rnn.default)
    lstm = nn.LSTM(6, 5, num_layers=2, batch_first=True)
    x = torch.randn(2, 3, 6)
    plain, columns = (formula(_cudnn_rnn_args(lstm, x, c), {}, None) for c in (False, True))
    # 6 tokens; per token layer 1 4*5*(6+5) = 220, layer 2 4*5*(5+5) = 200: 6 * 420 = 2520
    assert plain.macs == columns.macs == 2520
    # 2*2520 + bias adds 6 tokens * 40 gate units (80 gate rows / 2) * 3 + cell 6*2*5*9 = 540
    assert plain.flops == columns.flops == 5040 + 720 + 540
    assert (plain.macs, plain.flops) == (totals(lstm, x)["macs"], totals(lstm, x)["flops"])


def test_cudnn_lstm_with_projections_both_ways_counts_as_the_cpu():
    from modelprof.counting.formulas.registry import REGISTRY

    formula = REGISTRY.lookup(torch.ops.aten._cudnn_rnn.default)
    lstm = nn.LSTM(6, 5, num_layers=2, proj_size=3, bidirectional=True)
    x = torch.randn(4, 2, 6)
    plain, columns = (formula(_cudnn_rnn_args(lstm, x, c), {}, None) for c in (False, True))
    # 8 tokens, 2 directions; per token and direction layer 1 4*5*(6+3) + 3*5 = 195,
    # layer 2 4*5*(6+3) + 15 = 195 (its input is 2 directions x 3): 8 * 2 * 390 = 6240
    assert plain.macs == columns.macs == 6240 == totals(lstm, x)["macs"]
    assert plain.flops == columns.flops == totals(lstm, x)["flops"]


def test_weight_packing_and_shape_queries_are_free():
    # _cudnn_rnn_flatten_weight copies the weights into cuDNN's buffer; aten.dim returns a
    # number (a jagged nested tensor dispatches it)
    from modelprof.counting.formulas.registry import REGISTRY, ZERO

    w = [torch.randn(20, 6), torch.randn(20, 5)]
    flatten = REGISTRY.lookup(torch.ops.aten._cudnn_rnn_flatten_weight.default)
    # (weight_arr, weight_stride0, input_size, mode, hidden_size, proj_size, num_layers,
    #  batch_first, bidirectional)
    assert flatten((w, 2, 6, 2, 5, 0, 1, False, False), {}, torch.empty(220)) == ZERO
    dim = REGISTRY.lookup(torch.ops.aten.dim.default)
    assert dim((torch.randn(2, 3),), {}, 2) == ZERO


# -- everything else ----------------------------------------------------------------------------
def test_embedding_is_a_gather():
    t = totals(nn.Embedding(10, 4), torch.tensor([[1, 2, 3]]))
    # no arithmetic; reads the indices (3 int64 = 24 B) and the 3 rows it gathers (3x4 floats,
    # 48 B; not the 40-float table), writes 3x4 floats (48 B)
    assert (t["macs"], t["flops"]) == (0, 0)
    assert (t["read_bytes"], t["write_bytes"]) == (24 + 48, 48)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_embedding_bag_arithmetic(device):
    # 12 rows of width 16 looked up into 3 bags of 4: 12 x 16 = 192 elements combined
    idx, offsets = torch.arange(12), torch.tensor([0, 4, 8])
    bag = {m: nn.EmbeddingBag(20, 16, mode=m) for m in ("sum", "mean", "max")}
    flops = {m: totals(b, idx, offsets, device=device)["flops"] for m, b in bag.items()}
    # sum: 1 add an element (192); max: 1 comparison an element (192); mean: the adds and
    # then each of the 3 x 16 = 48 outputs divided by its bag's size: 192 + 48 = 240
    assert flops == {"sum": 192, "mean": 240, "max": 192}
    # per_sample_weights: each of the 192 elements multiplied by its weight first: 2 x 192
    weighted = totals(bag["sum"], idx, offsets, torch.rand(12), device=device)
    assert weighted["flops"] == 384
    # 2-D indices [3, 4] are 3 bags of 4 (the same 192 elements); mean adds 48 divisions
    assert totals(bag["mean"], idx.view(3, 4), device=device)["flops"] == 240


def test_quantized_embedding_bag_arithmetic():
    from modelprof.counting.formulas.registry import REGISTRY

    op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets.default
    formula = REGISTRY.lookup(op)
    packed, idx, offsets = torch.zeros(20, 24, dtype=torch.uint8), torch.arange(12), None
    out = torch.empty(3, 16)
    # (weight, indices, offsets, scale_grad_by_freq, mode, pruned_weights, per_sample_weights):
    # as the float bag, 12 rows x 16 = 192 combined; mean + 48 divisions; weights + 192
    assert formula((packed, idx, offsets, False, 0), {}, out).flops == 192
    assert formula((packed, idx, offsets, False, 1), {}, out).flops == 240
    weighted = (packed, idx, offsets, False, 0, False, torch.rand(12))
    assert formula(weighted, {}, out).flops == 384


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


def test_fused_elementwise_ops_cost_their_arithmetic():
    # t + value * a * b, t + value * a / b, a + w * (b - a): 3 flops each of 12 outputs = 36
    a, b, t = torch.randn(3, 4), torch.rand(3, 4) + 1, torch.randn(3, 4)
    assert totals(Fn(lambda t, a, b: torch.addcmul(t, a, b, value=0.5)), t, a, b)["flops"] == 36
    assert totals(Fn(lambda t, a, b: torch.addcdiv(t, a, b, value=0.5)), t, a, b)["flops"] == 36
    assert totals(Fn(lambda a, b: torch.lerp(a, b, 0.3)), a, b)["flops"] == 36
    assert totals(Fn(lambda t, a, b: t.clone().addcmul_(a, b)), t, a, b)["flops"] == 36


def test_a_foreach_op_counts_its_list_wherever_it_stands():
    # _foreach_pow.ScalarAndTensor(2.0, [a, b]) takes a scalar first: its list of 2 x 100
    # elements is 200 flops, where the first version found no list and counted 0 (review)
    from modelprof.counting.formulas.pointwise import per_listed

    a, b = torch.ones(100), torch.ones(10, 10)
    assert per_listed(1)((2.0, [a, b]), {}, None).resolved()[1] == 200
    assert per_listed(3)(([a, b], [a, b], [a, b]), {}, None).resolved()[1] == 600


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


@pytest.mark.parametrize(
    "how, expected",
    [
        # buf (100, 8) float32; idx: 2 int64 (16 B); src (2, 8): 64 B read, 64 B written
        ("index_copy", (16 + 64, 64)),
        ("index_put", (16 + 64, 64)),
        ("accumulate", (16 + 64 + 64, 64)),  # the 2 rows added into are read too
        # buf[:, idx3] = v: 3 int64 (24 B) pick 3 columns of all 100 rows: 300 x 4 = 1200 B
        ("columns", (24 + 1200, 1200)),
        # a boolean mask: how many it picks only its values tell; counted in full: buf 3200 B,
        # mask 800 B, the value (a 0-dim float) 4 B read, the whole buf written
        ("mask", (3200 + 800 + 4, 3200)),
    ],
)
def test_an_in_place_write_into_part_of_a_tensor_moves_the_part(how, expected):
    # a static KV cache's index_copy_ writes one token, not the cache (a decode step's
    # "lower bound" read the whole cache twice more than the step moves)
    class Writes(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Identity()  # a child: the writes are the parent's (self) row's ops
            self.register_buffer("buf", torch.zeros(100, 8))
            self.register_buffer("idx", torch.tensor([3, 7]))
            self.register_buffer("idx3", torch.tensor([1, 2, 5]))
            self.register_buffer("mask", torch.zeros(100, 8, dtype=torch.bool))
            self.register_buffer("v", torch.ones(100, 3))
            self.register_buffer("zero", torch.tensor(0.0))

        def forward(self, src):
            src = self.fc(src)
            if how == "index_copy":
                self.buf.index_copy_(0, self.idx, src)
            elif how == "index_put":
                self.buf.index_put_((self.idx,), src)
            elif how == "accumulate":
                self.buf.index_put_((self.idx,), src, accumulate=True)
            elif how == "columns":
                self.buf[:, self.idx3] = self.v  # index_put_ with indices (None, idx3)
            else:
                self.buf[self.mask] = self.zero
            return src

    df = profile(Writes(), inputs=torch.randn(2, 8), timing=False).to_dataframe()
    row = df[df["module"] == "(self)"].iloc[0]
    assert (row["read_bytes"], row["write_bytes"]) == expected


def test_lstm_flops_do_not_depend_on_the_kernel():
    lstm = nn.LSTM(4, 6)
    x = torch.randn(5, 3, 4)
    fused = profile(lstm, inputs=x, timing=False)  # oneDNN: one op per layer
    shapes = profile(lstm, inputs=x, timing=False, device="meta")  # per-step addmm path
    assert fused.totals["macs"] == shapes.totals["macs"] == 15 * 4 * 6 * (4 + 6)  # 3600
    assert fused.totals["flops"] == shapes.totals["flops"]
    assert fused.totals["madd"] == shapes.totals["madd"]  # (the fused rule lost the joins)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_fused_rnn_counts_as_its_per_step_cells_in_closed_form(kind):
    # 5 steps x batch 1 = 5 tokens, input 8, hidden 10 (LSTM 16); G gates (LSTM 4, GRU 3).
    # per token and gate unit: 2 bias adds + 1 add joining W_ih x and W_hh h; per token and
    # hidden unit the cell: LSTM 3 sigmoid + 2 tanh + f*c + i*g (3) + o*tanh(c) (1) = 9; GRU
    # 2 sigmoid + tanh + r*(W_hn h + b_hn) + ATen's h' = n + z*(h - n) (sub, mul, add) = 7.
    # MAdd: (2k - 1) per gate output of each of the two products, the joins, the cell.
    #   GRU:  MACs 5*30*18 = 2700; FLOPs 5400 + 5*30*3 + 5*10*7 = 6200;
    #         MAdd 5400 - 5*60 + 5*30 + 350 = 5600
    #   LSTM: MACs 5*64*24 = 7680; FLOPs 15360 + 5*64*3 + 5*16*9 = 17040;
    #         MAdd 15360 - 5*128 + 5*64 + 720 = 15760
    rnn, expected = {
        "gru": (nn.GRU(8, 10), (2700, 6200, 5600)),
        "lstm": (nn.LSTM(8, 16), (7680, 17040, 15760)),
    }[kind]
    x = torch.randn(5, 1, 8)
    got = []
    for mode in (contextlib.nullcontext, torch.inference_mode):  # inference: the fused op
        with mode():
            r = profile(rnn, inputs=x, timing=False)
        got.append(tuple(int(r.totals[k]) for k in ("macs", "flops", "madd")))
    meta = profile(rnn, inputs=x.to("meta"), timing=False, device="meta")  # per-step ops
    got.append(tuple(int(meta.totals[k]) for k in ("macs", "flops", "madd")))
    assert got == [expected] * 3


def test_fold_sums_its_overlapping_patches():
    # nn.Fold (col2im) adds every patch element into the output, one flop each, as a sum:
    # input 2 x (8 channels x 3 x 3) x 64 patches = 9216 elements read and added
    t = totals(nn.Fold((10, 10), 3), torch.randn(2, 72, 64))
    assert (t["macs"], t["flops"], t["madd"]) == (0, 9216, 9216)


def test_grid_sample_by_its_mode():
    # 50 outputs (2 channels x 5x5 grid): bilinear 4 neighbours, 2*4 - 1 = 7 flops each (350);
    # nearest is a gather, 0; bicubic 16 neighbours, 31 each (1,550). Every mode read 350.
    x, grid = torch.randn(1, 2, 8, 8), torch.rand(1, 5, 5, 2) * 2 - 1
    flops = {
        mode: totals(Fn(lambda a, g, m=mode: F.grid_sample(a, g, mode=m)), x, grid)["flops"]
        for mode in ("bilinear", "nearest", "bicubic")
    }
    assert flops == {"bilinear": 350, "nearest": 0, "bicubic": 1550}
    # 3-d: 2 channels x 3x3x3 grid = 54 outputs; trilinear 8 neighbours, 15 each (810)
    x3, grid3 = torch.randn(1, 2, 4, 4, 4), torch.rand(1, 3, 3, 3, 3) * 2 - 1
    near = totals(Fn(lambda a, g: F.grid_sample(a, g, mode="nearest")), x3, grid3)["flops"]
    assert (totals(Fn(F.grid_sample), x3, grid3)["flops"], near) == (810, 0)


def test_antialiased_resize_counts_its_widened_filter():
    # 64x64 -> 16x16 bilinear, antialias: scale 4 widens the filter's support to 4 pixels.
    # Output i of a dimension reads pixels int(4i + 2 - 4 + 0.5) .. int(4i + 2 + 4 + 0.5)
    # clipped to [0, 64): 6 taps at each edge, 8 between, 6 + 14*8 + 6 = 124 a row.
    # ATen runs the width pass first, 64 rows x 16 outputs: 64 * 2*124 - 1,024 = 14,848 flops;
    # then the height pass, 16 columns x 16: 16 * 2*124 - 256 = 3,712. In all 18,560 (read as
    # a plain bilinear resize, 7 x 256 = 1,792, before).
    resize = Fn(lambda a: F.interpolate(a, size=(16, 16), mode="bilinear", antialias=True))
    assert totals(resize, torch.randn(1, 1, 64, 64))["flops"] == 18_560
    # the taps are the filter's as ATen weighs them: no fewer than its non-zero weights (a 1-D
    # resize of the identity has one column of weights per input pixel)
    # at the scale ATen takes: n_in / n_out, 1 / a scale_factor given as it is (10 -> 2 at
    # 0.25 reads 4 pixels an output, not 5), and 0 with align_corners for one output (1 tap a
    # bilinear output, not all 64)
    cases = [((64, 16), {}), ((100, 33), {}), ((10, 3), {}), ((64, 128), {})]
    cases += [((10, 2), {"factor": 0.25}), ((64, 1), {"corners": True})]
    for mode, size in (("bilinear", 2), ("bicubic", 4)):
        for (n_in, n_out), how in cases:
            eye = torch.eye(n_in).reshape(n_in, 1, 1, n_in)
            corners, factor = how.get("corners", False), how.get("factor")
            given = (
                {"scale_factor": (1.0, factor), "recompute_scale_factor": False}
                if factor
                else {"size": (1, n_out)}
            )
            w = F.interpolate(eye, mode=mode, antialias=True, align_corners=corners, **given)
            assert w.shape[-1] == n_out
            nonzero = int((w != 0).sum())
            taps = _filter_taps(n_in, _scale(n_in, n_out, corners, factor), n_out, size)
            assert nonzero <= taps <= nonzero + 3, (mode, n_in, n_out, how)
    # and as the counter reads the call's arguments: 10 -> 2 at 0.25, bilinear, one row: 14
    # taps (ATen's weights), 2*14 - 2 = 26 flops (the height pass is skipped: 1 -> 1)
    quarter = Fn(
        lambda a: F.interpolate(
            a, scale_factor=(1.0, 0.25), mode="bilinear", antialias=True,
            recompute_scale_factor=False,
        )
    )  # fmt: skip
    assert totals(quarter, torch.randn(1, 1, 1, 10))["flops"] == 26


def test_bilinear_and_addbmm():
    # nn.Bilinear(3, 4, 5) on 2 samples, as ATen's _trilinear runs it: x1 with W over i,
    # 2 * 5 * 3 * 4 = 120 MACs, then that [2, 5, 4] with x2 over j, 2 * 5 * 4 = 40: 160 (the
    # second contraction was left out)
    t = totals(nn.Bilinear(3, 4, 5, bias=False), torch.randn(2, 3), torch.randn(2, 4))
    assert t["macs"] == 160
    b, m, k, n = 3, 2, 4, 5
    t = totals(Fn(torch.addbmm), torch.randn(m, n), torch.randn(b, m, k), torch.randn(b, k, n))
    # one dot product of length b*k = 12 per output, 10 outputs: 120 MACs; madd (2*12 - 1)*10
    assert (t["macs"], t["madd"]) == (120, 230)


def test_padded_transformer_encoder_runs_as_ragged_sequences():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2).eval()
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True  # the second sequence has 3 real tokens
    r = profile(
        enc, inputs={"src": torch.randn(2, 5, 8), "src_key_padding_mask": mask}, timing=False
    )
    # the fast path drops padding: sequences of 5 and 3 tokens, per layer
    #   projections 4*L*8*8 = 256 L, attention 2*L*L*8 = 16 L^2, feed-forward 2*L*8*16 = 256 L
    #   L=5: 1280 + 400 + 1280 = 2960; L=3: 768 + 144 + 768 = 1680; two layers: 9280
    assert r.totals["macs"] == 9280


# -- grouped matmul (mixture of experts) --------------------------------------------------------
def _ops_of(report):
    return report.by_operator().set_index("op")


def test_grouped_mm_every_layout_from_the_offsets():
    gmm = Fn(lambda a, b, offs: torch._grouped_mm(a, b, offs))
    offs = torch.tensor([2, 6, 10], dtype=torch.int32)  # groups of 2, 4 and 4
    # a [M_total=11, K=8] @ b [G=3, K=8, N=12]: rows 0..9 in groups, row 10 unused
    t = totals(gmm, torch.randn(11, 8), torch.randn(3, 8, 12), offs)
    # (2 + 4 + 4) rows x 8 x 12 = 960 MACs; madd (2*8 - 1) per output of the 10*12 computed
    assert (t["macs"], t["madd"]) == (960, 2 * 960 - 120)
    # a [G=3, M=5, K=8] @ b [K=8, N_total=16], column groups 4, 4, 4 (cols 12..15 unused)
    t = totals(
        gmm, torch.randn(3, 5, 8), torch.randn(8, 16), torch.tensor([4, 8, 12], dtype=torch.int32)
    )
    assert t["macs"] == 5 * 8 * 12  # M x K x (4 + 4 + 4) = 480
    # a [M=5, K_total=16] @ b [K_total=16, N=12], K split 4, 4, 4 -> out [3, 5, 12]
    t = totals(
        gmm, torch.randn(5, 16), torch.randn(16, 12), torch.tensor([4, 8, 12], dtype=torch.int32)
    )
    assert t["macs"] == 5 * 12 * 12  # M x N x (4 + 4 + 4) = 720
    assert t["madd"] == 2 * 720 - 3 * 5 * 12  # 3*5*12 outputs
    # batched: a [3, 5, 8] @ b [3, 8, 12], no offsets: 3*5*8*12 = 1440
    t = totals(
        Fn(lambda a, b: torch._grouped_mm(a, b)), torch.randn(3, 5, 8), torch.randn(3, 8, 12)
    )
    assert t["macs"] == 1440


def test_grouped_mm_empty_k_group_adds_no_madd():
    gmm = Fn(lambda a, b, offs: torch._grouped_mm(a, b, offs))
    m, k, n = 4, 16, 16
    a, b = torch.randn(m, k), torch.randn(k, n)  # K split in 2 groups -> out [2, 4, 16]
    for offs in ([0, 16], [16, 16]):  # one group of K = 16, one of K = 0 (first or last)
        t = totals(gmm, a, b, torch.tensor(offs, dtype=torch.int32))
        # MACs m*16*n = 1024; MAdd (2*16 - 1) for each of the m*n = 64 outputs of the
        # K = 16 group, 0 for the K = 0 group: 31*64 = 1984 (not 2*1024 - 2*64 = 1920)
        assert (t["macs"], t["madd"]) == (m * k * n, (2 * k - 1) * m * n) == (1024, 1984)
    t = totals(gmm, a, b, torch.tensor([8, 16], dtype=torch.int32))
    # both groups K = 8: (2*8 - 1) * 64 each, 2 * 15 * 64 = 1920
    assert t["madd"] == 2 * (2 * 8 - 1) * m * n == 1920


def test_grouped_mm_in_a_mixture_of_experts_layer():
    class Experts(nn.Module):
        """Tokens sorted by expert, one grouped matmul per projection (Mixtral-style)."""

        def __init__(self, experts=4, d=16, hidden=32):
            super().__init__()
            self.w_in = nn.Parameter(torch.randn(experts, d, hidden, dtype=torch.bfloat16))
            self.w_out = nn.Parameter(torch.randn(experts, hidden, d, dtype=torch.bfloat16))

        def forward(self, x, offs):
            h = F.silu(F.grouped_mm(x, self.w_in, offs=offs))
            return F.grouped_mm(h, self.w_out, offs=offs)

    model = Experts()
    x = torch.randn(24, 16, dtype=torch.bfloat16)
    offs = torch.tensor([5, 5, 17, 24], dtype=torch.int32)  # 5, 0, 12 and 7 tokens
    r = profile(model, inputs=(x, offs), timing=False)
    # each of the 24 routed tokens: 16*32 in + 32*16 out = 1024 MACs -> 24576
    assert r.totals["macs"] == 24 * 1024
    assert r.totals["params"] == 2 * 4 * 16 * 32
    assert _ops_of(r).loc["aten._grouped_mm.default", "calls"] == 2


def test_scaled_grouped_mm_formulas_share_the_layouts():
    from modelprof.counting.formulas.matmul import (
        _scaled_grouped_mm,
        _scaled_grouped_mm_v2,
        grouped_mm_cost,
    )

    a, b = torch.randn(11, 8), torch.randn(3, 8, 12)
    offs = torch.tensor([2, 6, 10], dtype=torch.int32)
    scale = torch.ones(1)
    v1 = _scaled_grouped_mm((a, b, scale, scale, offs), {}, None)
    v2 = _scaled_grouped_mm_v2((a, b, [scale], [0], [0], [scale], [0], [0], offs), {}, None)
    assert v1.macs == v2.macs == grouped_mm_cost(a, b, offs, False).macs == 960


# -- variable-length fused attention (CUDA kernels: formulas called on CPU tensors) ----------------
def test_flash_attention_varlen_counts_each_sequence():
    from modelprof.counting.formulas.attention import _flash_attention_forward

    heads, d = 4, 16
    lengths = [3, 5, 8, 2]  # a 4-sequence packed batch of 18 tokens
    cum = torch.tensor([0, 3, 8, 16, 18], dtype=torch.int32)
    q = k = v = torch.randn(18, heads, d)
    c = _flash_attention_forward((q, k, v, cum, cum, 8, 8, 0.0, False, False), {}, None)
    pairs = sum(n * n for n in lengths)  # 9 + 25 + 64 + 4 = 102 query-key pairs per head
    assert c.macs == heads * pairs * (d + d) == 13056
    assert c.note is None
    # as one sequence of 18 tokens it would be 18*18 = 324 pairs: 3.2x too many
    dense = _flash_attention_forward(
        (torch.randn(1, 18, heads, d),) * 3 + (None, None, 18, 18, 0.0, False, False), {}, None
    )
    assert dense.macs == heads * 324 * 32
    # per-sequence closed form = the sum of dense single-sequence counts (PyTorch's oracle)
    per_seq = sum(
        _flash_attention_forward(
            (torch.randn(1, n, heads, d),) * 3 + (None, None, n, n, 0.0, False, False), {}, None
        ).macs
        for n in lengths
    )
    assert per_seq == c.macs


def test_flash_attention_varlen_cross_lengths_and_kv_cache():
    from modelprof.counting.formulas.attention import _flash_attention_forward

    cum_q = torch.tensor([0, 1, 3], dtype=torch.int32)  # 1 and 2 queries
    cum_k = torch.tensor([0, 10, 16], dtype=torch.int32)  # 10 and 6 keys
    q, k, v = torch.randn(3, 2, 8), torch.randn(16, 2, 8), torch.randn(16, 2, 4)
    c = _flash_attention_forward((q, k, v, cum_q, cum_k, 2, 10, 0.0, False, False), {}, None)
    # pairs 1*10 + 2*6 = 22 per head, 2 heads, 8 + 4 MACs per pair: 528
    assert c.macs == 22 * 2 * 12 == 528
    used = torch.tensor([7, 3], dtype=torch.int32)  # seqused_k: keys really attended
    c = _flash_attention_forward(
        (q, k, v, cum_q, cum_k, 2, 10, 0.0, False, False), {"seqused_k": used}, None
    )
    assert c.macs == (1 * 7 + 2 * 3) * 2 * 12  # 13 pairs per head: 312


def test_efficient_attention_varlen_and_dense():
    from modelprof.counting.formulas.attention import _efficient_attention_forward

    cum = torch.tensor([0, 4, 10], dtype=torch.int32)  # lengths 4 and 6
    q = k = v = torch.randn(1, 10, 2, 8)  # packed as [1, total, H, E]
    c = _efficient_attention_forward((q, k, v, None, cum, cum, 6, 6, 0.0, 0), {}, None)
    assert c.macs == (16 + 36) * 2 * 16  # 52 pairs per head, 2 heads, 16 MACs: 1664
    dense = _efficient_attention_forward(
        (torch.randn(2, 6, 2, 8),) * 3 + (None, None, None, None, None, 0.0, 0), {}, None
    )
    assert dense.macs == 2 * 2 * 6 * 6 * 16  # B*H*L*S*(E+Ev) = 2304


def test_varlen_attention_without_values_is_a_bound_that_says_so():
    from modelprof.counting.formulas.attention import _flash_attention_forward

    cum = torch.tensor([0, 30, 60, 90, 123], dtype=torch.int32)
    exact = _flash_attention_forward(
        (torch.randn(123, 4, 16),) * 3 + (cum, cum, 40, 40, 0.0, False, False), {}, None
    )
    # 3*30*30 + 33*33 = 3789 pairs per head; 4 heads x 32 MACs
    assert exact.macs == 3789 * 4 * 32 and exact.note is None
    meta = torch.empty(123, 4, 16, device="meta")
    bound = _flash_attention_forward(
        (meta, meta, meta, cum.to("meta"), cum.to("meta"), 40, 40, 0.0, False, False), {}, None
    )
    # min(n*max^2 = 4*1600, total_q*max_k = 123*40 = 4920, total_k*max_q = 4920) = 4920
    assert bound.macs == 4920 * 4 * 32
    assert bound.note is not None and "bound" in bound.note
    assert bound.macs >= exact.macs


# -- backward kernels ----------------------------------------------------------------------------
def test_sdpa_backward_recomputes_the_scores():
    from modelprof.counting.counter import count_ops

    q, k, v = (torch.randn(2, 3, 8, 4, requires_grad=True) for _ in range(3))

    def step():
        F.scaled_dot_product_attention(q, k, v).sum().backward()

    c = count_ops(step)
    fwd = c.by_op["aten._scaled_dot_product_flash_attention_for_cpu.default"].macs
    bwd = c.by_op["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"].macs
    # forward 2*3*8*8 = 384 scores x (4 + 4) = 3072; backward 384 x (3*4 + 2*4) = 7680
    assert (fwd, bwd) == (3072, 7680)


def test_convolution_backward_by_output_mask():
    from modelprof.counting.counter import count_ops

    conv = nn.Conv2d(3, 4, 3, bias=True)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    c = count_ops(lambda: conv(x).sum().backward())
    fwd = c.by_op["aten.convolution.default"].macs
    bwd = c.by_op["aten.convolution_backward.default"]
    # forward: out 2x4x4x4 = 128 outputs x 27 = 3456; grad_input and grad_weight each as much;
    # grad_bias sums the 128 grad_output elements
    assert fwd == 3456 and bwd.macs == 2 * 3456
    assert bwd.flops == 4 * 3456 + 128
    x.requires_grad_(False)
    c = count_ops(lambda: conv(x).sum().backward())
    assert c.by_op["aten.convolution_backward.default"].macs == 3456  # grad_weight only


# -- pairwise distances ----------------------------------------------------------------------------
def test_cdist_both_kernels_count_the_same_macs():
    a, b = torch.randn(2, 5, 3), torch.randn(2, 7, 3)
    small = profile(Fn(torch.cdist), inputs=(a, b), timing=False)  # direct kernel
    assert "aten._cdist_forward.default" in set(small.by_operator()["op"])
    # 2*5*7 = 70 pairs x 3 = 210 MACs; + 70*3 subtractions + 70 square roots
    assert (small.totals["macs"], small.totals["flops"]) == (210, 420 + 210 + 70)
    a, b = torch.randn(1, 30, 3), torch.randn(1, 40, 3)  # > 25 rows: the matmul kernel
    mm = profile(Fn(torch.cdist), inputs=(a, b), timing=False)
    assert "aten._euclidean_dist.default" in set(mm.by_operator()["op"])
    # 1200 pairs x 3 = 3600 MACs; squared norms 2*(90 + 120) = 420; 5 per pair = 6000
    assert (mm.totals["macs"], mm.totals["flops"]) == (3600, 7200 + 420 + 6000)
    t = totals(Fn(lambda a, b: torch.cdist(a, b, p=1)), torch.randn(4, 3), torch.randn(6, 3))
    assert (t["macs"], t["flops"]) == (0, 3 * 24 * 3)  # 24 pairs x 3 dims x 3 (sub, abs, add)


# -- quantized models ------------------------------------------------------------------------------
def test_dynamic_quantized_linear_counts_and_shows_its_packed_weights():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    r = profile(q, (16,), timing=False)
    assert r.unsupported == {}
    # 16*32 + 32*4 = 640 MACs; flops 1280 + 36 bias adds + 32 ReLU
    assert (r.totals["macs"], r.totals["flops"]) == (640, 1348)
    # packed weights are the parameters: 16*32 + 32 + 32*4 + 4 = 676
    assert r.totals["params"] == r.model_params == 676
    df = r.to_dataframe().set_index("module")
    assert (df.loc["0", "params"], df.loc["2", "params"]) == (544, 132)
    # read: the 1x16 float input (64 B) + int8 weight 512 B + float bias 128 B
    assert df.loc["0", "read_bytes"] == 64 + 512 + 128


def _quantized_resnet18():
    from torchvision.models.quantization import resnet18

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = resnet18(weights=None, quantize=False).eval()
        model.fuse_model()
        model.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
        torch.ao.quantization.prepare(model, inplace=True)
        model(torch.randn(2, 3, 64, 64))  # calibration
        torch.ao.quantization.convert(model, inplace=True)
    return model


def test_static_quantized_resnet18_counts_as_its_float_twin():
    q = _quantized_resnet18()
    r = profile(q, (3, 224, 224), timing=False)
    assert r.unsupported == {}
    assert r.totals["macs"] == 1_814_073_344  # the float model's count: same convolutions
    # conv weights and fused-BN biases + fc: the float model's 11,689,512 less the 20 batch
    # norms' weight+bias (2*C each) plus one bias of C per conv that absorbed one: 4,800 fewer
    float_model = torchvision.models.resnet18()
    bn_channels = sum(
        m.num_features for m in float_model.modules() if isinstance(m, nn.BatchNorm2d)
    )
    assert bn_channels == 4800
    assert r.totals["params"] == r.model_params == 11_689_512 - bn_channels
    ops = set(r.by_operator()["op"])
    assert {
        "quantized.conv2d_relu.new",
        "quantized.add_relu.default",
        "quantized.linear.default",
        "aten.quantize_per_tensor.default",
    } <= ops


def test_int8_and_weight_only_matmuls():
    a, b = (
        torch.randint(-8, 8, (32, 64), dtype=torch.int8),
        torch.randint(-8, 8, (64, 16), dtype=torch.int8),
    )
    assert totals(Fn(torch._int_mm), a, b)["macs"] == 32 * 64 * 16  # 32768
    x, w = torch.randn(4, 64), torch.randint(-8, 8, (16, 64), dtype=torch.int8)
    t = totals(Fn(lambda x, w: torch.ops.aten._weight_int8pack_mm(x, w, torch.ones(16))), x, w)
    assert t["macs"] == 4 * 64 * 16  # 4096


# -- nested-tensor conversions --------------------------------------------------------------------
def test_nested_tensor_conversions_are_data_movement_not_unsupported():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    enc = nn.TransformerEncoder(layer, 1).eval()
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelProfWarning)
        warnings.filterwarnings("ignore", category=UserWarning, message=".*nested tensors.*")
        r = profile(
            enc, inputs={"src": torch.randn(2, 5, 8), "src_key_padding_mask": mask}, timing=False
        )
    assert r.unsupported == {}
    ops = _ops_of(r)
    assert ops.loc["aten._nested_tensor_from_mask.default", "flops"] == 0
    assert ops.loc["aten.to_padded_tensor.default", "flops"] == 0
    # sequences of 5 and 3 tokens: 1280 + 400 + 1280 = 2960 and 768 + 144 + 768 = 1680
    assert r.totals["macs"] == 2960 + 1680


def test_quantized_layers_match_their_float_closed_forms():
    import torch.ao.nn.quantized as nnq

    class Quantized(nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            q = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
            return self.layer(q).dequantize()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = totals(Quantized(nnq.ConvTranspose2d(4, 6, 3, stride=2)), torch.randn(1, 4, 5, 5))
        # as test_transposed_conv: 100 input positions x 6*9 = 5400; weight 4*6*9 + bias 6
        assert (t["macs"], t["params"]) == (5400, 222)
        t = totals(Quantized(nnq.Conv3d(2, 4, 3)), torch.randn(1, 2, 5, 5, 5))
        assert (t["macs"], t["params"]) == (5832, 4 * 2 * 27 + 4)  # as test_conv1d_and_conv3d
        lstm = torch.ao.quantization.quantize_dynamic(nn.LSTM(4, 6), {nn.LSTM}, dtype=torch.qint8)
        t = totals(lstm, torch.randn(5, 3, 4))
    # 15 tokens x 4 gates x 6 x (4 + 6) = 3600, as the float LSTM; params 4*6*(4+6) + 2*24
    assert (t["macs"], t["params"]) == (3600, 288)
