"""Normalisations: batch (eval and train), layer, group, instance (via batch norm), RMS.

Per element: statistics computed from the input (train batch norm, layer/group norm) 3 flops
(1 add for the mean, 1 subtract + 1 multiply-add folded as 2 for the variance); normalising with
them ((x - mean) * inv_std) 2; affine weight and bias 1 each. So eval BatchNorm with affine costs
4 — torchstat's MAdd for BatchNorm2d. RMS norm: 2 for the mean of squares, 1 to scale, 1 weight.
"""

from __future__ import annotations

import torch

from modelprof.counting.formulas.registry import (
    Cost,
    arg,
    optional_ops,
    register_formula,
    register_ops,
)

__all__ = ["NORM_FLOPS_PER_ELEMENT", "norm_cost"]

aten = torch.ops.aten

NORM_FLOPS_PER_ELEMENT = {"stats": 3, "normalize": 2, "affine": 2}


def norm_cost(numel: int, computes_stats: bool, n_affine: int) -> Cost:
    """``n_affine`` is how many of weight/bias are present (0, 1 or 2)."""
    per = NORM_FLOPS_PER_ELEMENT["normalize"] + n_affine
    if computes_stats:
        per += NORM_FLOPS_PER_ELEMENT["stats"]
    return Cost(0, flops=per * numel)


def _n_affine(*tensors) -> int:
    return sum(isinstance(t, torch.Tensor) for t in tensors)


@register_formula(
    aten.native_batch_norm,
    *optional_ops("cudnn_batch_norm", "miopen_batch_norm", "_native_batch_norm_legit"),
)
def _batch_norm(args, kwargs, out) -> Cost:
    # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    stats = bool(arg(args, kwargs, 5, "training", False)) or not isinstance(args[3], torch.Tensor)
    return norm_cost(args[0].numel(), stats, _n_affine(args[1], args[2]))


def _norm(computes_stats: bool, weight_at: int):
    """A norm whose weight and bias are the arguments at ``weight_at`` and after."""

    def formula(args, kwargs, out) -> Cost:
        n_affine = _n_affine(args[weight_at], args[weight_at + 1])
        return norm_cost(args[0].numel(), computes_stats, n_affine)

    return formula


# (input, weight, bias, running_mean, running_var, momentum, eps): statistics given or updated
register_ops("_native_batch_norm_legit_no_training _batch_norm_no_update")(_norm(False, 1))
register_ops("_batch_norm_with_update _batch_norm_with_update_functional")(_norm(True, 1))
register_formula(aten.native_layer_norm)(_norm(True, 2))  # (input, normalized_shape, weight, bias)
register_formula(aten.native_group_norm)(_norm(True, 1))  # (input, weight, bias, N, C, HxW, ...)


@register_ops("_fused_rms_norm rms_norm")
def _rms_norm(args, kwargs, out) -> Cost:
    # (input, normalized_shape, weight, eps): mean of squares (2), scale (1), weight (1)
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    return Cost(0, flops=(3 + _n_affine(weight)) * args[0].numel())
