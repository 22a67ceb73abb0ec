"""Attention: fused SDPA kernels of every backend (packed variable-length batches sequence by
sequence) and their backward, ``flex_attention``, and the fused ``nn.MultiheadAttention`` /
``nn.TransformerEncoderLayer`` fast paths."""

from __future__ import annotations

import dataclasses
import math

import torch

from modelprof.counting.formulas.norm import norm_cost
from modelprof.counting.formulas.pointwise import SOFTMAX_FLOPS_PER_ELEMENT
from modelprof.counting.formulas.registry import (
    Cost,
    arg,
    dot_madd,
    register_ops,
    total,
    wants_probe,
)
from modelprof.counting.formulas.values import has_values, offsets_to_lengths
from modelprof.runtime import compat

__all__ = ["attention_backward_cost", "attention_cost", "multi_head_attention_cost", "varlen_pairs"]


def attention_cost(
    batch_heads: int,
    l_q: int,
    l_k: int,
    d_qk: int,
    d_v: int,
    masked: bool = False,
    out_elements: int | None = None,
) -> Cost:
    """softmax(Q K^T * scale [+ mask]) V for ``batch_heads`` independent heads.

    [bh, l_q, d] @ [bh, d, l_k] -> [bh, l_q, l_k]   bh*l_q*l_k*d MACs
    [bh, l_q, l_k] @ [bh, l_k, d_v] -> [bh, l_q, d_v]  bh*l_q*l_k*d_v MACs
    plus, per score, 1 flop for the scale, 1 for an additive mask and the softmax's. A causal
    mask is counted as full attention (as torch.utils.flop_counter does). ``out_elements``: the
    output's elements when not ``bh*l_q*d_v`` (packed variable-length batches).
    """
    scores = batch_heads * l_q * l_k
    macs = scores * (d_qk + d_v)
    elementwise = scores * (1 + int(masked) + SOFTMAX_FLOPS_PER_ELEMENT)
    outputs = batch_heads * l_q * d_v if out_elements is None else out_elements
    # the two products' madd, each 0 where its length is (d_qk = 0; l_k = 0 leaves no scores)
    madd = dot_madd(scores * d_qk, scores) + dot_madd(scores * d_v, outputs) + elementwise
    return Cost(macs, flops=2 * macs + elementwise, madd=madd)


def _heads_first(cost, q, k, v, **kw) -> Cost:
    """``cost`` (:func:`attention_cost` or :func:`attention_backward_cost`) of query
    [..., L, E], key [..., S, E], value [..., S, Ev]: the leading dims are batch and heads."""
    *lead, l_q, d = q.shape
    return cost(math.prod(lead), l_q, k.shape[-2], d, v.shape[-1], **kw)


def _heads_second(cost, q, k, v, **kw) -> Cost:
    """The same of a dense q [B, L, H, E], k [B, S, H, E] (the flash and efficient kernels)."""
    b, l_q, h, d = q.shape
    return cost(b * h, l_q, k.shape[1], d, v.shape[-1], **kw)


def _packed(cost, q, v, pairs: int, note: str | None, **kw) -> Cost:
    """``cost`` over ``pairs`` query-key pairs in each of the H heads of a packed
    q [..., total_q, H, E]: per pair the work of one score."""
    total_q, heads, d = q.shape[-3:]
    out_elements = heads * total_q * v.shape[-1]
    c = cost(heads, 1, pairs, d, v.shape[-1], out_elements=out_elements, **kw)
    return dataclasses.replace(c, note=note)


def _sdpa(cost, mask_at: int | None, first: int = 0):
    """Family factory: an SDPA kernel costed by ``cost`` (forward or backward) on query
    [B, H, L, E], key [B, H, S, E], value [B, H, S, Ev] (any leading batch dims) at
    ``args[first:first + 3]``, its mask or bias at ``args[mask_at]`` or a keyword."""

    def formula(args, kwargs, out) -> Cost:
        mask = args[mask_at] if mask_at is not None and len(args) > mask_at else None
        mask = kwargs.get("attn_mask", kwargs.get("attn_bias", mask))
        q, k, v = args[first : first + 3]
        return _heads_first(cost, q, k, v, masked=isinstance(mask, torch.Tensor))

    return formula


# CPU: (query, key, value, dropout_p, is_causal, *, attn_mask=None, scale=None)
# flash: (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale)
register_ops(
    """_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention
    _scaled_dot_product_fused_attention_overrideable"""
)(_sdpa(attention_cost, None))
# (query, key, value, attn_bias, compute_log_sumexp, ...)
register_ops("_scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention")(
    _sdpa(attention_cost, 3)
)


