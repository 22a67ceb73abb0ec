"""A font the user names for a paper table stays (issue 38 item 17): only the default \\small
steps down to \\footnotesize to keep the columns a paper keeps; an explicit font_size="small"
keeps \\small and drops the columns, saying so."""

from __future__ import annotations

import pytest
import torch
from helpers import latex_headers

import modelprof


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(config).eval()
    return modelprof.profile(model, inputs=torch.randint(0, 1000, (1, 16)), timing=False)


def _header(tex: str) -> str:
    return " & ".join(latex_headers(tex))


def test_the_default_font_steps_down_to_keep_the_params(gpt2):
    # in a column (229.5 pt) \small has room for the module's name and type alone
    tex = gpt2.to_latex(depth=2, width="columnwidth")
    assert "\\footnotesize\n" in tex and _header(tex) == "module & type & params (K)"
    note = next(line for line in tex.splitlines() if "dropped" in line)
    assert "params" not in note  # the shapes, MACs, FLOPs and byte columns go, not the params


def test_an_explicit_small_stays_and_the_columns_go_as_said(gpt2):
    tex = gpt2.to_latex(depth=2, width="columnwidth", font_size="small")
    # it stepped down to \footnotesize as if no font had been named
    assert "\\small\n" in tex and "\\footnotesize" not in tex
    assert _header(tex) == "module & type"
    note = next(line for line in tex.splitlines() if "dropped" in line)
    assert "params" in note and "\\small" in note
    # the same through a ViewOptions
    from modelprof.render.options import ViewOptions

    view = ViewOptions.parse(depth=2, font_size="small", width="columnwidth")
    assert "\\small\n" in gpt2.to_latex(view=view)
