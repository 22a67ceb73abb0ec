"""A key of ``profile_generation(..., inputs={...})`` the model's forward does not take is
refused, naming it and the nearest name: a newcomer's ``{"input_id": ids}`` went to the
forward's ``**kwargs`` unread, and a random 128-token prompt was profiled in its place."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
from helpers import tiny_llama

from modelprof import ModelProfError, profile_generation

transformers = pytest.importorskip("transformers")

IDS = torch.zeros(1, 4, dtype=torch.long)


class _NamedOnly(transformers.GPT2LMHeadModel):
    """A GPT-2 whose forward names every input it takes (no ``**kwargs``)."""

    def forward(self, input_ids=None, attention_mask=None):  # refused before it runs
        return super().forward(input_ids, attention_mask=attention_mask)


def _gpt2() -> _NamedOnly:
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return _NamedOnly(cfg).eval()


def test_a_key_a_forward_without_kwargs_does_not_take_is_refused_with_the_nearest_name():
    with pytest.raises(ModelProfError, match=r"inputs\['input_id'\] .* did you mean 'input_ids'"):
        profile_generation(_gpt2(), inputs={"input_id": IDS}, new_tokens=2, timing=False)
    # nothing near: the names it takes, listed
    with pytest.raises(ModelProfError, match=r"inputs\['pixels'\] .* it takes \['attention_mask'"):
        profile_generation(_gpt2(), inputs={"pixels": IDS}, new_tokens=2, timing=False)


def test_the_keys_a_forward_takes_are_the_prompts():
    model = tiny_llama()
    mask = torch.ones_like(IDS)
    report = profile_generation(
        model, inputs={"input_ids": IDS, "attention_mask": mask}, new_tokens=2, timing=False
    )
    assert report.spec.prompt_len == 4  # the 4 ids given, not the default 128
    var = [
        p for p in inspect.signature(model.forward).parameters.values() if p.kind is p.VAR_KEYWORD
    ]
    if not typing.get_args(var[0].annotation):
        pytest.skip("this transformers' Llama takes **kwargs of no declared keys")
    # transformers' Llama takes **kwargs: Unpack[TransformersKwargs], those keys alone: one of
    # them is taken, input_id (none of them) refused
    report = profile_generation(
        model, inputs={"input_ids": IDS, "output_attentions": False}, new_tokens=2, timing=False
    )
    assert report.spec.prompt_len == 4
    with pytest.raises(ModelProfError, match=r"inputs\['input_id'\] .* did you mean 'input_ids'"):
        profile_generation(model, inputs={"input_id": IDS}, new_tokens=2, timing=False)
