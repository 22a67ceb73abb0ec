"""Encoder-decoder generation (T5, Whisper): through ``profile_generation``'s HuggingFace path the
encoder runs once as its own phase (counted, timed, per layer), then the decoder's prefill and
decode steps against a self-attention cache that grows and a cross-attention cache fixed at the
encoder's length; through ``step=`` an ``EncoderDecoderCache`` (returned alone or inside
``(encoder_output, cache)``) is put back after every pass, so each decode step runs at its own
decoder length. Tiny configs, closed forms beside each assertion."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import picture, tiny_t5

from modelprof import ModelProfError, compare_generation, profile_generation
from modelprof.cli import main
from modelprof.runtime import compat

transformers = pytest.importorskip("transformers")

# T5 (helpers.tiny_t5): 3 encoder and 2 decoder layers, d_model 16, 2 heads of d_kv 4 (inner 8),
# d_ff 32, ReLU feed-forward.
# Whisper: 1 encoder layer, 2 decoder layers, d_model 16, 2 heads (head_dim 8), FFN 32, 8 mel
# bins, 8 source positions (16 frames), 16 target positions
WHISPER_KW = dict(
    vocab_size=64,
    d_model=16,
    encoder_layers=1,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    num_mel_bins=8,
    max_source_positions=8,
    max_target_positions=16,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=3,
)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _whisper():
    torch.manual_seed(0)
    return _quiet(
        transformers.WhisperForConditionalGeneration, transformers.WhisperConfig(**WHISPER_KW)
    ).eval()


def _run(model, **kwargs):
    return _quiet(profile_generation, model, **kwargs)


def _t5_encoder_macs(source: int) -> int:
    # per source token and encoder layer: q, k, v, o 4 x 16 x 8 = 512; wi, wo 2 x 16 x 32 =
    # 1024; attention QK^T and AV 2 x 2 heads x source x 4 = 16 x source
    return 3 * source * (512 + 1024 + 16 * source)


def test_t5_encoder_runs_once_as_its_own_phase():
    model = tiny_t5()
    before = (picture(model), model.config.to_dict(), model.generation_config.to_dict())
    source = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    report = _run(
        model,
        inputs={"input_ids": source},
        prompt_len=4,
        new_tokens=6,
        batch_size=[1, 2],
        timing=False,
    )
    # the model, its config and generation config come back as they went in
    assert (picture(model), model.config.to_dict(), model.generation_config.to_dict()) == before
    phases = report.phases()
    assert [p.label for p in phases] == ["encoder", "prefill", "decode@4", "decode@6", "decode@8"]
    enc = report.encoder()
    # 3 x 6 x (1536 + 96) = 29,376; the source's 6 tokens are the encoder's output length
    assert enc.totals["macs"] == _t5_encoder_macs(6) == 29_376 and enc.tokens == 6
    # the source's one row repeated to batch 2: twice the MACs
    assert report.encoder(2).totals["macs"] == 2 * 29_376
    rows = enc.report.to_dataframe().set_index("module")
    # the encoder's rows carry the names the modules have in the model
    assert rows.loc["encoder", "macs"] == 29_376
    assert rows.loc["encoder.block.2.layer.1.DenseReluDense.wi", "macs"] == 6 * 16 * 32  # 3072
    assert "decoder" not in rows.index  # the decoder does not run in the encoder phase
    # ... and not again in the decoder's phases, which read what it made
    for p in phases[1:]:
        df = p.report.to_dataframe()
        assert not df["module"].str.startswith("encoder.").any()
        assert df.set_index("module").loc["decoder", "macs"] > 0


def test_t5_self_cache_grows_and_cross_cache_is_fixed_at_the_source_length():
    report = _run(
        tiny_t5(),
        inputs={"input_ids": torch.zeros(1, 6, dtype=torch.long)},
        prompt_len=4,
        new_tokens=6,
        batch_size=[1, 2],
        timing=False,
    )
    for b in (1, 2):
        for p in report.phases(b)[1:]:
            kv = p.kv
            n = p.context + p.tokens  # the decoder's tokens after the step: asked context + 1
            assert kv.tokens == n
            # self-attention: 2 (K, V) x 2 decoder layers x 2 heads x 4 x n x 4 B x batch
            assert kv.total_bytes - kv.cross_bytes == 2 * 2 * 2 * 4 * n * 4 * b == 128 * n * b
            # cross-attention: the same closed form over the 6 source tokens, at every step
            assert kv.per_layer_cross_bytes == (2 * 2 * 4 * 6 * 4 * b,) * 2  # 384 B x batch
            assert kv.cross_tokens == 6 and kv.matches_closed_form is True
    kv = report.kv
    assert kv.per_token_bytes == kv.closed_form_per_token == 128  # 2 x 2 x 2 x 4 x 4 B
    # the memory plan holds the cross-attention once per sequence, whatever the context
    assert report.memory.state_per_seq_bytes == 768 and report.memory.kv_per_token_bytes == 128
    assert "cross-attention over the encoder's 6 tokens" in repr(report)
    assert "self-attention 128 bytes/token" in repr(report)
    # the decoder's prompt of 4 tokens against the 6 source tokens, from the empty cache
    assert report.prefill().tokens == 4 and report.prefill().kv.tokens == 4


def test_whisper_runs_from_features_built_from_its_config():
    model = _whisper()
    before = picture(model)
    report = _run(model, prompt_len=3, new_tokens=5, timing=False)
    assert picture(model) == before
    enc = report.encoder()
    # conv1 8 -> 16 channels, kernel 3 over 16 frames: 16 x 16 x 8 x 3 = 6,144; conv2 16 -> 16,
    # stride 2 to 8 frames: 8 x 16 x 16 x 3 = 6,144; the layer per token: q, k, v, o
    # 4 x 16 x 16 = 1,024, fc1 and fc2 2 x 16 x 32 = 1,024, attention 2 x 8 x 16 = 256:
    # 8 x 2,304 = 18,432
    assert enc.totals["macs"] == 6_144 + 6_144 + 18_432 == 30_720
    assert enc.tokens == 8  # max_source_positions
    rows = enc.report.to_dataframe().set_index("module")
    assert rows.loc["model.encoder.conv2", "macs"] == 6_144
    kv = report.kv
    # cross-attention: 2 x 2 layers x 2 heads x 8 x 8 source tokens x 4 B = 2,048 B, fixed
    assert kv.cross_bytes == 2_048 and kv.cross_tokens == 8
    assert [p.kv.cross_bytes for p in report.phases()[1:]] == [2_048] * 4
    # self-attention per decoder token: 2 x 2 x 2 x 8 x 4 B = 256 B
    assert kv.per_token_bytes == kv.closed_form_per_token == 256
    # contexts asked for (3, 4, 6: the first, middle and last step) are the decoder lengths
    assert [p.context for p in report.phases()[2:]] == [3, 4, 6]
    assert [p.kv.tokens for p in report.phases()[2:]] == [4, 5, 7]


def test_the_decode_contexts_are_those_asked_for():
    report = _run(_whisper(), prompt_len=3, new_tokens=12, contexts=[3, 9, 14], timing=False)
    steps = report.phases()[2:]
    # decode at L: L decoder tokens in the self-attention cache before the step, L + 1 after;
    # 14 + 1 = 15 positions of the decoder's 16
    assert [p.context for p in steps] == [3, 9, 14]
    assert [p.kv.tokens for p in steps] == [4, 10, 15]
    # self-attention 256 B per decoder token, cross-attention 2,048 B at every step
    assert [p.kv.total_bytes for p in steps] == [256 * n + 2_048 for n in (4, 10, 15)]


def test_timed_encoder_decoder_generation():
    report = _run(_whisper(), prompt_len=3, new_tokens=4, repeat=2, warmup=1, warn=False)
    enc = report.encoder()
    # the encoder is timed per layer like any phase (no duration asserted: a loaded VM)
    assert enc.report.latency is not None and enc.report.latency.n >= 1
    df = enc.report.to_dataframe().set_index("module")
    assert df.loc["model.encoder.layers.0", "latency_ms"] > 0
    timing = report.timing
    # generate() made exactly new_tokens: TTFT then 3 decode steps per generation
    assert timing.end_to_end.n == 2 and timing.step_ms.shape == (2, 3)
    assert report.phase_table()["phase"].tolist() == ["encoder", "prefill"] + ["decode"] * 3


def test_without_a_cache_each_decode_step_recomputes_the_decoder_prefix():
    model = tiny_t5()
    source = {"input_ids": torch.zeros(1, 5, dtype=torch.long)}
    report = _run(
        model, inputs=source, prompt_len=3, new_tokens=4, cache=None, contexts=[4], timing=False
    )
    # decode at 4 without a cache: the decoder over 5 tokens, as a prefill of 5 tokens is
    five = _run(model, inputs=source, prompt_len=5, new_tokens=2, timing=False)
    assert report.decode(4).totals["macs"] == five.prefill().totals["macs"]
    assert (
        report.decode(4).kv is None
        and report.encoder().totals["macs"] == five.encoder().totals["macs"]
    )


def test_decoder_length_and_inputs_are_checked_before_running():
    model = _whisper()
    # 10 + 10 = 20 decoder tokens, the decoder has 16 positions (Whisper's generate counts the
    # last token too, though it is never fed)
    with pytest.raises(
        ModelProfError,
        match=r"prompt_len=10 \+ new_tokens=10 needs 20 positions \(its generate\(\) counts the "
        r"last token too\), more than the model's 16 decoder positions \(max_target_positions\)",
    ):
        _run(model, prompt_len=10, new_tokens=10, timing=False)
    with pytest.raises(
        ModelProfError,
        match=r"inputs\['input_features'\] of shape \(1, 8, 10\): "
        r"WhisperForConditionalGeneration takes \(batch, num_mel_bins=8, 2 x "
        r"max_source_positions=16\)",
    ):
        _run(
            model,
            inputs={"input_features": torch.zeros(1, 8, 10)},
            prompt_len=3,
            new_tokens=3,
            timing=False,
        )
    with pytest.raises(ModelProfError, match=r"cache='static': .* is an encoder-decoder model"):
        _run(model, prompt_len=3, new_tokens=4, cache="static", timing=False)
    ids = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(
        ModelProfError,
        match=r"prompt_len=4 contradicts inputs\['decoder_input_ids'\] of 5 tokens",
    ):
        _run(tiny_t5(), inputs={"decoder_input_ids": ids}, prompt_len=4, timing=False)
    # a source of 10**9 tokens is refused before it is made
    with pytest.raises(ModelProfError, match=r"after a source of 1000000000 tokens"):
        _run(tiny_t5(), prompt_len=10**9, new_tokens=2, timing=False)


class _T5FromEmbeddings(transformers.T5ForConditionalGeneration):
    main_input_name = "inputs_embeds"  # an encoder input modelprof cannot make up


def test_an_encoder_input_that_cannot_be_made_is_asked_for():
    with pytest.raises(
        ModelProfError,
        match=r"_T5FromEmbeddings encodes 'inputs_embeds', which modelprof cannot make "
        r"up; give it in inputs=\{'inputs_embeds': \.\.\.\}",
    ):
        _run(tiny_t5(_T5FromEmbeddings), prompt_len=3, new_tokens=3, timing=False)


def test_the_decoder_prompt_given_starts_where_it_says():
    model = tiny_t5()
    prompt = torch.tensor([[0, 5, 6]])
    report = _run(model, inputs={"decoder_input_ids": prompt}, new_tokens=3, timing=False)
    # the prompt's length is the given decoder prompt's; the source defaults to that length
    assert report.spec.prompt_len == 3 and report.encoder().tokens == 3
    assert report.prefill().kv.tokens == 3


# -- step=: the EncoderDecoderCache a step returns is put back --------------------------------
class _Step:
    """Encode at the first call, then decode against an ``EncoderDecoderCache``; ``tuple``:
    return ``(encoder_output, cache)`` as the cache value, else the cache alone (the encoder's
    output kept by the step). Records the decoder's cache length at every call."""

    def __init__(self, model, encode, tuple_cache: bool) -> None:
        self.model, self.encode, self.tuple = model, encode, tuple_cache
        self.lengths: list[int] = []
        self.encoded = None

    def __call__(self, tokens, cache):
        model = self.model
        if cache is None:
            self.encoded = model.get_encoder()(**self.encode(tokens))
            kv = compat.new_encoder_decoder_cache()
            tokens = torch.full((tokens.shape[0], 1), model.config.decoder_start_token_id)
        else:
            kv = cache[1] if self.tuple else cache
        self.lengths.append(kv.get_seq_length())
        name = compat.cache_argument(model.forward)
        out = model(
            encoder_outputs=self.encoded, decoder_input_ids=tokens, use_cache=True, **{name: kv}
        )
        kv = compat.output_cache(out)
        return out.logits, ((self.encoded, kv) if self.tuple else kv)


