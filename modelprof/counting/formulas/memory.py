"""Ops that only move, create or gather data: 0 flops, but their bytes count (see the counter).
Views (``OpOverload.is_view``, the ``inplace_view`` tag, and the aliasing-like ops VIEW marks
where the schema does not say so) are free: no flops, no bytes.
"""

from __future__ import annotations

import torch

from modelprof.counting.formulas.registry import (
    ZERO,
    Cost,
    arg,
    first,
    register_formula,
    register_ops,
    zero,
)
from modelprof.counting.formulas.values import has_values

__all__ = ["VIEW", "bag_entries", "embedding_bag", "embedding_bag_cost"]


def VIEW(args, kwargs, out):  # noqa: N802 - a sentinel formula
    """Metadata only: no arithmetic, no data movement."""
    return ZERO


register_formula(torch.Tag.inplace_view)(VIEW)
register_ops(
    """_unsafe_view unsafe_split unsafe_split_with_sizes unsafe_chunk _reshape_alias lift
    lift_fresh set_ resize_ resize_as_ _local_scalar_dense _assert_async _assert_scalar
    _assert_tensor_metadata _functional_assert_async sym_size sym_stride sym_numel
    sym_storage_offset _make_dep_token record_stream _has_same_storage_numel is_same_size
    _shape_as_tensor""",
    # queries that return a number, not data
    *"dim _fused_sdp_choice _nested_tensor_from_mask_left_aligned".split(),
    # nested tensors: views of a buffer and their metadata
    *"_nested_view_from_buffer _nested_view_from_jagged".split(),
    *(f"_nested_get_{x}" for x in "values offsets lengths ragged_idx".split()),
    *(f"_nested_get_{x}" for x in "min_seqlen max_seqlen jagged_dummy".split()),
    *(f"_nested_tensor_{x}" for x in ("size", "strides", "storage_offsets")),
    "_nested_compute_contiguous_strides_offsets",
)(VIEW)

# profiler bookkeeping (torch.optim wraps every step in record_function): no work
register_ops(
    "_record_function_enter _record_function_enter_new _record_function_exit",
    namespace="profiler",
)(VIEW)

