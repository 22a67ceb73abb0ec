"""profile_generation: counted phases against closed forms, the KV cache, MoE, bad input, and
the model/config coming back untouched. Tiny configs (2 layers, hidden 64), or shapes on meta."""

from __future__ import annotations

import copy
import re

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import tiny_llama as llama  # noqa: E402 - the 2-layer Llama every test here uses

from modelprof import GenerationReport, ModelProfError, compare_generation, profile_generation
from modelprof.counting.scope import CallRecord
from modelprof.generation.cache import cache_layers, closed_form_kv_per_token
from modelprof.generation.memory import activation_bytes
from modelprof.runtime import compat


def gpt2(
    n_layer: int = 2,
    d: int = 64,
    heads: int = 4,
    vocab: int = 128,
    positions: int = 256,
    device: str = "cpu",
) -> torch.nn.Module:
    cfg = transformers.GPT2Config(
        n_layer=n_layer,
        n_embd=d,
        n_head=heads,
        vocab_size=vocab,
        n_positions=positions,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.GPT2LMHeadModel(cfg).eval()


def rotary_macs(phase, head_dim: int) -> int:
    """MACs of a phase's rotary embedding angles, checked against both forms: transformers 5.17
    computes them as a matmul, inv_freq (head_dim / 2 x 1) @ positions (1 x tokens) =
    head_dim / 2 x tokens (batch 1); 5.24 as an elementwise product, 0. (GPT-2 has none: 0.)"""
    rows = phase.report.to_dataframe().set_index("module")
    if "model.rotary_emb" not in rows.index:
        return 0
    got = int(rows.loc["model.rotary_emb", "macs"])
    assert got in (0, head_dim // 2 * phase.tokens), (phase.name, got)
    return got


def gpt2_weight_macs(layers: int, d: int, ff: int) -> int:
    """Per token and layer: c_attn d x 3d, c_proj d x d, c_fc d x ff, mlp c_proj ff x d."""
    return layers * (d * 3 * d + d * d + 2 * d * ff)


def test_gpt2_small_shape_prefill_and_decode_macs(layers=12):
    # GPT-2 small's width (d=768, ff=3072, vocab 50257) on meta: shapes only, no weights
    d, ff, vocab, p, n = 768, 3072, 50257, 32, 9
    model = gpt2(layers, d, 12, vocab, 1024, device="meta")
    report = profile_generation(model, prompt_len=p, new_tokens=n, timing=False)
    weights = gpt2_weight_macs(layers, d, ff)
    # prefill: weights x P tokens + attention QK^T and AV over the full P x P scores per layer
    # (2 x layers x P^2 x d) + the lm_head for the last position only (generate's
    # logits_to_keep=1): d x vocab
    assert report.prefill().totals["macs"] == weights * p + 2 * layers * p * p * d + d * vocab
    # decode with L tokens cached: weights x 1 token + attention over L + 1 keys
    # (2 x layers x (L + 1) x d) + lm_head d x vocab
    for step in report.phases()[1:]:
        L = step.context
        assert step.totals["macs"] == weights + 2 * layers * (L + 1) * d + d * vocab
    assert [s.context for s in report.phases()[1:]] == [p, p + (n - 2) // 2, p + n - 2]
    # growth per cached token: 2 x layers x d MACs
    assert report.growth_slopes()["macs_per_token"] == pytest.approx(2 * layers * d)


def test_kv_cache_bytes_gpt2_from_the_cache_objects():
    model = gpt2()
    with pytest.warns(UserWarning, match=r"timing=False, so budget_s=2 is ignored"):
        report = profile_generation(model, prompt_len=8, new_tokens=4, timing=False, budget_s=2)
    kv = report.kv
    # 2 (K, V) x 2 layers x 4 heads x 16 head_dim x 4 bytes (float32) = 1024 bytes per token
    assert kv.closed_form_per_token == 2 * 2 * 4 * 16 * 4 == 1024
    assert kv.per_token_bytes == 1024 and kv.matches_closed_form
    # the last decode step (context 8 + 4 - 2 = 10) leaves 11 tokens
    assert kv.tokens == 11 and kv.total_bytes == 11 * 1024
    assert report.kv_cache()["bytes"].tolist() == [11 * 512, 11 * 512]


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # MHA, GQA, MQA
def test_llama_gqa_kv_bytes_and_decode_macs(kv_heads):
    model = llama(kv_heads)
    report = profile_generation(model, prompt_len=8, new_tokens=3, timing=False)
    # 2 x 2 layers x kv_heads x head_dim 16 x 4 bytes
    assert report.kv.per_token_bytes == 2 * 2 * kv_heads * 16 * 4
    assert report.kv.matches_closed_form
    d, ff, layers, vocab = 64, 96, 2, 128
    # q, o: d x d; k, v: d x kv_heads*16; gate, up, down: 3 x d x ff
    weights = layers * (2 * d * d + 2 * d * kv_heads * 16 + 3 * d * ff)
    for step in report.phases()[1:]:
        # attention over L + 1 keys for all 4 query heads: 2 x layers x (L + 1) x d
        assert step.totals["macs"] == weights + 2 * layers * (
            step.context + 1
        ) * d + d * vocab + rotary_macs(step, 16)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_decode_bytes_include_the_cache(device):
    report = profile_generation(llama(2, device=device), prompt_len=8, new_tokens=6, timing=False)
    g = report.growth()
    # a cached token's K and V are 2 x 2 layers x 2 heads x 16 x 4 bytes = 512 bytes; a decode
    # step reads them twice (DynamicCache's cat copies the cache, the attention reads it) and
    # writes them once (the cat's new cache)
    slopes = report.growth_slopes()
    assert slopes["read_bytes_per_token"] == pytest.approx(2 * 512)
    assert slopes["write_bytes_per_token"] == pytest.approx(512)
    assert (g["kv_cache_bytes"].diff().dropna() / g["context"].diff().dropna() == 512).all()
    # on meta too: the attention reads the 2 KV heads as cached, not expanded to the 4 query
    # heads (which would read 2 x 512 per token in the attention alone)


COUNTED = ["macs", "flops", "madd", "output_bytes", "read_bytes", "write_bytes"]


@pytest.mark.parametrize(
    "build",
    [
        lambda device: llama(2, device=device),  # GQA 4/2
        lambda device: gpt2(device=device),
    ],  # MHA
    ids=["llama-gqa", "gpt2-mha"],
)
def test_meta_counts_what_the_cpu_counts(build):
    # SDPA has no fused kernel on meta (PyTorch would run its math decomposition: scaled
    # copies, GQA heads repeated, the score matrix materialised); the counter runs it as the
    # CPU's fused kernel, so every row of every phase is the CPU's count. (A static cache is
    # not compared: its prefill moves a host tensor to the device, two more small copies on
    # meta, as on CUDA.)
    reports = {
        dev: profile_generation(build(dev), prompt_len=8, new_tokens=4, timing=False)
        for dev in ("cpu", "meta")
    }
    fused = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    for cpu, meta in zip(reports["cpu"].phases(), reports["meta"].phases(), strict=True):
        a, b = cpu.report.to_dataframe(), meta.report.to_dataframe()
        assert a["module"].tolist() == b["module"].tolist()
        pd.testing.assert_frame_equal(a[COUNTED], b[COUNTED])
        ops_cpu, ops_meta = cpu.report.by_operator(), meta.report.by_operator()
        pd.testing.assert_frame_equal(ops_cpu, ops_meta)
        # no bmm but the rotary angles' matmul, where transformers has one (5.17)
        bmm = ops_meta.set_index("op")["macs"].get("aten.bmm.default", 0)
        assert fused in set(ops_meta["op"]) and bmm == rotary_macs(meta, 16)


def test_static_cache_counts_and_holds_its_capacity():
    report = profile_generation(llama(2), prompt_len=8, new_tokens=4, cache="static", timing=False)
    assert report.kv.allocated and report.kv.matches_closed_form is None
    # StaticCache is allocated as generate() allocates it, for max_length - 1 = prompt + new
    # tokens - 1 = 11 tokens (the last token is never fed): 11 x 512 bytes
    assert report.kv.total_bytes == 11 * 512
    # said as a capacity, not as 563 bytes per token of the 10 held beside a closed form 512
    assert "KV cache: 5,632 bytes allocated (room for 11 tokens at the closed form's 512 " in repr(
        report
    )


def test_a_static_decode_step_costs_the_same_whatever_other_contexts_are_asked():
    # a static cache's attention runs over the whole buffer, so its size is part of a step's
    # cost: every step is counted on the buffer generate() allocates for prompt + new tokens,
    # a step past it on one just large enough for it (a note says so), never on one sized by
    # the other contexts asked (it was: decode@16 on 25, 66 or 122 tokens)
    d, layers, vocab, p, n = 64, 2, 128, 16, 8
    buffer = p + n - 1  # generate()'s StaticCache: max_length - 1 = 23 tokens

    def step(keys: int) -> int:
        # one token through each layer's linears (in x out: c_attn d x 3d, c_proj d x d, the
        # MLP's d x 4d and 4d x d) and the lm_head's d x vocab, and attention over `keys`
        # cached slots, masked or not: per layer keys x d MACs for the scores (q.K^T) and as
        # many for the values (scores.V)
        return gpt2_weight_macs(layers, d, 4 * d) + d * vocab + layers * 2 * keys * d

    for contexts in (None, [16], [16, 64], [16, 120]):
        report = profile_generation(
            gpt2(), prompt_len=p, new_tokens=n, cache="static", contexts=contexts, timing=False
        )
        assert report.decode(16).totals["macs"] == step(buffer), contexts
        # the cache reported is the generation's (2 layers x K and V x d x 4 bytes per token),
        # also where a later step was counted on a larger one of its own
        assert report.kv.total_bytes == buffer * layers * 2 * d * 4
    # decode@120 on 120 + 1 = 121 slots, decode@64 on 65, each named with its size
    assert report.decode(120).totals["macs"] == step(121)
    assert report.conventions == [
        "decode@120 is counted on a static cache of 121 tokens, just large enough for it: past "
        "the 23 tokens generate() allocates for prompt_len + new_tokens (the other steps' and "
        "the timed generation's cache), over all of which a static cache's attention runs"
    ]
    both = profile_generation(
        gpt2(), prompt_len=p, new_tokens=n, cache="static", contexts=[16, 64, 120], timing=False
    )
    assert both.decode(64).totals["macs"] == step(65)
    assert both.conventions[0].startswith(
        "decode@64 and decode@120 are counted on static caches of 65 and 121 tokens, just "
        "large enough for each: past the 23 tokens"
    )


@pytest.mark.parametrize("run", ["profile_generation", "compare_generation"])
def test_every_static_step_counted_and_timed_runs_on_the_generations_cache(run):
    # the counted steps' cache is the timed generation's, also after the user's own generate()
    # of 100 tokens, which transformers remembers to size a later call's cache from (4.56: the
    # cache it keeps, 5.24: the largest length yet); it is set aside during the run, and put
    # back after it; and a generation config's max_cache_len (5.24: a floor generate() raises
    # the cache to; unread before) is not applied
    model = gpt2()
    name = compat.cache_argument(model.forward)
    ids = torch.zeros(1, 16, dtype=torch.long)
    model.generate(ids, max_new_tokens=100, cache_implementation="static", pad_token_id=0)
    model.generation_config.max_cache_len = 60
    sizes: list[int] = []

    def seen(module, args, kwargs, output):  # the slots of the cache each forward ran on
        sizes.append(int(cache_layers(kwargs[name])[0][0].shape[-2]))

    model.register_forward_hook(seen, with_kwargs=True)
    kw = dict(prompt_len=16, new_tokens=8, cache="static", repeat=2, warmup=0, warn=False)
    if run == "profile_generation":
        profile_generation(model, **kw)
    else:
        compare_generation({"gpt2": model}, **kw)
    # the counted prefill and decode steps, their per-layer passes, the timed generations (a
    # prefill and 7 steps each, at least 2): every one on generate()'s 16 + 8 - 1 = 23 slots
    assert len(sizes) >= 2 * 8
    assert set(sizes) == {23}
    sizes.clear()
    model.generate(ids, max_new_tokens=8, cache_implementation="static", pad_token_id=0)
    assert set(sizes) == {115}  # the earlier 16 + 100 - 1, as transformers left it


@pytest.mark.parametrize("placed", ["built on meta", "moved to meta"])
def test_a_static_cache_on_meta_grows_to_a_later_context(placed):
    # a decode step past the prompt grows the cache first; transformers' mask asked a chunk
    # after the prompt whether its offset is 0, which meta cannot answer (a RuntimeError out
    # of profile_generation). On meta the cache is built again from empty in one chunk (the
    # prompt and the tokens to the context: offset 0 asks nothing), not a token a step (a
    # review: an hour of forwards for a 70B config at 8k), and counts as the CPU's does there
    calls: list[int] = []
    model = llama(2, device="meta" if placed == "built on meta" else "cpu")
    model.model.register_forward_pre_hook(lambda m, a: calls.append(1))
    kw = dict(prompt_len=8, new_tokens=6, cache="static", contexts=[60], timing=False)
    meta = profile_generation(model, device="meta", **kw).decode(60)
    cpu = profile_generation(llama(2), **kw).decode(60)
    assert meta.context == cpu.context == 60
    assert meta.totals["macs"] == cpu.totals["macs"] > 0
    assert meta.totals["flops"] == cpu.totals["flops"]
    # the prefill, the one chunk to context 60 and the decode step: a handful of forwards,
    # not one per token grown (52)
    assert len(calls) < 10


def test_without_cache_every_step_recomputes_the_prefix():
    d, layers, vocab = 64, 2, 128
    cached = profile_generation(gpt2(), prompt_len=8, new_tokens=4, timing=False)
    none = profile_generation(gpt2(), prompt_len=8, new_tokens=4, cache=None, timing=False)
    weights = gpt2_weight_macs(layers, d, 4 * d)
    for step in none.phases()[1:]:
        t = step.context + 1  # the whole sequence again: t x weights + full t x t attention
        assert step.totals["macs"] == weights * t + 2 * layers * t * t * d + d * vocab
        assert step.kv is None and step.tokens == t  # the forward runs over all t (not 1)
    assert none.decode().totals["macs"] > cached.decode().totals["macs"]


def test_moe_active_params_and_tokens_per_expert():
    cfg = transformers.MixtralConfig(
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    report = profile_generation(model, prompt_len=10, new_tokens=2, timing=False)
    moe = report.moe
    total = sum(p.numel() for p in model.parameters())
    # per layer the experts hold 4 x (gate_up 2*32*64 + down 64*32) = 24576; a token uses 2
    # of 4, so half of them is inactive: 2 layers x 12288
    assert [lay.expert_params for lay in moe.layers] == [24576, 24576]
    assert moe.total_params == total and moe.active_params == total - 2 * 12288
    # 10 prompt tokens x top-2 = 20 routings per layer
    assert [int(lay.tokens_per_expert.sum()) for lay in moe.layers] == [20, 20]
    assert moe.tokens_per_expert().shape == (2, 4)


@pytest.mark.slow
def test_llama_70b_shape_on_meta_is_bounded():
    # (its speed is measured by benchmarks/generation.py --part meta70b, not here)
    cfg = transformers.LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    report = profile_generation(
        model, prompt_len=8064, new_tokens=128, timing=False, contexts=[8190], target="H100 SXM"
    )
    # KV per token: 2 x 80 layers x 8 kv heads x 128 x 2 bytes = 327,680
    assert report.kv.per_token_bytes == closed_form_kv_per_token(cfg, torch.bfloat16) == 327680
    decode = report.decode(8190)
    # weights: 80 x (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672) + lm_head 8192 x 128256
    weights = 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 8192 * 128256
    assert decode.totals["macs"] == weights + 2 * 80 * 8191 * 8192 + rotary_macs(decode, 128)
    table = report.phase_table()
    assert (table["bound_ms"] > 0).all()
    # a decode step at batch 1 is memory bound: at least the weights' bytes over 3.35 TB/s
    assert table.iloc[-1]["bound_ms"] >= weights * 2 / 3.35e12 * 1e3
    # ... and within 1 % (the activations: a token's inputs and outputs of each layer) of the
    # weights' bytes plus three passes over the cache of 8191 tokens (DynamicCache's cat reads
    # the old cache and writes the new one, the attention reads it): SDPA counted as a fused
    # kernel reads the 8 KV heads as cached, not repeated to 64 heads with the scores
    # materialised as the decomposed kernel would
    kv = report.kv.total_bytes
    assert kv == 8191 * 327680
    assert table.iloc[-1]["bound_ms"] <= 1.01 * (weights * 2 + 3 * kv) / 3.35e12 * 1e3
    assert table.iloc[-1]["memory_bound_share"] > 0.9


def test_model_and_config_come_back_untouched():
    model = gpt2()
    state = copy.deepcopy(model.state_dict())
    use_cache, gen = model.config.use_cache, model.generation_config.to_dict()
    report = profile_generation(
        model, prompt_len=6, new_tokens=3, repeat=2, warmup=1, layer_timing=False, warn=False
    )
    assert isinstance(report, GenerationReport)
    assert model.config.use_cache == use_cache and model.generation_config.to_dict() == gen
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not model.training or model.training  # flag unchanged below
    model.train()
    profile_generation(model, prompt_len=6, new_tokens=2, timing=False)
    assert model.training


class _NoCacheLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)
        self.generation_config = transformers.GenerationConfig()
        self.lin = torch.nn.Linear(8, 16)

    def forward(self, input_ids, use_cache=False):
        return self.lin(torch.zeros(*input_ids.shape, 8))

    def generate(self, *a, **k):
        raise AssertionError("not reached")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(new_tokens=0), "new_tokens=0"),
        (dict(prompt_len=300), "prompt_len=300"),
        # 250 + 10 - 1 = 259 positions fed (the last token never is), past 256
        (dict(prompt_len=250, new_tokens=10), "needs 259 positions"),
        (dict(batch_size=[1, 0]), "batch_size"),
        # a report holds one row per batch size and one per context: a repeat was merged away
        (dict(batch_size=[1, 2, 1]), "batch_size=[1, 2, 1] names 1 twice"),
        (dict(contexts=[9, 8, 9]), "contexts=[9, 8, 9] names 9 twice"),
        # a list is named as given, its bad item in it (it read "contexts=-1 must be an int")
        (dict(contexts=[9, -1]), "contexts=[9, -1]: -1 is not an int >= 1"),
        (dict(batch_size=[1, 0]), "batch_size=[1, 0]: 0 is not an int >= 1"),
        (dict(cache="paged"), "cache='paged'"),
        (dict(target="Z9000"), "target='Z9000'"),
        (
            dict(target="A100"),
            "target='A100' is ambiguous: it fits 'A100 SXM 80GB', 'A100 PCIe 80GB'",
        ),
        (dict(device="meta", timing=True), "device='meta' has no clock"),
    ],
)
def test_bad_input_names_the_value(kwargs, match):
    args = dict(prompt_len=8, new_tokens=4, timing=False) | kwargs
    with pytest.raises(ModelProfError, match=re.escape(match)):
        profile_generation(gpt2(), **args)


