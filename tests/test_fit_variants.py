"""``fit`` on the kinds of model a user brings: a quantized layer's weights kept in buffers, an
encoder-decoder's cross-attention cache, grouped-query heads under tensor parallelism, and a
training plan that fits nowhere, which says where it would."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

from modelprof import ModelProfError
from modelprof.fit import fit
from modelprof.generation.memory import weights_bytes

transformers = pytest.importorskip("transformers")


class _GPTQLinear(nn.Module):
    """A 4-bit layer as GPTQ packs it: no parameters, its weights in buffers."""

    def __init__(self, n_in: int, n_out: int, group: int = 32) -> None:
        super().__init__()
        self.register_buffer("qweight", torch.zeros(n_in // 8, n_out, dtype=torch.int32))
        self.register_buffer("qzeros", torch.zeros(n_in // group, n_out // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.ones(n_in // group, n_out, dtype=torch.float16))
        self.register_buffer("bias", torch.zeros(n_out, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., : self.bias.shape[0]] + self.bias.to(x.dtype)


class _Int8WeightOnly(nn.Module):
    """An int8 weight kept as a frozen parameter, its float scales in a buffer."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=torch.int8), requires_grad=False)
        self.register_buffer("scale", torch.ones(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.weight.to(x.dtype) * self.scale[:, None]).t()


def test_a_quantized_layers_buffers_are_its_weights():
    model = nn.Sequential(_GPTQLinear(256, 256), _Int8WeightOnly(256, 64))
    report = fit(model, dtype=torch.float16, training=False)
    # GPTQ: qweight 32 x 256 int32 = 32,768, qzeros 8 x 32 int32 = 1,024, scales 8 x 256
    # fp16 = 4,096, bias 256 fp16 = 512; int8 layer: 64 x 256 = 16,384 and its 64 scales at
    # fp16 = 128: 54,912 B (the int8 parameter alone, 16,384, was all fit counted)
    assert report.table.loc["weights", "inference"] == 54_912
    assert weights_bytes(model, torch.float16) == 54_912  # generation's memory plan agrees
    # neither trained nor sharded: the same bytes in every training plan, no gradients
    assert (report.table.loc["weights"] == 54_912).all()
    assert (report.table.loc["gradients"] == 0).all()


def test_a_float_models_buffers_stay_out_of_its_weights():
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=101,
        max_position_embeddings=64,
    )
    report = fit(cfg, context=16, training=False)
    # 74,688 parameters x 2 bytes; the rotary frequencies (2 x 8 float32) are not weights
    assert report.table.loc["weights", "inference"] == 74_688 * 2


def _whisper():
    return transformers.WhisperConfig(
        d_model=64,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        vocab_size=100,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        max_source_positions=30,
        max_target_positions=64,
        num_mel_bins=8,
    )


def test_an_encoder_decoder_caches_its_source_for_cross_attention():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fit(_whisper(), dtype=torch.float32, context=16, training=False)
    # one token of the decoder's cache: 2 (K, V) x 2 decoder layers x 4 heads x 16 x 4 bytes
    # = 1,024 B; its own 16 tokens and Whisper's 30 encoded positions: 46 x 1,024 = 47,104
    # (the decoder's own tokens alone were 16,384)
    assert report.table.loc["kv_cache", "inference"] == 46 * 1024
    bart = transformers.BartConfig(
        d_model=64,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        max_position_embeddings=128,
        vocab_size=1000,
    )
    two = fit(bart, dtype=torch.float32, context=16, tp=2, training=False)
    # BART's source is the 16 token ids: (16 own + 16 encoded) x 1,024 B, the heads over 2 ranks
    assert two.table.loc["kv_cache", "inference"] == 32 * 1024 // 2


def _gqa(heads: int, kv: int, hidden: int):
    return transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=101,
        max_position_embeddings=64,
    )


@pytest.mark.parametrize(("heads", "kv", "tp"), [(6, 3, 2), (6, 2, 3), (8, 4, 8)])
def test_tp_must_split_or_replicate_whole_kv_heads(heads, kv, tp):
    cfg = _gqa(heads, kv, 16 * heads)
    if kv % tp and tp % kv:  # 3 KV heads on 2 ranks, 2 on 3: no rank holds whole heads
        with pytest.raises(ModelProfError, match=rf"tp={tp} neither splits the {kv} KV heads"):
            fit(cfg, context=16, tp=tp, training=False)
    else:  # 4 KV heads on 8 ranks: one each, replicated on 2
        fit(cfg, context=16, tp=tp, training=False)


