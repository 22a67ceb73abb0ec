"""max_batch at a context past the model's positions is refused, as max_context never answers
one: a newcomer's max_batch(24e9, context=100000) read 234 for a 2048-position model."""

from __future__ import annotations

import pytest

from modelprof import ModelProfError
from modelprof.generation.memory import MemoryPlan


def _plan(max_positions: int | None) -> MemoryPlan:
    # 1,000 B of weights, 512 B of KV a token, 100 B of activations a sequence
    return MemoryPlan(1000, 512.0, {"prefill": 100.0}, 1, 12, max_positions=max_positions)


def test_a_context_past_the_positions_is_refused():
    with pytest.raises(ModelProfError, match=r"context=100000 is past the model's 2048 positions"):
        _plan(2048).max_batch(24e9, context=100_000)
    # at the limit: (24e9 - 1,000) // (512 x 2048 + 100) = 22,886 sequences
    assert _plan(2048).max_batch(24e9, context=2048) == 22_886


def test_without_a_known_limit_memory_alone_bounds_it():
    # 24e9 // (512 x 100,000 + 100) = 468 (the 1,000 B of weights change nothing here)
    assert _plan(None).max_batch(24e9, context=100_000) == 468


def _llama_of(positions: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=positions,
    )
    return LlamaForCausalLM(config)


def test_a_generation_whose_last_token_needs_no_position_is_profiled():
    # prompt 60 + 5 new tokens on 64 positions: the last token is produced, never fed, so the
    # last step runs at 60 + 5 - 2 = 63 tokens in the cache and feeds position 63, the 64th.
    # HF's own generate runs it (60 + 5 = 65 tokens out); it was refused as "65 exceeds 64"
    import torch

    from modelprof import profile_generation

    model = _llama_of(64)
    ids = torch.zeros(1, 60, dtype=torch.long)
    out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape == (1, 65)  # 60 + 5
    report = profile_generation(model, prompt_len=60, new_tokens=5, timing=False)
    # the default contexts: first 60, middle (60 + 63) // 2 = 61, last 63 (needs 64 positions)
    assert report.spec.contexts == (60, 61, 63)
    # the plan's cache held at the limit, 64 tokens (not 60 + 5 = 65, past it: refused there)
    assert report.memory.context == 64
    assert report.memory.max_batch(24e9) >= 1
    # one more new token: 60 + 6 - 1 = 65 positions fed, past 64
    with pytest.raises(ModelProfError, match=r"new_tokens=6 needs 65 positions"):
        profile_generation(model, prompt_len=60, new_tokens=6, timing=False)


def test_a_prompt_filling_every_position_runs_one_new_token():
    # prompt 64 + 1 new token on 64 positions: the prefill feeds positions 0..63 and makes the
    # one new token, never fed: 64 + 1 - 1 = 64 positions. HF's generate runs it; it was
    # refused as "prompt_len=64 does not fit the model's 64 positions"
    import torch

    from modelprof import profile_generation

    model = _llama_of(64)
    out = model.generate(torch.zeros(1, 64, dtype=torch.long), max_new_tokens=1, do_sample=False)
    assert out.shape == (1, 65)
    report = profile_generation(model, prompt_len=64, new_tokens=1, contexts=[10], timing=False)
    assert report.spec.contexts == (10,)  # as given, nothing added
    # no decode step runs, so the default one (at context 64, needing 65 positions) is named
    with pytest.raises(ModelProfError, match=r"new_tokens=1 runs no decode step, and the one "):
        profile_generation(model, prompt_len=64, new_tokens=1, timing=False)
    with pytest.raises(ModelProfError, match=r"prompt_len=65 does not fit the model's 64 "):
        profile_generation(model, prompt_len=65, new_tokens=1, timing=False)


def test_the_kv_line_names_its_batch_where_several_were_profiled():
    # 2 layers x 2 KV heads x head_dim 16 (64 / 4 heads) x 2 (K and V) x 4 bytes = 512 B a
    # token; report.kv is the first batch size's cache (1 sequence of 16 + 6 - 1 = 21 tokens:
    # 10,752 B), which the line now says; it named no batch beside batch 2's 21,504 B
    pytest.importorskip("transformers")
    from helpers import tiny_llama

    from modelprof import profile_generation

    report = profile_generation(
        tiny_llama(), prompt_len=16, new_tokens=6, batch_size=[1, 2], timing=False
    )
    assert report.kv.batch_size == 1 and report.kv.total_bytes == 10_752
    assert "KV cache at batch 1: 512 bytes/token (closed form 512), 10,752 bytes" in repr(report)
    single = profile_generation(tiny_llama(), prompt_len=16, new_tokens=6, timing=False)
    assert "  KV cache: 512 bytes/token" in repr(single)  # one batch: nothing to tell apart


def test_a_context_shorter_than_the_profiled_prompt_holds_its_prefill_in_proportion():
    # a trial's tiny Llama profiled at a 16-token prompt: weights 875,840 B, KV 512 B a token,
    # the prefill's largest call 22,016 B (1,376 B a token), a decode step's 4,256 B. Asked at
    # context 12 (a prompt as long), the plan took the 16-token prefill's 22,016 B: batch 0 at
    # 900,000 B and max_context 4. A 12-token prefill's call holds at most 12/16 of it:
    # 875,840 + 12 x 512 + 12 x 1,376 = 898,496 <= 900,000 (13 tokens: 900,384, over)
    plan = MemoryPlan(
        875_840, 512.0, {"prefill": 22_016.0, "decode": 4_256.0}, 1, 22, prompt_len=16
    )
    assert plan.activation_seq_bytes(12) == 16_512.0  # 22,016 x 12 / 16
    assert plan.activation_seq_bytes(2) == 4_256.0  # the decode step's, above 2 x 1,376
    assert plan.activation_seq_bytes(16) == 22_016.0  # at the profiled prompt: as measured
    assert plan.max_batch(900_000, context=12) == 1 and plan.max_batch(900_000, context=13) == 0
    assert plan.max_context(900_000, batch=1) == 12
    # context 4: 24,160 B free over 4 x 512 + max(4,256, 4 x 1,376 = 5,504) = 7,552 a sequence
    assert plan.max_batch(900_000, context=4) == 3
