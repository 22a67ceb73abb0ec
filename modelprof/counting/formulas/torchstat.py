"""Module formulas for ``to_dataframe(style="torchstat")``, where torchstat's convention differs
from the default ``flops - macs`` (its ``resnet18`` table is the reference):
    Linear:            in_features * out_features per sample, bias ignored; MAdd
                       (2 * in_features - 1) an output, bias ignored on either of torch's paths
                       (addmm, or a non-contiguous input's matmul and its own bias add).
    BatchNorm:         Flops numel, doubled when affine; MAdd 4 * numel, affine or not.
    pooling (max/avg, fixed and adaptive): Flops = numel of the input.
    Softmax:           MAdd 3n - 1 per softmax of length n (n exp, n - 1 adds, n divides).
"""

from __future__ import annotations

from math import prod

from torch import nn

from modelprof.counting.formulas.registry import dot_madd, register_formula
from modelprof.runtime import compat

__all__: list[str] = []


@register_formula(nn.Linear)
def _linear(module, input_shapes, output_shapes):
    tokens = prod(input_shapes[0][:-1]) if input_shapes else 0
    macs = tokens * module.in_features * module.out_features
    return {"Flops": macs, "MAdd": dot_madd(macs, tokens * module.out_features)}


@register_formula(compat.TORCHSTAT_NORM)
def _batch_norm(module, input_shapes, output_shapes):
    numel = prod(input_shapes[0]) if input_shapes else 0
    return {"Flops": numel * (2 if module.affine else 1), "MAdd": 4 * numel}


@register_formula(*compat.TORCHSTAT_POOLS)
def _pool(module, input_shapes, output_shapes):
    return {"Flops": prod(input_shapes[0]) if input_shapes else 0}


@register_formula(nn.Softmax)
def _softmax(module, input_shapes, output_shapes):
    shape = input_shapes[0] if input_shapes else ()
    if not shape:
        return {}
    n = shape[module.dim if module.dim is not None else -1]
    if n == 0:  # softmaxes of length 0: no work (and prod // n would divide by zero)
        return {"MAdd": 0}
    return {"MAdd": (prod(shape) // n) * (3 * n - 1)}
