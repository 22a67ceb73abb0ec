"""Backward ops: the gradients autograd computes, counted by the conventions of the forward.

Contractions (MACs), per gradient asked for by the op's ``output_mask``:
    convolution_backward  grad_input (a transposed convolution) and grad_weight (the input with
                          grad_output) each the forward's MACs; grad_bias 1 flop per grad_output
                          element. So 2x the forward's MACs, 1x for a first layer, 0x frozen.
    fused attention       the scores recomputed, then dV, dP, dQ, dK: 3*d_qk + 2*d_v MACs per
                          score (``attention.attention_backward_cost``); the math path's backward
                          runs as bmm's.
    fused RNN layers      data and weight gradients: 2x the forward's gate MACs (1x when cuDNN is
                          asked for no weight gradient).
Per element (flops):
    normalisation         x_hat = (x - mean) * rstd recomputed: 2 (for the weight gradient, and
                          for the input gradient with batch statistics);
                          grad_input with batch statistics (train batch norm, layer, group norm):
                          rstd * (g - mean(g) - x_hat * mean(g * x_hat)) = 7, + 1 for g * weight;
                          with known statistics (eval batch norm): g * (weight * rstd) = 1;
                          grad_weight = sum(g * x_hat): 2; grad_bias = sum(g): 1.
                          RMS norm: x_hat 1, grad_input 5 (+1 weight), grad_weight 2.
    softmax, log_softmax  y * (g - sum(g * y)) and g - exp(y) * sum(g): 4.
    activations           1, as their forward (those without the pointwise tag listed here).
    pooling               max: 1 per grad_output element (scattered to the winners); avg and
                          adaptive avg: the forward's count.
    embedding             1 per grad_output element (added into the weight gradient).
    RNN cells             twice the forward's elementwise count; each bias gradient sums the gate
                          gradients over the tokens.
    select/slice/...      the gradient written into zeros: 0 flops (a copy).
"""

from __future__ import annotations

import torch

from modelprof.counting.formulas.conv import conv_macs
from modelprof.counting.formulas.pointwise import reduction
from modelprof.counting.formulas.pool import adaptive_windows, window
from modelprof.counting.formulas.registry import Cost, arg, register_formula, register_ops, zero
from modelprof.counting.formulas.rnn import GATE_MODE, cudnn_has_biases, cudnn_layout, gate_work

__all__ = [
    "NORM_BACKWARD_FLOPS_PER_ELEMENT",
    "SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT",
    "norm_backward_cost",
]

aten = torch.ops.aten

NORM_BACKWARD_FLOPS_PER_ELEMENT = dict(
    x_hat=2, input_stats=7, input_known=1, input_weight=1, weight=2, bias=1
)
SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT = 4


def _mask(args: tuple, kwargs: dict, pos: int, n: int) -> list[bool]:
    """An op's ``output_mask`` at ``pos`` (which gradients it computes); all ``n`` when absent."""
    mask = arg(args, kwargs, pos, "output_mask")
    return [True] * n if mask is None else [bool(m) for m in mask]


# -- convolution ------------------------------------------------------------------------------
@register_formula(aten.convolution_backward)
def _convolution_backward(args, kwargs, out) -> Cost:
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #  output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
    g, x, w = args[0], args[1], args[2]
    transposed = bool(arg(args, kwargs, 7, "transposed", False))
    grad_input, grad_weight, grad_bias = _mask(args, kwargs, 10, 3)
    forward = conv_macs(x.shape, w.shape, g.shape, transposed)
    macs = forward * (int(grad_input) + int(grad_weight))
    bias = g.numel() if grad_bias else 0  # sum of grad_output over all but the channels
    return Cost(macs, flops=2 * macs + bias)