# view ops whose ``_copy`` variants copy; ops with an in-place ``_`` variant
_RESHAPES = ("view", "_unsafe_view", "as_strided", "permute", "expand", "transpose", "t")
_PARTS = ("unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "unbind")
_WITH_INPLACE = ("scatter", "index_put", "index_fill", "index_copy", "masked_scatter")
# copies and layout changes
register_ops(
    """clone copy_ _to_copy _copy_from _copy_from_and_resize contiguous lift_fresh_copy
    _foreach_copy_ _foreach_clone _foreach_zero_
    alias_copy detach_copy to_mkldnn to_dense _to_dense mkldnn_reorder_conv2d_weight""",
    *(f"{v}_copy" for v in _RESHAPES + _PARTS),
)(zero)
# joins, gathers, scatters, padding, shuffles
register_ops(
    """cat stack hstack vstack index index_select gather _index_put_impl_ masked_select take
    constant_pad_nd _pad_circular roll flip repeat repeat_interleave tile pixel_shuffle
    pixel_unshuffle channel_shuffle native_channel_shuffle im2col embedding one_hot
    nonzero nonzero_static _unique2 unique_dim unique_consecutive searchsorted bucketize
    flatten_dense_tensors unflatten_dense_tensors""",
    *(name for op in _WITH_INPLACE for name in (op, f"{op}_")),
    *(f"{x}_scatter" for x in ("slice", "select", "diagonal", "as_strided")),
    *(f"{mode}_pad{d}d" for mode in ("reflection", "replication") for d in (1, 2, 3)),
)(zero)
# creation
register_ops(
    """empty_strided new_empty_strided fill fill_ zero_ arange linspace logspace scalar_tensor
    eye tril_indices triu_indices randperm normal normal_ uniform_ random_ exponential_
    multinomial _efficientzerotensor tensor_split""",
    *(f"{x}{form}" for x in ("empty", "zeros", "ones", "full") for form in ("", "_like")),
    *(f"new_{x}" for x in ("empty", "zeros", "ones", "full")),
    *(f"{x}{form}" for x in ("rand", "randn", "randint") for form in ("", "_like")),
)(zero)
# cuDNN's RNN weights copied into one flat buffer (flatten_parameters; autocast re-flattens);
# packing of variable-length sequences; padded <-> nested-tensor conversions (copies)
register_ops(
    """_cudnn_rnn_flatten_weight _pack_padded_sequence _pad_packed_sequence
    _nested_tensor_from_mask to_padded_tensor _nested_from_padded
    _nested_from_padded_and_nested_example _nested_tensor_from_tensor_list
    _nested_from_padded_tensor"""
)(zero)


def embedding_bag(last_at: int, padding_at: int | None):
    """Family factory: an EmbeddingBag op ``(weight, indices, offsets, scale_grad_by_freq, mode,
    ..., per_sample_weights, ...)`` (per_sample_weights at 6) with ``include_last_offset`` at
    ``last_at`` and ``padding_idx`` at ``padding_at`` (None: it takes none); each bag's width
    from the output [bags, D]."""

    def formula(args, kwargs, out) -> Cost:
        padding = None if padding_at is None else arg(args, kwargs, padding_at, "padding_idx", -1)
        last = bool(arg(args, kwargs, last_at, "include_last_offset", False))
        looked_up, note = bag_entries(args[1], arg(args, kwargs, 2, "offsets"), last, padding)
        weighted = arg(args, kwargs, 6, "per_sample_weights") is not None
        o, mode = first(out), arg(args, kwargs, 4, "mode", 0)
        return embedding_bag_cost(looked_up, o.shape[-1], mode, weighted, o.numel(), note)

    return formula


# (weight [V, D], indices [n], offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
#  include_last_offset, padding_idx)
register_ops("_embedding_bag _embedding_bag_forward_only embedding_bag")(embedding_bag(7, 8))


_BAG_ENTRIES_UNKNOWN = (
    "index values unknown (e.g. on the meta device): every index counted as looked up, "
    "those equal to padding_idx (which the bag skips) or past include_last_offset's last "
    "offset too, an upper bound"
)


def bag_entries(
    indices: torch.Tensor,
    offsets: torch.Tensor | None,
    include_last_offset: bool,
    padding_idx: int | None,
) -> tuple[int, str | None]:
    """The entries an ``EmbeddingBag`` combines: every index but those equal to ``padding_idx``
    (a negative one is none) and, with ``include_last_offset``, those at or past the last offset
    (in no bag). Without values (meta): every index, and a note saying it is a bound."""
    padded = padding_idx is not None and padding_idx >= 0
    tail = include_last_offset and isinstance(offsets, torch.Tensor) and offsets.numel() > 0
    if not (padded or tail):
        return indices.numel(), None
    if not has_values(indices) or (tail and not has_values(offsets)):
        return indices.numel(), _BAG_ENTRIES_UNKNOWN
    used = indices.detach().reshape(-1)
    if tail:
        used = used[: int(offsets.detach().reshape(-1)[-1])]
    if padded:
        return int((used != padding_idx).sum()), None
    return used.numel(), None


def embedding_bag_cost(
    looked_up: int, width: int, mode: int, weighted: bool, out: int, note: str | None = None
) -> Cost:
    """An ``EmbeddingBag``'s arithmetic: each of the ``looked_up`` rows of ``width`` elements
    combined into its bag, 1 flop an element (+1 with ``per_sample_weights``); mode ``mean``
    (1) divides each of the ``out`` output elements by its bag's size, 1 flop each. ``note``:
    :func:`bag_entries`'s, when ``looked_up`` is a bound."""
    elements = looked_up * width
    return Cost(0, flops=elements * (2 if weighted else 1) + (out if mode == 1 else 0), note=note)
