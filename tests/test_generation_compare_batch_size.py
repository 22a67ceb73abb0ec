"""compare_generation times its models at one batch size: a list, which profile_generation
takes, is refused before any model runs (a newcomer's batch_size=[1, 2] failed inside torch)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import ModelProfError, compare_generation


class _Untouchable(nn.Module):
    """A model that fails the test if anything calls it: the refusal comes first."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, *args, **kwargs):
        raise AssertionError("the model ran")


@pytest.mark.parametrize("batch_size", [[1, 2], (2,)])
def test_a_list_of_batch_sizes_is_refused_up_front(batch_size):
    with pytest.raises(ModelProfError, match=r"^batch_size=.*at one batch size; call it once"):
        compare_generation({"a": _Untouchable()}, prompt_len=4, new_tokens=2, batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [0, 1.5, "2"])
def test_a_batch_size_that_is_no_positive_int_is_refused_for_the_call(batch_size):
    # the call's own error, not one per model ("every model failed: model 'a': ...")
    with pytest.raises(ModelProfError, match=r"^batch_size=.* must be an int >= 1"):
        compare_generation({"a": _Untouchable()}, prompt_len=4, new_tokens=2, batch_size=batch_size)