# -- normalisation ----------------------------------------------------------------------------
def norm_backward_cost(
    numel: int,
    batch_stats: bool,
    has_weight: bool,
    grad_input: bool,
    grad_weight: bool,
    grad_bias: bool,
    per: dict[str, int] | None = None,
) -> Cost:
    """Flops of a normalisation's backward over ``numel`` input elements."""
    per = NORM_BACKWARD_FLOPS_PER_ELEMENT if per is None else per
    f = 0
    if grad_weight or (grad_input and batch_stats):
        f += per["x_hat"]
    if grad_input:
        f += per["input_stats"] if batch_stats else per["input_known"]
        if has_weight and batch_stats:
            f += per["input_weight"]
    if grad_weight and has_weight:
        f += per["weight"]
    if grad_bias:
        f += per["bias"]
    return Cost(0, flops=f * numel)


def _affine_backward(weight_at: int, bias_at: int, mask_at: int, train_at: int | None = None):
    """Family factory: a norm's backward on ``args[1]`` whose weight and bias (``args`` at
    ``weight_at``, ``bias_at``) may be None: no gradient of what is absent. Batch statistics
    unless ``args[train_at]`` says eval."""

    def formula(args, kwargs, out) -> Cost:
        gi, gw, gb = _mask(args, kwargs, mask_at, 3)
        weight, bias = args[weight_at], args[bias_at]
        has_weight, has_bias = isinstance(weight, torch.Tensor), isinstance(bias, torch.Tensor)
        stats = True if train_at is None else bool(args[train_at])
        return norm_backward_cost(
            args[1].numel(), stats, has_weight, gi, gw and has_weight, gb and has_bias
        )

    return formula


# (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
#  output_mask): a bias gradient only with a weight
register_formula(aten.native_batch_norm_backward)(_affine_backward(2, 2, 9, train_at=7))
# (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
register_formula(aten.native_layer_norm_backward)(_affine_backward(5, 6, 7))
# (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask): bias as weight
register_formula(aten.native_group_norm_backward)(_affine_backward(4, 4, 9))


@register_ops("batch_norm_backward")
def _batch_norm_backward_unified(args, kwargs, out) -> Cost:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
    #  output_mask, reserve): batch statistics unless it ran in eval (no saved statistics)
    x, save_mean = args[1], args[5]
    gi, gw, gb = _mask(args, kwargs, 9, 3)
    stats = isinstance(save_mean, torch.Tensor) and save_mean.numel() > 0
    return norm_backward_cost(x.numel(), stats, True, gi, gw, gb)


@register_ops("cudnn_batch_norm_backward miopen_batch_norm_backward")
def _backend_batch_norm_backward(args, kwargs, out) -> Cost:
    # (input, grad_output, weight, ...): train mode, every gradient
    return norm_backward_cost(args[0].numel(), True, True, True, True, True)


_RMS_BACKWARD = dict(x_hat=1, input_stats=5, input_known=5, input_weight=1, weight=2, bias=0)


@register_ops("_fused_rms_norm_backward")
def _rms_norm_backward(args, kwargs, out) -> Cost:
    # (grad_out, input, normalized_shape, rstd, weight, output_mask) -> (grad_input, grad_weight)
    x, weight = args[1], args[4]
    gi, gw = _mask(args, kwargs, 5, 2)
    has_weight = isinstance(weight, torch.Tensor)
    return norm_backward_cost(
        x.numel(), True, has_weight, gi, gw and has_weight, False, per=_RMS_BACKWARD
    )


# -- softmax and activations ------------------------------------------------------------------
# ``per`` flops an element of the first argument, grad_output
_per_grad_element = reduction

register_ops("_softmax_backward_data _log_softmax_backward_data _masked_softmax_backward")(
    _per_grad_element(SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT)
)

# activation backwards without the pointwise tag: 1 per element of grad_output, as the forward
register_ops(
    """hardswish_backward hardsigmoid_backward hardtanh_backward leaky_relu_backward elu_backward
    softplus_backward mish_backward log_sigmoid_backward softshrink_backward hardshrink_backward
    rrelu_with_noise_backward glu_backward _prelu_kernel_backward"""
)(_per_grad_element(1))

