"""A failed profile leaves no trace: after any exception (``BaseException`` included), on every
path, no modelprof dispatch mode is left on torch's mode stack (nor torch's in-mode flags set)
and no hook is left on any module or registered globally."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils import _python_dispatch as pd

from modelprof import compare, profile
from modelprof.counting.formulas.registry import REGISTRY

_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks",
)
_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def _trace(model: nn.Module) -> dict:
    """Everything a profile could leave behind, as plain values."""
    return {
        "modes": [type(m).__name__ for m in pd._get_current_dispatch_mode_stack()],
        "in_mode": pd._is_in_torch_dispatch_mode,
        "global_hooks": {n: len(getattr(module_globals, n, {})) for n in _GLOBAL_HOOKS},
        "module_hooks": {
            (name, h): len(getattr(m, h, None) or {})
            for name, m in model.named_modules()
            for h in _MODULE_HOOKS
        },
    }


class Boom(BaseException):
    """Not an Exception: only ``finally`` blocks see it."""


class _Net(nn.Module):
    def __init__(self, fail=None, on_call: int = 1) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.fail, self.on_call, self.calls = fail, on_call, 0

    def forward(self, x):
        self.calls += 1
        y = self.act(self.fc(x))
        if self.fail is not None and self.calls >= self.on_call:
            raise self.fail
        return y


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise Boom("in backward")


class _BackwardFails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return _RaiseInBackward.apply(self.fc(x))


def _boom_loss(out, target=None):
    raise Boom("in the loss")


CASES = {
    "ValueError in the forward": (lambda: _Net(ValueError("bad")), {"timing": False}),
    "KeyboardInterrupt in the forward": (lambda: _Net(KeyboardInterrupt()), {"timing": False}),
    "BaseException in the forward": (lambda: _Net(Boom("x")), {"timing": False}),
    "SystemExit in the forward": (lambda: _Net(SystemExit(3)), {"timing": False}),
    "RecursionError in the forward": (lambda: _Net(RecursionError("deep")), {"timing": False}),
    "fails while timed": (lambda: _Net(Boom("x"), on_call=3), {"budget_s": 0.05}),
    "fails in the per-layer timing": (lambda: _Net(ValueError("x"), on_call=8), {"budget_s": 0.05}),
    "loss raises (backward)": (
        lambda: _Net(),
        {"backward": True, "loss_fn": _boom_loss, "timing": False},
    ),
    "backward raises": (lambda: _BackwardFails(), {"backward": True, "timing": False}),
    "backward raises while timed": (lambda: _BackwardFails(), {"backward": True, "budget_s": 0.05}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_failure_path_leaves_no_mode_and_no_hook(case):
    build, options = CASES[case]
    model = build()
    before = _trace(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BaseException):
            profile(model, (4,), **options)
    assert _trace(model) == before
    torch.randn(3) + 1  # plain eager code runs outside any mode


def test_a_formula_raising_baseexception_leaves_no_trace():
    registry = REGISTRY.copy()

    def boom(args, kwargs, out):
        raise Boom("in a formula")

    registry.add((torch.ops.aten.relu.default,), boom, replace=True)
    model = _Net()
    before = _trace(model)
    with pytest.raises(Boom):
        profile(model, (4,), timing=False, registry=registry)
    assert _trace(model) == before


def test_compare_failure_leaves_no_trace():
    model = _Net(Boom("x"))
    before = _trace(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BaseException):
            compare({"a": model}, (4,), timing=False)
    assert _trace(model) == before


class _Composite(nn.Module):
    """Runs a composite op under inference mode: the counter enters itself again to count its
    decomposition, so an inner exit can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        with torch.inference_mode():
            return F.linear(x.detach(), self.w.detach()).relu()


def test_a_mode_exit_that_fails_before_popping_is_repaired(monkeypatch):
    # A RecursionError inside torch can hit TorchDispatchMode.__exit__ before it pops the mode
    # (what SDPA on a jagged nested tensor did at some stack depths). Fail it at each call in
    # turn: the stack and torch's flags come back every time.
    real = pd.set_is_in_mode_without_ignore_compile_internals
    for fail_at in range(1, 12):
        calls = {"n": 0}

        def flaky(value, fail_at=fail_at, calls=calls):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise RecursionError("maximum recursion depth exceeded (simulated)")
            return real(value)

        monkeypatch.setattr(pd, "set_is_in_mode_without_ignore_compile_internals", flaky)
        model = _Composite()
        before = _trace(model)
        try:
            profile(model, (4,), timing=False)
        except BaseException:  # noqa: BLE001 - any failure will do; the trace is checked
            pass
        monkeypatch.setattr(pd, "set_is_in_mode_without_ignore_compile_internals", real)
        assert _trace(model) == before, fail_at


def _at_depth(k: int, fn):
    return _at_depth(k - 1, fn) if k else fn()


def test_sdpa_on_a_jagged_nested_tensor_leaves_no_trace_at_any_stack_depth():
    class Attention(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q)

    q = torch.nested.nested_tensor(
        [torch.randn(3, 2, 8), torch.randn(5, 2, 8)], layout=torch.jagged
    ).transpose(1, 2)
    model = Attention()
    before = _trace(model)

    def run():
        try:
            profile(model, inputs=q, timing=False)
        except BaseException:  # noqa: BLE001 - counted or refused: either way, no trace
            pass

    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(400)  # keep the RecursionError, if any, cheap
        for k in range(40):
            _at_depth(k, run)
            assert _trace(model) == before, k
    finally:
        sys.setrecursionlimit(limit)


# --- nested (ragged) tensors: counted per component, or refused naming the op ----------------------


class _LinearReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 6)

    def forward(self, x):
        return self.fc(x).relu()


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided], ids=["jagged", "strided"])
def test_nested_linear_is_counted_as_the_sum_over_components(layout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: strided nested tensors are a prototype
        x = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=layout)
    report = profile(_LinearReLU(), inputs=x, timing=False)
    rows = 3 + 5  # the components' rows
    assert report.totals["macs"] == rows * 8 * 6  # 8*8*6 = 384
    # 2 flops per MAC, 1 per bias add and 1 per ReLU output: 768 + 48 + 48 = 864
    assert report.totals["flops"] == 2 * rows * 8 * 6 + rows * 6 + rows * 6
    assert report.totals["params"] == 8 * 6 + 6
    assert not report.unsupported


def test_sdpa_on_a_jagged_nested_tensor_is_counted_per_sequence():
    class Attention(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q)

    heads, dim, lengths = 2, 8, (3, 5)
    q = torch.nested.nested_tensor(
        [torch.randn(n, heads, dim) for n in lengths], layout=torch.jagged
    ).transpose(1, 2)
    report = profile(Attention(), inputs=q, timing=False)
    # per sequence of length n: q k^T and attn v, heads * n * n * dim MACs each
    # 2 * 2 * 8 * (3*3 + 5*5) = 1088
    assert report.totals["macs"] == 2 * heads * dim * sum(n * n for n in lengths)
    assert not report.unsupported


def test_a_formula_that_fails_on_the_components_names_the_op():
    from modelprof.errors import ModelProfError

    registry = REGISTRY.copy()

    def three_d_only(args, kwargs, out):
        assert out.dim() == 3, "expects a batch"
        raise AssertionError("never on a nested tensor")

    registry.add((torch.ops.aten.relu.default,), three_d_only, replace=True)
    x = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)
    with pytest.raises(ModelProfError, match=r"op aten\.relu\.default on a nested tensor"):
        profile(_LinearReLU(), inputs=x, timing=False, registry=registry)
    assert not pd._get_current_dispatch_mode_stack()
