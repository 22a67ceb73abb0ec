"""Quantized (int8) ops: ``quantized::`` convolutions and linear layers (weights packed in a
``torch.ScriptObject``) with their fused add/ReLU forms, the other quantized ops, and
quantize/dequantize.

Conventions (the float ones, applied to the integer arithmetic):
    conv / linear / matmul  MACs of the product, from the unpacked weight's shape; + 1 per
                            output for a bias and for each fused add or ReLU. The scale
                            conversions inside the kernel (requantising the int32 accumulators,
                            quantising a dynamic op's float input) are not counted.
    quantize / dequantize   1 per element (a scale and shift); dynamic range: + 1 per element.
    elementwise, norms, pools, softmax: as their float counterparts.
The packed weights are the layer's parameters, charged to the call that uses them (elements
once, bytes at every call).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from math import prod
from typing import Any

import torch

from modelprof.counting.formulas.conv import conv_cost
from modelprof.counting.formulas.matmul import low_precision_mm, matmul_cost
from modelprof.counting.formulas.memory import embedding_bag
from modelprof.counting.formulas.norm import norm_cost
from modelprof.counting.formulas.pointwise import SOFTMAX_FLOPS_PER_ELEMENT, elementwise
from modelprof.counting.formulas.pool import pool_cost
from modelprof.counting.formulas.registry import (
    REGISTRY,
    Cost,
    first,
    optional_ops,
    register_ops,
    register_present,
    zero,
)
from modelprof.counting.formulas.rnn import rnn_layers
from modelprof.runtime.tensors import stored_nbytes

__all__ = ["held_packed_weights", "module_packed_weights", "packed_size", "packed_weights"]

_quantized = functools.partial(register_ops, namespace="quantized")  # quantized:: ops by name


def _cell_state(obj: Any) -> tuple | None:
    """The state ``(kind, tensors, doubles, longs, packed)`` of a ``CellParamsBase`` (a
    dynamically quantized RNN layer), None for another object, ``()`` where unreadable."""
    if "CellParamsBase" not in str(getattr(obj, "_type", lambda: "")()):
        return None
    try:
        return tuple(obj.__getstate__()[0])
    except Exception:  # noqa: BLE001 - a layout this torch does not write: nothing to count
        return ()


def _cell_params(obj: Any) -> list[Any] | None:
    """The packed linear weights (input-hidden, hidden-hidden) of a ``CellParamsBase``, or None
    for another object: its tensors repeat the packed biases, so only ``packed`` counts."""
    state = _cell_state(obj)
    if state is None:
        return None
    return [p for p in state[4] if isinstance(p, torch.ScriptObject)] if len(state) > 4 else []


def packed_weights(obj: Any) -> list[torch.Tensor]:
    """The tensors (weight, bias) a packed-params object holds; [] if it cannot say."""
    cells = _cell_params(obj)
    if cells is not None:
        return [t for p in cells for t in packed_weights(p)]
    try:
        unpacked = obj.unpack()
    except Exception:  # noqa: BLE001 - not a packed-params object of a known kind
        return []
    if isinstance(unpacked, torch.Tensor):
        return [unpacked]
    found: list[torch.Tensor] = []
    for item in unpacked if isinstance(unpacked, (tuple, list)) else ():
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):  # (weight, bias) nested in a tuple
            found.extend(t for t in item if isinstance(t, torch.Tensor))
    return found


def packed_size(obj: Any, op: str) -> tuple[int, int]:
    """``(elements, bytes)`` of the tensors a packed-params object keeps, in one unpack; the
    bytes as :func:`stored_nbytes` counts them (an int8 weight with its per-channel scales and
    zero points). A float16 one (``quantize_dynamic(dtype=torch.float16)``: an ``_fp16`` op's,
    an RNN layer's of kind ``quantized_fp16``) keeps its weight matrices in half precision,
    though ``unpack`` returns them in float32: 2 bytes an element; its bias stays float32."""
    tensors = packed_weights(obj)
    state = _cell_state(obj)
    half = "_fp16" in op or bool(state) and state[0] == "quantized_fp16"
    stored = sum(
        t.numel() * 2 if half and t.dim() > 1 and t.is_floating_point() else stored_nbytes(t)
        for t in tensors
    )
    return sum(t.numel() for t in tensors), stored


def held_packed_weights(attributes: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """``(elements, bytes)`` of the packed weights (quantized layers', no ``nn.Parameter``) that
    modules hold as ``torch.ScriptObject`` values of these attribute dicts (their ``vars``),
    each object once (:func:`packed_size`; a module whose ``dtype`` is float16 keeps
    half-precision weights)."""
    seen: set[int] = set()
    elements = stored = 0
    script = torch.ScriptObject  # its exact type: isinstance against it costs 4x as much
    for attrs in attributes:
        for value in attrs.values():
            if type(value) is script and id(value) not in seen:
                seen.add(id(value))
                half = attrs.get("dtype") == torch.float16
                n, nbytes = packed_size(value, "_fp16" if half else "")
                elements += n
                stored += nbytes
    return elements, stored


def module_packed_weights(model: Any) -> tuple[int, int]:
    """:func:`held_packed_weights` of ``model``'s modules."""
    return held_packed_weights(map(vars, model.modules()))


def _packed(args: tuple) -> Any:
    return next(a for a in args if isinstance(a, torch.ScriptObject))


def _weight_bias(packed: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight, bias = packed.unpack()[:2]
    return weight, bias if isinstance(bias, torch.Tensor) else None


# -- convolutions -------------------------------------------------------------------------------
def _conv(fused_per_output: int):
    def formula(args, kwargs, out) -> Cost:
        # (qx, [qaccum,] packed_weight, ...): weight [C_out, C_in/g, *k] (transposed:
        # [C_in, C_out/g, *k]); the packed params know whether they are transposed
        packed = _packed(args)
        weight, bias = _weight_bias(packed)
        transposed = bool(packed.transpose()) if hasattr(packed, "transpose") else False
        return conv_cost(args[0], weight, bias, first(out), transposed, fused_per_output)

    return formula


_DIMS = ("1d", "2d", "3d")
_PLAIN_CONVS = [
    f"conv{t}{d}{dyn}" for t in ("", "_transpose") for d in _DIMS for dyn in ("", "_dynamic")
]
_quantized(*_PLAIN_CONVS)(_conv(0))
_quantized(*(f"conv{d}_{f}" for d in _DIMS for f in ("relu", "add")))(_conv(1))
_quantized(*(f"conv{d}_add_relu" for d in _DIMS))(_conv(2))


# -- linear and matmul ----------------------------------------------------------------------------
def _linear(fused_per_output: int):
    def formula(args, kwargs, out) -> Cost:
        # (X [..., in], packed W [out, in] (or a plain weight tensor), ...) -> [..., out]
        x = next(a for a in args if isinstance(a, torch.Tensor))
        if any(isinstance(a, torch.ScriptObject) for a in args):
            weight, bias = _weight_bias(_packed(args))
        else:  # linear_dynamic_fp16_unpacked_weight(X, weight, bias)
            weight, bias = args[1], args[2] if len(args) > 2 else None
        tokens = x.numel() // x.shape[-1] if x.dim() else 1
        n, k = weight.shape[0], weight.shape[1]
        extra = tokens * n * (fused_per_output + (1 if isinstance(bias, torch.Tensor) else 0))
        return matmul_cost(1, tokens, k, n, bias_adds=extra)

    return formula


_quantized(
    """linear linear_dynamic linear_dynamic_fp16 linear_dynamic_fp16_unpacked_weight
    linear_with_input_q_dq_qweight_dq_output_fp32"""
)(_linear(0))
_quantized(
    """linear_relu linear_relu_dynamic linear_relu_dynamic_fp16 linear_leaky_relu linear_tanh
    linear_with_input_q_dq_qweight_dq_relu_output_fp32"""
)(_linear(1))
# (qa [..., m, k], qb [..., k, n], scale, zero_point): every output a length-k dot product
_quantized("matmul")(low_precision_mm)


# -- elementwise, norms, pools, embeddings ------------------------------------------------------
_ARITHMETIC = ("add", "add_scalar", "mul", "mul_scalar")  # each with an ``_out`` form
_quantized(
    "relu6 sigmoid hardswish elu celu leaky_relu threshold clamp prelu cat_relu cat_relu_out",
    *(f"{op}{out}" for op in _ARITHMETIC for out in ("", "_out")),
)(elementwise(1))
_quantized(*(f"{op}_relu{out}" for op in _ARITHMETIC for out in ("", "_out")))(elementwise(2))
_quantized("softmax")(elementwise(SOFTMAX_FLOPS_PER_ELEMENT))
_quantized("cat cat_out dropout")(zero)


def _batch_norm(fused_per_output: int):
    def formula(args, kwargs, out) -> Cost:
        # (qx, weight, bias, mean, var, eps, output_scale, output_zero_point): known statistics
        n_affine = sum(isinstance(t, torch.Tensor) for t in args[1:3])
        cost = norm_cost(args[0].numel(), False, n_affine)
        return Cost(0, flops=cost.resolved()[1] + fused_per_output * args[0].numel())

    return formula


_quantized("batch_norm batch_norm1d batch_norm2d batch_norm3d")(_batch_norm(0))
_quantized("batch_norm_relu batch_norm1d_relu batch_norm2d_relu batch_norm3d_relu")(_batch_norm(1))


@_quantized("layer_norm group_norm instance_norm")
def _stat_norm(args, kwargs, out) -> Cost:
    # statistics computed from the input; weight and bias are the tensors among the arguments
    n_affine = sum(isinstance(t, torch.Tensor) for t in args[1:]) if len(args) > 1 else 0
    return norm_cost(args[0].numel(), True, min(n_affine, 2))


@_quantized("max_pool1d max_pool2d")
def _max_pool(args, kwargs, out) -> Cost:
    # (qx, kernel_size, stride, padding, dilation, ceil_mode)
    kernel = list(args[1]) if not isinstance(args[1], int) else [args[1]]
    return pool_cost(first(out).numel(), prod(kernel), "max")


# (weight, indices, offsets, scale_grad_by_freq, mode, pruned_weights, per_sample_weights,
#  compressed_indices_mapping, include_last_offset): the float EmbeddingBag's count, with no
#  padding_idx
_quantized(
    *(f"embedding_bag_{b}{o}" for b in ("byte", "4bit", "2bit") for o in ("", "_rowwise_offsets"))
)(embedding_bag(8, None))


_PACKED_CONVS = ("conv", "conv1d", "conv2d", "conv3d", *(f"conv_transpose{d}d" for d in (1, 2, 3)))
_quantized(
    """embedding_byte embedding_4bit conv2d_unpack_sizes linear_prepack linear_prepack_fp16
    linear_prepack_legacy linear_prepack_fp16_legacy linear_unpack linear_unpack_fp16
    embedding_bag_prepack embedding_bag_unpack""",
    *(f"{c}_{p}" for c in _PACKED_CONVS for p in ("prepack", "unpack")),
    *(f"make_quantized_cell_params{k}" for k in ("", "_dynamic", "_fp16")),
    *(
        f"conv{d}_{a}"
        for d in ("2d", "3d", "_transpose2d", "_transpose3d")
        for a in ("stride", "padding", "dilation", "groups", "output_padding", "transpose")
    ),
)(zero)


# -- quantize / dequantize (aten) ----------------------------------------------------------------
register_ops(
    """quantize_per_tensor quantize_per_channel dequantize fake_quantize_per_tensor_affine
    fake_quantize_per_channel_affine"""
)(elementwise(1))
register_ops("quantize_per_tensor_dynamic")(elementwise(2))
register_ops(
    """q_scale q_zero_point q_per_channel_scales q_per_channel_zero_points q_per_channel_axis
    qscheme int_repr _make_per_tensor_quantized_tensor _make_per_channel_quantized_tensor"""
)(zero)


# -- higher-order operators of quantization flows -------------------------------------------------
@register_ops("out_dtype", namespace="higher_order")
def _out_dtype(args, kwargs, out) -> Cost:
    # out_dtype(op, output_dtype, *op_args): the op, accumulating in another dtype (int8 mm)
    formula = REGISTRY.lookup(args[0])
    if formula is None:
        return Cost(0, flops=0, note=f"out_dtype around {args[0]}, which has no formula: 0")
    return formula(tuple(args[2:]), kwargs, out)


register_ops("print", namespace="higher_order")(zero)


# -- dynamically quantized RNNs (quantize_dynamic on nn.LSTM / nn.GRU) ---------------------------
def _input_overloads(*names: str) -> list:
    """The ``.input`` overloads (padded input; ``.data`` takes a PackedSequence's data)."""
    return [p.input for p in optional_ops(*names) if hasattr(p, "input")]


# (input, hx, CellParamsBase[] (one per layer and direction), ...): the float RNN's gate
# matmuls, from the unpacked weights' shapes (int8 or fp16 arithmetic, the same products)
register_present(*_input_overloads("quantized_lstm"))(rnn_layers("lstm", packed_weights))
register_present(*_input_overloads("quantized_gru"))(rnn_layers("gru", packed_weights))
