"""Generation makes exactly ``new_tokens`` whatever the model's tokens (a model whose every
token is EOS made 1), and says nothing of transformers' warnings about the settings modelprof
gives ``generate`` (Whisper printed one per timed generation)."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from modelprof import profile_generation

transformers = pytest.importorskip("transformers")

QUICK = dict(layer_timing=False, budget_s=0.2, warmup=1, warn=False)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _llama(eos):
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=8,
        bos_token_id=0,
        pad_token_id=0,
        eos_token_id=eos,
    )
    torch.manual_seed(0)
    return _quiet(transformers.LlamaForCausalLM, config).eval()


@pytest.mark.parametrize("every_token_eos", [True, False])
def test_exactly_new_tokens_come_from_a_model_that_only_says_eos(every_token_eos):
    if every_token_eos:  # all 8 ids are EOS: suppressing EOS left no token to pick
        model = _llama(list(range(8)))
    else:  # one EOS (3), which the head always picks: its logit 100, the others 0
        model = _llama(3)
        with torch.no_grad():
            model.lm_head.weight.zero_()
            model.lm_head.weight[3] = 1.0
        model.model.norm.register_forward_hook(lambda m, i, o: torch.full_like(o, 100.0 / 16))
    before = model.generation_config.to_dict()
    report = _quiet(profile_generation, model, prompt_len=4, new_tokens=5, **QUICK)
    # each timed generate() made exactly 5 tokens (a shorter one raises "made 1 tokens"), and
    # the TPOT is over 5 - 1 = 4 steps of each
    assert report.timings[1].end_to_end.n >= 1
    assert model.generation_config.to_dict() == before  # a copy was given to generate()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_whisper_generation_says_no_transformers_warning():
    config = transformers.WhisperConfig(
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
    torch.manual_seed(0)
    model = _quiet(transformers.WhisperForConditionalGeneration, config).eval()
    handler = _Records()
    root = logging.getLogger("transformers")
    root.addHandler(handler)
    try:
        report = _quiet(profile_generation, model, prompt_len=3, new_tokens=3, **QUICK)
    finally:
        root.removeHandler(handler)
    assert report.timings[1].end_to_end.n >= 1
    # before: "Both `max_new_tokens` (=3) and `max_length`(=20) seem to have been set" once per
    # timed generation, and "Passing `generation_config` together with ..." once
    said = [r.getMessage() for r in handler.records if r.levelno >= logging.WARNING]
    assert said == []
    # the filter is gone with the run: the logger is as it was
    assert not logging.getLogger("transformers.generation.utils").filters
