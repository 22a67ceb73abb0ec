"""compare_generation with a failing candidate keeps the others (issue 38 item 18): the failure
in its row's ``error``, every model failing named each, never a raw error of one model."""

from __future__ import annotations

import pytest
import torch

from modelprof import ModelProfError
from modelprof.generation.compare import compare_generation

QUICK = dict(budget_s=0.1, min_samples=3, warn=False)


def _lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def _failing(after: int):
    """A model whose body raises from its ``after + 1``-th call on (0: at once)."""
    model = _lm()
    forward, calls = model.transformer.forward, [0]

    def broken(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise RuntimeError("boom")
        return forward(*args, **kwargs)

    model.transformer.forward = broken
    return model


@pytest.mark.parametrize("after", [0, 2])  # at its warm-up; inside the interleaved rounds
def test_a_failing_model_keeps_the_others(after):
    df = compare_generation(
        {"good": _lm(), "bad": _failing(after)}, prompt_len=4, new_tokens=3, **QUICK
    )
    assert list(df.index) == ["good", "bad"]
    assert df.loc["good", "ttft_ms"] > 0 and df.loc["good", "rank"] == 1
    assert df.loc["bad", "error"] == "RuntimeError: boom"
    assert df.isna().loc["bad", ["ttft_ms", "rank"]].all()
    assert df.attrs["failed"] == {"bad": "RuntimeError: boom"}
    assert "bad failed and is not compared (its error column says why)" in df.attrs["notes"]


def test_a_failing_first_model_hands_the_ratios_to_the_next():
    df = compare_generation(
        {"bad": _failing(0), "good": _lm()}, prompt_len=4, new_tokens=3, **QUICK
    )
    assert df.loc["good", "ttft_x"] == 1.0
    assert "the ratios are to good, the first model that ran" in df.attrs["notes"]


def test_every_model_failing_names_each():
    with pytest.raises(ModelProfError, match="every model failed") as err:
        compare_generation(
            {"a": _failing(0), "b": _failing(2)}, prompt_len=4, new_tokens=3, **QUICK
        )
    assert "model 'a': RuntimeError: boom" in str(err.value)
    assert "model 'b': RuntimeError: boom" in str(err.value)


def test_a_failing_model_is_warned_as_compare_warns_it():
    # compare() warns each failed model (a row alone is easy to miss); this table warned none
    from modelprof import ModelProfWarning

    quick = {**QUICK, "warn": True}
    with pytest.warns(ModelProfWarning, match=r"modelprof: bad failed and is not compared: Runt"):
        compare_generation({"good": _lm(), "bad": _failing(0)}, 4, 3, **quick)


def test_an_encoder_decoders_cross_attention_cache_is_named_beside_its_kv_bytes():
    from helpers import tiny_t5

    df = compare_generation({"gpt2": _lm(), "t5": tiny_t5()}, 4, 3, **QUICK)
    # GPT-2: 2 (K, V) x 1 layer x 32 wide x 4 B = 256 B a token, its whole cache
    assert df.loc["gpt2", "kv_bytes_per_token"] == 256
    # T5's, 2 x 2 decoder layers x 8 (2 heads x d_kv 4) x 4 B = 128 B, its self-attention
    # only: its cross-attention cache (as much per source token) is said apart
    assert df.loc["t5", "kv_bytes_per_token"] == 128
    assert any(
        note.startswith("kv_bytes_per_token: the decoder's self-attention cache; t5 also keep")
        for note in df.attrs["notes"]
    )


@pytest.mark.parametrize("after", [3, 6])  # a plain pass's call; a hooked pass's call
def test_a_failure_while_timing_layers_names_the_model_not_modelprofs_wrapper(after):
    # a newcomer read "forward of _Timed failed in the model (_Timed)": the per-phase wrapper
    # modelprof times the layers through, not their model
    from modelprof import profile_generation

    with pytest.raises(ModelProfError, match="while timing layers: RuntimeError: boom") as e:
        profile_generation(_failing(after), prompt_len=4, new_tokens=3, **QUICK)
    assert str(e.value).startswith("forward of GPT2LMHeadModel failed in ")
    assert "_Timed" not in str(e.value)
