"""Matrix products (``linear``, ``matmul``, ``einsum`` and ``@`` reach the dispatcher as mm,
addmm, bmm, baddbmm, mv, dot), grouped matmuls of mixture-of-experts layers, and ``cdist``."""

from __future__ import annotations

from math import prod

import torch

from modelprof.counting.formulas.registry import (
    Cost,
    arg,
    dot_madd,
    optional_ops,
    register_formula,
    register_ops,
)
from modelprof.counting.formulas.values import has_values

__all__ = ["grouped_mm_cost", "low_precision_mm", "matmul_cost"]

aten = torch.ops.aten


def matmul_cost(batch: int, m: int, k: int, n: int, bias_adds: int = 0) -> Cost:
    """[batch, m, k] @ [batch, k, n] -> [batch, m, n]: batch*m*k*n MACs; madd (2k-1) per output
    (0 where k = 0: :func:`dot_madd`)."""
    macs = batch * m * k * n
    return Cost(macs, flops=2 * macs + bias_adds, madd=dot_madd(macs, batch * m * n))


def _product(at: int, per_output: int = 0):
    """Family factory: ``args[at] @ args[at + 1]`` -> [b, m, n], each operand a batch of
    matrices, a matrix or a vector (m or n of 1); + ``per_output`` flops an output for an added
    bias (and a fused activation), not MACs."""

    def formula(args, kwargs, out) -> Cost:
        a, b = args[at].shape, args[at + 1].shape
        batch, m = (a[0] if len(a) == 3 else 1), (a[-2] if len(a) > 1 else 1)
        n = b[-1] if len(b) > 1 else 1
        return matmul_cost(batch, m, a[-1], n, bias_adds=per_output * batch * m * n)

    return formula


# [m, k] @ [k, n] -> [m, n] (_scaled_mm: the scales not counted); [b, m, k] @ [b, k, n] ->
# [b, m, n]; [m, k] @ [k] -> [m]; [k] . [k] -> scalar
register_formula(aten.mm, aten.bmm, aten.mv, aten.dot, aten.vdot, *optional_ops("_scaled_mm"))(
    _product(0)
)
# bias + the same: the bias add is one flop per output (not a MAC)
register_formula(aten.addmm, aten.baddbmm, aten.addmv)(_product(1, 1))
register_ops("_addmm_activation")(_product(1, 2))  # activation(bias + mat1 @ mat2)


@register_formula(aten.addbmm)
def _addbmm(args, kwargs, out) -> Cost:
    # c + sum_b [b, m, k] @ [b, k, n] -> [m, n]: one dot product of length b*k per output
    (b, m, k), n = args[1].shape, args[2].shape[2]
    return matmul_cost(1, m, b * k, n, bias_adds=m * n)


@register_formula(aten._trilinear)
def _trilinear(args, kwargs, out) -> Cost:
    # nn.Bilinear: y[b, o] = sum_ij x1[b, i] W[o, i, j] x2[b, j], as ATen pairs it: x1 with W
    # over i (b*o*i*j MACs), then that [b, o, j] with x2 over j (b*o*j)
    x1, w = args[0], args[1]
    tokens = x1.numel() // x1.shape[-1] if x1.dim() else 1
    macs = tokens * w.numel() + (tokens * w.shape[0] * w.shape[-1] if w.dim() == 3 else 0)
    return Cost(macs, flops=2 * macs, madd=dot_madd(macs, out.numel()))


@register_ops("linear mkldnn_linear")
def _linear(args, kwargs, out) -> Cost:
    # linear(x[..., k], w[n, k], bias) when a backend keeps it whole -> [..., n]
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    m, k, n = prod(x.shape[:-1]), x.shape[-1], w.shape[0]
    return matmul_cost(1, m, k, n, bias_adds=m * n if bias is not None else 0)


@register_ops(
    """_int_mm _weight_int8pack_mm _weight_int4pack_mm _weight_int4pack_mm_for_cpu
    _weight_int4pack_mm_with_scales_and_zeros _dyn_quant_matmul_4bit"""
)
def low_precision_mm(args, kwargs, out) -> Cost:
    # int8 / weight-only int8 and int4 matmuls: x [m, k] @ W -> [m, n] (W packed or [n, k];
    # _dyn_quant_matmul_4bit: k is its in_features): every output a length-k dot product; the
    # per-channel/group scales are not counted
    k = args[0].shape[-1]
    n_out = out.numel()
    return Cost(n_out * k, madd=dot_madd(n_out * k, n_out))


# -- grouped matmul (mixture-of-experts) -------------------------------------------------------
_OFFSETS_UNKNOWN = (
    "group offsets unknown (no tensor values, e.g. on the meta device): "
    "counted as if every row of the jagged dimension belonged to a group, "
    "an upper bound"
)


