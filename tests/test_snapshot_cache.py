"""A generation's KV cache is put back between timed passes by the ``Snapshot`` that keeps
everything passed beside a model: after a step and a rewind the cache holds what it held, bit
for bit (every object's attributes, every list and dict, every tensor's dtype, shape, strides
and bytes), for a dynamic, a static, a sliding-window and an encoder-decoder cache, and for any
object graph of tensors, lists, dicts and slotted objects (a recurrent state:
tests/test_generation_states.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import picture

from modelprof import ModelProfError, profile_generation
from modelprof.runtime.guard import watching_writes
from modelprof.runtime.snapshot import Snapshot

transformers = pytest.importorskip("transformers")

# tiny models: 2 layers of 2 KV heads of 8 (hidden 32 over 4 heads)
_SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "max_position_embeddings": 64,
}


def _llama_config():
    return transformers.LlamaConfig(**_SIZES)


def _mistral_config():
    return transformers.MistralConfig(**_SIZES, sliding_window=4)


def _model(config):
    torch.manual_seed(0)
    cls = (
        transformers.MistralForCausalLM
        if isinstance(config, transformers.MistralConfig)
        else transformers.LlamaForCausalLM
    )
    return cls(config).eval()


_CACHES = {
    "dynamic": (_llama_config, lambda c: transformers.DynamicCache(config=c)),
    "static": (_llama_config, lambda c: transformers.StaticCache(config=c, max_cache_len=16)),
    "sliding": (_mistral_config, lambda c: transformers.DynamicCache(config=c)),
}


@pytest.mark.parametrize("kind", sorted(_CACHES))
def test_a_rewound_cache_holds_what_it_held_bit_for_bit(kind):
    make_config, make_cache = _CACHES[kind]
    config = make_config()
    model, cache = _model(config), make_cache(config)
    with torch.no_grad():
        model(input_ids=torch.arange(6)[None], past_key_values=cache, use_cache=True)
        before, snap = picture(cache), Snapshot(cache)
        for step in range(3):  # three decode steps, each rewound: each sees the cache at 6
            model(input_ids=torch.tensor([[7 + step]]), past_key_values=cache, use_cache=True)
            assert int(cache.get_seq_length()) == 7  # the step added one token
            snap.reset() if step else snap.restore()
            assert int(cache.get_seq_length()) == 6  # 6 prompt tokens, the step's taken out
            assert picture(cache) == before  # every tensor's bytes, sizes, strides, flags


def test_a_rewound_encoder_decoder_cache_holds_what_it_held():
    cache = transformers.EncoderDecoderCache(
        transformers.DynamicCache(), transformers.DynamicCache()
    )
    g = torch.Generator().manual_seed(0)

    def step(tokens: int, cross: bool) -> None:
        for layer in range(2):  # the decoder's own keys and values grow by ``tokens``
            kv = [torch.randn(1, 2, tokens, 4, generator=g) for _ in range(2)]
            cache.self_attention_cache.update(*kv, layer)
            if cross:  # the encoder's keys and values, once
                enc = [torch.randn(1, 2, 5, 4, generator=g) for _ in range(2)]
                cache.cross_attention_cache.update(*enc, layer)
                cache.is_updated[layer] = True

    step(3, cross=True)
    before, snap = picture(cache), Snapshot(cache)
    step(1, cross=False)
    assert cache.get_seq_length() == 4  # 3 + the step's 1
    snap.reset()
    assert cache.get_seq_length() == 3
    assert picture(cache) == before
    step(1, cross=True)  # a step that also writes the cross-attention cache
    snap.reset()
    assert picture(cache) == before


@pytest.mark.parametrize("kind", sorted(_CACHES))
def test_copy_on_write_keeps_only_what_the_step_writes(kind):
    """A snapshot taken with ``copy_on_write=True`` and watching the step copies a tensor just
    before the step first writes it, and rewinds the cache bit for bit all the same."""
    make_config, make_cache = _CACHES[kind]
    config = make_config()
    model, cache = _model(config), make_cache(config)
    with torch.no_grad():
        model(input_ids=torch.arange(6)[None], past_key_values=cache, use_cache=True)
        before, snap = picture(cache), Snapshot(cache, copy_on_write=True)
        with watching_writes(snap):
            model(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True)
        snap.restore()
        assert picture(cache) == before
        model(input_ids=torch.tensor([[8]]), past_key_values=cache, use_cache=True)
        snap.reset()  # a pass after the watched one, writing the same tensors
        assert picture(cache) == before
    # a dynamic cache's step writes nothing in place (torch.cat makes new tensors, a sliding
    # window's cut too): nothing copied, where an up-front copy holds 6 tokens x 2 layers x
    # K, V x 2 heads x 8 x 4 B = 1,536 B; a static one's step writes each layer's keys and
    # values (1 x 2 heads x 16 x 8 x 4 B = 1,024 B each) and its int64 cumulative_length:
    # 2 x (2 x 1,024 + 8) = 4,112 B
    assert snap.copied_bytes == {"dynamic": 0, "sliding": 0, "static": 4112}[kind]
    if kind == "dynamic":
        assert Snapshot(cache).copied_bytes == 1536


def test_a_write_the_watched_pass_did_not_make_is_refused():
    a, b = torch.zeros(3), torch.zeros(3)
    snap = Snapshot([a, b], copy_on_write=True)
    with watching_writes(snap):
        a.add_(1)
    a.add_(1)
    b.add_(1)  # written after the watch, which did not see it written: no values kept
    with pytest.raises(ModelProfError, match=r"shape \(3,\)"):
        snap.reset()
    assert a.tolist() == [0.0, 0.0, 0.0]  # copied before its first write: put back


def test_a_write_is_refused_also_when_the_tensor_was_then_pointed_elsewhere():
    """The guard's rule, now the snapshot's too (one restorer): a tensor written in place and
    then swapped (``.data = other``) had its entry values overwritten all the same."""
    a = torch.zeros(3)
    snap = Snapshot([a], copy_on_write=True)
    a.add_(1)  # no watch: no copy was taken
    a.data = torch.zeros(5)
    with pytest.raises(ModelProfError, match=r"shape \(3,\)"):
        snap.restore()
    assert a.shape == (3,)  # its storage and shape are back, its values could not be


def test_a_swapped_tensor_gets_its_gradient_back_after_its_shape():
    """A gradient fits its tensor's entry shape only: each is put back after the tensors."""
    w = torch.zeros(2, 3, requires_grad=True)
    grad = torch.ones(2, 3)
    w.grad = grad
    snap = Snapshot([w])
    w.data = torch.zeros(4)
    w.grad = torch.full((4,), 2.0)
    snap.restore()
    assert w.shape == (2, 3) and w.grad is grad and grad.tolist() == [[1.0] * 3] * 2


