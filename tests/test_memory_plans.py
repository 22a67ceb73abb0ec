"""Generation's memory plan against the cache that really exists: a sliding-window layer holds
at most ``sliding_window - 1`` past tokens however long the context (issue 38, item 5)."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from modelprof import ModelProfError, ModelProfWarning, fit, profile_generation

transformers = pytest.importorskip("transformers")

#: 2 layers, 2 KV heads of 16: K and V of one token in one layer, float32: 2 x 2 x 16 x 4 B
LAYER_TOKEN = 2 * 2 * 16 * 4  # 256 B
#: a token's id, int64, held by its sequence at every context (fit's inputs row)
ID = 8


def _small(config_class, **kw):
    config = config_class(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        **kw,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(config).eval()


def _plan(model, prompt_len=90, new_tokens=10):
    torch.manual_seed(0)
    return profile_generation(model, prompt_len=prompt_len, new_tokens=new_tokens, timing=False)


def test_mistral_sliding_window_plan_caps_at_the_window():
    model = _small(transformers.MistralConfig, sliding_window=8)
    report = _plan(model)
    mem = report.memory
    # every layer slides: a window of 8 holds 7 past tokens, 2 layers x 256 B x 7 = 3,584 B,
    # what the cache held after 99 tokens
    assert report.kv.total_bytes == 2 * LAYER_TOKEN * 7 == 3584
    assert mem.kv_bytes() == 3584  # context 100 (before: 3584 / 99 x 100, linear)
    assert mem.kv_bytes(context=10_000) == 3584
    assert mem.kv_bytes(batch=3, context=4) == 3 * 4 * 2 * LAYER_TOKEN  # inside the window
    assert mem.ids_per_token_bytes == ID
    act = max(mem.activation_per_seq_bytes.values())
    budget = mem.weights_bytes + 5 * (3584 + act + ID * 100_000)
    # 5 sequences at context 100,000: the cache stops growing at the window, their ids do not
    # (8 B a token); prompts of the profiled 90 tokens: their activations as measured
    assert mem.max_batch(budget, context=100_000, prompt_len=90) == 5
    assert mem.max_batch(budget, context=100_001, prompt_len=90) == 4
    # past the window only the ids grow: (budget - weights - 5 x (act + 3,584)) / (5 x 8) =
    # 100,000 tokens, inside the model's 131,072 positions
    assert mem.max_context(budget, batch=5, prompt_len=90) == 100_000
    # a budget that runs out inside the window: 3 tokens of 2 x 256 B per sequence fit, beside
    # prompts of 2 tokens, whose prefill holds 2/90 of the profiled one's (or a decode step's,
    # if more)
    short = max(
        mem.activation_per_seq_bytes["prefill"] * 2 / 90, mem.activation_per_seq_bytes["decode"]
    )
    assert mem.activation_seq_bytes(2) == short
    tight = mem.weights_bytes + 2 * (short + 3 * (2 * LAYER_TOKEN + ID))
    assert mem.max_context(tight, batch=2, prompt_len=2) == 3  # (prompts of 2 tokens)


def test_mixed_full_and_sliding_layers_grow_by_the_full_ones():
    # Qwen2 with max_window_layers=1: layer 0 keeps every token, layer 1 slides (window 8)
    model = _small(
        transformers.Qwen2Config, use_sliding_window=True, sliding_window=8, max_window_layers=1
    )
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    report = _plan(model)
    mem = report.memory
    # after 99 tokens: 99 x 256 (full) + 7 x 256 (sliding) = 27,136 B
    assert report.kv.total_bytes == (99 + 7) * LAYER_TOKEN
    assert (mem.kv_per_token_bytes, mem.window_per_token_bytes) == (LAYER_TOKEN, LAYER_TOKEN)
    assert mem.kv_bytes(context=1000) == (1000 + 7) * LAYER_TOKEN
    act = max(mem.activation_per_seq_bytes.values())
    budget = mem.weights_bytes + act + (500 + 7) * LAYER_TOKEN + 500 * ID
    # past the window only the full layer and the ids grow: (budget - weights - act - 7 x
    # 256) / (256 + 8)
    assert mem.max_context(budget, batch=1, prompt_len=90) == 500


def test_full_attention_plan_is_unchanged():
    mem = _plan(_small(transformers.LlamaConfig), prompt_len=8, new_tokens=4).memory
    # 2 layers x 256 B a token, no window
    assert (mem.kv_per_token_bytes, mem.window_per_token_bytes, mem.window_tokens) == (512, 0, 0)
    assert mem.kv_bytes(context=1000) == 1000 * 512
    assert mem.max_context(mem.weights_bytes * 10) < sys.maxsize
    # memory for far more tokens than the model has positions: its positions bound the context
    roomy = mem.weights_bytes + 10 * mem.max_positions * 512 + 10**9
    assert mem.max_context(roomy, batch=1) == mem.max_positions == 2048  # LlamaConfig's default


def test_a_context_is_sized_with_prompts_as_long_as_it_as_fit_sizes_it():
    # a newcomer's max_batch(24e9, context=2048) after a 16-token prompt kept that prompt's
    # activations, 3.5x too many sequences by fit's count. Llama of _small: the largest leaf of
    # a prefill of T tokens is the MLP's activation, T x 128 in and out, float32: 1,024 B a
    # token (the lm_head keeps one token's logits); the KV cache 2 layers x 256 B = 512 B a
    # token; its int64 id 8 B. A sequence of 2,048 tokens, prompts as long: 2,048 x (512 + 8 +
    # 1,024) B
    model = _small(transformers.LlamaConfig)
    mem = _plan(model, prompt_len=16, new_tokens=8).memory
    assert mem.activation_seq_bytes(2048) == 2048 * 1024
    expected = int((24e9 - mem.weights_bytes) // (2048 * (512 + ID + 1024)))
    assert mem.max_batch(24e9, context=2048) == expected

    # fit agrees: that batch fits at context 2,048, one more does not
    def fits(batch):
        plan = fit(model, memory_bytes=24e9, dtype=torch.float32, batch_size=batch, context=2048)
        return plan.fits("inference")

    assert fits(expected) and not fits(expected + 1)
    # the longest context for 4 sequences in 3e6 B: 4 x c x (512 + 8 + 1,024) <= 3e6 - weights
    budget = 3e6
    assert mem.max_context(budget, batch=4) == int((budget - mem.weights_bytes) // (4 * 1544))
    # prompts of the profiled 16 tokens: its measured activations (16 x 1,024 B at most)
    assert mem.activation_seq_bytes(16) == mem.activation_seq_bytes() <= 16 * 1024
    assert mem.max_batch(24e9, context=2048, prompt_len=16) > 1.4 * expected
    # a prompt longer than its context, or a context of none
    with pytest.raises(ModelProfError, match="prompt_len=4096 is longer than context=2048"):
        mem.max_batch(24e9, context=2048, prompt_len=4096)
    for bad in (0, -1, 1.5, "16"):
        with pytest.raises(ModelProfError, match=f"context={bad!r} must be an int >= 1"):
            mem.max_batch(24e9, context=bad)
    with pytest.raises(ModelProfError, match="batch=-4 must be an int >= 1"):
        mem.max_context(24e9, batch=-4)


def test_the_command_lines_memory_line_sizes_prompts_as_long_as_the_context(capsys):
    # `modelprof generate --memory`: the same plan as the Python call's, prompts as long as
    # the context, and it says so
    from modelprof.cli import main

    spec = (
        "LlamaConfig:hidden_size=64,intermediate_size=128,num_hidden_layers=2,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=256"
    )
    args = ["generate", spec, "--prompt-len", "16", "--new-tokens", "8", "--no-timing"]
    assert main([*args, "--memory", "3e6"]) == 0
    mem = _plan(_small(transformers.LlamaConfig), prompt_len=16, new_tokens=8).memory
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("fits "))
    assert line == (
        f"fits 3,000,000 bytes (prompts as long as the context): batch <= {mem.max_batch(3e6)} "
        f"at 24 tokens; context <= {mem.max_context(3e6)} tokens at batch 1"
    )
    # at 24 tokens, prompts of 24: (3e6 - weights) // (24 x (512 + 8 + 1,024)) sequences
    assert mem.max_batch(3e6) == int((3e6 - mem.weights_bytes) // (24 * 1544))


def test_memory_given_as_text_reads_as_the_command_line_reads_it():
    # a newcomer's fit(cfg, memory_bytes="24GB") was refused, while --memory 24GB was taken
    model = _small(transformers.LlamaConfig)
    mem = _plan(model, prompt_len=16, new_tokens=8).memory
    assert mem.max_batch("24GB", context=2048) == mem.max_batch(24e9, context=2048)
    assert mem.max_context("1GiB", batch=2) == mem.max_context(2**30, batch=2)
    text = fit(model, memory_bytes="24GB", dtype=torch.float32)
    number = fit(model, memory_bytes=24e9, dtype=torch.float32)
    assert str(text) == str(number)
    with pytest.raises(ModelProfError, match="memory_bytes='lots' must be a finite"):
        fit(model, memory_bytes="lots")


def _counting_plan(count, max_positions=None):
    # 1,000 B of weights, 512 B of KV a token, 100 B of activations in the profiled phases
    # (a 4-token prompt), a prefill of t tokens counted by ``count``
    from modelprof.generation.memory import MemoryPlan

    return MemoryPlan(
        1000, 512.0, {"prefill": 100.0}, 1, 12, max_positions=max_positions, prompt_len=4,
        count_prefill=count,
    )  # fmt: skip


def test_a_prefill_that_cannot_be_counted_keeps_the_profiled_prompts_figures():
    from modelprof.generation.memory import MemoryPlan

    # no counter (a step function, an encoder-decoder, a plan built by hand): the profiled
    # prompt's 100 B stand at any context, and the plan says so
    plain = MemoryPlan(1000, 512.0, {"prefill": 100.0}, 1, 12, prompt_len=4)
    with pytest.warns(ModelProfWarning, match="cannot be counted at another length"):
        assert plain.max_batch(24e9, context=2048) == int((24e9 - 1000) // (512 * 2048 + 100))
    assert "cannot be counted at another length" in plain.prefill_note
    # a count that fails (a forward meta cannot run): the same, said
    failing = _counting_plan(lambda tokens: None)
    with pytest.warns(ModelProfWarning, match="the count of a longer prefill on meta failed"):
        assert failing.max_batch(24e9, context=2048) == plain.max_batch(24e9, context=2048)
    assert "the count of a longer prefill on meta failed" in failing.prefill_note
    # a count that works: 10 B a token, 20,480 B at 2,048 tokens, and no note
    counted = _counting_plan(lambda tokens: 10.0 * tokens)
    assert counted.max_batch(24e9, context=2048) == int((24e9 - 1000) // (2048 * (512 + 10)))
    assert counted.prefill_note is None


def test_counts_stop_at_the_cap_and_grow_in_proportion_past_it():
    from modelprof.generation.memory import COUNT_CAP

    seen = []

    def count(tokens):
        seen.append(tokens)
        return 10.0 * tokens

    # no known positions: a prompt of 4 x COUNT_CAP tokens is counted at the cap (10 B a
    # token there) and grows in proportion: 10 x 4 x COUNT_CAP bytes
    plan = _counting_plan(count)
    assert plan.activation_seq_bytes(4 * COUNT_CAP) == 10.0 * 4 * COUNT_CAP
    assert seen == [COUNT_CAP]
    # the longest context of one sequence in 1e8 B: no KV cap, so memory alone bounds it:
    # 1,000 + c x (512 + 10) <= 1e8 -> c = 191,568; no count past the cap was asked for
    assert plan.max_context(1e8) == int((1e8 - 1000) // 522)
    assert max(seen) == COUNT_CAP
    # a known limit is the cap: counts up to it
    capped = _counting_plan(count, max_positions=2 * COUNT_CAP)
    assert capped.activation_seq_bytes(2 * COUNT_CAP) == 10.0 * 2 * COUNT_CAP


def test_a_generation_report_pickles_and_keeps_no_weights_alive():
    import gc
    import pickle
    import weakref

    model = _small(transformers.LlamaConfig)
    report = _plan(model, prompt_len=16, new_tokens=8)
    counted = report.memory.max_batch(24e9, context=2048)
    # pickled, the plan keeps its figures and its counter (a copy of the model on meta): a
    # newcomer's unpickled plan read 3.4x the sequences, the counter left behind
    back = pickle.loads(pickle.dumps(report))
    assert back.memory.activation_per_seq_bytes == report.memory.activation_per_seq_bytes
    assert back.memory.max_batch(24e9, context=2048) == counted
    assert back.memory.prefill_note is None
    # the report keeps no weights alive (it counts on a copy of the model on meta, made with
    # no byte of its weights); with the model gone, a new length is counted all the same:
    # 4,096 x 1,024 B
    gone = weakref.ref(model)
    weights = [weakref.ref(p) for p in model.parameters()]
    del model
    gc.collect()
    assert gone() is None and all(w() is None for w in weights)
    assert report.memory.activation_seq_bytes(4096) == 4096 * 1024
    assert report.memory.prefill_note is None
    assert report.memory.max_batch(24e9, context=2048) == counted
