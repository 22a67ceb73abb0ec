"""Closed forms of the backward, loss and optimizer formulas, derived beside each assertion.

Each backward op runs for real (on the meta device: shapes only) and its formula is read from the
registry, so a formula that does not match the op's real argument layout fails here."""

from __future__ import annotations

import pytest
import torch

from modelprof.counting.formulas.attention import attention_backward_cost
from modelprof.counting.formulas.backward import norm_backward_cost
from modelprof.counting.formulas.optim import optimizer_cost
from modelprof.counting.formulas.registry import REGISTRY

aten = torch.ops.aten


def cost(op, *args, **kwargs) -> tuple[int, int]:
    """(macs, flops) the registry's formula gives the real call ``op(*args, **kwargs)``."""
    out = op(*args, **kwargs)
    formula = REGISTRY.lookup(op)
    assert formula is not None, f"no formula for {op}"
    macs, flops, _ = formula(args, kwargs, out).resolved()
    return macs, flops


def meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


# -- convolution --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mask, macs, flops",
    [
        # forward: out 2x8x5x5 = 400 outputs x (3*3*3 = 27) = 10800 MACs
        ([True, True, True], 21600, 2 * 21600 + 400),  # input + weight grads, bias = sum of 400
        ([False, True, True], 10800, 2 * 10800 + 400),  # first layer: no input grad
        ([True, False, False], 10800, 2 * 10800),  # frozen weight and bias
        ([False, False, False], 0, 0),
    ],
)
def test_convolution_backward(mask, macs, flops):
    g, x, w = meta(2, 8, 5, 5), meta(2, 3, 5, 5), meta(8, 3, 3, 3)
    got = cost(
        aten.convolution_backward.default,
        g,
        x,
        w,
        [8],
        [1, 1],
        [1, 1],
        [1, 1],
        False,
        [0, 0],
        1,
        mask,
    )
    assert got == (macs, flops)


def test_transposed_convolution_backward():
    # forward: 1x4x5x5 input positions (100) each into 6 x 9 = 54 outputs: 5400 MACs
    g, x, w = meta(1, 6, 11, 11), meta(1, 4, 5, 5), meta(4, 6, 3, 3)
    got = cost(
        aten.convolution_backward.default,
        g,
        x,
        w,
        None,
        [2, 2],
        [0, 0],
        [1, 1],
        True,
        [0, 0],
        1,
        [True, True, False],
    )
    assert got == (2 * 5400, 4 * 5400)  # both grads: 2 x forward MACs, 2 flops per MAC


# -- normalisation ------------------------------------------------------------------------------
def test_norm_backward_cost_closed_forms():
    n = 100
    # train BN / layer / group norm, all grads, affine: x_hat 2 + input 7 + g*w 1 + weight 2
    # + bias 1 = 13 per element
    assert norm_backward_cost(n, True, True, True, True, True).flops == 13 * n
    # eval BN, all grads: x_hat 2 (for the weight grad) + input 1 + weight 2 + bias 1 = 6
    assert norm_backward_cost(n, False, True, True, True, True).flops == 6 * n
    # eval BN, frozen affine: g * (w * rstd) only = 1
    assert norm_backward_cost(n, False, True, True, False, False).flops == n
    # no affine, batch statistics: x_hat 2 + input 7 = 9
    assert norm_backward_cost(n, True, False, True, False, False).flops == 9 * n


def test_batch_norm_backward_op():
    x, g = meta(2, 4, 3, 3), meta(2, 4, 3, 3)
    w, rm, rv, sm, sv = meta(4), meta(4), meta(4), meta(4), meta(4)
    # 72 elements; train, all grads: 13 per element (test above) = 936
    assert cost(
        aten.native_batch_norm_backward.default,
        g,
        x,
        w,
        rm,
        rv,
        sm,
        sv,
        True,
        1e-5,
        [True, True, True],
    ) == (0, 936)
    # eval, input grad only: 1 per element = 72
    assert cost(
        aten.native_batch_norm_backward.default,
        g,
        x,
        w,
        rm,
        rv,
        sm,
        sv,
        False,
        1e-5,
        [True, False, False],
    ) == (0, 72)