def test_past_the_kv_heads_each_rank_holds_one_whole():
    report = fit(_gqa(4, 2, 64), context=16, tp=4, training=False)
    # rank 0 at tp=4 with 2 KV heads of 16: embedding and head 26 of 101 rows x 64 = 3,328;
    # a layer: q_proj 16 x 64, k_proj and v_proj one whole KV head 16 x 64 each (a quarter,
    # 8 rows, is no head), o_proj 64 x 16, gate and up 24 x 64, down 64 x 24, norms 2 x 64:
    # 8,832; 2 layers + final norm 64: 21,056 elements x 2 bytes (bf16)
    assert report.table.loc["weights", "inference"] == 21_056 * 2
    # the KV cache: 2 x 2 layers x 2 KV heads x 16 x 2 bytes x 16 tokens over 2 ranks
    assert report.table.loc["kv_cache", "inference"] == 2 * 2 * 2 * 16 * 2 * 16 // 2


def test_a_training_plan_that_fits_nowhere_says_from_how_many_ranks_zero3_would():
    cfg = _gqa(4, 2, 64)
    memory = 400_000
    kw = dict(context=16, memory_bytes=memory, optimizer="adam", mixed_precision=False)
    report = fit(cfg, ranks=2, dtype=torch.float32, **kw)
    assert not report.table.loc["fits"].iloc[1:].any()
    (note,) = [n for n in report.notes if n.startswith("no training plan fits on 2 ranks")]
    n = int(re.search(r"would fit from (\d+) ranks", note)[1])
    # the number said is the first that fits: its own table at n fits, at n - 1 it does not
    assert fit(cfg, ranks=n, dtype=torch.float32, **kw).fits("ZeRO-3 (FSDP)")
    assert not fit(cfg, ranks=n - 1, dtype=torch.float32, **kw).fits("ZeRO-3 (FSDP)")
    assert f"({n * 1} GPUs at tp=1)" in note
    # a memory that the saved activations alone exceed: no number of ranks, said with why
    tiny = fit(cfg, ranks=2, dtype=torch.float32, **{**kw, "memory_bytes": 1000})
    assert any("at no number of ranks" in n and "saved activations" in n for n in tiny.notes)


class _LoRA(nn.Module):
    """A low-rank adapter beside a frozen Linear: rank 4, no biases."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x))


def test_a_frozen_base_under_adapters_has_no_gradients_or_optimizer_state():
    model = transformers.LlamaForCausalLM(_gqa(4, 2, 64))
    model.requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj = _LoRA(layer.self_attn.q_proj)  # 64 -> 64
        layer.self_attn.v_proj = _LoRA(layer.self_attn.v_proj)  # 64 -> 32
    report = fit(model, context=16)
    t = report.table["data parallel"]
    # trained: 2 layers x (q: 64 x 4 + 4 x 64, v: 64 x 4 + 4 x 32) = 1,792 elements in 8
    # tensors; every one of the 74,688 + 1,792 = 76,480 held as bf16 weights
    assert t["weights"] == 76_480 * 2
    assert t["gradients"] == 1_792 * 2  # bf16 (all 76,480 were counted: 152,960)
    assert t["master_weights"] == 1_792 * 4  # fp32 under mixed precision
    assert t["optimizer_state"] == 2 * 4 * 1_792 + 4 * 8  # Adam's m, v and a step a tensor
    # the causal LM's 21 tensors (embedding, head, 9 a layer, final norm) are the frozen ones
    assert any(n.startswith("21 parameter tensors are frozen") for n in report.notes)


class _WithHead(nn.Module):
    """A user's classifier over a causal LM's last hidden states: no config of its own."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm, self.head = lm, nn.Linear(64, 7)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lm(input_ids, output_hidden_states=True).hidden_states[-1])


def test_a_users_model_around_a_transformers_one_is_counted_with_its_config():
    report = fit(_WithHead(transformers.LlamaForCausalLM(_gqa(4, 2, 64))), context=16)
    t = report.table
    # weights: the LM's 74,688 and the head's 64 x 7 + 7 = 455 elements, bf16
    assert t.loc["weights", "inference"] == (74_688 + 455) * 2
    # its forward ran on meta with 16 token ids (a module without a config counted none): the
    # largest leaf call is the MLP's SiLU, 16 x 96 in and 16 x 96 out, bf16 (the LM head on
    # every position, which the wrapper asks for, is 16 x 64 in and 16 x 101 out: less)
    assert t.loc["activation", "inference"] == 2 * 16 * 96 * 2
    assert t.loc["saved_activations", "data parallel"] > 0
    assert not any("without a transformers config" in n for n in report.notes)


