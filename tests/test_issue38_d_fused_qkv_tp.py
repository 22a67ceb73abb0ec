"""Issue 38 items 5 and 13's class, fused: under tensor parallelism a fused query-key-value
projection holds, on each rank, heads / tp query heads and kv_heads / tp KV heads when tp
divides them, else one whole KV head (replicated): (heads / tp + 2 x kv_per_rank) x head_dim
output rows, as the separate k_proj and v_proj already did. Every model here: hidden 64, 8 heads
of 8, one layer, 100 ids; weights at bf16 (2 bytes), rank 0's shapes."""

from __future__ import annotations

import pytest
from transformers import FalconConfig, GPT2Config, GPTBigCodeConfig, Phi3Config

from modelprof import fit
from modelprof.errors import ModelProfError

SMALL = dict(vocab_size=100, bos_token_id=1, eos_token_id=2)


def _weights(config, tp):
    return fit(config, context=16, tp=tp, training=False).table.loc["weights", "inference"]


def test_gpt2_fused_mha_conv1d():
    cfg = GPT2Config(n_embd=64, n_head=8, n_layer=1, n_positions=32, **SMALL)
    # tp=4: wte 25 of 100 rows x 64 = 1,600 (the head tied to it); wpe 8 of 32 x 64 = 512;
    # ln_1, ln_2, ln_f whole 3 x 128; c_attn Conv1D [64, 192] = (8 + 2 x 8) x 8 outputs: a rank
    # (8/4 + 2 x 8/4) x 8 = 48 of them, 64 x 48 = 3,072 and bias 48; attn.c_proj 16 x 64 =
    # 1,024, bias whole 64; c_fc 16 x 256 = 4,096, bias 64; mlp.c_proj 64 x 64 = 4,096, bias 64
    elements = 1_600 + 512 + 3 * 128 + 3_072 + 48 + 1_024 + 64 + 4_096 + 64 + 4_096 + 64
    assert elements == 15_024
    assert _weights(cfg, 4) == elements * 2


def test_gptbigcode_multi_query_fused_c_attn():
    cfg = GPTBigCodeConfig(
        n_embd=64, n_head=8, n_layer=1, n_positions=32, multi_query=True, **SMALL
    )
    # c_attn: Linear 64 -> (8 + 2 x 1) x 8 = 80; tp=4 > 1 KV head: a rank holds 8/4 = 2 query
    # heads and the one whole KV head's key and value: (2 + 2) x 8 = 32 rows, 32 x 64 = 2,048 and
    # bias 32 (80 / 4 = 20 rows were counted, no whole KV head: 1,280 and 20). The rest as GPT-2
    # (Linear layout): wte 1,600, wpe 512, 3 norms 384, attn.c_proj 64 x 16 = 1,024 + bias 64,
    # c_fc 64 x 64 = 4,096 + 64, mlp.c_proj 64 x 64 = 4,096 + bias 64; its causal mask, a bool buffer of 32 x 32 positions, is no weight (its
    # 1,024 B were counted as a quantized layer's, 256 B a rank)
    elements = 1_600 + 512 + 384 + 2_048 + 32 + 1_024 + 64 + 4_096 + 64 + 4_096 + 64
    assert elements == 13_984
    assert _weights(cfg, 4) == elements * 2


@pytest.mark.parametrize(
    ("tp", "expected"),
    [
        # tp=4 over 2 KV heads: query_key_value (8 + 2 x 2) x 8 = 96 rows; a rank 8/4 = 2 query
        # heads + one whole KV head: (2 + 2 x 1) x 8 = 32 rows x 64 = 2,048 (96 / 4 = 24 rows,
        # 1,536, were counted); word_embeddings 25 x 64 = 1,600 (tied head); ln_attn, ln_mlp,
        # ln_f whole 3 x 128; dense 16 x 64 = 1,024; dense_h_to_4h 64 x 64 = 4,096;
        # dense_4h_to_h 64 x 64 = 4,096; no biases
        (4, 1_600 + 384 + 2_048 + 1_024 + 4_096 + 4_096),
        # tp=8: (1 + 2 x 1) x 8 = 24 rows x 64 = 1,536 (12 rows were counted); embeddings
        # 13 x 64 = 832; dense 8 x 64 = 512; the MLP's 32 x 64 and 64 x 32: 2 x 2,048
        (8, 832 + 384 + 1_536 + 512 + 2 * 2_048),
    ],
)
def test_falcon_new_decoder_architecture(tp, expected):
    cfg = FalconConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_hidden_layers=1,
        new_decoder_architecture=True,
        num_kv_heads=2,
        **SMALL,
    )
    assert _weights(cfg, tp) == expected * 2


