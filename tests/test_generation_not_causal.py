"""A transformers causal-LM class built bidirectional (BERT's LM head without
``is_decoder=True``) is no causal LM: transformers only logs it and runs it, each token seeing
later ones and no KV cache kept, so ``profile_generation`` refuses it, naming the flag."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers import BertConfig, BertLMHeadModel, GPT2Config, GPT2LMHeadModel

from modelprof import ModelProfError, profile_generation
from modelprof.cli import main

_BERT = dict(
    hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100
)
_SPEC = "BertConfig:" + ",".join(f"{k}={v}" for k, v in _BERT.items())


def test_a_bidirectional_lm_head_is_refused_with_the_flag_to_set():
    with pytest.raises(ModelProfError, match=r"BertLMHeadModel is built bidirectional"):
        profile_generation(BertLMHeadModel(BertConfig(**_BERT)), 4, 3, timing=False)
    with pytest.raises(ModelProfError, match=r"build it with config\.is_decoder=True"):
        profile_generation(BertLMHeadModel(BertConfig(**_BERT)), 4, 3, timing=False)


def test_a_decoder_built_as_one_is_profiled():
    report = profile_generation(
        BertLMHeadModel(BertConfig(**_BERT, is_decoder=True)), 4, 3, timing=False
    )
    # keys and values of 1 layer, 64 wide, fp32: 2 x 64 x 4 = 512 B a token; the cache
    # ends at prompt 4 + 3 new - 1 (the last is never fed) = 6 tokens: 3,072 B
    assert (report.kv.tokens, report.kv.per_layer_bytes) == (6, (3072,))


def test_gpt2_whose_config_reads_no_is_decoder_is_not_refused():
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100))
    # 2 x 32 x 4 = 256 B a token, 6 tokens
    assert profile_generation(model, 4, 3, timing=False).kv.per_layer_bytes == (1536,)


def test_generate_refuses_a_bidirectional_config_and_runs_it_as_a_decoder(capsys):
    assert main(["generate", _SPEC, "--prompt-len", "4", "--new-tokens", "3", "--no-timing"]) == 2
    assert "add is_decoder=True to the config SPEC" in capsys.readouterr().err
    spec = _SPEC + ",is_decoder=True"
    assert main(["generate", spec, "--prompt-len", "4", "--new-tokens", "3", "--no-timing"]) == 0


def test_xlm_says_causal_in_its_own_flag():
    # XLM has no is_decoder: is_encoder=True always (False cannot be built, "XLM can only be
    # used as an encoder"), and causal=True makes its causal LM: refused without it, naming it
    from transformers import XLMConfig, XLMWithLMHeadModel

    from modelprof.generation.lm import encoder_only

    small = dict(emb_dim=32, n_layers=1, n_heads=2, vocab_size=100)
    with pytest.raises(ModelProfError, match=r"\(config\.causal=False\).*config\.causal=True"):
        profile_generation(XLMWithLMHeadModel(XLMConfig(**small)), 4, 3, timing=False)
    assert not encoder_only(XLMWithLMHeadModel(XLMConfig(causal=True, **small)))


def test_a_config_files_own_kinds_are_taken_as_written(tmp_path):
    # a real config.json's values as its file has them: Llama 3.1's eos_token_id is a list of
    # three ids where LlamaConfig's default is one int (an override's kind check refused it)
    from modelprof.generation.specs import load_language_model

    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, '
        '"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, '
        '"vocab_size": 100, "eos_token_id": [1, 2, 3]}'
    )
    model = load_language_model(str(path))[0]
    assert model.config.eos_token_id == [1, 2, 3]