def _bert(layers: int, **kw):
    return transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=96,
        vocab_size=100,
        **kw,
    )


def test_a_composite_encoder_decoder_config_caches_its_decoders_keys_and_values():
    cfg = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        _bert(1), _bert(2, is_decoder=True, add_cross_attention=True)
    )
    report = fit(cfg, dtype=torch.float32, context=16, training=False)
    assert report.model == "EncoderDecoderModel"
    # the decoder's config: 2 (K, V) x 2 layers x 4 heads x 16 x 4 bytes = 1,024 B a token,
    # for its own 16 tokens and the 16 encoded ones (the composite config's own names held
    # none of it: 0 B)
    assert report.table.loc["kv_cache", "inference"] == 32 * 1024


def test_a_vision_language_config_is_built_with_its_lm_head():
    text = _gqa(4, 2, 64)
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=16,
        projection_dim=32,
    )
    cfg = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=100)
    report = fit(cfg, context=16, training=False)
    assert report.model == "LlavaForConditionalGeneration"  # the bare LlavaModel was built
    with torch.device("meta"):
        bare = transformers.LlavaModel(cfg)
    # the model that generates text holds the 101 x 64 LM head the bare model has not
    assert report.parameters == sum(p.numel() for p in bare.parameters()) + 101 * 64


