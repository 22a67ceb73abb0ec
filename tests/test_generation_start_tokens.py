"""Encoder-decoders as transformers 5 builds them from a bare config: the decoder's start token
(T5's and Switch Transformers' configs name none: their pad token is it), and encoders whose
outputs the decoder reads by name (Switch Transformers). Tiny configs, closed forms beside the
assertions."""

from __future__ import annotations

import warnings

import pytest
import torch

from modelprof import ModelProfError, profile_generation
from modelprof.cli import main
from modelprof.generation.lm import decoder_start

transformers = pytest.importorskip("transformers")

T5_SPEC = "T5Config:vocab_size=64,d_model=16,d_kv=4,d_ff=32,num_layers=1,num_heads=2"
# Switch: one encoder and one decoder layer, both sparse (a router of 2 experts, top-1),
# d_model 16, 2 heads of d_kv 8 (inner 16), d_ff 32
SWITCH_KW = dict(
    vocab_size=64,
    d_model=16,
    d_ff=32,
    d_kv=8,
    num_layers=1,
    num_decoder_layers=1,
    num_heads=2,
    num_experts=2,
    encoder_sparse_step=1,
    decoder_sparse_step=1,
)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _switch(cls=None, **overrides):
    config = transformers.SwitchTransformersConfig(**{**SWITCH_KW, **overrides})
    torch.manual_seed(0)
    return _quiet(cls or transformers.SwitchTransformersForConditionalGeneration, config).eval()


def _t5(**overrides):
    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2, **overrides
    )
    torch.manual_seed(0)
    return _quiet(transformers.T5ForConditionalGeneration, config).eval()


def _source():
    return {"input_ids": torch.randint(2, 64, (1, 6), generator=torch.Generator().manual_seed(0))}


def test_a_bare_t5_config_names_no_start_token_and_its_pad_token_is_used():
    model = _t5()
    # transformers 5 declares decoder_start_token_id on the generation config only; T5Config's
    # pad token is 0 and it has no bos token: T5 starts its decoder from the pad token
    assert getattr(model.config, "decoder_start_token_id", None) is None
    assert getattr(model.generation_config, "decoder_start_token_id", None) is None
    assert decoder_start(model) == model.config.pad_token_id == 0
    # given, the start token wins over the bos and pad tokens
    assert decoder_start(_t5(pad_token_id=5, bos_token_id=4, decoder_start_token_id=3)) == 3
    assert decoder_start(_t5(pad_token_id=5, bos_token_id=4)) == 4  # as generate() picks


def test_a_bare_t5_is_timed_from_its_pad_token():
    model = _t5()
    gc_before = model.generation_config.to_dict()
    report = _quiet(
        profile_generation,
        model,
        inputs=_source(),
        prompt_len=3,
        new_tokens=3,
        layer_timing=False,
        budget_s=0.2,
        warmup=1,
    )
    timing = report.timings[1]
    # generate() ran (it raised "decoder_start_token_id or bos_token_id has to be defined"
    # before) and made exactly new_tokens each time: a short run raises
    assert timing.end_to_end.n >= 1 and report.spec.new_tokens == 3
    # the start token was given to generate() on a copy: the model's own is as it was
    assert model.generation_config.to_dict() == gc_before


def test_no_start_token_is_refused_before_anything_runs():
    model = _t5(pad_token_id=None, eos_token_id=None)
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ModelProfError, match="no decoder_start_token_id, bos_token_id or pad_"):
        _quiet(profile_generation, model, prompt_len=3, new_tokens=2, timing=False)
    assert calls == []  # not one forward


def test_the_command_line_times_a_bare_t5_config(capsys):
    args = ["generate", T5_SPEC, "--prompt-len", "3", "--new-tokens", "3", "--budget", "0.2"]
    assert _quiet(main, [*args, "--no-layer-timing"]) == 0
    out = capsys.readouterr()
    assert "T5ForConditionalGeneration" in out.out and "TTFT" in out.out
    assert "generations timed" in out.err


def test_the_command_line_takes_any_attribute_the_config_class_takes(capsys):
    # decoder_start_token_id is no attribute of a bare T5Config (transformers 5), yet the class
    # takes it; a misspelling is still refused, with the attribute it resembles
    spec = T5_SPEC + ",decoder_start_token_id=0"
    assert (
        _quiet(main, ["generate", spec, "--prompt-len", "3", "--new-tokens", "2", "--no-timing"])
        == 0
    )
    capsys.readouterr()
    bad = T5_SPEC + ",decoder_start_tokn_id=0"
    assert _quiet(main, ["generate", bad, "--no-timing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelprof: error: ")
    assert "no attribute 'decoder_start_tokn_id'; did you mean 'decoder_start_token_id'?" in err[0]


def test_the_command_line_refuses_a_config_with_no_start_token(capsys):
    spec = T5_SPEC + ",pad_token_id=None,eos_token_id=None"
    assert _quiet(main, ["generate", spec, "--no-timing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decoder_start_token_id=N" in err[0]


def _switch_encoder_macs(source: int) -> int:
    # per source token: q, k, v, o 4 x 16 x 16 = 1,024; the router 16 x 2 = 32; one expert
    # (top-1) wi, wo 2 x 16 x 32 = 1,024; QK^T and AV 2 x 2 heads x source x 8 = 32 x source
    return source * (1024 + 32 + 1024 + 32 * source)


def test_switch_transformers_generation_is_counted_and_timed():
    model = _switch()
    report = _quiet(
        profile_generation,
        model,
        inputs=_source(),
        prompt_len=3,
        new_tokens=3,
        layer_timing=False,
        budget_s=0.2,
        warmup=1,
    )
    encoder = report.phase_tables[1][0]
    assert encoder.name == "encoder" and encoder.tokens == 6
    assert encoder.totals["macs"] == _switch_encoder_macs(6) == 13_632
    assert report.timings[1].end_to_end.n >= 1


class _TupleUnlessAsked(torch.nn.Module):
    """An encoder that returns a plain tuple unless called with ``return_dict=True`` (as a
    transformers encoder under a config's ``return_dict=False`` does)."""

    def __init__(self, encoder):
        super().__init__()
        self.inner = encoder

    def forward(self, return_dict=None, **kwargs):
        out = self.inner(**kwargs)
        return out if return_dict else out.to_tuple()


def test_the_encoder_is_asked_for_the_output_the_decoder_reads_by_name():
    model = _switch()
    wrapped = _TupleUnlessAsked(model.get_encoder())
    model.get_encoder = lambda: wrapped
    report = _quiet(
        profile_generation, model, inputs=_source(), prompt_len=3, new_tokens=2, timing=False
    )
    # called as generate() calls it (return_dict=True), the encoder gave the ModelOutput whose
    # last_hidden_state and router_logits Switch's forward reads: the counts are those of the
    # model's own encoder, and the decoder ran against its 6 positions
    assert report.phase_tables[1][0].totals["macs"] == _switch_encoder_macs(6)
    assert report.kv.cross_tokens == 6
