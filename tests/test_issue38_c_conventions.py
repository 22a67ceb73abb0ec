"""A result states the conventions behind its numbers where a reader could assume otherwise
(issue 38 item 19): an encoder-decoder's prefill head on every decoder position, a 16-bit
Mamba's float32 state, the fused attention's recompute in the raw training totals."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import modelprof
from modelprof.generation.report import GenerationReport


def test_an_encoder_decoder_generation_says_its_prefill_head_runs_on_every_position():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=100,
        decoder_start_token_id=0,
    )  # fmt: skip
    g = modelprof.profile_generation(
        T5ForConditionalGeneration(config).eval(), prompt_len=4, new_tokens=3, timing=False
    )
    said = "the prefill computes the output layer on every decoder prompt position"
    assert any(said in note for note in g.conventions)
    assert said in repr(g) and "## Conventions" in g.to_markdown()


def _fake(dtype: str, state: int) -> SimpleNamespace:
    return SimpleNamespace(
        batch_sizes=[1],
        phases=lambda b: [],
        kv=SimpleNamespace(state_bytes=state),
        dtype=dtype,
        spec=SimpleNamespace(past_static_cache=()),  # no step on a static cache of its own
    )


def test_a_16_bit_recurrent_state_is_said_to_be_held_in_float32():
    conventions = GenerationReport.conventions.fget
    assert any("SSM state in float32" in n for n in conventions(_fake("bfloat16", 4096)))
    assert conventions(_fake("float32", 4096)) == []
    assert conventions(_fake("bfloat16", 0)) == []


def test_a_training_step_with_fused_attention_says_its_raw_totals_hold_the_recompute():
    import torch.nn.functional as F
    from torch import nn

    from modelprof.timing.peaks import Peaks

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(32, 96)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 16, 3, 2, 16).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v).sum()

    report = modelprof.profile(
        Attn(), inputs=torch.randn(2, 16, 32), backward=True, timing=False,
        loss_fn=lambda out, target=None: out,
    )  # fmt: skip
    util = report.utilization(Peaks(1e12, 1e12))
    assert (
        len(util.notes) == 1 and "fused attention backward spent recomputing Q K^T" in util.notes[0]
    )
    assert util.notes[0] in util.describe()
    forward_only = modelprof.profile(Attn(), inputs=torch.randn(2, 16, 32), timing=False)
    assert forward_only.utilization(Peaks(1e12, 1e12)).notes == ()
