"""Encoder-decoder models: refused by the decoder-only HF path with the step= recipe that works,
and through that recipe an ``EncoderDecoderCache`` (inside the step's cache value) is put back
after every counted step, its cross-attention bytes read apart from the self-attention ones."""

from __future__ import annotations

import warnings

import pytest
import torch

from modelprof import ModelProfError, profile_generation

transformers = pytest.importorskip("transformers")


def _t5():
    config = transformers.T5Config(
        vocab_size=64,
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


class _T5Step:
    """The docs' recipe: encode the prompt at the first call, then decode against an
    EncoderDecoderCache; the cache value is ``(encoder_output, cache)``. Records the decoder's
    cache length at every call."""

    def __init__(self, model) -> None:
        self.model, self.lengths = model, []

    def __call__(self, tokens, cache):
        model = self.model
        if cache is None:
            encoded = model.get_encoder()(input_ids=tokens)
            cache = (
                encoded,
                transformers.EncoderDecoderCache(
                    transformers.DynamicCache(), transformers.DynamicCache()
                ),
            )
            tokens = torch.full((tokens.shape[0], 1), model.config.decoder_start_token_id)
        encoded, kv = cache
        self.lengths.append(kv.get_seq_length())
        out = model(encoder_outputs=encoded, decoder_input_ids=tokens, cache=kv, use_cache=True)
        return out.logits, (encoded, out.cache)


def test_the_hf_path_refuses_an_encoder_decoder_with_the_recipe():
    with pytest.raises(
        ModelProfError,
        match=r"T5ForConditionalGeneration is an encoder-decoder "
        r"model: .* Profile it with step=.*Encoder-decoder",
    ):
        profile_generation(_t5(), prompt_len=8, new_tokens=4, timing=False)
    config = transformers.WhisperConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_mel_bins=8,
        max_source_positions=8,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whisper = transformers.WhisperForConditionalGeneration(config).eval()
    with pytest.raises(
        ModelProfError,
        match=r"WhisperForConditionalGeneration is an "
        r"encoder-decoder model: .*input_features",
    ):
        profile_generation(whisper, prompt_len=4, new_tokens=4, timing=False)


def test_the_step_recipe_is_rewound_and_reads_both_caches():
    model = _t5()
    step = _T5Step(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = profile_generation(model, prompt_len=8, new_tokens=6, step=step, timing=False)
    # every step saw the decoder's cache where the run had put it: the prefill an empty one,
    # each decode context's own length (0, 1, 1, 3, 3, 5: a context is reached, counted, put
    # back), never a cache grown by the passes before (the failure this guards against)
    assert max(step.lengths) == 5
    kv = report.kv
    # cross-attention per layer: 8 encoder tokens x K and V x 2 heads x d_kv 4 x 4 B = 512 B,
    # the same at every decoder context
    assert kv.per_layer_cross_bytes == (512, 512) and kv.cross_bytes == 1024
    # self-attention after the last counted step: 6 decoder tokens x 2 x 2 x 4 x 4 B = 384 B
    assert kv.tokens == 6 and kv.per_layer_bytes == (512 + 384, 512 + 384)
    # per decoder token: 2 layers x 64 B = 128 B, the closed form of the config
    assert kv.per_token_bytes == kv.closed_form_per_token == 128
    assert kv.matches_closed_form is True
    # the decode steps are counted at growing self-attention lengths: more MACs at each
    macs = [p.totals["macs"] for p in report.phases()[1:]]
    assert len(macs) == 3 and macs == sorted(macs) and len(set(macs)) == 3