class _FixedState(torch.optim.Optimizer):
    """Keeps a buffer of 3 floats per parameter, whatever its shape (as a custom optimizer's
    running statistics might), and takes a plain SGD step."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if not self.state[p]:
                    self.state[p]["buf"] = torch.zeros(3)
                p.add_(p.grad, alpha=-group["lr"])


def test_a_fixed_size_state_is_not_read_as_a_dimension_of_the_probe():
    from modelprof.step.optimizer_state import optimizer_states

    rule = optimizer_states(_FixedState)
    # 3 floats = 12 bytes per parameter tensor, whatever its shape; before, the 3 matched the
    # probe's first dimension (3 of 3 x 5) and was read as one element per row: 64 x 4 = 256
    # bytes for a (64, 64) weight
    for shape in [(3,), (3, 5), (64,), (64, 64), (3, 5, 7, 11)]:
        assert rule.nbytes(shape, 4) == (0, 12), shape
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    real = _FixedState(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    real.step()
    held = sum(t.nbytes for s in real.state.values() for t in s.values())
    assert held == 4 * 12  # four parameter tensors, 12 bytes each


@pytest.mark.parametrize(
    "kw, heads_cached",
    [
        (dict(new_decoder_architecture=True, num_kv_heads=2), 8),
        (dict(multi_query=True), 1),
        (dict(multi_query=False), 8),
    ],
    ids=["new_decoder_architecture", "multi_query", "multi_head"],
)
def test_falcons_cache_is_planned_as_transformers_holds_it(kw, heads_cached):
    import transformers

    from modelprof.generation.cache import closed_form_kv_bytes

    config = transformers.FalconConfig(
        vocab_size=64, hidden_size=64, num_attention_heads=8, num_hidden_layers=1, **kw
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.FalconForCausalLM(config).eval()
        out = model(torch.zeros(1, 5, dtype=torch.long), use_cache=True)
    real = sum(x.nbytes for layer in out.past_key_values.layers for x in (layer.keys, layer.values))
    # 2 (K, V) x 1 layer x heads cached x head dim 8 x 5 tokens x 4 bytes: the new architecture
    # broadcasts its 2 KV heads to all 8 before caching them (2,560 B, read as 1 head before:
    # 320), multi-query caches 1 (320 B), multi-head all 8
    assert real == 2 * heads_cached * 8 * 5 * 4
    assert closed_form_kv_bytes(config, torch.float32, 5, 1) == real


@pytest.mark.parametrize("training", ["yes", None, 1, "False"])
def test_training_must_be_true_or_false(training):
    # before: any value was taken for its truth ("False" planned training, None did not)
    with pytest.raises(ModelProfError, match=r"training=.* must be True or False"):
        fit(nn.Linear(4, 4), training=training)


def test_an_optimizer_that_refuses_without_a_message_is_named_in_one_line():
    # str() of a bare RuntimeError() is empty: the refusal was quoted as its first line and
    # raised an IndexError instead
    from modelprof.step.optimizer_state import optimizer_states

    class Mute(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError()

    rule = optimizer_states(lambda params: Mute(params, lr=0.1))  # probed when first asked
    with pytest.raises(ModelProfError, match=r"cannot step a float32 .*: RuntimeError: $"):
        rule.nbytes((4, 4), 4)


def test_an_encoder_keeps_no_kv_cache_and_its_index_buffers_are_no_weights():
    # BertModel: embeddings 100 x 64 + 512 x 64 + 2 x 64 + LayerNorm 128 = 39,424; a layer:
    # QKV 3 x 4,160, attention output 4,160 + 128, intermediate 6,240, output 6,208 + 128 =
    # 29,344, twice; pooler 4,160: 102,272 parameters, 204,544 B in bf16. Its int64
    # position_ids and token_type_ids (512 each, 8 KiB) are indices, not packed weights (a
    # newcomer's fit said "quantized or packed"), and an encoder keeps no KV cache (it read
    # 2 x 2 layers x 16 x 64 x 2 B = 8,192 B)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        given = fit(transformers.BertModel(_bert(2)), context=16, training=False)
        built = fit(_bert(2), context=16, training=False)
    for report in (given, built):
        assert report.table.loc["weights", "inference"] == 102_272 * 2
        assert report.table.loc["kv_cache", "inference"] == 0
        assert not any("quantized or packed" in n for n in report.notes)
    # built from an encoder's config: its base model, not a causal LM without is_decoder
    assert any(n.startswith("counted BertModel,") for n in built.notes)
    # XLM says it by is_encoder (transformers 5 gives its config no is_decoder): no cache
    # either, where it had read 2 x 2 layers x 16 x 64 x 2 B = 8,192 B (review)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xlm = fit(
            transformers.XLMConfig(emb_dim=64, n_layers=2, n_heads=4, vocab_size=100),
            context=16,
            training=False,
        )
    assert xlm.table.loc["kv_cache", "inference"] == 0
    # as a decoder (is_decoder=True) BERT's causal LM keeps its 8,192 B of keys and values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoder = fit(_bert(2, is_decoder=True), context=16, training=False)
    assert any(n.startswith("counted BertLMHeadModel,") for n in decoder.notes)
    assert decoder.table.loc["kv_cache", "inference"] == 2 * 2 * 16 * 64 * 2


class _PackedWithNorm(nn.Module):
    """BitNet's layer as transformers packs it: no parameter of its own, its weight four 2-bit
    values a byte in a uint8 buffer, a scale, and a norm inside it."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(n // 4, n, dtype=torch.uint8))
        self.register_buffer("weight_scale", torch.ones(1, dtype=torch.bfloat16))
        self.norm = nn.LayerNorm(n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def test_packed_weights_of_a_layer_with_modules_inside_are_kept():
    report = fit(nn.Sequential(_PackedWithNorm(256)), dtype=torch.bfloat16, training=False)
    # the uint8 weight 64 x 256 = 16,384 B and its scale's 2 B, as stored; the norm's 512
    # parameters at bf16 = 1,024 B: 17,410 (an int64 buffer alone is an index, not these)
    assert report.table.loc["weights", "inference"] == 16_384 + 2 + 1_024
    assert any("quantized or packed" in n for n in report.notes)


def test_a_config_of_parts_keeps_its_decoders_cache():
    # Qwen2-Audio: an audio encoder whose layers say is_decoder=False beside a Qwen2 decoder
    # that reads no such flag: the decoder's cache stays, 2 (K, V) x 2 layers x 16 tokens x
    # 2 KV heads x 16 x 2 B = 4,096 B (a review found the flag read as the whole model's: 0)
    cfg = transformers.Qwen2AudioConfig(
        text_config={
            "model_type": "qwen2",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
        },
        audio_config={
            "model_type": "qwen2_audio_encoder",
            "d_model": 64,
            "encoder_layers": 1,
            "encoder_attention_heads": 4,
            "encoder_ffn_dim": 96,
            "num_mel_bins": 8,
        },
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fit(cfg, context=16, training=False)
    assert report.table.loc["kv_cache", "inference"] == 2 * 2 * 16 * 2 * 16 * 2
