"""Convolutions of every dimension, grouped and transposed, and their backward."""

from __future__ import annotations

from math import prod

import torch

from modelprof.counting.formulas.registry import Cost, first, register_formula, register_ops

__all__ = ["conv_cost", "conv_macs"]

aten = torch.ops.aten


def conv_macs(x_shape, w_shape, out_shape, transposed: bool = False) -> int:
    """MACs of one convolution: N * prod(w.shape) * prod(spatial of the side the kernel slides
    over) — every output position of a normal one (w [C_out, C_in/g, *k]) is a dot product of
    length C_in/g * prod(k); every *input* position of a transposed one (w [C_in, C_out/g, *k])
    scatters into C_out/g * prod(k) outputs."""
    spatial = (x_shape if transposed else out_shape)[2:]
    return x_shape[0] * prod(w_shape) * prod(spatial)


def conv_cost(x, w, bias, out, transposed: bool, fused_per_output: int = 0) -> Cost:
    """A convolution's cost, + 1 flop per output for a bias and each fused op (add, ReLU)."""
    macs = conv_macs(x.shape, w.shape, out.shape, transposed)
    n_out = out.numel()
    extra = n_out * (fused_per_output + (bias is not None))
    # madd: torchstat's (2k - 1) per output of a length-k dot product, + 1 for a bias
    return Cost(macs, flops=2 * macs + extra, madd=2 * macs - n_out + extra)


@register_formula(aten.convolution, aten._convolution, aten.convolution_overrideable)
def _convolution(args, kwargs, out) -> Cost:
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    transposed = args[6] if len(args) > 6 else kwargs.get("transposed", False)
    return conv_cost(args[0], args[1], args[2] if len(args) > 2 else None, out, bool(transposed))


def _backend(transposed: bool):
    def formula(args, kwargs, out) -> Cost:
        # (input, weight, [bias | kernel_size], ...): only the weight/bias tensors matter; the
        # bias a 1-D tensor in slot 2 or, after kernel_size, 3
        bias = next((a for a in args[2:4] if isinstance(a, torch.Tensor) and a.dim() == 1), None)
        return conv_cost(args[0], args[1], bias, first(out), transposed)

    return formula


register_ops(
    """cudnn_convolution mkldnn_convolution miopen_convolution _slow_conv2d_forward thnn_conv2d
    slow_conv3d slow_conv_dilated2d slow_conv_dilated3d _nnpack_spatial_convolution
    cudnn_convolution_relu cudnn_convolution_add_relu miopen_depthwise_convolution
    _conv_depthwise2d"""
)(_backend(False))
register_ops(
    """cudnn_convolution_transpose miopen_convolution_transpose slow_conv_transpose2d
    slow_conv_transpose3d"""
)(_backend(True))
