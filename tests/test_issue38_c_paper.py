"""Paper tables of real models keep what a reviewer reads (type and output shape), name a child
under its shown parent by its own name, and say the model (issue 38 item 17)."""

from __future__ import annotations

import pytest
import torch
import torchvision
from helpers import latex_headers

import modelprof


def _header(tex: str) -> str:
    """The column headers, each one's lines joined: ``module & type & output shape & ...``."""
    return " & ".join(latex_headers(tex))


def _body(tex: str) -> list[str]:
    return [line.split(" & ")[0] for line in tex.split(r"\midrule")[1].strip().splitlines()]


@pytest.fixture(scope="module")
def resnet18():
    model = torchvision.models.resnet18(weights=None).eval()
    return modelprof.profile(model, (3, 224, 224), timing=False, device="meta")


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(config).eval()
    return modelprof.profile(model, inputs=torch.randint(0, 1000, (1, 16)), timing=False)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_the_default_fit_keeps_type_and_output_shape(resnet18, gpt2, depth):
    # the shapes went before FLOPs (about 2 x MACs): resnet18 and GPT-2 at every depth
    # dropped output_shape to fit 345 pt
    for report in (resnet18, gpt2):
        head = _header(report.to_latex(depth=depth))
        assert "type" in head and "output shape" in head, head


def test_a_table_steps_down_a_font_size_before_it_drops_the_shapes(gpt2):
    # at the text width the names over two lines leave room for the shapes in \small; in a
    # column (229.5 pt) GPT2LMHeadModel twice (its root's name and type) leaves none for the
    # params in \small: \footnotesize keeps them. (The whole tree needs \footnotesize: its
    # (self) rows' 32.77 K MACs put the MACs in K, 2662.40 at the root, wider than 2.66 M.)
    depth2 = gpt2.to_latex(depth=2)
    assert "output shape" in _header(depth2) and "\\small\n" in depth2
    assert "\\footnotesize\n" in gpt2.to_latex() and "MACs (K)" in _header(gpt2.to_latex())
    tex = gpt2.to_latex(depth=2, width="columnwidth")
    assert "\\footnotesize\n" in tex and _header(tex) == "module & type & params (K)"
    small = gpt2.to_latex(depth=2, width="columnwidth", font_size="small")
    assert _header(small) == "module & type"
    # a font the user names stays: the shapes go instead
    assert "\\normalsize\n" in gpt2.to_latex(depth=2, font_size="normalsize")


def test_a_child_is_named_by_its_own_name_under_its_shown_parent(resnet18, gpt2):
    names = _body(resnet18.to_latex(depth=3))
    assert names[0] == "ResNet"  # the root: the model, not (root)
    # under layer1.0 (itself kept whole: a bare "0" names nothing) its conv1 is "conv1"
    at = names.index(r"\hspace{1.6em}layer1.0")
    assert names[at + 1] == r"\hspace{2.4em}conv1"
    assert not any("layer1.0.conv1" in n for n in names)
    gpt = _body(gpt2.to_latex(depth=2))
    assert r"\hspace{1.6em}wte" in gpt and not any("transformer.wte" in n for n in gpt)


def test_a_leaf_table_keeps_whole_names(resnet18):
    # no parent shown above a leaf: nothing says whose part it is, so the path stays
    names = _body(resnet18.to_latex(leaf_only=True))
    assert "layer1.0.conv1" in names


def test_a_generation_table_keeps_its_work_and_starts_each_phase_at_its_root():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)
    g = modelprof.profile_generation(
        GPT2LMHeadModel(config).eval(), prompt_len=8, new_tokens=3, timing=False
    )
    tex = g.to_latex()
    # no priority was named: every column was unranked and the rightmost went first, leaving
    # phase, context and module alone
    assert _header(tex).startswith("phase & context & module & type")
    assert "MACs" in _header(tex)
    decode_roots = [line for line in tex.splitlines() if line.startswith("decode & ")]
    # each phase's root is the top of its own tree, not a child of the prefill's root
    assert decode_roots and decode_roots[0].split(" & ")[2] == "GPT2LMHeadModel"


def test_a_timed_generation_table_keeps_the_work_and_its_time_before_the_type():
    # a newcomer's timed Llama table kept phase, context, module and type alone: all 25 columns
    # of to_dataframe() went to LaTeX and params, MACs and latency were dropped to fit. A
    # report's compact columns go, under the phase's, and the type is dropped before them
    # (the params, which no phase changes, before the MACs and the latency, which it does)
    from helpers import tiny_llama

    g = modelprof.profile_generation(
        tiny_llama(), prompt_len=16, new_tokens=2, budget_s=0.2, warn=False
    )
    tex = g.to_latex()
    kept = latex_headers(tex)[:6]
    assert [h.partition(" (")[0] for h in kept] == [
        "phase",
        "context",
        "module",
        "params",
        "MACs",
        "latency",
    ]
    dropped = next(line for line in tex.splitlines() if line.startswith("% dropped"))
    assert "type" in dropped and "latency_ms" not in dropped
    # every column given is one of a report's or the phase's: none of the raw frame's
    for raw in ("call", "depth", "leaf", "trainable_params", "latency_std_ms"):
        assert raw not in dropped


def test_a_training_steps_table_keeps_the_backwards_time():
    # a newcomer's backward=True table dropped backward_latency_ms (and backward_flops) to fit,
    # keeping the forward's alone: a step's table keeps its backward's time beside the forward's
    # (the output shape goes first)
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)
    )
    r = modelprof.profile(model, (3, 32, 32), backward=True, budget_s=0.2, warn=False)
    names = [h.partition(" (")[0] for h in latex_headers(r.to_latex())]
    assert names[:6] == ["module", "type", "params", "MACs", "latency", "backward latency"]
    # a forward's table is as before: the output shape kept before the latency's share
    forward = modelprof.profile(model, (3, 32, 32), budget_s=0.2, warn=False)
    assert "output shape" in _header(forward.to_latex())


def test_the_caption_names_a_torchvision_model_by_its_builder(resnet18):
    # "ResNet" is resnet18's and resnet50's class alike: the caption said it for both
    assert r"\caption{resnet18, input 1$\times$3$\times$224$\times$224" in resnet18.to_latex()
    fifty = modelprof.profile(
        torchvision.models.resnet50(weights=None), (3, 224, 224), timing=False, device="meta"
    )
    assert r"\caption{resnet50, input" in fifty.to_latex()
    # a head of its own is no published architecture: the class, as recorded
    custom = modelprof.profile(
        torchvision.models.resnet18(weights=None, num_classes=7), (3, 64, 64), timing=False,
        device="meta",
    )  # fmt: skip
    assert r"\caption{ResNet, input" in custom.to_latex()