def test_layer_and_group_norm_backward_ops():
    x, g = meta(2, 3, 8), meta(2, 3, 8)  # 48 elements, normalised over the last 8
    mean, rstd = meta(2, 3, 1), meta(2, 3, 1)
    # affine, all grads: 13 per element = 624
    assert cost(
        aten.native_layer_norm_backward.default,
        g,
        x,
        [8],
        mean,
        rstd,
        meta(8),
        meta(8),
        [True, True, True],
    ) == (0, 624)
    # no affine: x_hat 2 + input 7 = 9 per element = 432
    assert cost(
        aten.native_layer_norm_backward.default,
        g,
        x,
        [8],
        mean,
        rstd,
        None,
        None,
        [True, False, False],
    ) == (0, 432)
    xg, gg = meta(2, 4, 6), meta(2, 4, 6)  # group norm, 48 elements, 2 groups
    assert cost(
        aten.native_group_norm_backward.default,
        gg,
        xg,
        meta(2, 2),
        meta(2, 2),
        meta(4),
        2,
        4,
        6,
        2,
        [True, True, True],
    ) == (0, 624)


# -- softmax, activations, pooling, embedding ---------------------------------------------------
def test_softmax_backward_ops():
    g, y = meta(3, 10), meta(3, 10)
    # y * (g - sum(g * y)): 4 per element x 30 = 120
    assert cost(aten._softmax_backward_data.default, g, y, 1, torch.float32) == (0, 120)
    assert cost(aten._log_softmax_backward_data.default, g, y, 1, torch.float32) == (0, 120)


def test_activation_backward_ops():
    g, x = meta(4, 5), meta(4, 5)
    assert cost(aten.threshold_backward.default, g, x, 0.0) == (0, 20)  # pointwise: 1 x 20
    assert cost(aten.hardswish_backward.default, g, x) == (0, 20)  # listed: 1 x 20


def test_pooling_backward_ops():
    x = meta(1, 2, 4, 4)
    g = meta(1, 2, 2, 2)  # 2x2 windows, stride 2: 8 outputs
    idx = torch.empty(1, 2, 2, 2, dtype=torch.int64, device="meta")
    # max: each of the 8 gradients added at its winner: 8
    assert cost(
        aten.max_pool2d_with_indices_backward.default,
        g,
        x,
        [2, 2],
        [2, 2],
        [0, 0],
        [1, 1],
        False,
        idx,
    ) == (0, 8)
    # avg: k = 4 per gradient element, as the forward: 32
    assert cost(
        aten.avg_pool2d_backward.default, g, x, [2, 2], [2, 2], [0, 0], False, True, None
    ) == (0, 32)
    # adaptive avg 4x4 -> 1x1: one window of 16 per channel, 2 channels = 32
    assert cost(aten._adaptive_avg_pool2d_backward.default, meta(1, 2, 1, 1), x) == (0, 32)


def test_embedding_backward_op():
    g = meta(2, 3, 5)  # 6 looked-up rows of width 5
    idx = torch.empty(2, 3, dtype=torch.int64, device="meta")
    # each of the 30 gradient elements added into the weight's gradient: 30
    assert cost(aten.embedding_dense_backward.default, g, idx, 10, -1, False) == (0, 30)


# -- attention ----------------------------------------------------------------------------------
def test_attention_backward_cost_closed_form():
    # bh = 2*3 = 6, l_q = 4, l_k = 5, d = 8, d_v = 8: scores 6*4*5 = 120
    c = attention_backward_cost(6, 4, 5, 8, 8)
    assert c.macs == 120 * (3 * 8 + 2 * 8)  # 4800 = 5 products of 120*8 each
    # per score: scale 1 + exp 2 + dS 2 + its scale 1 = 6 -> 720; D = rowsum(dO*O): 2 per
    # output element, 6*4*8 = 192 -> 384
    assert c.resolved()[1] == 2 * 4800 + 720 + 384


def test_cpu_flash_attention_backward_op():
    q, k, v = meta(2, 3, 4, 8), meta(2, 3, 5, 8), meta(2, 3, 5, 8)
    o, lse = meta(2, 3, 4, 8), meta(2, 3, 4)
    macs, flops = cost(
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        meta(2, 3, 4, 8),
        q,
        k,
        v,
        o,
        lse,
        0.0,
        False,
    )
    assert (macs, flops) == (4800, 2 * 4800 + 720 + 384)  # as the closed form above


