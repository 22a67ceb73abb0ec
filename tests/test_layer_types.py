"""Layer types for the per-layer-type summary: by torch.nn class, else by the dominant op; and
Report.by_layer_type on real models (leaf sums equal the totals; (self) rows typed by their ops)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelprof import profile
from modelprof.report.layer_types import LAYER_TYPES, layer_type, op_layer_type


@pytest.mark.parametrize(
    "op, kind",
    [
        ("convolution.default", "conv"),
        ("aten.addmm.default", "linear"),
        ("bmm", "matmul"),
        ("_scaled_dot_product_flash_attention_for_cpu.default", "attention"),
        ("native_layer_norm.default", "norm"),
        ("relu_.default", "activation"),
        ("_softmax.default", "activation"),
        ("max_pool2d_with_indices.default", "pool"),
        ("add_.Tensor", "elementwise"),  # not in the table: its pointwise tag says so
        ("mul.Tensor", "elementwise"),
        ("cat.default", "data movement"),
        ("mean.dim", "reduction"),
        ("embedding.default", "embedding"),
        ("no_such_op.default", "other"),
    ],
)
def test_op_layer_types(op: str, kind: str) -> None:
    assert op_layer_type(op) == kind
    assert kind in LAYER_TYPES


def test_module_class_first_then_ops() -> None:
    assert layer_type("Conv2d", {"convolution.default": 10}) == "conv"
    assert (
        layer_type("BatchNorm2d", {"empty.memory_format": 0, "native_batch_norm.default": 4})
        == "norm"
    )
    # a (self) row carries its parent's class: typed by its ops (a residual add)
    assert layer_type("BasicBlock", {"add_.Tensor": 16384}, is_self=True) == "elementwise"
    # the op with the most FLOPs wins; allocations say nothing
    assert (
        layer_type("MyBlock", {"empty.memory_format": 0, "bmm.default": 100, "add.Tensor": 5})
        == "matmul"
    )
    assert layer_type("MyBlock", {"empty.memory_format": 0}) == "other"
    assert layer_type("MyBlock", {}) == "other"
    # a user class that happens to have no known name and ran an attention kernel
    assert layer_type("Attention", {"scaled_dot_product_attention.default": 1}) == "attention"


class _ZerosThenCat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.fc(x), torch.zeros(2, 4)])


def test_allocations_are_passed_over_with_their_namespace() -> None:
    # a profile's op names carry the namespace ("aten.zeros.default"): the (self) row's
    # zeros only allocates, so its concat types it as data movement, not "other"
    table = profile(_ZerosThenCat(), (4,), batch_size=2, timing=False).by_layer_type()
    assert set(table.index) == {"linear", "data movement"}
    assert layer_type("M", {"aten.empty.memory_format": 0}, is_self=True) == "other"


class Block(nn.Module):
    """Attention written by hand with SDPA, a residual add and a concat in its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))
        return self.norm(x + y.squeeze(1))


def test_by_layer_type_sums_leaves_and_types_self_rows_by_their_ops() -> None:
    model = Block().eval()
    report = profile(model, (4, 8), timing=False)
    table = report.by_layer_type()
    # the Block's own ops (SDPA, the add) are its (self) row: typed attention by its biggest op
    assert set(table.index) == {"linear", "attention", "norm"}
    # leaf sums equal the model totals (each shared parameter once)
    for column in ("params", "macs", "flops", "read_bytes", "write_bytes"):
        assert int(table[column].sum()) == report.totals[column], column
    # qkv: 4 tokens x 24 outputs x 8 inputs = 768 MACs; SDPA: QK^T 4x4x8 + AV 4x4x8 = 256 MACs
    assert table.loc["linear", "macs"] == 768
    assert table.loc["attention", "macs"] == 256
    assert table.loc["linear", "params"] == 8 * 24 + 24  # 216
    assert table.loc["norm", "params"] == 16  # weight + bias of LayerNorm(8)
    assert list(table.columns) == [
        "calls",
        "params",
        "macs",
        "flops",
        "macs_pct",
        "flops_pct",
        "madd",
        "read_bytes",
        "write_bytes",
    ]  # untimed: no latency columns


def test_resnet_residual_adds_are_elementwise_not_basicblock() -> None:
    torchvision = pytest.importorskip("torchvision")
    report = profile(torchvision.models.resnet18(), (3, 32, 32), device="meta", timing=False)
    table = report.by_layer_type()
    # 8 BasicBlocks, one residual add each; 20 convs (17 + 3 downsample), 20 BNs, 17 ReLU calls
    assert table.loc["elementwise", "calls"] == 8
    assert table.loc["conv", "calls"] == 20 and table.loc["norm", "calls"] == 20
    assert table.loc["activation", "calls"] == 17
    assert "BasicBlock" not in table.index
    assert int(table["macs"].sum()) == report.totals["macs"]
    # the shares of the totals, beside latency_pct: the kinds' add up to 100 %
    for c in ("macs", "flops"):
        assert table[f"{c}_pct"].sum() == pytest.approx(100.0)
        assert table.loc["conv", f"{c}_pct"] == 100 * table.loc["conv", c] / report.totals[c]


def test_a_training_steps_loss_and_optimizer_are_their_own_types() -> None:
    # once grouped by their ops as "other"; the (loss) and (optimizer) rows are typed by kind
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    report = profile(
        model,
        (8,),
        backward=True,
        loss_fn=F.cross_entropy,
        target=torch.tensor([1]),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        timing=False,
    )
    table = report.by_layer_type()
    rows = {r.module: r for r in report.rows}
    # plain SGD: 2 FLOPs per element (scale, add) on 8 * 8 + 8 + 8 * 2 + 2 = 90 parameters
    assert table.loc["optimizer", "calls"] == 1 and table.loc["optimizer", "flops"] == 180
    assert table.loc["loss", "flops"] == rows["(loss)"].flops > 0
    assert "other" not in table.index
    assert int(table["flops"].sum()) == report.totals["flops"]
    # the backward's costs by kind too (a newcomer found only the forward's): they sum to the
    # step's totals; the first Linear's input needs no grad, so its backward is the weight's
    # gradient alone (8 x 8 = 64 MACs), the second's both (2 x 8 x 2 = 32): linear 96
    assert int(table["backward_macs"].sum()) == report.totals["backward_macs"] == 96
    assert table.loc["linear", "backward_macs"] == 96
    assert int(table["backward_flops"].sum()) == report.totals["backward_flops"]
    assert "backward_latency_ms" not in table.columns  # not timed


def test_a_share_of_nothing_is_nan_as_in_the_rows() -> None:
    # a model of no MACs: the MACs share has no base (the rows' macs_pct reads NaN too)
    report = profile(nn.Sequential(nn.ReLU()), (4,), timing=False)
    table = report.by_layer_type()
    assert report.totals["macs"] == 0 and table["macs_pct"].isna().all()
    assert table.loc["activation", "flops_pct"] == 100.0  # 4 FLOPs of 4
