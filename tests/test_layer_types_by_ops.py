"""Modules of classes the layer-type table does not know are typed by the ops they run: an
RMSNorm written out is ``norm``, a tanh GELU written out is ``activation``, as in Llama and
GPT-2."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.report.layer_types import layer_type


class RMSNorm(nn.Module):
    """Llama's LlamaRMSNorm, as transformers writes it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class NewGELU(nn.Module):
    """GPT-2's NewGELUActivation, as transformers writes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            0.5
            * x
            * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        )


class Rotary(nn.Module):
    """cos/sin of positions concatenated: elementwise maths (cos, sin dominate), no activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x * 2.0
        return torch.cat([f.cos(), f.sin()], dim=-1)


def test_rmsnorm_and_gelu_written_out_are_typed_by_their_ops() -> None:
    model = nn.Sequential(nn.Linear(8, 8), RMSNorm(8), NewGELU(), Rotary())
    types = profile(model, (4, 8), timing=False).by_layer_type()
    assert set(types.index) == {
        "linear",
        "norm",
        "activation",
        "elementwise",
    }  # rotary: elementwise
    # the norm: 4*8 elements; the activation, the same elements
    assert types.loc["norm", "calls"] == 1 and types.loc["activation", "calls"] == 1
    assert types.loc["norm", "params"] == 8  # its weight


def test_known_classes_and_dominant_op_unchanged() -> None:
    assert layer_type("LayerNorm", {"aten.native_layer_norm.default": 7}) == "norm"
    # a residual add is elementwise, not an activation: no nonlinearity
    assert layer_type("Block", {"aten.add.Tensor": 10}, is_self=True) == "elementwise"
    # a softmax written out has a reduction: not "activation" by the all-elementwise rule
    assert (
        layer_type(
            "MySoftmax", {"aten.exp.default": 8, "aten.sum.dim_IntList": 8, "aten.div.Tensor": 8}
        )
        != "activation"
    )
    # QuickGELU x * sigmoid(1.702 x): mul dominates, the sigmoid makes it an activation
    assert (
        layer_type("QuickGELU", {"aten.mul.Tensor": 16, "aten.sigmoid.default": 8}) == "activation"
    )
    # a bf16 norm casts to float32 and back around its ops
    assert (
        layer_type(
            "T5LayerNorm",
            {
                "aten._to_copy.default": 0,
                "aten.pow.Tensor_Scalar": 8,
                "aten.mean.dim": 8,
                "aten.add.Tensor": 1,
                "aten.rsqrt.default": 1,
                "aten.mul.Tensor": 16,
            },
        )
        == "norm"
    )


def test_llama_and_gpt2_get_norm_and_activation_rows() -> None:
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaModel(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    gpt2 = transformers.GPT2Model(
        transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=16)
    )
    ids = {"input_ids": torch.randint(0, 64, (1, 8))}
    llama_types = profile(llama, ids, timing=False).by_layer_type()
    gpt2_types = profile(gpt2, ids, timing=False).by_layer_type()
    assert llama_types.loc["norm", "calls"] == 3  # input, post-attention and final RMSNorm
    assert "activation" in gpt2_types.index  # NewGELUActivation