# gradients written into zeros at the selected positions: copies, 0 flops
register_ops(
    "select_backward slice_backward diagonal_backward unfold_backward index_select_backward"
)(zero)


# -- pooling ----------------------------------------------------------------------------------
# (grad_output, input, ..., indices): each gradient added at its winner's position
register_ops(
    """max_pool2d_with_indices_backward max_pool3d_with_indices_backward
    adaptive_max_pool2d_backward adaptive_max_pool3d_backward"""
)(_per_grad_element(1))


def _avg_pool_backward(dims: int):
    def formula(args, kwargs, out) -> Cost:
        # (grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad, ...)
        return Cost(0, flops=args[0].numel() * window(args[2], dims))

    return formula


for _dims in (2, 3):
    register_ops(f"avg_pool{_dims}d_backward")(_avg_pool_backward(_dims))


@register_ops("_adaptive_avg_pool2d_backward _adaptive_avg_pool3d_backward")
def _adaptive_avg_pool_backward(args, kwargs, out) -> Cost:
    # (grad_output [N, C, *out], input [N, C, *in]): the forward's windows, walked back
    g = args[0]
    dims = g.dim() - 2 if g.dim() > 2 else 1
    return Cost(0, flops=adaptive_windows(args[1], g.shape[-dims:]))


# -- embedding --------------------------------------------------------------------------------
# (grad_output [..., D], indices, num_weights, padding_idx, scale_grad_by_freq)
register_ops("embedding_dense_backward embedding_backward")(_per_grad_element(1))


# -- recurrent layers -------------------------------------------------------------------------
def _rnn_backward_cost(
    tokens: int,
    weight_shapes: list,
    hidden: int,
    kind: str,
    directions_layers: int,
    n_biases: int,
    weight_grads: bool,
) -> Cost:
    forward, gate_units, cell = gate_work(tokens, weight_shapes, hidden, kind, directions_layers)
    macs = forward * (2 if weight_grads else 1)
    return Cost(macs, flops=2 * macs + tokens * gate_units * n_biases + 2 * cell)


@register_ops("mkldnn_rnn_layer_backward")
def _mkldnn_rnn_layer_backward(args, kwargs, out) -> Cost:
    # (input, w_ih, w_hh, b_ih, b_hh, hx, cx, output, hy, cy, grad_output, grad_hy, grad_cy,
    #  reverse, mode, hidden_size, num_layers, has_biases, train, bidirectional, ...)
    x, w_ih, w_hh = args[0], args[1], args[2]
    mode, hidden, has_biases = int(args[14]), int(args[15]), bool(args[17])
    tokens = x.numel() // x.shape[-1] if x.dim() else 0
    shapes, biases = [tuple(w_ih.shape), tuple(w_hh.shape)], 2 if has_biases else 0
    return _rnn_backward_cost(tokens, shapes, hidden, GATE_MODE[mode], 1, biases, True)


@register_ops("_cudnn_rnn_backward miopen_rnn_backward")
def _cudnn_rnn_backward(args, kwargs, out) -> Cost:
    # (input, weight[], weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
    #  grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
    #  bidirectional, batch_sizes, dropout_state, reserve, output_mask)
    mask = _mask(args, kwargs, 21, 4)
    biases = 2 if cudnn_has_biases(args[2]) and mask[3] else 0
    return _rnn_backward_cost(*cudnn_layout(args, 10), biases, mask[3])


@register_ops("_thnn_fused_lstm_cell_backward_impl _thnn_fused_gru_cell_backward")
def _fused_cell_backward(args, kwargs, out) -> Cost:
    # the gate matmuls' gradients run as mm; here the cell (2x its forward's 3 per gate unit)
    # and, with biases, the bias gradient (the gate gradients summed over the batch)
    grad_gates = out[0]
    has_bias = bool(args[-1])
    return Cost(0, flops=(6 + int(has_bias)) * grad_gates.numel())