# -- recurrent layers ---------------------------------------------------------------------------
def test_mkldnn_lstm_layer_backward_op():
    # one LSTM layer: input 8, hidden 16, 5 steps x batch 3 = 15 tokens
    # forward gate MACs per token: 4*16*(8 + 16) = 1536 -> 23040; backward 2x = 46080
    # bias grads: 2 biases x 15 tokens x 64 gate units = 1920; cell 2 x 9 x 15 x 16 = 4320
    formula = REGISTRY.lookup(aten.mkldnn_rnn_layer_backward.default)
    args = (
        meta(5, 3, 8),
        meta(64, 8),
        meta(64, 16),
        meta(64),
        meta(64),
        meta(3, 16),
        meta(3, 16),
        meta(5, 3, 16),
        meta(3, 16),
        meta(3, 16),
        meta(5, 3, 16),
        None,
        None,
        False,
        2,
        16,
        1,
        True,
        True,
        False,
        [],
        False,
        meta(1),
    )
    assert formula(args, {}, None).resolved()[:2] == (46080, 2 * 46080 + 1920 + 4320)


# -- losses -------------------------------------------------------------------------------------
def test_loss_ops():
    x = meta(4, 10)
    t = torch.empty(4, dtype=torch.int64, device="meta")
    # nll_loss, mean: 1 per target (the reduction) = 4; backward 1 per target = 4
    out = aten.nll_loss_forward.default(x, t, None, 1, -100)
    assert cost(aten.nll_loss_forward.default, x, t, None, 1, -100) == (0, 4)
    assert cost(aten.nll_loss_backward.default, meta(), x, t, None, 1, -100, out[1]) == (0, 4)
    y = meta(4, 10)
    # mse, mean: (x - y)^2 2 + reduction 1 = 3 per element x 40 = 120; backward 3 x 40
    assert cost(aten.mse_loss.default, x, y, 1) == (0, 120)
    assert cost(aten.mse_loss_backward.default, meta(), x, y, 1) == (0, 120)


# -- optimizers ---------------------------------------------------------------------------------
def _params() -> list[torch.Tensor]:
    a, b, frozen = torch.zeros(10, 3), torch.zeros(7), torch.zeros(5)
    a.grad, b.grad = torch.zeros(10, 3), torch.zeros(7)  # frozen has no grad: skipped
    return [a, b, frozen]


@pytest.mark.parametrize(
    "make, per, states",
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), 2, 0),  # p -= lr*g
        # + b = mu*b + g: a multiply and an add (torch's alpha = 1 - 0 adds alone)
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 4, 1),
        # + b = mu*b + 0.5*g: the damped add multiplies too, 2 + 1 + 2
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5), 5, 1),
        (
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
            8,
            1,
        ),  # update 2 + weight decay 2 + momentum 2 + nesterov g += mu*b 2
        (lambda p: torch.optim.SGD(p, lr=0.1, maximize=True), 3, 0),  # + g = -g
        (lambda p: torch.optim.Adam(p), 13, 2),  # m 3, v 4, denom 3, p 3
        (lambda p: torch.optim.Adam(p, weight_decay=0.1), 15, 2),  # + L2: g += wd*p
        (lambda p: torch.optim.AdamW(p), 14, 2),  # + p *= 1 - lr*wd
        (lambda p: torch.optim.AdamW(p, amsgrad=True, maximize=True), 16, 3),  # + max + neg
    ],
)
def test_optimizer_formulas(make, per, states):
    params = _params()
    c = optimizer_cost(make(params), lambda p: p.grad is not None)
    n = 30 + 7  # elements with a gradient
    assert (c.elements, c.flops) == (n, per * n)
    # fp32: read param + grad + states, write param + states
    assert (c.read_bytes, c.write_bytes) == ((2 + states) * n * 4, (1 + states) * n * 4)


def test_unknown_optimizer_has_no_formula():
    params = _params()
    assert optimizer_cost(torch.optim.RMSprop(params), lambda p: p.grad is not None) is None
