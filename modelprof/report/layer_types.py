"""What kind of layer a row is (``conv``, ``linear``, ``attention``, ``norm``, ...), for
:meth:`modelprof.Report.by_layer_type`.

A row is typed by its module class when that is a ``torch.nn`` layer this table knows, else by
what it ran: the composition of its ops (a reduction with an inverse square root is a ``norm``,
as RMSNorm is written; only elementwise ops with a nonlinearity are an ``activation``, as GPT-2's
GELU is), else the op with the most FLOPs. So a ``(self)`` row, which carries its parent's class,
is typed by what it does (a ResNet block's residual add is ``elementwise``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["LAYER_TYPES", "layer_type", "op_layer_type"]

LAYER_TYPES: tuple[str, ...] = (
    *"conv linear matmul attention recurrent norm activation pool elementwise reduction".split(),
    *"embedding upsample dropout".split(),
    "data movement",
    "other",
    "loss",
    "optimizer",
)
"""Every type a row can get, in the order a summary lists ties (a training step's ``(loss)`` and
``(optimizer)`` rows are typed by their kind, not by their ops)."""


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# torch.nn (and torchvision.ops) layer classes, by class name.
_MODULE_TYPES: dict[str, str] = {}
for _kind, _classes in {
    "conv": "Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d LazyConv1d "
    "LazyConv2d LazyConv3d LazyConvTranspose1d LazyConvTranspose2d LazyConvTranspose3d",
    "linear": "Linear LazyLinear Bilinear NonDynamicallyQuantizableLinear",
    "attention": "MultiheadAttention",
    "recurrent": "LSTM GRU RNN LSTMCell GRUCell RNNCell",
    "norm": "BatchNorm1d BatchNorm2d BatchNorm3d LazyBatchNorm1d LazyBatchNorm2d LazyBatchNorm3d "
    "SyncBatchNorm LayerNorm GroupNorm InstanceNorm1d InstanceNorm2d InstanceNorm3d "
    "LazyInstanceNorm1d LazyInstanceNorm2d LazyInstanceNorm3d LocalResponseNorm "
    "CrossMapLRN2d RMSNorm FrozenBatchNorm2d",
    "activation": "ReLU ReLU6 RReLU GELU SiLU Mish Sigmoid Tanh Hardswish Hardsigmoid Hardtanh "
    "LeakyReLU ELU SELU CELU PReLU GLU Softplus Softsign Softshrink Hardshrink "
    "Tanhshrink Threshold LogSigmoid Softmax Softmin Softmax2d LogSoftmax",
    "pool": "MaxPool1d MaxPool2d MaxPool3d AvgPool1d AvgPool2d AvgPool3d AdaptiveAvgPool1d "
    "AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d "
    "AdaptiveMaxPool3d LPPool1d LPPool2d LPPool3d FractionalMaxPool2d FractionalMaxPool3d",
    "embedding": "Embedding EmbeddingBag",
    "upsample": "Upsample UpsamplingNearest2d UpsamplingBilinear2d",
    "dropout": "Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout",
    "data movement": "Flatten Unflatten Identity PixelShuffle PixelUnshuffle ChannelShuffle "
    "ZeroPad1d ZeroPad2d ZeroPad3d ConstantPad1d ConstantPad2d ConstantPad3d "
    "ReflectionPad1d ReflectionPad2d ReflectionPad3d ReplicationPad1d "
    "ReplicationPad2d ReplicationPad3d CircularPad1d CircularPad2d CircularPad3d",
}.items():
    _MODULE_TYPES.update(dict.fromkeys(_names(_classes), _kind))

# aten ops (name without overload) whose kind their tags cannot tell.
_OP_TYPES: dict[str, str] = {}
for _kind, _ops in {
    "conv": "convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d "
    "conv_transpose3d mkldnn_convolution cudnn_convolution cudnn_convolution_transpose "
    "miopen_convolution _slow_conv2d_forward slow_conv3d_forward thnn_conv2d "
    "convolution_overrideable _convolution_mode",
    "linear": "addmm mm linear _addmm_activation mkldnn_linear _mkldnn_linear",
    "matmul": "bmm baddbmm addbmm matmul einsum dot vdot mv addmv addr outer tensordot",
    "attention": "scaled_dot_product_attention _scaled_dot_product_attention_math "
    "_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu "
    "_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention "
    "_scaled_dot_product_fused_attention_overrideable _flash_attention_forward "
    "_efficient_attention_forward _native_multi_head_attention "
    "_transformer_encoder_layer_fwd flex_attention",
    "recurrent": "lstm gru rnn_tanh rnn_relu mkldnn_rnn_layer _thnn_fused_lstm_cell "
    "_thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell",
    "norm": "native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training "
    "_native_batch_norm_legit_functional batch_norm _batch_norm_impl_index "
    "_batch_norm_with_update _batch_norm_no_update cudnn_batch_norm miopen_batch_norm "
    "native_layer_norm layer_norm native_group_norm group_norm instance_norm "
    "_fused_rms_norm rms_norm",
    "activation": "relu relu_ relu6 gelu gelu_ silu silu_ mish mish_ sigmoid sigmoid_ tanh tanh_ "
    "hardswish hardswish_ hardsigmoid hardsigmoid_ hardtanh hardtanh_ leaky_relu "
    "leaky_relu_ elu elu_ selu selu_ celu celu_ softplus softshrink hardshrink glu "
    "_prelu_kernel prelu rrelu_with_noise threshold threshold_ log_sigmoid_forward "
    "softmax _softmax log_softmax _log_softmax _safe_softmax",
    "pool": "max_pool1d max_pool2d max_pool3d max_pool2d_with_indices max_pool3d_with_indices "
    "mkldnn_max_pool2d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d "
    "adaptive_avg_pool2d adaptive_avg_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d "
    "mkldnn_adaptive_avg_pool2d adaptive_max_pool1d adaptive_max_pool2d "
    "adaptive_max_pool3d fractional_max_pool2d fractional_max_pool3d",
    "reduction": "sum mean amax amin max min prod var std var_mean std_mean norm "
    "linalg_vector_norm logsumexp argmax argmin cumsum",
    "embedding": "embedding _embedding_bag embedding_bag _embedding_bag_forward_only",
    "upsample": "upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_bilinear2d "
    "upsample_bicubic2d upsample_linear1d upsample_trilinear3d _upsample_nearest_exact2d "
    "_upsample_bilinear2d_aa grid_sampler_2d",
    "dropout": "dropout native_dropout bernoulli bernoulli_",
    "data movement": "cat stack copy_ clone _to_copy contiguous constant_pad_nd pad "
    "reflection_pad1d reflection_pad2d replication_pad2d index index_select "
    "gather scatter slice_scatter select_scatter repeat roll flip "
    "_unsafe_view pixel_shuffle pixel_unshuffle channel_shuffle "
    "native_channel_shuffle split_with_sizes_copy unbind_copy",
}.items():
    _OP_TYPES.update(dict.fromkeys(_names(_ops), _kind))

# ops that only allocate: they say nothing about what a row does
_FACTORIES = _names(
    "empty empty_like zeros zeros_like ones ones_like full full_like new_empty "
    "new_zeros new_ones new_full empty_strided arange scalar_tensor lift_fresh"
)


def _base(op: str) -> str:
    """``"zeros"`` of ``"aten.zeros.default"``, ``"zeros.default"`` or ``"zeros"``."""
    return op.removeprefix("aten.").split(".")[0]


def op_layer_type(op: str) -> str:
    """The layer type of one aten op (``"aten.relu_.default"``, ``"relu_.default"``, ``"relu_"``):
    the tables above, then the op's ``pointwise`` tag (``elementwise``), else ``other``."""
    base = _base(op)
    if base in _OP_TYPES:
        return _OP_TYPES[base]
    packet = getattr(torch.ops.aten, base, None)
    if packet is not None:
        try:
            overloads = [getattr(packet, o) for o in packet.overloads()]
        except (AttributeError, RuntimeError):
            overloads = []
        if any(torch.Tag.pointwise in o.tags for o in overloads):
            return "elementwise"
    return "other"