_LENGTHS_UNKNOWN = (
    "sequence lengths unknown (no values in the offsets, e.g. on the meta "
    "device): counted at the bound min(n*max_q*max_k, total_q*max_k, "
    "total_k*max_q) query-key pairs per head"
)


def varlen_pairs(
    cum_q: torch.Tensor,
    cum_k: torch.Tensor,
    max_q: int,
    max_k: int,
    total_q: int,
    total_k: int,
    k_lengths: torch.Tensor | None = None,
) -> tuple[int, str | None]:
    """Query-key pairs of a packed variable-length batch, sum_i Lq_i * Lk_i, from the cumulative
    offsets (``k_lengths``: the key lengths used, as a KV cache's ``seqused_k``). Without
    values: the tightest bound the shapes give, and a note saying so."""
    if has_values(cum_q) and has_values(cum_k) and (k_lengths is None or has_values(k_lengths)):
        lq = offsets_to_lengths(cum_q)
        lk = (
            [int(v) for v in k_lengths.reshape(-1).tolist()]
            if k_lengths is not None
            else offsets_to_lengths(cum_k)
        )
        return sum(a * b for a, b in zip(lq, lk)), None
    n = cum_q.shape[0] - 1
    return min(n * max_q * max_k, total_q * max_k, total_k * max_q), _LENGTHS_UNKNOWN


@register_ops("_flash_attention_forward")
def _flash_attention_forward(args, kwargs, out) -> Cost:
    # (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    #  return_debug_mask, *, scale, window_size_left, window_size_right, seqused_k,
    #  alibi_slopes, block_table, ...)
    # dense: q [B, L, H, E], k [B, S, H, E]; packed (cum_seq_q given): q [total_q, H, E]
    q, k, v = args[0], args[1], args[2]
    cum_q, cum_k = arg(args, kwargs, 3, "cum_seq_q"), arg(args, kwargs, 4, "cum_seq_k")
    alibi = isinstance(kwargs.get("alibi_slopes"), torch.Tensor)
    if cum_q is None:
        return _heads_second(attention_cost, q, k, v, masked=alibi)
    max_q, max_k = int(arg(args, kwargs, 5, "max_q")), int(arg(args, kwargs, 6, "max_k"))
    used_k = kwargs.get("seqused_k")
    pairs, note = varlen_pairs(cum_q, cum_k, max_q, max_k, q.shape[0], k.shape[0], used_k)
    return _packed(attention_cost, q, v, pairs, note, masked=alibi)


@register_ops("_efficient_attention_forward")
def _efficient_attention_forward(args, kwargs, out) -> Cost:
    # (query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #  dropout_p, custom_mask_type, compute_log_sumexp, *, scale, seqlen_k, window_size)
    # dense: q [B, L, H, E]; packed (cu_seqlens_q given): q [1, total_q, H, E]
    q, k, v = args[0], args[1], args[2]
    bias = arg(args, kwargs, 3, "bias")
    masked = isinstance(bias, torch.Tensor)
    cu_q, cu_k = arg(args, kwargs, 4, "cu_seqlens_q"), arg(args, kwargs, 5, "cu_seqlens_k")
    if cu_q is None:
        return _heads_second(attention_cost, q, k, v, masked=masked)
    max_q, max_k = arg(args, kwargs, 6, "max_seqlen_q"), arg(args, kwargs, 7, "max_seqlen_k")
    total_q, total_k = q.shape[-3], k.shape[-3]
    max_q = int(max_q if max_q is not None else total_q)
    max_k = int(max_k if max_k is not None else total_k)
    pairs, note = varlen_pairs(cu_q, cu_k, max_q, max_k, total_q, total_k, kwargs.get("seqlen_k"))
    return _packed(attention_cost, q, v, pairs, note, masked=masked)


def attention_backward_cost(
    batch_heads: int,
    l_q: int,
    l_k: int,
    d_qk: int,
    d_v: int,
    masked: bool = False,
    out_elements: int | None = None,
) -> Cost:
    """Backward of a fused attention kernel, which recomputes the scores:

    recompute  S = Q K^T                     bh*l_q*l_k*d_qk MACs
    dV = P^T dO,  dP = dO V^T                bh*l_q*l_k*d_v each
    dQ = dS K,    dK = dS^T Q                bh*l_q*l_k*d_qk each
    so 3*d_qk + 2*d_v MACs per score (torch.utils.flop_counter's count). Per score: the scale
    (1) and mask (1, when there is one) again, P = exp(S - logsumexp) (2), dS = P * (dP - D)
    (2) and its scale (1); per output element D = rowsum(dO * O) (2). ``out_elements``: the
    output's elements when not ``bh*l_q*d_v`` (packed variable-length batches).
    """
    scores = batch_heads * l_q * l_k
    macs = scores * (3 * d_qk + 2 * d_v)
    outputs = batch_heads * l_q * d_v if out_elements is None else out_elements
    elementwise = scores * (1 + int(masked) + 2 + 2 + 1) + 2 * outputs
    return Cost(macs, flops=2 * macs + elementwise)


