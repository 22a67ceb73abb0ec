"""Convolutions of every dimension, grouped and transposed, and their backward."""

from __future__ import annotations

import functools
from math import prod
from typing import Any

import torch

from modelprof.counting.formulas.registry import (
    Cost,
    dot_madd,
    first,
    register_formula,
    register_ops,
)

__all__ = ["conv_cost", "conv_macs"]

aten = torch.ops.aten


def conv_macs(x_shape, w_shape, out_shape, transposed: bool = False) -> int:
    """MACs of one convolution: N * prod(w.shape) * prod(spatial of the side the kernel slides
    over) — every output position of a normal one (w [C_out, C_in/g, *k]) is a dot product of
    length C_in/g * prod(k); every *input* position of a transposed one (w [C_in, C_out/g, *k])
    scatters into C_out/g * prod(k) outputs."""
    spatial = (x_shape if transposed else out_shape)[2:]
    return x_shape[0] * prod(w_shape) * prod(spatial)


def conv_cost(
    x, w, bias, out, transposed: bool, fused_per_output: int = 0, geometry: tuple | None = None
) -> Cost:
    """A convolution's cost, + 1 flop per output for a bias and each fused op (add, ReLU);
    ``geometry`` (stride, padding, dilation) says which outputs a transposed one reaches."""
    macs = conv_macs(x.shape, w.shape, out.shape, transposed)
    n_out = out.numel()
    extra = n_out * (fused_per_output + (bias is not None))
    # madd: torchstat's (2k - 1) per output of a length-k dot product, + 1 for a bias; a
    # transposed one with a stride past its kernel leaves outputs no product reaches (k = 0)
    summed = n_out if not transposed else _reached(x.shape, out.shape, w.shape, geometry, macs)
    return Cost(macs, flops=2 * macs + extra, madd=dot_madd(macs, summed) + extra)


def _reached(x_shape, out_shape, w_shape, geometry: tuple | None, macs: int) -> int:
    """Outputs of a transposed convolution that receive a product: input position i and kernel
    tap t land on output i * stride - padding + t * dilation, in each dimension; without the
    geometry, at most one an output (each reached output has at least one product)."""
    if geometry is None:
        return min(prod(out_shape), macs)
    per_dim = [_landed(*dims) for dims in zip(x_shape[2:], w_shape[2:], out_shape[2:], *geometry)]
    return out_shape[0] * out_shape[1] * prod(per_dim)


@functools.lru_cache(maxsize=256)
def _landed(size: int, k: int, out: int, stride: int, padding: int, dilation: int) -> int:
    if dilation == 1 and stride <= k:  # (the usual) the taps tile one run of outputs
        last = (size - 1) * stride + k - 1 - padding
        return max(0, min(last, out - 1) - max(-padding, 0) + 1)
    taps = {i * stride - padding + t * dilation for i in range(size) for t in range(k)}
    return sum(1 for o in taps if 0 <= o < out)


def _geometry(w: torch.Tensor, given: Any) -> tuple[tuple[int, ...], ...]:
    """(stride, padding, dilation) from ``given``, each one value a spatial dimension of the
    weight ``w`` (a single value stands for every dimension)."""
    n = w.dim() - 2
    return tuple(tuple(v) * (n if len(v) == 1 else 1) for v in given)


@register_formula(aten.convolution, aten._convolution, aten.convolution_overrideable)
def _convolution(args, kwargs, out) -> Cost:
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    transposed = bool(args[6] if len(args) > 6 else kwargs.get("transposed", False))
    geometry = _geometry(args[1], args[3:6]) if transposed else None
    return conv_cost(
        args[0], args[1], args[2] if len(args) > 2 else None, out, transposed, geometry=geometry
    )


# a transposed backend's (stride, padding, dilation) argument positions, and their defaults
_TRANSPOSED_AT = {
    "slow_conv_transpose2d": (4, 5, 7),
    "slow_conv_transpose3d": (4, 5, 7),
    "cudnn_convolution_transpose": (4, 2, 5),
    "miopen_convolution_transpose": (5, 3, 6),
}
_DEFAULTS = ([1], [0], [1])


def _backend(transposed: bool, at: tuple[int, int, int] | None = None):
    def formula(args, kwargs, out) -> Cost:
        # (input, weight, [bias | kernel_size], ...): only the weight/bias tensors matter; the
        # bias a 1-D tensor in slot 2 or, after kernel_size, 3
        bias = next((a for a in args[2:4] if isinstance(a, torch.Tensor) and a.dim() == 1), None)
        geometry = None
        if at is not None:
            given = [args[i] if len(args) > i else d for i, d in zip(at, _DEFAULTS)]
            geometry = _geometry(args[1], given)
        return conv_cost(args[0], args[1], bias, first(out), transposed, geometry=geometry)

    return formula


register_ops(
    """cudnn_convolution mkldnn_convolution miopen_convolution _slow_conv2d_forward thnn_conv2d
    slow_conv3d slow_conv_dilated2d slow_conv_dilated3d _nnpack_spatial_convolution
    cudnn_convolution_relu cudnn_convolution_add_relu miopen_depthwise_convolution
    _conv_depthwise2d"""
)(_backend(False))
for _name, _at in _TRANSPOSED_AT.items():
    register_ops(_name)(_backend(True, _at))
