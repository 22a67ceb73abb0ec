"""Elementwise ops, activations, softmax, reductions and interpolation.

Per-element costs (documented convention):
    elementwise arithmetic, comparisons, activations (relu, gelu, silu, hardswish, sigmoid,
    tanh, ...): 1 flop per *output* element (broadcasting counts the output).
    softmax / log_softmax: 5 per element (max, subtract, exp, sum, divide or log-subtract).
    reductions (sum, mean, max, argmax, ...): 1 per *input* element;
    var/std: 3 per input element; vector norms: 2 per input element.
    interpolation: a weighted sum of the 2^d (linear) or 4^d (cubic) neighbours,
    2n - 1 flops per output for n neighbours; nearest is a gather, 0 flops; antialiased, a
    pass a dimension over the taps its scaled filter covers.
"""

from __future__ import annotations

import functools
from math import prod
from typing import Any

import torch

from modelprof.counting.formulas.registry import (
    Cost,
    arg,
    optional_ops,
    register_formula,
    register_ops,
)
from modelprof.runtime.tensors import iter_tensors

__all__ = ["SOFTMAX_FLOPS_PER_ELEMENT", "elementwise", "reduction"]

aten = torch.ops.aten

SOFTMAX_FLOPS_PER_ELEMENT = 5


def elementwise(per_output: int = 1):
    """Family factory: ``per_output`` flops for every element of the (first) output."""

    def formula(args, kwargs, out) -> Cost:
        t = out if isinstance(out, torch.Tensor) else next(iter_tensors(out), None)
        return Cost(0, flops=per_output * (t.numel() if t is not None else 0))

    return formula


def reduction(per_input: int = 1):
    """Family factory: ``per_input`` flops for every element of the reduced input."""

    def formula(args, kwargs, out) -> Cost:
        return Cost(0, flops=per_input * args[0].numel())

    return formula


# Every op the dispatcher tags pointwise: add, mul, relu_, gelu, where, eq, clamp, ...
register_formula(torch.Tag.pointwise)(elementwise(1))

# Activations and other elementwise ops whose in-place or out-of-place overloads carry no
# pointwise tag (those of _WITH_INPLACE in both forms).
_WITH_INPLACE = ("hardswish", "hardtanh", "elu", "selu", "celu", "threshold", "mish", "bernoulli")
_SCATTERS = ("index_add", "scatter_add", "scatter_reduce", "tril", "triu")
register_ops(
    """hardsigmoid_ relu6 leaky_relu_ glu prelu _prelu_kernel rrelu_with_noise softplus
    softshrink hardshrink log_sigmoid_forward silu_ gelu_ clamp_ clamp_min_ clamp_max_
    masked_fill_ sgn _conj_physical logical_not_""",
    *(name for op in _WITH_INPLACE + _SCATTERS for name in (op, f"{op}_")),
)(elementwise(1))
# fused elementwise ops cost their arithmetic: t + value * a * b, t + value * a / b and
# a + w * (b - a) are 3 per element (as optim.py's Adam counts them), so an optimizer counted
# op by op costs what its formula would
register_ops("addcmul addcmul_ addcdiv addcdiv_ lerp lerp_")(elementwise(3))


def _scaled(alpha: Any) -> bool:
    """An add or sub that scales its second operand (``alpha`` other than 1: 2, 0.5, 1 + 1j)."""
    return bool(alpha != 1)


@register_ops("add add_ sub sub_ rsub")
def _add(args, kwargs, out) -> Cost:
    # x + alpha * y is a multiply and an add an element where alpha is not 1: SGD's update
    # p.add_(g, alpha=-lr) costs 2, as its formula counts it (1 with alpha 1, as pointwise)
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    return elementwise(2 if _scaled(alpha) else 1)(args, kwargs, out)


def per_listed(per_element: int):
    """Family factory: a ``_foreach_`` op (the multi-tensor form an optimizer's ``foreach``
    path runs), ``per_element`` flops for every element of its first list of tensors, as the
    single-tensor ops count it tensor by tensor."""

    def formula(args, kwargs, out) -> Cost:  # (_foreach_pow.ScalarAndTensor: a scalar first)
        first = next((a for a in args if isinstance(a, (list, tuple))), ())
        return Cost(0, flops=per_element * sum(t.numel() for t in iter_tensors(first)))

    return formula


_FOREACH_ONE = """abs acos asin atan ceil clamp_max clamp_min cos cosh div erf erfc exp expm1
floor frac lgamma log log10 log1p log2 maximum minimum mul neg pow reciprocal round rsqrt
sigmoid sign sin sinh sqrt tan tanh trunc"""
register_ops(*(f"_foreach_{n}{form}" for n in _FOREACH_ONE.split() for form in ("", "_")))(
    per_listed(1)
)
register_ops(
    *(f"_foreach_{n}{form}" for n in ("addcmul", "addcdiv", "lerp") for form in ("", "_"))
)(per_listed(3))


@register_ops("_foreach_add _foreach_add_ _foreach_sub _foreach_sub_")
def _foreach_add(args, kwargs, out) -> Cost:
    # (lists; alpha only by keyword): 2 an element where alpha scales the second list, as _add
    return per_listed(2 if _scaled(kwargs.get("alpha", 1)) else 1)(args, kwargs, out)


