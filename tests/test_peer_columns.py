"""What peers' users expect: trainable vs frozen parameters (torchinfo), each row's
share of MACs/FLOPs (ptflops, DeepSpeed), an estimated total memory for inference and for a
training step (torchinfo's "estimated total size")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.errors import ModelProfError


def _half_frozen() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    return model


def test_trainable_and_frozen_params_per_row_and_in_totals() -> None:
    r = profile(_half_frozen(), (4,), timing=False)
    df = r.to_dataframe().set_index("module")
    # Linear(4, 3): 4*3 + 3 = 15 frozen; Linear(3, 2): 3*2 + 2 = 8 trainable
    assert (df.loc["0", "trainable_params"], df.loc["0", "frozen_params"]) == (0, 15)
    assert (df.loc["1", "trainable_params"], df.loc["1", "frozen_params"]) == (8, 0)
    assert (df.loc["", "trainable_params"], df.loc["", "frozen_params"]) == (8, 15)  # root
    assert (r.totals["trainable_params"], r.totals["frozen_params"]) == (8, 15)
    assert "trainable params 8, frozen 15 (requires_grad=False)" in r.summary()


def test_macs_and_flops_share_per_row() -> None:
    r = profile(
        nn.Sequential(nn.Linear(4, 3, bias=False), nn.Linear(3, 2, bias=False)), (4,), timing=False
    )
    df = r.to_dataframe().set_index("module")
    # MACs 4*3 = 12 and 3*2 = 6 of 18; without biases FLOPs are 2x MACs: the same shares
    assert df.loc["0", "macs_pct"] == pytest.approx(100 * 12 / 18)
    assert df.loc["1", "macs_pct"] == pytest.approx(100 * 6 / 18)
    assert df.loc["1", "flops_pct"] == pytest.approx(100 * 12 / 36)
    assert df.loc["", "flops_pct"] == pytest.approx(100.0)  # the root holds everything
    assert df[df["leaf"]]["flops_pct"].sum() == pytest.approx(100.0)
    assert "FLOPs share" in r.to_markdown()  # beside the latency share


def test_memory_estimate_inference_and_training_step() -> None:
    r = profile(_half_frozen(), (4,), timing=False)
    est = r.memory_estimate()
    # float32: params 23*4 = 92 B (trainable 8*4 = 32), no buffers, input 4*4 = 16 B;
    # largest leaf working set beyond the input (its own row): Linear(4, 3) reads the input
    # (16 B, counted there) and writes 12 B; Linear(3, 2) reads 12 and writes 8 = 20 B; leaf
    # outputs 12 + 8 = 20 B
    assert est.loc["parameters", "inference"] == 92
    assert est.loc["activations", "inference"] == 20
    assert est.loc["total", "inference"] == 92 + 16 + 20  # 128
    assert est.loc["saved for backward", "training_step"] == 20  # estimated
    assert est.loc["gradients", "training_step"] == 32
    # Adam's m, v (2 x 32 B) and its 4-byte step for each of the 2 trainable tensors
    assert est.loc["optimizer state", "training_step"] == 2 * 32 + 2 * 4
    assert est.loc["total", "training_step"] == 92 + 16 + 20 + 20 + 32 + 72  # 252
    assert r.memory_estimate(optimizer_states=0).loc["optimizer state", "training_step"] == 0
    assert "estimated memory: inference 128 B" in r.summary()


def test_memory_estimate_counts_the_input_once() -> None:
    # one Linear(512, 512) without bias at batch 512, float32: weight 1 MiB, input 1 MiB,
    # output 1 MiB; the peak holds those three, and the leaf's input is the model's input
    r = profile(nn.Linear(512, 512, bias=False), (512,), batch_size=512, timing=False)
    est = r.memory_estimate()
    mib = 512 * 512 * 4
    assert est.loc["inputs", "inference"] == mib
    assert est.loc["activations", "inference"] == mib  # the output alone
    assert est.loc["total", "inference"] == 3 * mib
    # a stack of same-shape layers: the second Linear reads ReLU's output while the caller still
    # holds the input; live then: weights 2 + input 1 + ReLU's output 1 + its output 1 = 5 MiB
    stack = nn.Sequential(
        nn.Linear(512, 512, bias=False), nn.ReLU(), nn.Linear(512, 512, bias=False)
    )
    est = profile(stack, (512,), batch_size=512, timing=False).memory_estimate()
    assert est.loc["activations", "inference"] == 2 * mib
    assert est.loc["total", "inference"] == 5 * mib


def test_memory_estimate_of_a_profiled_training_step() -> None:
    model = _half_frozen()
    sgd = profile(
        model, (4,), timing=False, backward=True, optimizer=lambda p: torch.optim.SGD(p, lr=0.1)
    )
    adam = profile(model, (4,), timing=False, backward=True, optimizer="adam")
    # plain SGD keeps no state; Adam two tensors per trainable element, 2 * 32 B, and a
    # 4-byte step per trainable tensor (Linear(3, 2)'s weight and bias): 64 + 8 = 72 B
    assert sgd.memory_estimate().loc["optimizer state", "training_step"] == 0
    assert adam.memory_estimate().loc["optimizer state", "training_step"] == 72
    saved = adam.memory_estimate().loc["saved for backward"]
    assert saved["training_step"] == adam.totals["saved_bytes"] and "measured" in saved["how"]


def test_memory_estimate_counts_a_saved_input_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    r = profile(model, inputs=torch.randn(4, 16), backward=True, timing=False)
    est = r.memory_estimate()
    # float32: the first Linear saves x, 4*16*4 = 256 B (the inputs row's), ReLU its output
    # and the second Linear its input, 4*32*4 = 512 B each (one tensor, saved once): 768 B
    # in all, of which 768 - 256 = 512 B beyond the inputs
    assert int(r.totals["saved_bytes"]) == 4 * 16 * 4 + 4 * 32 * 4 == 768
    assert est.loc["inputs", "training_step"] == 4 * 16 * 4  # 256
    assert est.loc["saved for backward", "training_step"] == 4 * 32 * 4  # 512


def test_memory_estimate_refuses_optimizer_states_beside_a_profiled_optimizer() -> None:
    model = _half_frozen()
    r = profile(model, (4,), timing=False, backward=True, optimizer="adamw")
    # AdamW's m and v of the 8 trainable elements, 2 * 8 * 4 = 64 B, and a 4-byte step for
    # each of its 2 trainable tensors: 64 + 8 = 72 B, the profiled optimizer's own
    assert r.memory_estimate().loc["optimizer state", "training_step"] == 2 * 8 * 4 + 2 * 4
    with pytest.raises(ModelProfError, match=r"optimizer_states=1 .*AdamW"):
        r.memory_estimate(optimizer_states=1)  # was ignored: 72 B still
    # without a profiled optimizer it sizes the assumed state: 1 * 32 B, no step
    assert (
        profile(model, (4,), timing=False)
        .memory_estimate(optimizer_states=1)
        .loc["optimizer state", "training_step"]
        == 1 * 8 * 4
    )