# CPU: (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask,
# scale); the others take no mask
register_ops(
    """_scaled_dot_product_flash_attention_for_cpu_backward
    _scaled_dot_product_flash_attention_backward
    _scaled_dot_product_fused_attention_overrideable_backward"""
)(_sdpa(attention_backward_cost, None, first=1))
# (grad_out, query, key, value, attn_bias, out, logsumexp, ...)
register_ops("_scaled_dot_product_efficient_attention_backward")(
    _sdpa(attention_backward_cost, 4, first=1)
)
# (grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, ...)
register_ops("_scaled_dot_product_cudnn_attention_backward")(
    _sdpa(attention_backward_cost, 8, first=1)
)


def _varlen_backward(packed_dims: int):
    """Family factory: the flash (packed q [total_q, H, E]: ``packed_dims`` 3) or efficient
    (packed q [1, total_q, H, E]: 4) kernel's backward; dense q [B, L, H, E]."""

    def formula(args, kwargs, out) -> Cost:
        # flash: (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
        # max_k, ...); efficient: (grad_out, query, key, value, bias, out, cu_seqlens_q,
        # cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
        q, k, v = args[1], args[2], args[3]
        cum_q, cum_k = args[6], args[7]
        if cum_q is None or q.dim() != packed_dims:
            return _heads_second(attention_backward_cost, q, k, v)
        pairs, note = varlen_pairs(
            cum_q, cum_k, int(args[8]), int(args[9]), q.shape[-3], k.shape[-3]
        )
        return _packed(attention_backward_cost, q, v, pairs, note)

    return formula


_flash_attention_backward = register_ops("_flash_attention_backward")(_varlen_backward(3))
_efficient_attention_backward = register_ops("_efficient_attention_backward")(_varlen_backward(4))


# -- flex_attention (a higher-order operator) ---------------------------------------------------
_MOD_NOT_COSTED = (
    "score_mod/mask_mod could not be run on one score to cost it: "
    "their per-score work is not counted"
)


def _per_score(
    probe, fn, q: torch.Tensor, n_index_args: int, with_score: bool, buffers: tuple
) -> int | None:
    """Flops of one score_mod/mask_mod call on 0-d inputs (the eager kernel calls it once per
    score, vectorised), or None if it cannot be run that way."""
    working = torch.float64 if q.dtype == torch.float64 else torch.float32
    index = torch.zeros((), dtype=torch.int64, device=q.device)
    args = (
        ((torch.zeros((), dtype=working, device=q.device),) if with_score else ())
        + (index,) * n_index_args
        + tuple(buffers)
    )
    try:
        with compat.getitem_to_index():
            return probe(fn, *args).resolved()[1]
    except Exception:  # noqa: BLE001 - data-dependent or device-specific mods
        return None


@register_ops("flex_attention", namespace="higher_order")
@wants_probe
def _flex_attention(args, kwargs, out, probe) -> Cost:
    # (query [B, Hq, L, E], key [Bkv, Hkv, S, E], value [Bkv, Hkv, S, Ev], score_mod,
    #  block_mask (..., mask_mod), scale, kernel_options, score_mod_other_buffers,
    #  mask_mod_other_buffers): attention over every query head (GQA shares k/v) plus the
    #  score_mod's ops per score and, with a mask, the mask_mod's + 1; masked blocks count fully
    q, k, v, score_mod, block_mask = args[:5]
    score_buffers = arg(args, kwargs, 7, "score_mod_other_buffers", ())
    mask_buffers = arg(args, kwargs, 8, "mask_mod_other_buffers", ())
    *lead, l_q, d = q.shape
    bh = math.prod(lead)
    mask_mod = block_mask[-1] if isinstance(block_mask, tuple) and block_mask else None
    try:
        from torch.nn.attention.flex_attention import noop_mask
    except ImportError:
        noop_mask = None
    masked = mask_mod is not None and mask_mod is not noop_mask
    base = attention_cost(bh, l_q, k.shape[-2], d, v.shape[-1], masked=masked)
    score_flops = _per_score(probe, score_mod, q, 4, True, tuple(score_buffers))
    mask_flops = _per_score(probe, mask_mod, q, 4, False, tuple(mask_buffers)) if masked else 0
    note = None
    if score_flops is None or mask_flops is None:
        note, score_flops, mask_flops = _MOD_NOT_COSTED, score_flops or 0, mask_flops or 0
    extra = bh * l_q * k.shape[-2] * (score_flops + mask_flops)
    macs, flops, madd = base.resolved()
    return Cost(macs, flops=flops + extra, madd=madd + extra, note=note)