@dataclasses.dataclass(slots=True)
class _Slotted:
    state: torch.Tensor
    count: int
    history: list


def test_any_object_graph_is_rewound():
    held = _Slotted(torch.zeros(3), 0, [torch.ones(2)])
    graph = {"a": held, "b": [torch.arange(4.0), {"c": torch.tensor(5.0)}]}

    def seen() -> tuple:  # the picture of a slotted object is its identity: its slots apart
        return picture(graph), held.__slots__, picture([held.state, held.count, held.history])

    before, snap = seen(), Snapshot(graph)
    for _ in range(2):
        held.state.add_(1)  # written in place
        held.count += 1  # a slot rebound
        held.history.append(held.state.clone())  # a list grown
        graph["b"][0] = torch.cat([graph["b"][0], graph["b"][0]])  # an item rebound
        graph["b"][1]["c"].mul_(2)  # a 0-d tensor written in place
        graph["d"] = 1  # a key added
        snap.reset()
        assert seen() == before


def test_the_check_sees_a_cache_left_changed():
    """The picture the tests compare tells a cache one token longer, or one value off."""
    config = _llama_config()
    model, cache = _model(config), transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.arange(6)[None], past_key_values=cache, use_cache=True)
        before, snap = picture(cache), Snapshot(cache)
        model(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True)
        assert picture(cache) != before  # 7 tokens
        snap.reset()
        cache.layers[1].values[0, 0, 0, 0] += 1  # one value, with no step
        assert picture(cache) != before


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_every_timed_pass_starts_from_the_cache_as_it_was_before_the_step(kind, monkeypatch):
    """Before each timed pass of a phase (and after the last) the cache holds, bit for bit,
    what it held when the phase's snapshot was taken, before its counted step."""
    taken, resets = {}, []
    init, reset = Snapshot.__init__, Snapshot.reset

    def recording_init(self, *objs, **how):
        init(self, *objs, **how)
        taken[id(self)] = (objs, picture(objs))

    def checked_reset(self):
        reset(self)
        live, before = taken[id(self)]
        assert picture(live) == before
        resets.append(self)

    monkeypatch.setattr(Snapshot, "__init__", recording_init)
    monkeypatch.setattr(Snapshot, "reset", checked_reset)
    model = _model(_llama_config())
    options = {"repeat": 2, "warmup": 0, "warn": False}
    report = profile_generation(model, prompt_len=4, new_tokens=3, cache=kind, **options)
    # prefill and decode at contexts 4 and 5 (the steps making tokens 2 and 3 of 3: 4 + 3 - 2
    # = 5), each timed: each puts its own cache back before its passes and once after them
    assert [p.context for p in report.phases()] == [0, 4, 5]
    assert len({id(s) for s in resets}) == 3
    for phase in report.phases():
        assert phase.report.layer_timing.n == 2