def test_a_model_without_cache_support_asked_to_use_one():
    with pytest.raises(ModelProfError, match="takes no KV cache"):
        profile_generation(_NoCacheLM(), prompt_len=4, new_tokens=2, timing=False)


def test_step_function_returning_the_wrong_thing():
    model = gpt2()
    with pytest.raises(ModelProfError, match="must return \\(logits, cache\\)"):
        profile_generation(
            model,
            step=lambda tokens, cache: model(tokens).logits,
            prompt_len=4,
            new_tokens=2,
            timing=False,
        )
    with pytest.raises(ModelProfError, match="returned logits"):
        profile_generation(
            model,
            step=lambda tokens, cache: ("no", cache),
            prompt_len=4,
            new_tokens=2,
            repeat=1,
            warmup=0,
            layer_timing=False,
        )
    with pytest.raises(ModelProfError, match="not a HuggingFace causal LM"):
        profile_generation(torch.nn.Linear(2, 2), prompt_len=4, new_tokens=2, timing=False)


def test_step_function_counts_like_the_hf_model():
    model = gpt2()

    def step(tokens, cache):
        out = model(input_ids=tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits, out.past_key_values

    via_step = profile_generation(model, step=step, prompt_len=8, new_tokens=4, timing=False)
    via_hf = profile_generation(model, prompt_len=8, new_tokens=4, timing=False)
    for a, b in zip(via_step.phases(), via_hf.phases()):
        assert a.totals["macs"] == b.totals["macs"]
    # the step's module is the root; the model's rows sit under "model."
    assert "model.transformer.h.0.attn" in set(via_step.to_dataframe()["module"])
    # named as the model through the step (a step named "step" read "step step")
    assert via_step.model_name == "GPT2LMHeadModel via step()"


def test_memory_to_fit_and_the_largest_batch_and_context():
    model = llama(2)
    report = profile_generation(model, prompt_len=8, new_tokens=4, timing=False)
    mem = report.memory
    weights = sum(p.numel() for p in model.parameters()) * 4 + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    assert mem.weights_bytes == weights
    # KV at batch 1 and 12 tokens (prompt + new): 12 x 512 bytes
    assert mem.kv_per_token_bytes == 512 and mem.kv_bytes() == 12 * 512
    # the token ids it holds, int64: 12 x 8 bytes, in their own column
    assert mem.ids_per_token_bytes == 8 and mem.ids_bytes() == 12 * 8
    assert mem.to_dict()["ids_per_token_bytes"] == 8
    table = mem.table().set_index("phase")
    act = mem.activation_per_seq_bytes
    assert table.loc["prefill", "total_bytes"] == weights + 12 * (512 + 8) + act["prefill"]
    assert table.loc["prefill", "inputs_bytes"] == 12 * 8
    parts = ["weights_bytes", "kv_cache_bytes", "inputs_bytes", "activation_bytes"]
    assert (table[parts].sum(axis=1) == table["total_bytes"]).all()
    assert act["prefill"] > act["decode"] > 0
    per_seq = 100 * (512 + 8) + max(act.values())
    budget = weights + 3 * per_seq + 1
    # prompts of the profiled 8 tokens: its activations as measured
    assert mem.max_batch(budget, context=100, prompt_len=8) == 3  # 3 sequences of 100 tokens
    with pytest.raises(ModelProfError, match="context=1000 is past the model's 128 positions"):
        mem.max_batch(budget, context=1000)
    # batch 2: (budget - weights - 2 x act) / (2 x (512 + 8)) tokens, here 100 (+ 5 bytes to
    # spare)
    tight = weights + 2 * max(act.values()) + 100 * 2 * (512 + 8) + 5
    assert mem.max_context(tight, batch=2, prompt_len=8) == 100
    # the first budget would hold 150+ tokens of batch 2 ((3 x 100 x 520 + act) / (2 x 520)),
    # past the model's 128 positions:
    # no context past them fits the model
    assert mem.max_positions == 128 and mem.max_context(budget, batch=2, prompt_len=8) == 128
    with pytest.raises(ModelProfError, match="memory_bytes=-1"):
        mem.max_batch(-1)
    for bad in (float("inf"), float("nan")):  # inf passed ``> 0``; nan failed int() raw
        with pytest.raises(ModelProfError, match=f"memory_bytes={bad}"):
            mem.max_batch(bad)
        with pytest.raises(ModelProfError, match=f"memory_bytes={bad}"):
            mem.max_context(bad)


def test_the_memory_plan_holds_the_ids_a_generation_joins():
    # a given prompt of int32 ids at batch 2: generate() joins the decode steps' int64 ids to
    # it, so the sequence holds int64 ids, 8 B a token: 2 x 12 x 8 B at 8 + 4 tokens
    ids = torch.randint(0, 128, (2, 8), dtype=torch.int32)
    report = profile_generation(
        llama(), inputs={"input_ids": ids}, new_tokens=4, batch_size=2, timing=False
    )
    mem = report.memory
    assert mem.ids_per_token_bytes == 8 and mem.ids_bytes() == 2 * 12 * 8


def test_compare_generation_of_hf_models():
    from modelprof import compare_generation

    table = compare_generation(
        {"mha": llama(4), "mqa": llama(1)},
        prompt_len=4,
        new_tokens=3,
        repeat=2,
        warmup=0,
        warn=False,
    )
    assert list(table.index) == ["mha", "mqa"]
    # 2 x 2 layers x kv_heads x 16 x 4 bytes
    assert table["kv_bytes_per_token"].tolist() == [1024, 256]
    assert table.loc["mha", "tpot_x"] == pytest.approx(1.0)
    assert (table["generations"] == 2).all()


@pytest.mark.parametrize("cache", ["static", None])
def test_hf_caches_are_timed_per_layer_at_a_fixed_context(cache):
    model = llama(2)
    report = profile_generation(
        model, prompt_len=6, new_tokens=4, cache=cache, repeat=2, warmup=0, warn=False
    )
    for phase in report.phases():
        df = phase.report.to_dataframe().set_index("module")
        assert df.loc["model.layers.0.self_attn", "latency_ms"] > 0
        assert phase.report.layer_timing.n == 2
    assert report.timing.step_ms.shape == (2, 3)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_snapshot_puts_a_cache_back_after_each_step(kind):
    from modelprof.runtime.snapshot import Snapshot

    model = llama(2)
    cache = (
        transformers.StaticCache(config=model.config, max_cache_len=12)
        if kind == "static"
        else transformers.DynamicCache(config=model.config)
    )
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 8, dtype=torch.long), past_key_values=cache, use_cache=True)
        restore = Snapshot(cache).reset
        for _ in range(20):  # 20 steps: a static cache of 12 would overflow unrestored
            model(
                input_ids=torch.zeros(1, 1, dtype=torch.long), past_key_values=cache, use_cache=True
            )
            assert int(cache.get_seq_length()) == 9
            restore()
            assert int(cache.get_seq_length()) == 8