@register_ops("flex_attention_backward", namespace="higher_order")
def _flex_attention_backward(args, kwargs, out) -> Cost:
    # (query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, ...)
    return _heads_first(attention_backward_cost, *args[:3])


def multi_head_attention_cost(
    batch: int, l_q: int, l_kv: int, embed: int, heads: int, has_bias: bool, masked: bool
) -> Cost:
    """Projections + attention + output projection of ``nn.MultiheadAttention``.

    in-projection:  q [B, L, E] @ [E, E], k and v [B, S, E] @ [E, E]   B*(L + 2S)*E*E MACs
    attention:      heads of size E/H                                  see attention_cost
    out-projection: [B, L, E] @ [E, E]                                 B*L*E*E MACs
    """
    d = embed // heads
    attn = attention_cost(batch * heads, l_q, l_kv, d, d, masked)
    proj_macs = batch * (l_q + 2 * l_kv) * embed * embed + batch * l_q * embed * embed
    proj_out = batch * (l_q + 2 * l_kv) * embed + batch * l_q * embed
    bias_adds = proj_out if has_bias else 0
    return Cost(
        attn.macs + proj_macs,
        flops=attn.flops + 2 * proj_macs + bias_adds,
        madd=attn.madd + dot_madd(proj_macs, proj_out),
    )


@register_ops("_native_multi_head_attention")
def _native_mha(args, kwargs, out) -> Cost:
    # (query [B, L, E], key [B, S, E], value, embed_dim, num_head, qkv_weight, qkv_bias,
    #  proj_weight, proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type)
    q, k = args[0], args[1]
    embed, heads = int(args[3]), int(args[4])
    batch = q.shape[0] if q.dim() == 3 else 1
    masked = isinstance(arg(args, kwargs, 9, "mask"), torch.Tensor)
    has_bias = args[6] is not None
    cost = multi_head_attention_cost(
        batch, q.shape[-2], k.shape[-2], embed, heads, has_bias, masked
    )
    if not arg(args, kwargs, 10, "need_weights", True):
        return cost
    # returning the weights, the kernel scales q (L x E) rather than each score, as the slow
    # path does; averaged over the heads (average_attn_weights), 1 flop more per score
    scores = batch * heads * q.shape[-2] * k.shape[-2]
    extra = batch * q.shape[-2] * embed - scores
    if arg(args, kwargs, 11, "average_attn_weights", True):
        extra += scores
    return Cost(cost.macs, flops=cost.flops + extra, madd=cost.madd + extra)


@register_ops("_transformer_encoder_layer_fwd")
def _encoder_layer(args, kwargs, out) -> Cost:
    # (src [B, L, E], embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
    #  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
    #  ffn_weight_1 [F, E], ffn_bias_1, ffn_weight_2 [E, F], ffn_bias_2, mask, mask_type)
    src = args[0]
    embed, heads = int(args[1]), int(args[2])
    mask = args[18] if len(args) > 18 else kwargs.get("mask")
    if getattr(src, "is_nested", False):  # padded batch as ragged sequences: each on its own
        lengths = [c.shape[0] for c in src.unbind()]
    else:
        batch, length = (src.shape[0], src.shape[1]) if src.dim() == 3 else (1, src.shape[0])
        lengths = [length] * batch
    masked = isinstance(mask, torch.Tensor)
    attn = total(multi_head_attention_cost(1, n, n, embed, heads, True, masked) for n in lengths)
    hidden = args[14].shape[0]
    tokens = sum(lengths)
    ffn_macs = 2 * tokens * embed * hidden  # E->F and F->E
    ffn_out = tokens * (hidden + embed)  # (their bias adds)
    # E->F: tokens x F dots of length E; F->E: tokens x E dots of length F
    ffn_madd = dot_madd(ffn_macs // 2, tokens * hidden) + dot_madd(ffn_macs // 2, tokens * embed)
    # two affine layer norms, the activation over F, two residual adds over E
    norms = 2 * norm_cost(tokens * embed, True, 2).flops
    elementwise = norms + tokens * hidden + 2 * tokens * embed
    return Cost(
        attn.macs + ffn_macs,
        flops=attn.flops + 2 * ffn_macs + ffn_out + elementwise,
        madd=attn.madd + ffn_madd + elementwise,
    )
