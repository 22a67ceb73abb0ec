"""Attention: fused scaled-dot-product kernels (every backend) and the fused
``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` fast paths."""
from __future__ import annotations

import torch

from .norm import NORM_FLOPS_PER_ELEMENT
from .pointwise import SOFTMAX_FLOPS_PER_ELEMENT
from .registry import Cost, optional_ops, register_formula

__all__ = ["attention_cost", "multi_head_attention_cost"]

aten = torch.ops.aten


def attention_cost(batch_heads: int, l_q: int, l_k: int, d_qk: int, d_v: int,
                   masked: bool = False) -> Cost:
    """softmax(Q K^T * scale [+ mask]) V for ``batch_heads`` independent heads.

    [bh, l_q, d] @ [bh, d, l_k] -> [bh, l_q, l_k]   bh*l_q*l_k*d MACs
    [bh, l_q, l_k] @ [bh, l_k, d_v] -> [bh, l_q, d_v]  bh*l_q*l_k*d_v MACs
    plus, per score, 1 flop for the scale, 1 for an additive mask and the softmax's
    SOFTMAX_FLOPS_PER_ELEMENT. A causal mask is counted as full attention (as
    torch.utils.flop_counter does).
    """
    scores = batch_heads * l_q * l_k
    macs = scores * (d_qk + d_v)
    elementwise = scores * (1 + int(masked) + SOFTMAX_FLOPS_PER_ELEMENT)
    n_out = scores + batch_heads * l_q * d_v  # outputs of the two products
    return Cost(macs, flops=2 * macs + elementwise, madd=2 * macs - n_out + elementwise)


def _bhld(args, kwargs, mask_pos: int | None) -> Cost:
    # query [B, H, L, E], key [B, H, S, E], value [B, H, S, Ev]; any leading batch dims
    q, k, v = args[0], args[1], args[2]
    *lead, l_q, d = q.shape
    bh = 1
    for s in lead:
        bh *= s
    mask = None
    if mask_pos is not None and len(args) > mask_pos:
        mask = args[mask_pos]
    mask = kwargs.get("attn_mask", kwargs.get("attn_bias", mask))
    return attention_cost(bh, l_q, k.shape[-2], d, v.shape[-1],
                          masked=isinstance(mask, torch.Tensor))


@register_formula(*optional_ops("_scaled_dot_product_flash_attention_for_cpu"))
def _sdpa_cpu(args, kwargs, out) -> Cost:
    # (query, key, value, dropout_p, is_causal, *, attn_mask=None, scale=None)
    return _bhld(args, kwargs, mask_pos=None)


@register_formula(*optional_ops("_scaled_dot_product_flash_attention",
                                "_scaled_dot_product_fused_attention_overrideable"))
def _sdpa_flash(args, kwargs, out) -> Cost:
    # (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale)
    return _bhld(args, kwargs, mask_pos=None)


@register_formula(*optional_ops("_scaled_dot_product_efficient_attention",
                                "_scaled_dot_product_cudnn_attention"))
def _sdpa_efficient(args, kwargs, out) -> Cost:
    # (query, key, value, attn_bias, compute_log_sumexp, ...)
    return _bhld(args, kwargs, mask_pos=3)


@register_formula(*optional_ops("_flash_attention_forward", "_efficient_attention_forward"))
def _attention_blhd(args, kwargs, out) -> Cost:
    # query [B, L, H, E], key [B, S, H, E], value [B, S, H, Ev] (varlen: [total, H, E])
    q, k, v = args[0], args[1], args[2]
    if q.dim() == 4:
        b, l_q, h, d = q.shape
        l_k = k.shape[1]
    else:  # packed variable-length batch: count as one sequence of all tokens
        b, (l_q, h, d), l_k = 1, q.shape, k.shape[0]
    bias = args[3] if len(args) > 3 and isinstance(args[3], torch.Tensor) and \
        args[3].dim() >= 2 else None
    return attention_cost(b * h, l_q, l_k, d, v.shape[-1], masked=bias is not None)


def multi_head_attention_cost(batch: int, l_q: int, l_kv: int, embed: int, heads: int,
                              has_bias: bool, masked: bool) -> Cost:
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
    return Cost(attn.macs + proj_macs,
                flops=attn.flops + 2 * proj_macs + bias_adds,
                madd=attn.madd + 2 * proj_macs - proj_out)


@register_formula(*optional_ops("_native_multi_head_attention"))
def _native_mha(args, kwargs, out) -> Cost:
    # (query [B, L, E], key [B, S, E], value, embed_dim, num_head, qkv_weight, qkv_bias,
    #  proj_weight, proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type)
    q, k = args[0], args[1]
    embed, heads = int(args[3]), int(args[4])
    batch = q.shape[0] if q.dim() == 3 else 1
    mask = args[9] if len(args) > 9 else kwargs.get("mask")
    return multi_head_attention_cost(batch, q.shape[-2], k.shape[-2], embed, heads,
                                     has_bias=args[6] is not None,
                                     masked=isinstance(mask, torch.Tensor))


@register_formula(*optional_ops("_transformer_encoder_layer_fwd"))
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
    per_seq = [multi_head_attention_cost(1, n, n, embed, heads, has_bias=True,
                                         masked=isinstance(mask, torch.Tensor))
               for n in lengths]
    attn = Cost(sum(c.macs for c in per_seq), flops=sum(c.resolved()[1] for c in per_seq),
                madd=sum(c.resolved()[2] for c in per_seq))
    hidden = args[14].shape[0]
    tokens = sum(lengths)
    ffn_macs = 2 * tokens * embed * hidden  # E->F and F->E
    ffn_out = tokens * (hidden + embed)
    # two affine layer norms, the activation over F, two residual adds over E, ffn biases
    elementwise = (2 * (NORM_FLOPS_PER_ELEMENT["stats"] + NORM_FLOPS_PER_ELEMENT["normalize"]
                        + NORM_FLOPS_PER_ELEMENT["affine"]) * tokens * embed
                   + tokens * hidden + 2 * tokens * embed)
    return Cost(attn.macs + ffn_macs,
                flops=attn.flops + 2 * ffn_macs + ffn_out + elementwise,
                madd=attn.madd + 2 * ffn_macs - ffn_out + elementwise)
