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


@pytest.mark.parametrize("after", [3, 6])  # a plain pass's call; a hooked pass's call
def test_a_failure_while_timing_layers_names_the_model_not_modelprofs_wrapper(after):
    # a newcomer read "forward of _Timed failed in the model (_Timed)": the per-phase wrapper
    # modelprof times the layers through, not their model
    from modelprof import profile_generation

    with pytest.raises(ModelProfError, match="while timing layers: RuntimeError: boom") as e:
        profile_generation(_failing(after), prompt_len=4, new_tokens=3, **QUICK)
    assert str(e.value).startswith("forward of GPT2LMHeadModel failed in ")
    assert "_Timed" not in str(e.value)
