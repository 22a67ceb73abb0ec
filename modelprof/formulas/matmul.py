"""Matrix products: mm, addmm, bmm, baddbmm, matrix-vector, dot (``linear``, ``matmul``,
``einsum`` and ``@`` reach the dispatcher as these)."""
from __future__ import annotations

from math import prod

import torch

from .registry import Cost, optional_ops, register_formula

__all__ = ["matmul_cost"]

aten = torch.ops.aten


def matmul_cost(batch: int, m: int, k: int, n: int, bias_adds: int = 0) -> Cost:
    """[batch, m, k] @ [batch, k, n] -> [batch, m, n]: batch*m*k*n MACs; madd (2k-1) per output."""
    macs = batch * m * k * n
    n_out = batch * m * n
    return Cost(macs, flops=2 * macs + bias_adds, madd=2 * macs - n_out)


@register_formula(aten.mm)
def _mm(args, kwargs, out) -> Cost:
    # [m, k] @ [k, n] -> [m, n]
    (m, k), n = args[0].shape, args[1].shape[1]
    return matmul_cost(1, m, k, n)


@register_formula(aten.addmm)
def _addmm(args, kwargs, out) -> Cost:
    # bias + [m, k] @ [k, n] -> [m, n]; the bias add is one flop per output (not a MAC)
    (m, k), n = args[1].shape, args[2].shape[1]
    return matmul_cost(1, m, k, n, bias_adds=m * n)


@register_formula(aten.bmm)
def _bmm(args, kwargs, out) -> Cost:
    # [b, m, k] @ [b, k, n] -> [b, m, n]
    (b, m, k), n = args[0].shape, args[1].shape[2]
    return matmul_cost(b, m, k, n)


@register_formula(aten.baddbmm)
def _baddbmm(args, kwargs, out) -> Cost:
    # c + [b, m, k] @ [b, k, n] -> [b, m, n]
    (b, m, k), n = args[1].shape, args[2].shape[2]
    return matmul_cost(b, m, k, n, bias_adds=b * m * n)


@register_formula(aten.addbmm)
def _addbmm(args, kwargs, out) -> Cost:
    # c + sum_b [b, m, k] @ [b, k, n] -> [m, n]: one dot product of length b*k per output
    (b, m, k), n = args[1].shape, args[2].shape[2]
    return matmul_cost(1, m, b * k, n, bias_adds=m * n)


@register_formula(aten._trilinear)
def _trilinear(args, kwargs, out) -> Cost:
    # nn.Bilinear: y[b, o] = sum_ij x1[b, i] W[o, i, j] x2[b, j]: b*o*i*j MACs
    x1, w = args[0], args[1]
    tokens = x1.numel() // x1.shape[-1] if x1.dim() else 1
    macs = tokens * w.numel()
    return Cost(macs, flops=2 * macs, madd=2 * macs - out.numel())


@register_formula(aten.mv)
def _mv(args, kwargs, out) -> Cost:
    # [m, k] @ [k] -> [m]
    m, k = args[0].shape
    return matmul_cost(1, m, k, 1)


@register_formula(aten.addmv)
def _addmv(args, kwargs, out) -> Cost:
    m, k = args[1].shape
    return matmul_cost(1, m, k, 1, bias_adds=m)


@register_formula(aten.dot, aten.vdot)
def _dot(args, kwargs, out) -> Cost:
    # [k] . [k] -> scalar
    return matmul_cost(1, 1, args[0].shape[0], 1)


@register_formula(*optional_ops("linear", "mkldnn_linear"))
def _linear(args, kwargs, out) -> Cost:
    # linear(x[..., k], w[n, k], bias) when a backend keeps it whole -> [..., n]
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    m, k, n = prod(x.shape[:-1]), x.shape[-1], w.shape[0]
    return matmul_cost(1, m, k, n, bias_adds=m * n if bias is not None else 0)


@register_formula(*optional_ops("_addmm_activation"))
def _addmm_activation(args, kwargs, out) -> Cost:
    # activation(bias + [m, k] @ [k, n]): addmm plus one flop per output for the activation
    (m, k), n = args[1].shape, args[2].shape[1]
    return matmul_cost(1, m, k, n, bias_adds=2 * m * n)


@register_formula(*optional_ops("_scaled_mm"))
def _scaled_mm(args, kwargs, out) -> Cost:
    (m, k), n = args[0].shape, args[1].shape[1]
    return matmul_cost(1, m, k, n)