@pytest.mark.parametrize("tuple_cache", [True, False])
def test_a_step_cache_is_put_back_to_each_decoder_length(tuple_cache):
    model = tiny_t5()
    step = _Step(model, lambda tokens: {"input_ids": tokens}, tuple_cache)
    report = _run(model, prompt_len=8, new_tokens=6, step=step, timing=False)
    # decode at L is the step with L - 8 + 1 decoder tokens in the cache (8: the prompt the
    # encoder read, 1: the start token): contexts 8, 10, 12 -> 1, 3, 5; every counted step saw
    # the cache where the run had put it, never one grown by the passes before
    assert max(step.lengths) == 5
    assert [p.kv.tokens for p in report.phases()[1:]] == [2, 4, 6]
    kv = report.kv
    # cross-attention: 2 x 2 heads x 4 x 8 source tokens x 4 B = 512 B per decoder layer
    assert kv.per_layer_cross_bytes == (512, 512) and kv.cross_tokens == 8
    assert kv.per_token_bytes == kv.closed_form_per_token == 128
    macs = [p.totals["macs"] for p in report.phases()[1:]]
    assert macs == sorted(macs) and len(set(macs)) == 3


def test_a_timed_whisper_step_never_runs_past_its_target_positions():
    model = _whisper()
    features = torch.zeros(1, 8, 16)
    step = _Step(model, lambda tokens: {"input_features": features}, tuple_cache=False)
    # 3 + 13 = 16 positions; the per-layer passes of each decode step run many times
    report = _run(model, prompt_len=3, new_tokens=13, step=step, repeat=2, warmup=1, warn=False)
    # the last step's decoder holds 12 tokens before it: the 13th new token needs position 13
    # (< 16); without the rewinding each timed pass would have grown the cache past 16
    assert max(step.lengths) == 12
    assert [p.context for p in report.phases()[1:]] == [3, 8, 14]
    assert report.decode(14).report.latency is not None