def test_falcon_multi_query():
    cfg = FalconConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_hidden_layers=1,
        new_decoder_architecture=False,
        multi_query=True,
        **SMALL,
    )
    # query_key_value (8 + 2 x 1) x 8 = 80 rows; tp=4: (2 + 2 x 1) x 8 = 32 rows x 64 = 2,048
    # (20 rows, 1,280, were counted); embeddings 1,600; input_layernorm, ln_f 2 x 128; dense
    # 1,024; the MLP 2 x 4,096
    elements = 1_600 + 256 + 2_048 + 1_024 + 2 * 4_096
    assert elements == 13_120
    assert _weights(cfg, 4) == elements * 2


def test_phi3_fused_qkv_proj():
    cfg = Phi3Config(
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=1,
        intermediate_size=96,
        pad_token_id=0,
        **SMALL,
    )
    # qkv_proj (8 + 2 x 2) x 8 = 96 rows; tp=4: (2 + 2 x 1) x 8 = 32 rows x 64 = 2,048 (24
    # rows, 1,536, were counted); embed_tokens and the untied lm_head 2 x 25 x 64 = 3,200;
    # 3 RMSNorms 3 x 64; o_proj 64 x 16 = 1,024; gate_up_proj 48 x 64 = 3,072; down_proj
    # 64 x 24 = 1,536
    elements = 3_200 + 192 + 2_048 + 1_024 + 3_072 + 1_536
    assert elements == 11_072
    assert _weights(cfg, 4) == elements * 2


def test_falcon_kv_heads_are_num_kv_heads_for_the_tp_check():
    # new_decoder_architecture: 3 KV heads (num_kv_heads), whatever multi_query (default True)
    # says; tp=2 neither splits 3 nor gives each rank one whole: refused (it was read as 1 KV
    # head and accepted)
    cfg = FalconConfig(
        hidden_size=96,
        num_attention_heads=12,
        num_hidden_layers=1,
        new_decoder_architecture=True,
        num_kv_heads=3,
        **SMALL,
    )
    with pytest.raises(ModelProfError, match=r"tp=2 neither splits the 3 KV heads"):
        fit(cfg, context=16, tp=2, training=False)
    # tp=3 splits them: (4 + 2 x 1) x 8 = 48 rows of query_key_value's 144 a rank
    fit(cfg, context=16, tp=3, training=False)


def test_a_layer_named_qkv_whose_output_is_not_the_heads_splits_as_before():
    from torch import nn

    from modelprof.fit import _Heads, _tp_shape

    heads = _Heads(tp=4, heads=8, kv=1, head_dim=8)
    layer = nn.Linear(64, 100)  # 100 is not (8 + 2 x 1) x 8 = 80: no fused QKV; 100 / 4 = 25
    assert _tp_shape((100, 64), layer, "attn.qkv", "weight", heads) == (25, 64)
    # 80 outputs: (2 + 2) x 8 = 32 rows a rank
    assert _tp_shape((80, 64), nn.Linear(64, 80), "attn.qkv", "weight", heads) == (
        32,
        64,
    )


def test_falcons_attention_dense_is_row_parallel_its_bias_whole():
    cfg = FalconConfig(
        hidden_size=64,
        num_attention_heads=8,
        num_hidden_layers=1,
        new_decoder_architecture=True,
        num_kv_heads=8,
        bias=True,
        **SMALL,
    )
    # tp=2: query_key_value (8 + 2 x 8) x 8 = 192 rows, a rank 96 x 64 = 6,144 + bias 96;
    # self_attention.dense row-parallel: 64 x 32 = 2,048 and its bias whole, 64 (split along
    # dim 0 before: 32); dense_h_to_4h 128 x 64 = 8,192 + bias 128; dense_4h_to_h 64 x 128 =
    # 8,192 + bias whole 64; word_embeddings 50 x 64 = 3,200 (tied head); ln_attn, ln_mlp,
    # ln_f whole 3 x 128
    elements = 6_144 + 96 + 2_048 + 64 + 8_192 + 128 + 8_192 + 64 + 3_200 + 384
    assert elements == 28_512
    assert _weights(cfg, 2) == elements * 2


def test_gpt2s_c_fc_splits_its_output():
    cfg = GPT2Config(n_embd=64, n_head=8, n_layer=1, n_positions=32, n_inner=90, **SMALL)
    # tp=4, the MLP 90 wide (not a multiple of 4): c_fc Conv1D [64, 90] is column-parallel, a
    # rank 64 x ceil(90 / 4) = 64 x 23 = 1,472 (split by its input before: 16 x 90 = 1,440),
    # bias 23; mlp.c_proj [90, 64] row-parallel by its input: 23 x 64 = 1,472, bias whole 64;
    # the rest as in test_gpt2_fused_mha_conv1d: wte 1,600, wpe 512, norms 384, c_attn 3,072 +
    # 48, attn.c_proj 1,024 + 64
    elements = 1_472 + 23 + 1_472 + 64 + 1_600 + 512 + 384 + 3_072 + 48 + 1_024 + 64
    assert elements == 9_735
    assert _weights(cfg, 4) == elements * 2
