"""Vision-language prompts: ``profile_generation(..., inputs={...})`` gives the prompt's forward
its image (``pixel_values``) and its own token ids, so the vision tower has its rows in the
prefill and the image tokens count in the context."""

from __future__ import annotations

import warnings

import pytest
import torch

from modelprof import ModelProfError, profile, profile_generation

transformers = pytest.importorskip("transformers")

IMAGE_TOKEN = 63


def _llava():
    vision = transformers.CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
        projection_dim=16,
    )
    text = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    config = transformers.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=IMAGE_TOKEN,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(config).eval()


def _prompt():
    # a 16x16 image in 8x8 patches becomes (16/8)^2 = 4 image tokens, then 6 text tokens
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat(
        [torch.full((1, 4), IMAGE_TOKEN), torch.randint(0, 60, (1, 6), generator=gen)], dim=1
    )
    return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 16, 16, generator=gen)}


def _run(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile_generation(model, **kwargs)


def test_the_image_is_counted_in_the_prefill_and_its_tokens_in_the_context():
    model = _llava()
    report = _run(model, inputs=_prompt(), new_tokens=3, timing=False)
    # the prompt is the given ids: 4 image + 6 text tokens; decode contexts 10 and 11
    assert report.spec.prompt_len == 10 and report.spec.contexts == (10, 11)
    prefill = report.prefill().report.to_dataframe().set_index("module")["macs"]
    # patch embedding: 4 patches x 16 channels x (3 x 8 x 8) = 12,288
    assert prefill["model.vision_tower.embeddings.patch_embedding"] == 12_288
    # the one encoder layer on 4 patches + the class token = 5 tokens: q, k, v, o 4 x 16 x 16
    # x 5 = 5,120; scores and values 2 x 5 x 5 x 16 = 800; MLP 2 x 16 x 32 x 5 = 5,120
    assert prefill["model.vision_tower.encoder.layers.0"] == 11_040
    # projector on the 4 image features: 16 x 32 + 32 x 32 = 1,536 per token x 4 = 6,144
    assert prefill["model.multi_modal_projector"] == 6_144
    # the prefill is the model's forward on the prompt, less the logits of the 9 positions
    # generate() does not ask for (logits_to_keep=1): lm_head 32 x 64 x 9 = 18,432
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = profile(model, inputs=_prompt(), timing=False).totals["macs"]
    assert prefill[""] == whole - 18_432
    # a decode step does not see the image again (its cache holds what it became)
    decode = report.decode().report.to_dataframe()
    assert not decode["module"].str.contains("vision_tower").any()
    # 12 tokens in the cache after the last step: K and V x 2 layers x 2 KV heads x 8 dims
    # x 4 B = 256 B per token, image tokens included
    assert report.kv.per_token_bytes == 256 and report.kv.tokens == 12


def test_the_image_reaches_generate_at_every_batch_size():
    report = _run(
        _llava(),
        inputs=_prompt(),
        new_tokens=3,
        batch_size=[1, 2],
        repeat=2,
        warmup=1,
        layer_timing=False,
    )
    rope = {
        b: report.prefill(b)
        .report.to_dataframe()
        .set_index("module")["macs"]["model.language_model.rotary_emb"]
        for b in (1, 2)
    }
    # the rotary angles are computed once per position, for every sequence at once (position
    # ids [1, 10]): transformers 5.17 as a matmul inv_freq [1, 4, 1] @ positions [1, 1, 10]
    # = 4 x 10 = 40 MACs at any batch size, 5.24 as an elementwise product, 0 MACs
    assert rope[1] == rope[2] and rope[1] in (0, 40)
    for b in (1, 2):
        assert report.timings[b].end_to_end.n == 2
        # the prompt's one image repeated to the batch: b x the batch-1 prefill, the rotary
        # angles once
        once = report.prefill(1).totals["macs"] - rope[1]
        assert report.prefill(b).totals["macs"] == b * once + rope[1]


def test_prompt_inputs_are_checked():
    model = _llava()
    pixels = {"pixel_values": _prompt()["pixel_values"]}
    with pytest.raises(ModelProfError, match=r"without input_ids: .* image tokens \(id 63\)"):
        _run(model, inputs=pixels, timing=False)
    with pytest.raises(
        ModelProfError,
        match=r"prompt_len=8 contradicts inputs\['input_ids'\] "
        r"of 10 tokens",
    ):
        _run(model, inputs=_prompt(), prompt_len=8, timing=False)
    with pytest.raises(
        ModelProfError,
        match=r"contexts=\[4, 12\]: 4 is shorter than the "
        r"prompt given in inputs= \(10 tokens\)",
    ):
        _run(model, inputs=_prompt(), new_tokens=3, contexts=[4, 12], timing=False)
    with pytest.raises(ModelProfError, match=r"a step function passes its own"):
        _run(model, inputs=_prompt(), step=lambda t, c: (model(t).logits, c), timing=False)