def test_compare_generation_runs_encoder_decoders():
    table = _quiet(
        compare_generation,
        {"t5": tiny_t5(), "whisper": _whisper()},
        prompt_len=3,
        new_tokens=3,
        repeat=2,
        warmup=1,
        warn=False,
    )
    # each generated exactly 3 tokens twice (a short generate() would have raised); the
    # first model is the reference of the ratios
    assert list(table["generations"]) == [2, 2] and table["ttft_x"].iloc[0] == 1.0


def test_the_command_line_builds_and_runs_an_encoder_decoder_config(capsys):
    spec = "WhisperConfig:" + ",".join(f"{k}={v}" for k, v in WHISPER_KW.items())
    args = ["generate", spec, "--prompt-len", "3", "--new-tokens", "3", "--no-timing"]
    assert _quiet(main, args) == 0
    out = capsys.readouterr()
    assert "batch 1: encoder, prefill and 2 decode steps counted" in out.err
    # the encoder phase's closed form, as above: 6,144 + 6,144 + 18,432 = 30,720 MACs
    assert "WhisperForConditionalGeneration" in out.out and "encoder 3.07e-05 GMACs" in out.out


def test_bart_reads_its_decoder_heads_and_positions():
    config = transformers.BartConfig(
        vocab_size=64,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    model = _quiet(transformers.BartForConditionalGeneration, config).eval()
    source = {"input_ids": torch.randint(3, 64, (1, 7), generator=torch.Generator().manual_seed(0))}
    report = _run(model, inputs=source, prompt_len=3, new_tokens=4, timing=False)
    kv = report.kv
    # the decoder's 4 heads of 16 / 4 = 4 (not the encoder's 2 of 8): 2 x 2 layers x 4 x 4 x 4 B
    assert kv.per_token_bytes == kv.closed_form_per_token == 256
    # cross-attention over the 7 source tokens: 2 x 4 x 4 x 7 x 4 B = 896 B per layer
    assert kv.per_layer_cross_bytes == (896, 896) and kv.cross_tokens == 7
    with pytest.raises(
        ModelProfError,
        # 20 + 20 - 1 = 39 positions fed, past 32
        match=r"needs 39 positions .* than the model's 32 decoder positions "
        r"\(max_position_embeddings\)",
    ):
        _run(model, inputs=source, prompt_len=20, new_tokens=20, timing=False)