register_ops("_foreach_max")(per_listed(1))  # a reduction of each tensor: 1 per element read
register_ops("_foreach_norm")(per_listed(2))  # as a vector norm's 2 per element


@register_ops("dropout native_dropout")
def _dropout(args, kwargs, out) -> Cost:
    # (input, p, train): in eval the op returns its input (0 flops, as when it is not run at
    # all); in training 3 per element — draw the mask, scale by 1/(1-p), multiply — as the
    # unfused path (bernoulli_, div_, mul) counts it
    train = arg(args, kwargs, 2, "train", True)
    return elementwise(0 if train is False else 3)(args, kwargs, out)


register_ops("_softmax _log_softmax _safe_softmax softmax log_softmax special_softmax")(
    elementwise(SOFTMAX_FLOPS_PER_ELEMENT)
)

_REDUCTIONS = """sum mean amax amin max min argmax argmin prod cumsum cumprod logsumexp all any
count_nonzero aminmax nansum cummax cummin median nanmedian mode kthvalue topk sort argsort"""
register_formula(*(getattr(aten, name) for name in _REDUCTIONS.split()))(reduction(1))
# col2im (nn.Fold) sums overlapping patches: one add per patch element it reads, as a sum
register_formula(aten.col2im)(reduction(1))
register_formula(aten.var, aten.std, aten.var_mean, aten.std_mean)(reduction(3))
register_formula(
    aten.linalg_vector_norm, aten.norm, *optional_ops("_linalg_vector_norm", "frobenius_norm")
)(reduction(2))


def _interpolation(neighbours: int):
    return elementwise(2 * neighbours - 1 if neighbours > 1 else 0)


_NEAREST = ("upsample_nearest", "_upsample_nearest_exact")
register_ops(*(f"{n}{d}d" for n in _NEAREST for d in (1, 2, 3)))(_interpolation(1))
register_ops("upsample_linear1d")(_interpolation(2))
register_ops("upsample_bilinear2d cudnn_grid_sampler")(_interpolation(4))
register_ops("upsample_trilinear3d")(_interpolation(8))


def _grid_sampler(neighbours: tuple[int, ...]):
    """``grid_sample`` by its ``interpolation_mode`` (argument 2): its neighbours for
    bilinear/trilinear (0), nearest (1, a gather) and bicubic (2)."""
    formulas = [_interpolation(n) for n in neighbours]

    def formula(args, kwargs, out) -> Cost:
        return formulas[int(arg(args, kwargs, 2, "interpolation_mode", 0))](args, kwargs, out)

    return formula


register_ops("grid_sampler_2d")(_grid_sampler((4, 1, 16)))
register_ops("grid_sampler_3d")(_grid_sampler((8, 1)))
register_ops("upsample_bicubic2d")(_interpolation(16))


def _antialiased(size: int):
    """An antialiased resize (``interpolate(antialias=True)``) runs one pass a resized
    dimension, last first, as ATen does; an output of a pass is a weighted sum of the taps its
    filter covers, 2n - 1 flops for n taps. Downsampling by s widens the filter (``size``: 2
    linear, 4 cubic) s times, so a tap count grows with the scale."""

    def formula(args, kwargs, out) -> Cost:
        x = args[0]
        corners = bool(arg(args, kwargs, 2, "align_corners", False))
        given = _given_scales(args, kwargs)
        shape, flops = list(x.shape), 0
        for d in (3, 2):
            n_in, n_out = x.shape[d], out.shape[d]
            if n_in == n_out:
                continue  # (ATen skips that pass)
            shape[d] = n_out
            taps = _filter_taps(n_in, _scale(n_in, n_out, corners, given[d - 2]), n_out, size)
            outputs = prod(shape)
            flops += 2 * taps * (outputs // n_out) - outputs
        return Cost(0, flops=flops)

    return formula


def _given_scales(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """The (height, width) scale factors a resize was given: ``scales_h``/``scales_w``, or the
    ``.vec`` overload's ``scale_factors``; None where none was."""
    third = args[3] if len(args) > 3 else kwargs.get("scales_h", kwargs.get("scale_factors"))
    if isinstance(third, (list, tuple)):  # (.vec)
        return (third[0], third[1]) if len(third) == 2 else (None, None)
    return third, arg(args, kwargs, 4, "scales_w", None)


def _scale(n_in: int, n_out: int, corners: bool, given: Any) -> float:
    """Input pixels an output step, as ATen's ``area_pixel_compute_scale``: with
    ``align_corners`` (n_in - 1) / (n_out - 1) (0 for one output), else 1 / the scale factor
    given, else n_in / n_out."""
    if corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / given if given is not None and given > 0 else n_in / n_out


@functools.lru_cache(maxsize=256)
def _filter_taps(n_in: int, scale: float, n_out: int, size: int) -> int:
    """The taps of all ``n_out`` outputs of one dimension, as ATen's antialias weights bound
    them (``_compute_indices_min_size_weights_aa``)."""
    support = size / 2 * max(scale, 1.0)
    total = 0
    for i in range(n_out):
        center = scale * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        total += min(int(center + support + 0.5), n_in) - low
    return total


register_ops("_upsample_bilinear2d_aa")(_antialiased(2))
register_ops("_upsample_bicubic2d_aa")(_antialiased(4))