# the ops that make a composition of elementwise ops an activation (cos/sin are not: rotary
# embeddings use them), and the ones that make a reduction a normalisation
_NONLINEAR = _names(
    "tanh erf erfc sigmoid exp expm1 softplus clamp_min clamp hardtanh log_sigmoid_forward"
)
_CASTS = _names("_to_copy clone contiguous copy_ alias detach")  # a dtype round trip around it
_INV_SQRT = _names("rsqrt sqrt")
_NORM_REDUCTIONS = _names("mean var var_mean std std_mean sum norm linalg_vector_norm")
_CONTRACTIONS = frozenset({"conv", "linear", "matmul", "attention", "recurrent"})


def _composite_type(ops: Mapping[str, int]) -> str | None:
    """``norm`` or ``activation`` for a row whose ops compose one (see the module docstring),
    else None."""
    bases = {_base(op) for op in ops} - _CASTS
    kinds = {op_layer_type(b) for b in bases}
    if kinds & _CONTRACTIONS:
        return None
    if bases & _INV_SQRT and bases & _NORM_REDUCTIONS:
        return "norm"
    if kinds <= {"elementwise", "activation"} and (bases & _NONLINEAR or "activation" in kinds):
        return "activation"
    return None


def layer_type(module_type: str, ops: Mapping[str, int], *, is_self: bool = False) -> str:
    """The layer type of a row: its ``torch.nn`` class when known (not for a ``(self)`` row),
    else the composition of its ops, else its dominant op (most FLOPs; the first that is not an
    allocation among ops without FLOPs), else ``other``."""
    if not is_self and module_type in _MODULE_TYPES:
        return _MODULE_TYPES[module_type]
    if is_self and module_type == "MultiheadAttention":
        return "attention"  # its own ops are the attention itself (in-projection, softmax, bmm)
    doing = {op: f for op, f in ops.items() if _base(op) not in _FACTORIES}
    if not doing:
        return "other"
    composite = _composite_type(doing)
    if composite is not None:
        return composite
    best = max(doing.items(), key=lambda kv: kv[1])[0]  # first op wins a tie (dicts keep order)
    return op_layer_type(best)
