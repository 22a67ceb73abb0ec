"""Generation's own edges: a run too large for memory refused before anything is allocated, a
step function's own exception named with its call and phase, and a per-token slope whose
interval reaches zero shown as not measurable rather than as a negative time."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from modelprof import ModelProfError, profile_generation
from modelprof.generation.timing import GenerationTiming, fit_slope
from modelprof.timing.measurement import Measurement


class _Counted:
    """``step(tokens, cache)`` over an Embedding(16, 8) + Linear(8, 16), counting its calls and
    raising at call ``fail_at``."""

    def __init__(self, fail_at: int | None = None) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
        self.calls, self.fail_at = 0, fail_at

    def __call__(self, tokens, cache):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"step {self.calls} exploded")
        return self.model(tokens), cache


def test_a_prompt_larger_than_memory_is_refused_before_the_first_step():
    step = _Counted()
    with pytest.raises(ModelProfError) as e:
        profile_generation(step.model, prompt_len=10**12, new_tokens=4, step=step, timing=False)
    # 10**12 + 4 tokens: int64 ids 8 B each + hidden states of the widest embedding, 8 floats
    # of 4 B: 40 B a token, 40,000,000,000,160 B = 40,000.0 GB, more than any machine has
    assert (
        "prompt_len=1000000000000 + new_tokens=4 at batch_size 1 needs 40,000.0 GB for "
        "the token ids and a layer's hidden states alone, more than the" in str(e.value)
    )
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    assert step.calls == 0  # nothing ran, nothing was allocated for it


def test_a_prompt_no_tensor_can_hold_is_refused():
    step = _Counted()
    with pytest.raises(ModelProfError, match=r"more elements than a tensor can hold"):
        # 10**19 + 4 token ids >= 2**63 elements
        profile_generation(step.model, prompt_len=10**19, new_tokens=4, step=step, timing=False)
    assert step.calls == 0


def test_a_language_model_too_large_at_that_length_is_refused_from_its_config():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2**40,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LlamaForCausalLM(config)
    # T = 10**10 + 4 tokens: ids 8 B; KV 2 layers x (K, V) x 2 heads x 8 dims x 4 B = 256 B;
    # hidden states 32 x 4 B = 128 B: 392 B a token = 3,920,000,001,568 B = 3,920.0 GB
    with pytest.raises(
        ModelProfError,
        match=r"needs 3,920\.0 GB for the token ids and the KV "
        r"cache and a layer's hidden states alone",
    ):
        profile_generation(model, prompt_len=10**10, new_tokens=4, timing=False)


@pytest.mark.parametrize(
    "fail_at, where",
    [
        (1, r"call 1 \(in the prefill at batch 1, tokens \(1, 4\)\)"),
        # prefill (1), then the cache is built from context 4 to 5 by uncounted steps (2, 3)
        (3, r"call 3 \(in building the cache to context 5, batch 1, tokens \(1, 1\)\)"),
    ],
)
def test_a_step_functions_own_exception_names_its_call_and_phase(fail_at, where):
    step = _Counted(fail_at)
    with pytest.raises(
        ModelProfError,
        match=r"step function _Counted raised at its "
        + where
        + rf": RuntimeError: step {fail_at} exploded",
    ) as e:
        profile_generation(step.model, prompt_len=4, new_tokens=4, step=step, timing=False)
    assert isinstance(e.value.__cause__, RuntimeError)


def test_a_step_functions_exception_while_timed_names_the_timed_generations():
    step = _Counted()
    profile_generation(step.model, prompt_len=4, new_tokens=4, step=step, timing=False)
    counted = step.calls  # the counting passes' calls; the timed generations come next
    step = _Counted(counted + 2)
    with pytest.raises(
        ModelProfError,
        match=rf"call {counted + 2} \(in the timed generations "
        r"at batch 1",
    ):
        profile_generation(
            step.model,
            prompt_len=4,
            new_tokens=4,
            step=step,
            repeat=2,
            warmup=1,
            layer_timing=False,
        )


def test_a_slope_whose_interval_reaches_zero_is_not_measurable():
    contexts = np.arange(10, 15)
    noisy = fit_slope(contexts, np.array([5.0, 3.0, 6.0, 2.0, 5.0]))
    # least squares slope of (5, 3, 6, 2, 5) on 10..14: sum((x - 12) y) = -10 - 3 + 0 + 2 + 10
    # = -1 over sum((x - 12)^2) = 10: -0.1 ms per token, but its 95 % interval (t with 3
    # degrees of freedom) reaches well above zero
    assert noisy.ms_per_token == pytest.approx(-0.1)
    assert noisy.ci_low < 0 < noisy.ci_high and not noisy.measurable
    assert np.isnan(noisy.measured_ms_per_token)
    assert noisy.describe().startswith("not measurable (interval ")
    # a tight interval wholly below zero is a measured slope, said as negative, not as
    # "not measurable": 1 - 0.03 L ms steps (the summary's -0.0305 to -0.026 ms per token)
    falling = fit_slope(contexts, 1.0 - 0.03 * contexts + np.array([0, 1e-4, -1e-4, 0, 1e-4]))
    # the residuals' 1e-4 ms against a slope of 0.03 ms per token: the interval stays within
    # 1 % of -0.03, wholly below zero
    assert falling.ci_high < 0 and not falling.measurable
    assert np.isnan(falling.measured_ms_per_token)
    assert falling.describe().startswith("negative (interval -0.03")
    assert falling.describe().endswith("the load moved the runs), no figure to quote")
    clean = fit_slope(contexts, 1.0 + 0.05 * contexts + np.array([0, 1e-4, -1e-4, 0, 1e-4]))
    assert clean.measurable and clean.measured_ms_per_token == pytest.approx(0.05, rel=1e-2)
    assert clean.describe().startswith("0.05 ms per token (")


def _timing(step_medians: np.ndarray) -> GenerationTiming:
    runs = np.vstack([step_medians] * 3)
    m = Measurement(np.array([10.0, 10.0, 10.0]))
    return GenerationTiming(1, 10, 6, m, m, Measurement(runs.reshape(-1)), runs, np.arange(10, 15))


def test_the_summary_shows_a_slope_only_where_it_was_measured():
    noisy = _timing(np.array([5.0, 3.0, 6.0, 2.0, 5.0])).summary()
    assert np.isnan(noisy["step_ms_per_context_token"])  # never -0.1 ms
    assert noisy["step_slope_ci_low"] < 0 < noisy["step_slope_ci_high"]  # the interval kept
    grows = _timing(np.array([1.5, 1.55, 1.6, 1.65, 1.7])).summary()
    assert grows["step_ms_per_context_token"] == pytest.approx(0.05)


def _decode_timed(step_ms: list[float]):
    """A counted run whose decode phases are given plain-run times (one per context)."""
    step = _Counted()
    report = profile_generation(step.model, prompt_len=4, new_tokens=7, step=step, timing=False)
    decode = [p for p in report.phases() if p.name == "decode"]
    for p, ms in zip(decode, step_ms):
        p.report.latency = Measurement(np.full(5, ms))
    return report, [p.context for p in decode]


def test_the_decode_phases_time_per_token_follows_the_step_times_rule():
    # a newcomer's growth_slopes() read a negative latency_ms_per_token (the per-layer passes')
    report, contexts = _decode_timed([5.0, 3.0, 4.0])
    # the first, middle and last of the 6 decode steps after 4 tokens (contexts 4 to 9)
    assert contexts == [4, 6, 9]
    slopes = report.growth_slopes()
    # least squares of (5, 3, 4) on (4, 6, 9), mean 19/3: sum((x - 19/3) y) = (-7/3) 5 -
    # (1/3) 3 + (8/3) 4 = -2 over sum((x - 19/3)^2) = 49/9 + 1/9 + 64/9 = 38/3: -3/19 ms a
    # token, whose interval reaches zero: NaN, never a negative time, the interval kept beside
    assert np.isnan(slopes["latency_ms_per_token"])
    assert slopes["latency_ms_per_token_ci_low"] < -3 / 19 < slopes["latency_ms_per_token_ci_high"]
    assert slopes["latency_ms_per_token_ci_high"] > 0
    # a clean growth is measured: 1 + 0.05 L at L = 4, 6, 9, its interval a point above zero
    slopes = _decode_timed([1.2, 1.3, 1.45])[0].growth_slopes()
    assert slopes["latency_ms_per_token"] == pytest.approx(0.05)


def test_the_tokens_rate_says_whether_it_is_over_the_batch():
    # a newcomer read "355.0 tokens/s" for batch 4 beside summary()'s tokens_per_s of 88.75:
    # the printed figure is the batch's (4 x 88.75 = 355), and now says so
    from types import SimpleNamespace

    from modelprof.generation.report import _tokens_rate

    # beside it the rate over whole generations (batch x new tokens / median end to end): a
    # newcomer's median step read 1,119.6 tokens/s where whole generations made 481.9, a
    # quarter of the steps 4-9 ms, and the gap was only in summary()
    four = SimpleNamespace(
        batch_size=4, tokens_per_s=88.75, batch_tokens_per_s=355.0, end_to_end_tokens_per_s=300.0
    )
    assert _tokens_rate(four, False, False) == (
        "355.0 tokens/s over the batch (88.8 per sequence; 300.0 end to end)"
    )
    one = SimpleNamespace(
        batch_size=1, tokens_per_s=88.75, batch_tokens_per_s=88.75, end_to_end_tokens_per_s=40.0
    )
    assert _tokens_rate(one, False, False) == "88.8 tokens/s (40.0 end to end)"
    # a rate over a rough TPOT (a rough end to end) is rough: marked ~, each by its own
    assert _tokens_rate(one, True, False) == "~88.8 tokens/s (40.0 end to end)"
    assert _tokens_rate(four, False, True) == (
        "355.0 tokens/s over the batch (88.8 per sequence; ~300.0 end to end)"
    )


def test_a_step_functions_own_cache_is_said_without_a_closed_form():
    # a newcomer's step= report read "(closed form None)": no config gives the model's shape,
    # so there is none to compare with
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))

    def step(tokens, cache):
        # one layer's keys and values: 8 float32 a token each, grown by the tokens given
        new = [torch.zeros(1, tokens.shape[1], 8), torch.zeros(1, tokens.shape[1], 8)]
        kept = new if cache is None else [torch.cat(p, dim=1) for p in zip(cache[0], new)]
        return model(tokens), [kept]

    report = profile_generation(model, prompt_len=4, new_tokens=3, step=step, timing=False)
    # 2 tensors x 8 floats x 4 bytes = 64 bytes a token; the cache holds the 4 prompt tokens
    # and the 2 fed back (the third new token is never fed): 6 x 64 = 384 bytes
    assert "64 bytes/token (no closed form for this model), 384 bytes" in (repr(report))
    assert "closed form None" not in repr(report)