def test_sliding_window_cache_holds_the_window_and_decode_stops_growing():
    cfg = transformers.MistralConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        sliding_window=4,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(cfg).eval()
    report = profile_generation(model, prompt_len=8, new_tokens=4, timing=False)
    # each layer keeps sliding_window - 1 = 3 past tokens of 2 x 2 heads x 16 x 4 bytes = 256
    assert report.kv.per_layer_bytes == (3 * 256, 3 * 256)
    assert report.kv.closed_form_bytes == 2 * 3 * 256 and report.kv.matches_closed_form
    # 1,536 bytes over the 11 tokens seen would read 140 bytes/token beside a closed form 512:
    # the summary says the window holds fewer tokens than seen
    assert (
        "KV cache: 1,536 bytes at 11 tokens, the closed form's: a sliding window holds fewer "
        "tokens than seen (512 bytes per token held)" in repr(report)
    )
    # q, o 64 x 64; k, v 64 x 32; mlp 3 x 64 x 96 per layer; lm_head 64 x 128; attention over
    # the window of 4 keys: 2 x 2 layers x 4 x 64, whatever the context
    weights = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96) + 64 * 128
    assert [p.totals["macs"] - rotary_macs(p, 16) for p in report.phases()[1:]] == [
        weights + 2 * 2 * 4 * 64
    ] * 3
    assert report.growth_slopes()["macs_per_token"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("name", ["DeepseekV3", "DeepseekV2"])
def test_mla_cache_holds_the_compressed_latent(name):
    # DeepSeek-style MLA, dense layers (first_k_dense_replace = layers: no MoE), float32
    cfg = getattr(transformers, f"{name}Config")(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        vocab_size=128,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForCausalLM")(cfg).eval()
    report = profile_generation(model, prompt_len=8, new_tokens=4, timing=False)
    # transformers' DeepSeek attention calls Cache.update(kv_nope, k_rot) with the latent
    # (kv_lora_rank 32, after kv_a_layernorm) and the shared rope key (qk_rope_head_dim 8), one
    # "head" each, and expands them with kv_b_proj after the cache. Per token and layer:
    # (32 + 8) x 4 bytes = 160; 2 layers: 320. The decompressed per-head form would be
    # 2 layers x 4 heads x ((16 + 8) K + 16 V) x 4 bytes = 1280 (4x more).
    kv = report.kv
    assert (
        kv.closed_form_per_token
        == closed_form_kv_per_token(cfg, torch.float32)
        == 2 * (32 + 8) * 4
        == 320
    )
    assert kv.per_token_bytes == 320 and kv.matches_closed_form
    # the last decode step (context 8 + 4 - 2 = 10) leaves 11 tokens: 11 x 160 per layer
    assert kv.tokens == 11 and kv.per_layer_bytes == (11 * 160, 11 * 160)
    assert kv.total_bytes == kv.closed_form_bytes == 11 * 320
    assert report.kv_cache()["bytes"].tolist() == [11 * 160, 11 * 160]


def test_growth_slopes_of_counted_columns_are_exact():
    # polyfit's float least squares read 3072.0000000018017 MACs a token here
    report = profile_generation(
        gpt2(2, 768, 12, 50257, 1024, device="meta"), prompt_len=32, new_tokens=9, timing=False
    )
    slopes = report.growth_slopes()
    # attention over one more cached token: QK^T and AV, 2 x 2 layers x 768 MACs
    assert slopes["macs_per_token"] == 2 * 2 * 768
    # K and V of a token, 2 x 2 layers x 768 x 4 bytes, written once and read twice (the
    # cache's cat copies it, the attention reads it)
    assert slopes["write_bytes_per_token"] == 12_288 and slopes["read_bytes_per_token"] == 24_576
    assert repr(slopes["macs_per_token"]) == "3072.0"


def test_a_median_without_an_interval_says_so_instead_of_nan_nan():
    # one timed run in one block: no interval of the median can be stated
    report = profile_generation(
        llama(1), prompt_len=4, new_tokens=3, layer_timing=False, repeat=1, warmup=0
    )
    assert not report.timings[1].ttft.has_interval
    text = str(report)
    assert "nan" not in text and "TTFT" in text
    assert "(no interval from 1 run in 1 block)" in text


def test_a_static_caches_room_leaves_out_its_constant_bytes():
    # a static self-attention cache beside cross-attention keys and values: the room is the
    # self-attention bytes' (2 x 16,384 - 2 x 8,192 = 16,384 B at 1,024 B/token: 16 tokens)
    from modelprof.generation.cache import KVCacheInfo
    from modelprof.generation.report import _kv_words

    kv = KVCacheInfo(
        (16384, 16384),
        7,
        1,
        1024,
        allocated=True,
        per_layer_cross_bytes=(8192, 8192),
    )
    assert _kv_words(kv) == (
        "self-attention 16,384 bytes allocated (room for 16 tokens at the closed form's 1024 "
        "bytes/token), holding 7 tokens"
    )


def test_a_leaf_of_views_only_holds_no_activation_of_its_own():
    # a Linear leaf: 1x4 float32 in (16 B), 1x8 out (32 B); an nn.Flatten after it ran no op
    # (a view of that output): 32 B in and out, the same tensor
    lin = CallRecord(1, "lin", "Linear", 1, 1, 0, False, [(1, 4)], 16, 144, 36, output_bytes=32)
    lin.ops["aten.addmm.default"] = 72
    flat = CallRecord(2, "flat", "Flatten", 1, 1, 0, False, [(1, 8)], 32, 0, 0, output_bytes=32)
    assert activation_bytes([lin, flat]) == 16 + 32  # the Linear's, not 32 + 32
