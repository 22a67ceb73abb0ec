"""Ops that only move, create or gather data: 0 flops, but their bytes count (see the counter).

Ops whose schema says they alias their input (``view``, ``t``, ``permute``, ``expand``,
``split``, ...) are free: no flops, no bytes; the counter recognises them by
``OpOverload.is_view`` and the ``inplace_view`` tag, and VIEW marks the few aliasing-like ops
whose schema does not say so.
"""

from __future__ import annotations

import dataclasses

import torch

from modelprof.counting.formulas.registry import (
    ZERO,
    Cost,
    arg,
    optional_ops,
    register_formula,
    register_present,
)
from modelprof.counting.formulas.values import has_values

__all__ = ["VIEW", "bag_entries", "embedding_bag_cost"]

aten = torch.ops.aten


def VIEW(args, kwargs, out):  # noqa: N802 - a sentinel formula
    """Metadata only: no arithmetic, no data movement."""
    return ZERO


register_formula(
    torch.Tag.inplace_view,
    *optional_ops(
        "_unsafe_view",
        "unsafe_split",
        "unsafe_split_with_sizes",
        "unsafe_chunk",
        "_reshape_alias",
        "lift_fresh",
        "set_",
        "resize_",
        "resize_as_",
        "_local_scalar_dense",
        "_assert_async",
        "_assert_scalar",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "_nested_tensor_size",
        "_nested_tensor_strides",
        "_functional_assert_async",
        "_make_dep_token",
        "record_stream",
        "_has_same_storage_numel",
        "is_same_size",
        "_shape_as_tensor",
        "_assert_tensor_metadata",
        "lift",
        # queries that return a number, not data
        "dim",
        "_fused_sdp_choice",
        "_nested_tensor_from_mask_left_aligned",
        # nested tensors: views of a buffer and their metadata
        "_nested_view_from_buffer",
        "_nested_view_from_jagged",
        "_nested_get_values",
        "_nested_get_offsets",
        "_nested_get_lengths",
        "_nested_get_ragged_idx",
        "_nested_get_min_seqlen",
        "_nested_get_max_seqlen",
        "_nested_get_jagged_dummy",
        "_nested_compute_contiguous_strides_offsets",
        "_nested_tensor_storage_offsets",
    ),
)(VIEW)

# profiler bookkeeping (torch.optim wraps every step in record_function): no work
register_present(
    *optional_ops(
        "_record_function_enter",
        "_record_function_enter_new",
        "_record_function_exit",
        namespace="profiler",
    )
)(VIEW)


def _zero(args, kwargs, out):
    return ZERO


register_present(
    *optional_ops(
        # copies and layout changes
        "clone",
        "copy_",
        "_to_copy",
        "_copy_from",
        "_copy_from_and_resize",
        "contiguous",
        "lift_fresh_copy",
        "alias_copy",
        "detach_copy",
        "view_copy",
        "permute_copy",
        "expand_copy",
        "transpose_copy",
        "t_copy",
        "unsqueeze_copy",
        "squeeze_copy",
        "slice_copy",
        "select_copy",
        "split_copy",
        "split_with_sizes_copy",
        "unbind_copy",
        "as_strided_copy",
        "_unsafe_view_copy",
        "to_mkldnn",
        "to_dense",
        "_to_dense",
        "mkldnn_reorder_conv2d_weight",
        # joins, gathers, scatters, padding, shuffles
        "cat",
        "stack",
        "hstack",
        "vstack",
        "index",
        "index_select",
        "gather",
        "scatter",
        "scatter_",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "index_fill",
        "index_fill_",
        "index_copy",
        "index_copy_",
        "masked_select",
        "masked_scatter",
        "masked_scatter_",
        "take",
        "slice_scatter",
        "select_scatter",
        "diagonal_scatter",
        "as_strided_scatter",
        "constant_pad_nd",
        "reflection_pad1d",
        "reflection_pad2d",
        "reflection_pad3d",
        "replication_pad1d",
        "replication_pad2d",
        "replication_pad3d",
        "_pad_circular",
        "roll",
        "flip",
        "repeat",
        "repeat_interleave",
        "tile",
        "pixel_shuffle",
        "pixel_unshuffle",
        "channel_shuffle",
        "native_channel_shuffle",
        "im2col",
        "col2im",
        "embedding",
        "one_hot",
        "nonzero",
        "nonzero_static",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "searchsorted",
        "bucketize",
        "flatten_dense_tensors",
        "unflatten_dense_tensors",
        # creation
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "fill",
        "fill_",
        "zero_",
        "arange",
        "linspace",
        "logspace",
        "scalar_tensor",
        "eye",
        "tril_indices",
        "triu_indices",
        "randn",
        "randn_like",
        "rand",
        "rand_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "normal_",
        "uniform_",
        "random_",
        "exponential_",
        "multinomial",
        "_efficientzerotensor",
        "tensor_split",
        # cuDNN's RNN weights copied into one flat buffer (flatten_parameters; autocast re-flattens)
        "_cudnn_rnn_flatten_weight",
        # packing of variable-length sequences; padded <-> nested-tensor conversions (copies)
        "_pack_padded_sequence",
        "_pad_packed_sequence",
        "_nested_tensor_from_mask",
        "to_padded_tensor",
        "_nested_from_padded",
        "_nested_from_padded_and_nested_example",
        "_nested_tensor_from_tensor_list",
        "_nested_from_padded_tensor",
    )
)(_zero)


@register_present(*optional_ops("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"))
def _embedding_bag(args, kwargs, out):
    # (weight [V, D], indices [n], offsets, scale_grad_by_freq, mode, sparse,
    #  per_sample_weights, include_last_offset, padding_idx)
    looked_up, note = bag_entries(
        args[1],
        arg(args, kwargs, 2, "offsets"),
        bool(arg(args, kwargs, 7, "include_last_offset", False)),
        arg(args, kwargs, 8, "padding_idx", -1),
    )
    cost = embedding_bag_cost(
        looked_up,
        args[0].shape[1],
        arg(args, kwargs, 4, "mode", 0),
        arg(args, kwargs, 6, "per_sample_weights", None) is not None,
        _first(out).numel(),
    )
    return cost if note is None else dataclasses.replace(cost, note=note)


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
    """The entries an ``EmbeddingBag`` combines, and a note when they are a bound: every index
    but those equal to ``padding_idx`` (torch leaves them out of the bag, and out of the
    mean's count; at the aten level a negative ``padding_idx`` is none) and, with
    ``include_last_offset``, those at or past the last offset (in no bag). On the meta device
    the values are unknown: every index, and the note."""
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


def embedding_bag_cost(looked_up: int, width: int, mode: int, weighted: bool, out: int) -> Cost:
    """An ``EmbeddingBag``'s arithmetic: each of the ``looked_up`` rows of ``width`` elements
    is combined into its bag, 1 flop an element (an add for sum and mean, a comparison for
    max); ``per_sample_weights`` multiply each of those elements first, 1 flop more; mode
    ``mean`` (1) divides each of the ``out`` output elements by its bag's size, 1 flop each."""
    elements = looked_up * width
    return Cost(0, flops=elements * (2 if weighted else 1) + (out if mode == 1 else 0))


def _first(out: object) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out
