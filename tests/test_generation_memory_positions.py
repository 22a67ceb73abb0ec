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
