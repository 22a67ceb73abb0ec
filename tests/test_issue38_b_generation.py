"""Issue 38 items 7 and 8, the classes beyond their examples: an encoder-decoder whose start
token lies outside its decoder's vocabulary is refused before anything runs; a model whose
config says ``return_dict=False`` (its forwards return tuples) is generated as any other, its
config put back; Switch Transformers' experts get their active parameters. Tiny configs, closed
forms beside the assertions."""

from __future__ import annotations

import warnings

import pytest
import torch

from modelprof import ModelProfError, profile_generation
from modelprof.cli import main

transformers = pytest.importorskip("transformers")

T5_KW = dict(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
LLAMA_KW = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _model(cls, config_cls, **kw):
    torch.manual_seed(0)
    return _quiet(cls, config_cls(**kw)).eval()


def _t5(**overrides):
    return _model(
        transformers.T5ForConditionalGeneration, transformers.T5Config, **T5_KW, **overrides
    )


def _source():
    return {"input_ids": torch.randint(2, 64, (1, 6), generator=torch.Generator().manual_seed(0))}


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_start_token_outside_the_vocabulary_is_refused_before_anything_runs(device):
    model = _t5(decoder_start_token_id=1000)
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    # the decoder's embedding has vocab_size = 64 rows (ids 0-63): generate() and every counted
    # phase would index it with 1000 (before: an IndexError out of the first forward on the
    # CPU, and on meta, where nothing is indexed, a report of a run that cannot happen)
    with pytest.raises(ModelProfError, match="token 1000, outside its vocabulary of 64"):
        _quiet(profile_generation, model, prompt_len=3, new_tokens=2, timing=False, device=device)
    assert calls == []


def test_the_command_line_refuses_a_start_token_outside_the_vocabulary(capsys):
    spec = "T5Config:" + ",".join(f"{k}={v}" for k, v in T5_KW.items())
    assert _quiet(main, ["generate", spec + ",decoder_start_token_id=64", "--no-timing"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("modelprof")]
    # 64 is one past the last id of a 64-row embedding
    assert len(err) == 1 and "token 64, outside its vocabulary of 64 (ids 0 to 63)" in err[0]


def _llama(**overrides):
    return _model(transformers.LlamaForCausalLM, transformers.LlamaConfig, **LLAMA_KW, **overrides)


@pytest.mark.parametrize("make", [_llama, _t5], ids=["llama", "t5"])
def test_a_config_that_returns_tuples_is_generated_as_any_other(make):
    plain, tuples = make(), make(return_dict=False)
    kwargs = dict(prompt_len=3, new_tokens=3, timing=False)
    if make is _t5:
        kwargs["inputs"] = _source()
    # before: a ModelProfError around transformers' own "'tuple' object has no attribute
    # 'last_hidden_state'" (Llama: its causal LM reads its inner model's output by name, with
    # return_dict=True asked or not) or "... no attribute 'cache'" (T5's logits and cache)
    want = _quiet(profile_generation, plain, **kwargs)
    got = _quiet(profile_generation, tuples, **kwargs)
    # the same weights (seed 0) and the same calls: phase for phase the same MACs
    assert [p.totals["macs"] for p in got.phase_tables[1]] == [
        p.totals["macs"] for p in want.phase_tables[1]
    ]
    # keys and values per token: 2 x 1 layer x 2 heads x 8 (16 / 2) x 4 bytes = 128 (T5 as
    # much: 2 x 1 decoder layer x 2 heads x d_kv 4 x 4 bytes = 64 in self-attention)
    assert got.kv.per_token_bytes == want.kv.per_token_bytes == (128 if make is _llama else 64)
    assert got.kv.total_bytes == want.kv.total_bytes
    assert tuples.config.return_dict is False  # put back as it was


def test_a_config_that_returns_tuples_is_timed_through_its_generate():
    model = _llama(return_dict=False)
    report = _quiet(
        profile_generation,
        model,
        prompt_len=3,
        new_tokens=3,
        layer_timing=False,
        budget_s=0.2,
        warmup=1,
    )
    # generate() ran, each time making exactly the 3 tokens asked (a short run raises)
    assert report.timings[1].end_to_end.n >= 1
    assert model.config.return_dict is False


def test_switch_transformers_experts_get_their_active_parameters():
    model = _model(
        transformers.SwitchTransformersForConditionalGeneration,
        transformers.SwitchTransformersConfig,
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
    report = _quiet(
        profile_generation, model, inputs=_source(), prompt_len=3, new_tokens=2, timing=False
    )
    total = sum(p.numel() for p in model.parameters())
    # before: no MoE at all (report.moe None), though docs/generation.md names Switch's experts.
    # Each sparse layer (one in the encoder, one in the decoder) holds 2 experts of wi 32 x 16
    # and wo 16 x 32: 2 x 1,024 = 2,048 parameters, of which a top-1 router runs 1 of 2 per
    # token: 1,024 idle per layer, 2,048 in all
    assert report.moe is not None
    assert [(lay.num_experts, lay.top_k, lay.expert_params) for lay in report.moe.layers] == [
        (2, 1, 2048),
        (2, 1, 2048),
    ]
    assert report.moe.total_params == total == 8496
    assert report.moe.active_params == total - 2 * 1024 == 6448
    assert "MoE: 6,448 active of 8,496 parameters per token" in str(report)


def test_compare_generation_takes_a_config_that_returns_tuples():
    from modelprof import compare_generation

    tuples = _llama(return_dict=False)
    # before: the candidate failed in transformers' own "'tuple' object has no attribute
    # 'last_hidden_state'" (now a failing candidate keeps its row: its error, no figures)
    df = _quiet(
        compare_generation,
        {"plain": _llama(), "tuples": tuples},
        prompt_len=3,
        new_tokens=3,
        budget_s=0.2,
        warmup=1,
    )
    # both generated and were timed: no error column (one appears only for a failed model),
    # and each row has its generations and a TPOT
    assert "error" not in df.columns
    assert (df["generations"] >= 1).all() and df["tpot_ms"].notna().all()
    assert tuples.config.return_dict is False  # put back as it was