def grouped_mm_cost(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, has_bias: bool
) -> Cost:
    """``_grouped_mm`` in each layout it accepts (G groups, ``offs`` the cumulative ends of the
    groups along the jagged dimension; entries past ``offs[-1]`` are not computed):

        a [M_total, K] @ b [G, K, N]  -> [M_total, N]   group g: rows_g x K x N
        a [G, M, K]    @ b [K, N_total] -> [M, N_total]  group g: M x K x cols_g
        a [M, K_total] @ b [K_total, N] -> [G, M, N]     group g: M x k_g x N
        a [G, M, K]    @ b [G, K, N]  -> [G, M, N]       (no offsets) G x M x K x N

    so the MACs are (sum over groups of the jagged extent) x the two fixed extents, i.e.
    ``offs[-1]`` x the fixed extents. Without values the jagged extent is the whole dimension.
    MAdd is (2k - 1) an output of a group whose contraction is k long: a group of K split to
    k = 0 does no arithmetic (0, as :func:`dot_madd`), so its M x N outputs are not subtracted.
    """
    if a.dim() == 3 and b.dim() == 3:  # batched: one matmul per group
        g, m, k = a.shape
        n = b.shape[-1]
        return matmul_cost(g, m, k, n, bias_adds=g * m * n if has_bias else 0)
    if a.dim() == 2 and b.dim() == 3:  # rows of a are grouped; an output row holds N dots
        jagged, fixed, dots_per_unit = a.shape[0], a.shape[1] * b.shape[-1], b.shape[-1]
    elif a.dim() == 3 and b.dim() == 2:  # columns of b are grouped; an output column holds M
        jagged, fixed, dots_per_unit = b.shape[1], a.shape[1] * a.shape[2], a.shape[1]
    else:  # K is grouped: G x M x N outputs, whatever the split
        jagged, fixed, dots_per_unit = a.shape[1], a.shape[0] * b.shape[1], 0
    note, groups = None, offs.shape[0] if offs is not None else 1
    summed = groups  # the groups of a K split that sum anything (without values: all of them)
    if offs is not None and has_values(offs):
        ends = offs.detach().reshape(-1).long()
        jagged = int(ends[-1]) if ends.numel() else 0
        summed = int((ends.diff(prepend=ends.new_zeros(1)) > 0).sum())
    elif offs is not None:
        note = _OFFSETS_UNKNOWN
    macs = jagged * fixed
    n_out = jagged * dots_per_unit if dots_per_unit else groups * fixed
    bias_adds = n_out if has_bias else 0
    dots = jagged * dots_per_unit if dots_per_unit else summed * fixed
    madd = dot_madd(macs, dots) + bias_adds
    return Cost(macs, flops=2 * macs + bias_adds, madd=madd, note=note)


def _grouped(offs_at: int):
    """A grouped matmul ``(self, mat2, ..., offs, bias, ...)`` with ``offs`` at ``offs_at``."""

    def formula(args, kwargs, out) -> Cost:
        offs, bias = arg(args, kwargs, offs_at, "offs"), arg(args, kwargs, offs_at + 1, "bias")
        return grouped_mm_cost(args[0], args[1], offs, isinstance(bias, torch.Tensor))

    return formula


# (self, mat2, offs, ...); (self, mat2, scale_a, scale_b, offs, ...); (self, mat2, scale_a[],
# recipe_a, swizzle_a, scale_b[], recipe_b, swizzle_b, offs, ...)
_grouped_mm = register_ops("_grouped_mm")(_grouped(2))
_scaled_grouped_mm = register_ops("_scaled_grouped_mm")(_grouped(4))
_scaled_grouped_mm_v2 = register_ops("_scaled_grouped_mm_v2")(_grouped(8))


# -- pairwise distances -------------------------------------------------------------------------
@register_ops("_euclidean_dist")
def _euclidean_dist(args, kwargs, out) -> Cost:
    # cdist p=2 through a matmul: x1 [.., P, M], x2 [.., R, M] -> [.., P, R]
    #   dot products x1 @ x2^T: batch*P*R*M MACs; squared norms of the rows of x1 and x2:
    #   2 per input element (square, add); per output -2*dot + |a|^2 + |b|^2, clamp, sqrt: 5
    x1, x2 = args[0], args[1]
    m = x1.shape[-1]
    pairs = out.numel()
    macs = pairs * m
    elementwise = 2 * (x1.numel() + x2.numel()) + 5 * pairs
    return Cost(macs, flops=2 * macs + elementwise, madd=dot_madd(macs, pairs) + elementwise)


@register_ops("_cdist_forward")
def _cdist_forward(args, kwargs, out) -> Cost:
    # (x1 [.., P, M], x2 [.., R, M], p, compute_mode) -> [.., P, R], pair by pair:
    #   p = 2: M squared differences summed per pair = M MACs (as the matmul path counts them)
    #          + M subtractions + 1 square root;
    #   p = 0, 1, inf: subtract, abs (or !=), accumulate: 3 per element pair;
    #   other p: subtract, abs, pow, accumulate: 4 per element pair, + 1 root per pair.
    x1, p = args[0], float(arg(args, kwargs, 2, "p"))
    m = x1.shape[-1]
    pairs = out.numel()
    if p == 2.0:
        macs = pairs * m
        elementwise = pairs * m + pairs
        return Cost(macs, flops=2 * macs + elementwise, madd=dot_madd(macs, pairs) + elementwise)
    if p in (0.0, 1.0, float("inf")):
        return Cost(0, flops=3 * pairs * m)
    return Cost(0, flops=4 * pairs * m + pairs)
