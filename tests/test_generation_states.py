"""State-space and hybrid caches: a Mamba or Mamba2 layer keeps a conv state and an SSM state
(the same bytes at every context), read from the cache per layer beside a hybrid's keys and
values, and the memory plan holds them once per sequence."""

from __future__ import annotations

import warnings

import pytest
import torch

from modelprof import profile_generation
from modelprof.generation.cache import kv_info
from modelprof.runtime import compat
from modelprof.runtime.snapshot import Snapshot

transformers = pytest.importorskip("transformers")


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _mamba():
    config = transformers.MambaConfig(
        vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4
    )
    torch.manual_seed(0)
    return _quiet(transformers.MambaForCausalLM, config).eval()


def _mamba2():
    config = transformers.Mamba2Config(
        vocab_size=64,
        hidden_size=16,
        state_size=4,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        num_heads=4,
        head_dim=8,
        n_groups=1,
    )
    torch.manual_seed(0)
    return _quiet(transformers.Mamba2ForCausalLM, config).eval()


def _jamba():
    config = transformers.JambaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        mamba_d_state=4,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        use_mamba_kernels=False,
    )
    torch.manual_seed(0)
    return _quiet(transformers.JambaForCausalLM, config).eval()


def test_mamba_states_are_read_per_layer_and_constant_in_context():
    report = _quiet(profile_generation, _mamba(), prompt_len=6, new_tokens=4, timing=False)
    kv = report.kv
    # per layer: conv state (expand 2 x hidden 16 = 32 channels) x conv_kernel 4 = 128 floats,
    # SSM state 32 channels x state_size 4 = 128 floats: 256 x 4 B = 1,024 B
    assert kv.per_layer_bytes == kv.per_layer_state_bytes == (1024, 1024)
    assert kv.state_bytes == 2048 and kv.per_token_bytes == 0  # nothing grows per token
    # the cache after the prefill holds the same states as after the last decode step
    assert report.prefill().kv.per_layer_bytes == (1024, 1024)
    # the plan holds them once per sequence at any context: 2,048 B at 10 tokens and at 10,000
    assert report.memory.kv_bytes(context=10) == report.memory.kv_bytes(context=10_000) == 2048
    assert "2,048 bytes of recurrent state (the same at every context)" in repr(report)


def test_mamba2_states_are_read_per_layer():
    report = _quiet(profile_generation, _mamba2(), prompt_len=6, new_tokens=4, timing=False)
    # conv state: intermediate 32 + 2 x n_groups 1 x state 4 = 40 channels x kernel 4 = 160
    # floats; SSM state: 4 heads x head_dim 8 x state 4 = 128 floats: 288 x 4 B = 1,152 B
    assert report.kv.per_layer_bytes == report.kv.per_layer_state_bytes == (1152, 1152)
    table = report.kv_cache()
    assert list(table["state_bytes"]) == [1152, 1152] and list(table["bytes_per_token"]) == [0, 0]


def test_a_hybrid_holds_states_and_keys_and_values_apart():
    report = _quiet(profile_generation, _jamba(), prompt_len=6, new_tokens=4, timing=False)
    kv = report.kv
    # layer 0 Mamba: 32 x 4 conv + 32 x 4 SSM floats = 1,024 B; layer 1 attention after the
    # last decode step, 9 tokens: K and V x 2 KV heads x head_dim 4 x 4 B x 9 = 576 B
    assert kv.tokens == 9
    assert kv.per_layer_bytes == (1024, 576) and kv.per_layer_state_bytes == (1024, 0)
    # keys and values alone grow: 576 / 9 = 64 B per token, the closed form of the one
    # attention layer (config.layer_types: linear_attention, full_attention)
    assert kv.per_token_bytes == kv.closed_form_per_token == 64
    assert kv.matches_closed_form is True
    # 9 tokens: 64 x 9 + 1,024 = 1,600 B; 100 tokens: 64 x 100 + 1,024 = 7,424 B
    assert report.memory.kv_bytes(context=9) == 1600
    assert report.memory.kv_bytes(context=100) == 7424


class _OlderMambaCache:
    """The layout of transformers 4.x's ``MambaCache``: one conv and one SSM state per layer in
    two lists (what a ``step=`` function may still return)."""

    def __init__(self, layers: int, channels: int, kernel: int, state: int) -> None:
        self.conv_states = [torch.zeros(1, channels, kernel) for _ in range(layers)]
        self.ssm_states = [torch.zeros(1, channels, state) for _ in range(layers)]


def test_an_older_mamba_cache_layout_is_read_per_layer():
    info = kv_info(
        _OlderMambaCache(3, 32, 4, 16), tokens=7, batch_size=1, config=None, dtype=torch.float32
    )
    # per layer: 32 x 4 conv + 32 x 16 SSM floats = 640 x 4 B = 2,560 B
    assert info.per_layer_bytes == info.per_layer_state_bytes == (2560,) * 3
    assert info.per_token_bytes == 0


def test_a_snapshot_puts_a_recurrent_state_back():
    model = _mamba()
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        out = _quiet(model, input_ids=ids, use_cache=True)
        cache = compat.output_cache(out)  # cache_params= on transformers 5.17, cache= on 5.24
        before = [
            t.clone()
            for layer in cache.layers
            for t in (*layer.conv_states.values(), *layer.recurrent_states.values())
        ]
        restore = Snapshot(cache).reset
        own = compat.cache_argument(model.forward)
        _quiet(model, input_ids=ids[:, :1], use_cache=True, **{own: cache})  # a decode step
        after = [
            t
            for layer in cache.layers
            for t in (*layer.conv_states.values(), *layer.recurrent_states.values())
        ]
        assert any(not torch.equal(a, b) for a, b in zip(after, before))  # written in place
        restore()
        again = [
            t
            for layer in cache.layers
            for t in (*layer.conv_states.values(), *layer.recurrent_states.values())
        ]
    assert all(torch.equal(a, b) for a, b in zip(again, before))
