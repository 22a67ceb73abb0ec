"""device="meta" counts attention as the CPU runs it: ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` on their fast paths where the CPU takes them, SDPA as the CPU's fused kernel on the slow path and in the
training step (forward and backward), so a model counted on meta counts what it counts on the
CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelprof import profile


def _vit(device: str) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    with torch.device(device):
        return VisionTransformer(
            image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64
        ).eval()


def _attention_ops(by_op) -> list[str]:
    return sorted(k for k in by_op if "attention" in k or "bmm" in k or "softmax" in k)


def test_vit_b_16_on_meta_counts_the_cpus_flops():
    import torchvision

    with torch.device("meta"):
        model = torchvision.models.vit_b_16(weights=None).eval()
    r = profile(model, (3, 224, 224), device="meta", timing=False)
    # the CPU's figure (MultiheadAttention's fast path); meta counted 35,213,242,936 before,
    # the attention as bmm + softmax + mul
    assert r.totals["flops"] == 35_215_200_328
    assert _attention_ops(r._by_op) == ["aten._native_multi_head_attention.default"]


def test_a_forward_on_meta_is_the_cpus(monkeypatch):
    monkeypatch.setenv("MODELPROF_STATIC_ROUTE", "real")  # the CPU's own kernels
    cpu = profile(_vit("cpu"), (3, 32, 32), timing=False)
    meta = profile(_vit("meta"), (3, 32, 32), device="meta", timing=False)
    assert _attention_ops(meta._by_op) == ["aten._native_multi_head_attention.default"]
    cols = ["module", "macs", "flops", "read_bytes", "write_bytes", "output_shape"]
    assert meta.to_dataframe()[cols].equals(cpu.to_dataframe()[cols])


def test_a_training_step_on_meta_is_the_cpus():
    cpu = profile(_vit("cpu"), (3, 32, 32), timing=False, backward=True)
    meta = profile(_vit("meta"), (3, 32, 32), device="meta", timing=False, backward=True)
    fused = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert _attention_ops(meta._by_op) == [f"{fused}.default"]
    assert _attention_ops(meta.training_step.cost.by_op) == [f"{fused}_backward.default"]
    for key in ("macs", "flops", "backward_macs", "backward_flops", "read_bytes"):
        assert meta.totals[key] == cpu.totals[key], key


class _Cross(nn.Module):
    """Cross-attention (the slow path on the CPU too) and self-attention with weights."""

    def __init__(self) -> None:
        super().__init__()
        self.cross = nn.MultiheadAttention(16, 2, batch_first=True)
        self.self_attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.cross(x, x[:, :3], x[:, :3])
        z, w = self.self_attn(y, y, y)  # need_weights=True: the weights come back
        return z + w.sum()


@pytest.mark.parametrize("backward", [False, True])
def test_cross_attention_and_weights_on_meta_are_the_cpus(backward, monkeypatch):
    monkeypatch.setenv("MODELPROF_STATIC_ROUTE", "real")
    torch.manual_seed(0)
    cpu = profile(_Cross().eval(), (5, 16), timing=False, backward=backward)
    with torch.device("meta"):
        model = _Cross().eval()
    meta = profile(model, (5, 16), device="meta", timing=False, backward=backward)
    assert _attention_ops(meta._by_op) == _attention_ops(cpu._by_op)
    for key in cpu.totals:
        assert meta.totals[key] == cpu.totals[key], key


def _encoder(batch_first: bool) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


@pytest.mark.parametrize("batch_first", [True, False])
def test_an_encoder_layer_on_meta_runs_as_on_the_cpu(batch_first):
    # batch_first: the CPU runs each layer as one fused op (its eval fast path), and meta must
    # too; not batch_first: the CPU's fast-path test refuses, and meta decomposes the layer alike
    cpu = profile(_encoder(batch_first), (5, 16), batch_size=2, timing=False)
    with torch.device("meta"):
        model = _encoder(batch_first)
    meta = profile(model, (5, 16), batch_size=2, device="meta", timing=False)
    cols = ["module", "type", "leaf", "macs", "flops", "read_bytes", "write_bytes", "output_shape"]
    assert meta.to_dataframe()[cols].equals(cpu.to_dataframe()[cols])
    fused = "aten._transformer_encoder_layer_fwd.default" in meta._by_op
    assert fused is batch_first
    if batch_first:
        rows = meta.to_dataframe().set_index("module")
        # each layer a leaf reading its input (2x5x16 float32: 640 B) and its parameters once:
        # in_proj 3*16*16 + 48, out_proj 16*16 + 16, two norms 2*32, linear1 32*16 + 32,
        # linear2 16*32 + 16 = 2224 floats = 8896 B; it writes its 2x5x16 output, 640 B
        assert list(rows.index) == ["", "layers.0", "layers.1"]
        assert rows.loc["layers.0", "read_bytes"] == 640 + 8896
        assert rows.loc["layers.0", "write_bytes"] == 640
