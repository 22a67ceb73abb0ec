"""Known leaf modules counted from their calls (counting/leaves.py) give the very report the
per-op path gives: whole DataFrames, rows, per-op totals (names, order, calls, notes), the
unsupported ops and the parameter count, on every torchvision classification model and on
the cases the leaf path must hand back to the per-op one."""
from __future__ import annotations

import warnings

import pytest
import torch
import torchvision
from torch import nn

from modelprof import profile
from modelprof.counting import forward as forward_mod
from modelprof.counting import leaves as leaves_mod

from helpers import equal_reports

# the smallest input each family takes (ViT and MaxViT need their fixed image size)
_FIXED = {"vit": 224, "maxvit": 224, "swin": 224, "inception": 75, "googlenet": 64}


def _size(name: str) -> int:
    return next((s for k, s in _FIXED.items() if name.startswith(k)), 64)


def _profile(model: nn.Module, inputs, leaves: bool, monkeypatch, **kw):
    monkeypatch.setattr(forward_mod, "LEAVES_FROM_CALLS", leaves)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile(model, inputs=inputs, timing=False, **kw)


def _same_reports(model: nn.Module, inputs, monkeypatch, **kw) -> None:
    a = _profile(model, inputs, True, monkeypatch, **kw)
    b = _profile(model, inputs, False, monkeypatch, **kw)
    equal_reports(a, b)


def _build(name: str, monkeypatch) -> nn.Module:
    """The model with uninitialised weights (set to ones below: the counts read no values,
    and the zoo's random init takes minutes): built on the meta device, or, where the
    constructor reads values (RegNet), with the init functions stubbed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.device("meta"):
                return torchvision.models.get_model(name, weights=None).to_empty(device="cpu")
        except NotImplementedError:
            for fn in ("normal_", "uniform_", "kaiming_normal_", "kaiming_uniform_",
                       "trunc_normal_", "xavier_uniform_", "constant_", "zeros_", "ones_"):
                monkeypatch.setattr(nn.init, fn, lambda t, *a, **k: t)
            return torchvision.models.get_model(name, weights=None)


def _zoo(name: str, monkeypatch) -> tuple[nn.Module, torch.Tensor]:
    """A torchvision classification model in eval, its weights ones and integer buffers zeros
    (no random init to wait for), and an input at its evaluation size."""
    model = _build(name, monkeypatch)
    model.eval()
    for t in (*model.parameters(), *model.buffers()):
        with torch.no_grad():
            t.copy_(torch.ones_like(t) if t.is_floating_point() else torch.zeros_like(t))
    return model, torch.randn(1, 3, _size(name), _size(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", torchvision.models.list_models(module=torchvision.models))
def test_torchvision_zoo_same_report_with_leaves_from_calls(name: str, monkeypatch) -> None:
    _same_reports(*_zoo(name, monkeypatch), monkeypatch)


class _Calls(nn.Module):
    """Leaves in the cases handed back to the per-op path: another module's parameter as the
    input, a leaf with a hook, an overridden forward, train-mode batch norm, a 1-D conv-free
    linear, a non-contiguous input, an in-place activation on a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.other = nn.Linear(4, 4)
        self.hooked = nn.ReLU()
        self.hooked.register_forward_hook(lambda m, a, o: o * 2)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU(inplace=True)
        self.gelu = nn.GELU(approximate="tanh")
        self.ln = nn.LayerNorm(4)
        self.register_buffer("buf", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(self.other.weight)         # another module's weight, charged here
        y = self.hooked(y) + self.fc(x.t().contiguous()).t()
        y = self.gelu(self.ln(y.t()))          # a non-contiguous input (y.t()) to LayerNorm
        self.act(self.buf)                     # writes a buffer: the guard copies it first
        z = self.bn(y.reshape(1, 4, 2, 2))
        return z.sum() + self.fc(x[0]).sum()   # a 1-D input: the per-op path


@pytest.mark.parametrize("training", [False, True])
def test_fallbacks_give_the_same_report(training: bool, monkeypatch) -> None:
    torch.manual_seed(0)
    model = _Calls()
    buf = model.buf.clone()
    _same_reports(model, torch.randn(4, 4), monkeypatch, training=training)
    assert torch.equal(model.buf, buf)       # the in-place write on the buffer was put back


def test_the_leaf_path_runs_unobserved_leaves(monkeypatch) -> None:
    # a plain CNN: every leaf but none of the containers is counted from its call (the counter
    # sees no op of them); the report is the per-op one
    seen = []
    real = leaves_mod.LeafCounter.post

    def post(self, module, args, kwargs, output, raised=False):
        seen.append((type(module).__name__, self._suspended is not None))
        return real(self, module, args, kwargs, output, raised)
    monkeypatch.setattr(leaves_mod.LeafCounter, "post", post)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 2)).eval()
    _same_reports(model, torch.randn(1, 3, 8, 8), monkeypatch)
    first = seen[:len(seen) // 2]            # the run with the leaf path on
    assert first == [("Conv2d", True), ("BatchNorm2d", True), ("ReLU", True),
                     ("Flatten", False), ("Linear", True), ("Sequential", False)]


def test_a_leaf_that_raises_puts_the_counter_back(monkeypatch) -> None:
    # the counter is off the dispatch stack while the conv runs; its error is reported as
    # the per-op path reports it, and no mode is left on the stack
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).eval()
    from modelprof import ModelProfError
    messages = []
    for leaves in (True, False):
        with pytest.raises(ModelProfError, match=r"in module '0' \(Conv2d") as err:
            _profile(model, torch.randn(1, 2, 8, 8), leaves, monkeypatch)
        messages.append(str(err.value))
        assert torch._C._len_torch_dispatch_stack() == 0
    assert messages[0] == messages[1]
