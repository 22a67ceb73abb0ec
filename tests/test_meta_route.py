"""A counting-only CPU profile counted on meta (counting/meta_route.py) gives the very report
the real kernels give — every row, count, op name and note, on the CPU — and falls back to the
real pass wherever meta cannot be trusted, with no trace of the attempt. (The torchvision zoo:
tests/test_leaves.py, ``-m slow``.)"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.counting.meta_route import ROUTE_ENV

from helpers import equal_reports


def _both(model: nn.Module, inputs, monkeypatch, **kw):
    """(the meta route's report where it applies, the real pass's report, the first's
    warnings)."""
    monkeypatch.setenv(ROUTE_ENV, "meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = profile(model, inputs=inputs, timing=False, **kw)
    monkeypatch.setenv(ROUTE_ENV, "real")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = profile(model, inputs=inputs, timing=False, **kw)
    assert real.env["static_route"] == "real"
    return first, real, [str(w.message) for w in caught]


def _equal(a, b) -> None:
    equal_reports(a, b)
    assert a.device == b.device == "cpu" and not any("meta" in n for n in a.notes)


@pytest.mark.parametrize("name", ["resnet50", "vit_b_16"])
def test_torchvision_models_are_counted_on_meta_as_on_the_cpu(name: str, monkeypatch) -> None:
    tv = pytest.importorskip("torchvision")
    model = getattr(tv.models, name)().eval()
    on_meta, real, caught = _both(model, torch.randn(1, 3, 224, 224), monkeypatch)
    assert on_meta.env["static_route"] == "meta" and caught == []
    _equal(on_meta, real)
    if name == "vit_b_16":   # the CPU's fast attention path, counted as the CPU runs it
        assert on_meta._by_op["aten._native_multi_head_attention.default"].calls == 12
    else:                    # torchvision's 4.09 GMACs
        assert int(on_meta.to_dataframe().macs.iloc[0]) == 4_089_184_256


class _Branches(nn.Module):
    """Data-dependent: a branch on a value and boolean-mask indexing."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:
            y = y * 2
        return y[y > 0].sum() + y.relu().sum()


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[y > 0]


@pytest.mark.parametrize("model", [_Branches(), _Masked()], ids=["branch", "mask"])
def test_a_data_dependent_model_falls_back_to_the_real_pass(model, monkeypatch) -> None:
    first, real, caught = _both(model.eval(), torch.randn(3, 4), monkeypatch)
    assert first.env["static_route"] == "real" and caught == []   # no trace of the attempt
    _equal(first, real)


class _Remembers(nn.Module):
    """Rebinds an attribute, warns, then branches on a value: the meta attempt fails after
    both; the real pass must see the module as it was and warn once."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.seen is None
        self.seen = True
        warnings.warn("forward ran")
        y = self.fc(x) if first else self.fc(x) * 3
        return y * 2 if y.sum() > 0 else y * 4


def test_a_failed_attempt_leaves_nothing_behind(monkeypatch) -> None:
    model = _Remembers().eval()
    first, real, caught = _both(model, torch.randn(2, 4), monkeypatch)
    assert first.env["static_route"] == "real"
    assert caught.count("forward ran") == 1   # the real pass's; the attempt's was dropped
    # the real pass saw ``seen`` unset: the first-call branch, one addmm and no mul by 3
    # (the branch on the value adds one mul either way; the second-call branch would add one)
    assert first._by_op["aten.mul.Tensor"].calls == real._by_op["aten.mul.Tensor"].calls == 1
    _equal(first, real)
    assert model.seen is None


class _Warns(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("from the model")
        return self.fc(x)


def test_warnings_of_a_meta_count_reach_the_caller_once(monkeypatch) -> None:
    first, real, caught = _both(_Warns().eval(), torch.randn(2, 4), monkeypatch)
    assert first.env["static_route"] == "meta" and caught == ["from the model"]
    _equal(first, real)


class _Attention(nn.Module):
    """nn.MultiheadAttention: self-attention (the CPU's fast path unless the projections have
    no bias), cross-attention (its slow path, SDPA fused), and an item set from a number."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True, bias=bias)
        self.cross = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attn(x, x, x, need_weights=False)
        z, _ = self.cross(y, x, x, need_weights=False)
        mask = z.new_zeros(z.shape[1], z.shape[1])
        mask[1:, 0] = 2          # a slice: fill_ from a CPU scalar on the CPU
        mask[0, 0] = 1.5         # one element: copy_
        return z + mask.sum()


@pytest.mark.parametrize("bias", [True, False])
def test_multihead_attention_is_counted_as_on_the_cpu(bias: bool, monkeypatch) -> None:
    first, real, caught = _both(_Attention(bias).eval(), torch.randn(2, 5, 8), monkeypatch)
    # without biases the CPU takes the slow path after its checks: meta is not trusted then
    assert first.env["static_route"] == ("meta" if bias else "real") and caught == []
    _equal(first, real)
    fast = first._by_op.get("aten._native_multi_head_attention.default")
    assert (fast.calls if fast else 0) == (1 if bias else 0)
    assert first._by_op["aten.fill_.Tensor"].calls == 1
    assert first._by_op["aten._scaled_dot_product_flash_attention_for_cpu.default"].calls == \
        (1 if bias else 2)


class _Ones(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)


@pytest.mark.parametrize("case", ["encoder_layer", "lstm", "plain", "grad", "tensor_attribute"])
def test_what_meta_cannot_be_trusted_with_runs_the_real_kernels(case: str, monkeypatch) -> None:
    x = torch.randn(2, 5, 8)
    kw: dict = {}
    if case == "encoder_layer":   # its own fast path checks the device inline
        model = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    elif case == "lstm":          # oneDNN's RNN kernel on the CPU
        model = nn.LSTM(8, 8, batch_first=True)
    elif case == "grad":
        model, kw = nn.Linear(8, 8), {"no_grad": False}
    else:
        model = nn.Sequential(nn.Linear(8, 8), _Ones())
        if case == "tensor_attribute":   # a tensor outside the parameters and buffers
            model[1].scale = torch.ones(8)
    first, real, caught = _both(model.eval(), x, monkeypatch, **kw)
    expected = "meta" if case == "plain" else "real"   # (plain: the control)
    assert first.env["static_route"] == expected and caught == []
    _equal(first, real)


def test_the_meta_route_is_asked_for_by_the_environment_variable(monkeypatch) -> None:
    # opt-in: by default (and with =real) the real kernels count
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    assert profile(model, (8,), timing=False).env["static_route"] == "real"
    monkeypatch.setenv(ROUTE_ENV, "real")
    assert profile(model, (8,), timing=False).env["static_route"] == "real"
    monkeypatch.setenv(ROUTE_ENV, "meta")
    assert profile(model, (8,), timing=False).env["static_route"] == "meta"
