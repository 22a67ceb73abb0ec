"""compare_generation's refusal of models given other than as a dict names them briefly: a
newcomer's list of two Llamas came back as a 2,191-character message, the models' reprs."""

from __future__ import annotations

import pytest
from helpers import tiny_llama

from modelprof import ModelProfError, compare_generation


def test_a_list_of_models_is_named_by_type_and_index():
    model = tiny_llama()
    with pytest.raises(ModelProfError) as e:
        compare_generation([model, model], prompt_len=4, new_tokens=2)
    said = str(e.value)
    assert "got a list of 2 ([0] LlamaForCausalLM, [1] LlamaForCausalLM)" in said
    assert "embed_tokens" not in said and len(said) < 200  # no module tree


def test_a_long_list_names_the_first_eight():
    with pytest.raises(ModelProfError, match=r"\(\[0\] int, .* \[7\] int, \.\.\. 2 more\)"):
        compare_generation(list(range(10)))
