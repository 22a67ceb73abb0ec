"""``profile(..., backward=True)`` as a user meets it: nothing of theirs changed, errors that name
the bad value, the table's views and exports, ``compare`` and the command line."""

from __future__ import annotations

import json
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import state_snapshot
from torch import nn

from modelprof import compare, profile
from modelprof.cli import main
from modelprof.errors import ModelProfError

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")

FAST = dict(repeat=3, warmup=1, roofline=False)
COUNT = dict(timing=False, roofline=False)


class Net(nn.Module):
    """Conv, batch norm (running statistics), dropout (the RNG) and a frozen head bias."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4 * 6 * 6, 5)
        self.head.bias.requires_grad_(False)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _global_hooks() -> int:
    from torch.nn.modules import module as m

    return len(m._global_forward_hooks) + len(m._global_forward_pre_hooks)


@pytest.mark.parametrize("timing", [False, True])
def test_model_inputs_and_optimizer_come_back_untouched(timing):
    torch.manual_seed(0)
    model = Net()
    model.eval()
    model.bn.train()  # mixed flags, restored module by module
    before = state_snapshot(model)
    objects = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    grad = torch.full_like(model.conv.weight, 0.25)
    model.conv.weight.grad = grad  # a .grad the user had: kept, same object, same values
    user_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in user_opt.param_groups]
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    rng = torch.get_rng_state()
    hooks = _global_hooks()
    flags = [m.training for m in model.modules()]

    report = profile(
        model,
        inputs=x,
        backward=True,
        optimizer=user_opt,
        timing=timing,
        **({"repeat": 3, "warmup": 1} if timing else {}),
        roofline=False,
    )

    assert report.totals["backward_macs"] > 0
    after = model.state_dict(keep_vars=True)
    for k, v in before.items():
        assert after[k] is objects[k], k  # the same tensors ...
        assert torch.equal(after[k], v), k  # ... with the same values (BN stats too)
    assert model.conv.weight.grad is grad and torch.equal(grad, torch.full_like(grad, 0.25))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "conv.weight")
    assert x.grad is None
    assert [m.training for m in model.modules()] == flags
    assert user_opt.state == {} or all(not s for s in user_opt.state.values())
    assert [{k: v for k, v in g.items() if k != "params"} for g in user_opt.param_groups] == groups
    assert torch.equal(torch.get_rng_state(), rng)  # dropout ran on a forked generator
    assert _global_hooks() == hooks
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert model.head.bias.requires_grad is False


def test_inside_no_grad_the_step_still_runs_and_grad_mode_comes_back():
    torch.manual_seed(0)
    with torch.no_grad():
        r = profile(nn.Linear(4, 3), (4,), backward=True, **COUNT)
        assert not torch.is_grad_enabled()
    # weight grad [3, 1] @ [1, 4] = 12 MACs; bias grad 3 flops
    assert (r.totals["backward_macs"], r.totals["backward_flops"]) == (12, 27)


# -- bad input ----------------------------------------------------------------------------------
class Ints(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).argmax(dim=1)


@pytest.mark.parametrize(
    "kwargs, model, match",
    [
        ({}, lambda: nn.Linear(4, 3).requires_grad_(False), "no parameter that requires grad"),
        ({}, lambda: nn.ReLU(), "ReLU has no parameter that requires grad"),
        ({}, Ints, r"output of Ints is a Tensor\[2, int64\] \(no grad\)"),
        (
            {"loss_fn": lambda out: out * 2},
            lambda: nn.Linear(4, 3),
            r"loss_fn=<lambda> returned a tensor of shape \(2, 3\), not a scalar",
        ),
        ({"loss_fn": "mse"}, lambda: nn.Linear(4, 3), "loss_fn='mse' is not callable"),
        (
            {"loss_fn": lambda out: out.detach().sum()},
            lambda: nn.Linear(4, 3),
            "does not depend on any parameter",
        ),
        (
            {"loss_fn": lambda out, t: F.cross_entropy(out, t), "target": torch.tensor([1, 7])},
            lambda: nn.Linear(4, 3),
            "loss_fn=<lambda> raised",
        ),
        ({"target": torch.tensor([1, 2])}, lambda: nn.Linear(4, 3), "target= needs loss_fn="),
        ({"optimizer": "adamx"}, lambda: nn.Linear(4, 3), "optimizer='adamx' is not a torch.optim"),
        ({"optimizer": torch.optim.LBFGS}, lambda: nn.Linear(4, 3), "LBFGS needs a closure"),
        # "returned a int" before: the article follows the type's first sound
        ({"optimizer": lambda p: 3}, lambda: nn.Linear(4, 3), "returned an int, not a"),
        (
            {"loss_fn": lambda out: object()},
            lambda: nn.Linear(4, 3),
            r"loss_fn=<lambda> returned an object, not a tensor",
        ),
        (
            {"loss_fn": lambda out: [out.sum()]},
            lambda: nn.Linear(4, 3),
            r"loss_fn=<lambda> returned a list, not a tensor",
        ),
        ({"optimizer": 3}, lambda: nn.Linear(4, 3), "optimizer=3 must be"),
        ({"no_grad": True}, lambda: nn.Linear(4, 3), "no_grad=True contradicts backward=True"),
        (
            {"cuda_graph": True},
            lambda: nn.Linear(4, 3),
            "cuda_graph is not supported with backward=True",
        ),
    ],
)
def test_bad_step_options_name_the_value(kwargs, model, match):
    with pytest.raises(ModelProfError, match=match):
        profile(model(), (4,), batch_size=2, backward=True, **COUNT, **kwargs)


def test_an_error_names_a_type_with_its_article():
    from collections import OrderedDict

    from modelprof.errors import a_type, with_article

    # by the first letter: a, e, i, o take "an"; a "u" reads "you" (a uint8), consonants "a"
    got = [a_type(v) for v in (3, object(), OrderedDict(), [], 2.0, None)]
    assert got == ["an int", "an object", "an OrderedDict", "a list", "a float", "a NoneType"]
    assert [with_article(n) for n in ("ExportedProgram", "uint8", "dict")] == [
        "an ExportedProgram",
        "a uint8",
        "a dict",
    ]


def test_step_options_without_backward_are_refused():
    with pytest.raises(ModelProfError, match="optimizer given with backward=False"):
        profile(nn.Linear(4, 3), (4,), optimizer=torch.optim.SGD, **COUNT)
    with pytest.raises(ModelProfError, match="backward='yes' must be True or False"):
        profile(nn.Linear(4, 3), (4,), backward="yes", **COUNT)


def test_optimizer_template_with_a_foreign_parameter():
    stray = nn.Parameter(torch.zeros(2))
    with pytest.raises(ModelProfError, match=r"parameter of shape \(2,\) that is not one of"):
        profile(nn.Linear(4, 3), (4,), backward=True, optimizer=torch.optim.SGD([stray]), **COUNT)


def test_optimizer_over_frozen_parameters_is_refused():
    """Every parameter frozen, the input requiring grad: a backward exists, but an optimizer
    would step nothing (torch refuses an empty parameter list); without one the step runs."""
    frozen = nn.Linear(4, 3).requires_grad_(False)
    x = torch.randn(2, 4, requires_grad=True)
    match = r"optimizer=AdamW: no parameter of Linear requires grad \(2 parameter tensor"
    with pytest.raises(ModelProfError, match=match):
        profile(frozen, x, backward=True, optimizer="adamw", **COUNT)
    report = profile(frozen, x, backward=True, **COUNT)
    # the input gradient only: grad_out [2, 3] @ weight [3, 4] = 24 MACs
    assert report.totals["backward_macs"] == 24


def test_backward_failure_names_the_model():
    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("boom")

    class M(nn.Linear):
        def forward(self, x):
            return Bad.apply(super().forward(x))

    with pytest.raises(ModelProfError, match="the backward pass of M \\(loss sum\\) failed.*boom"):
        profile(M(4, 3), (4,), backward=True, **COUNT)


@pytest.mark.parametrize("phase", ["loss", "optimizer"])
def test_a_loss_or_optimizer_that_fails_only_once_timed_is_named(phase):
    # the first calls (checked, counted) pass: only the timed steps meet the failure, whose
    # error named no phase ("a training step of Linear failed while timing it")
    calls = [0]

    def flaky(here: str) -> None:
        calls[0] += here == phase
        if calls[0] > 3:
            raise RuntimeError("boom")

    def loss_fn(out):
        flaky("loss")
        return out.sum()

    class Opt(torch.optim.SGD):
        def step(self, closure=None):
            flaky("optimizer")
            return super().step(closure)

    named = {"loss": "loss_fn=loss_fn", "optimizer": r"optimizer.step\(\) \(optimizer=<lambda>\)"}
    with pytest.raises(ModelProfError, match=f"Linear failed in {named[phase]} while timing it"):
        profile(
            nn.Linear(4, 3),
            (4,),
            backward=True,
            loss_fn=loss_fn,
            optimizer=lambda ps: Opt(ps, lr=0.1),
            warn=False,
            **FAST,
        )
    assert calls[0] == 4  # it did fail in the timed steps


class _LateBackward(torch.autograd.Function):
    """Identity; its backward raises from its fourth call on (the checked and counted steps'
    pass: only the timed ones meet it)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _LateBackward.calls += 1
        if _LateBackward.calls > 3:
            raise RuntimeError(f"backward broke at call {_LateBackward.calls}")
        return grad


class _Late(nn.Module):
    def forward(self, x):
        return _LateBackward.apply(x)


def test_a_backward_that_fails_only_once_timed_names_its_module():
    # the timed steps' failure said only "failed in the backward", where the counted one names
    # the module; nested (inner.1) so that neither the root nor its parent will do
    _LateBackward.calls = 0
    model = nn.Sequential(
        OrderedDict(a=nn.Linear(4, 4), inner=nn.Sequential(nn.ReLU(), _Late(), nn.Linear(4, 2)))
    )
    with pytest.raises(ModelProfError) as info:
        profile(model, (4,), backward=True, warn=False, **FAST)
    assert _LateBackward.calls == 4  # it did fail in the timed steps
    assert (
        "a training step of Sequential failed in the backward of module 'inner.1' (_Late) "
        "while timing it: RuntimeError: backward broke at call 4" in str(info.value)
    )


# -- views and exports --------------------------------------------------------------------------
def test_views_and_exports_carry_the_step(tmp_path: Path):
    torch.manual_seed(0)
    r = profile(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
        (4,),
        backward=True,
        optimizer="sgd",
        **FAST,
    )
    df = r.to_dataframe()
    for col in (
        "backward_macs",
        "backward_flops",
        "saved_bytes",
        "backward_latency_ms",
        "backward_latency_std_ms",
        "backward_latency_pct",
    ):
        assert col in df.columns
    assert list(df["module"][-2:]) == ["(loss)", "(optimizer)"]
    leaves = df[df["leaf"]]
    for col in ("macs", "flops", "backward_macs", "backward_flops", "saved_bytes"):
        assert leaves[col].sum() == r.totals[col], col  # leaves add up to the totals
    # the torchstat view stays the model's forward: no step rows
    ts = r.to_dataframe(style="torchstat")
    assert "(loss)" not in set(ts["module name"]) and "(optimizer)" not in set(ts["module name"])
    md = r.to_markdown()
    assert "backward FLOPs" in md and "(optimizer)" in md
    data = json.loads(Path(r.to_json(tmp_path / "r.json")).read_text())
    assert data["env"]["training_step"]["backward"]["n"] == 3
    assert "training step (loss sum, optimizer SGD)" in r.summary()
    assert r.by_operator("backward")["macs"].sum() == r.totals["backward_macs"]
    with pytest.raises(ModelProfError, match="direction='sideways'"):
        r.by_operator("sideways")


def test_compare_with_backward():
    torch.manual_seed(0)
    df = compare(
        {
            "narrow": nn.Sequential(nn.Linear(10, 20), nn.ReLU()),
            "wide": nn.Sequential(nn.Linear(10, 40), nn.ReLU()),
        },
        (10,),
        backward=True,
        **FAST,
    )
    # first layer, input without grad: weight grad 10*20 = 200 MACs / 10*40 = 400
    assert list(df["backward_macs"]) == [200, 400]
    assert df.loc["wide", "backward_flops_x"] == pytest.approx(
        df.loc["wide", "backward_flops"] / df.loc["narrow", "backward_flops"]
    )
    assert (df["backward_latency_median_ms"] > 0).all()


def test_cli_backward(tmp_path: Path, capsys: pytest.CaptureFixture):
    f = tmp_path / "nets.py"
    f.write_text(
        textwrap.dedent("""
        from torch import nn
        INPUT_SIZE = (10,)
        def narrow():
            return nn.Sequential(nn.Linear(10, 20), nn.ReLU())
    """)
    )
    assert (
        main(["profile", f"{f}:narrow", "--no-timing", "--backward", "--optimizer", "adamw"]) == 0
    )
    out = capsys.readouterr().out
    # weight grad 10*20 = 200 MACs (input without grad); AdamW 14 flops x 220 parameters
    assert "backward MACs 200" in out
    assert "optimizer FLOPs 3,080" in out
    assert main(["profile", f"{f}:narrow", "--no-timing", "--optimizer", "adamw"]) == 2
    assert "--optimizer needs --backward" in capsys.readouterr().err


def test_step_in_another_dtype_counts_the_same_and_saves_twice_the_bytes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    before = state_snapshot(model)
    r32 = profile(model, (8,), batch_size=2, backward=True, **COUNT)
    r64 = profile(model, (8,), batch_size=2, backward=True, dtype=torch.float64, **FAST)
    # backward MACs (batch 2): the first Linear's input needs no grad, so only its weight
    # gradient, 2 x 8 x 16 = 256; the second Linear's input and weight gradients, 2 x (2 x 16 x 4)
    # = 256 -> 512 whatever the dtype
    assert r32.totals["backward_macs"] == r64.totals["backward_macs"] == 512
    assert r64.dtype == "float64" and r64.backward_latency is not None
    saved32 = r32.to_dataframe().set_index("module")["saved_bytes"]
    saved64 = r64.to_dataframe().set_index("module")["saved_bytes"]
    # the first Linear keeps its input (2 x 8 values), ReLU its output (2 x 16), which the second
    # Linear shares: 64 and 128 bytes in float32, twice that in float64
    assert (saved32["0"], saved32["1"], saved32["2"]) == (64, 128, 0)
    assert (saved64["0"], saved64["1"], saved64["2"]) == (128, 256, 0)
    # the user's model: still float32, the same values, no grads
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict(keep_vars=True).items())
    assert all(p.grad is None for p in model.parameters())


# -- TorchScript: the forward as one row; the training step refused before it runs -------------
class _CountsCalls(nn.Module):
    """An eager model around a scripted Linear, counting its own forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.jit.script(nn.Linear(6, 4))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x)


def test_a_torchscript_training_step_is_refused_before_anything_runs():
    scripted = torch.jit.script(nn.Sequential(nn.Linear(6, 4), nn.ReLU()))
    with pytest.raises(
        ModelProfError,
        match=r"the model is TorchScript \(RecursiveScriptModule\)"
        r".*functional_call.*Profile the eager module",
    ):
        profile(scripted, (6,), backward=True, timing=False)
    model = _CountsCalls()
    with pytest.raises(ModelProfError, match=r"module 'inner' of the model is TorchScript"):
        profile(model, (6,), backward=True, timing=False)
    assert model.calls == 0  # refused before any forward
    # the forward alone: one opaque row, counted in full: 6*4 = 24 MACs, 6*4 + 4 = 28 params
    report = profile(scripted, (6,), timing=False)
    assert (report.totals["macs"], report.totals["params"]) == (24, 28)


def test_submodules_held_in_eval_mode_are_named_when_a_step_sets_train_mode():
    model = nn.Sequential(
        nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Sequential(nn.Dropout(0.5), nn.Linear(8, 2))
    )
    model[1].eval()  # a frozen batch norm
    model[2].eval()  # a head whose dropout the user switched off
    report = profile(model, (8,), batch_size=4, backward=True, timing=False)
    # the top-most modules held in eval under a parent in train mode: "1" and "2", not 2.0
    (note,) = [n for n in report.timing_notes if "held in eval mode" in n]
    assert "held in eval mode: 1, 2, so their batch norms used batch statistics" in note
    assert not model[1].training and not model[2][0].training  # given back as they were
    # the whole model in eval mode: train mode is the documented default, nothing to say
    model.eval()
    quiet = profile(model, (8,), batch_size=4, backward=True, timing=False)
    assert not any("held in eval mode" in n for n in quiet.timing_notes)

    class KeepsNormFrozen(nn.Sequential):
        def train(self, mode=True):  # the detection backbones' override: the model decides
            super().train(mode)
            self[1].eval()
            return self

    kept = KeepsNormFrozen(nn.Linear(8, 8), nn.BatchNorm1d(8).eval(), nn.Linear(8, 2))
    said = profile(kept, (8,), batch_size=4, backward=True, timing=False).timing_notes
    assert not any("held in eval mode" in n for n in said)


def test_trainable_parameters_the_backward_does_not_reach_are_named():
    from torch.utils.checkpoint import checkpoint

    class Reentrant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.unused = nn.Linear(8, 8), nn.Linear(8, 2), nn.Linear(8, 8)

        def forward(self, x):
            # a reentrant checkpoint whose input needs no grad: a's parameters get none
            return self.b(checkpoint(self.a, x, use_reentrant=True))

    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        report = profile(Reentrant(), (8,), batch_size=4, backward=True, timing=False)
    (note,) = [n for n in report.timing_notes if "got no gradient" in n]
    # a.weight, a.bias (the checkpoint) and unused.weight, unused.bias (never called): 4
    assert note.startswith(
        "4 trainable parameter(s) got no gradient in the step (a.weight, a.bias, unused.weight "
        "and 1 more): the loss does not reach them"
    )
    # every trainable parameter reached: nothing said
    plain = profile(nn.Linear(8, 2), (8,), batch_size=4, backward=True, timing=False)
    assert not any("got no gradient" in n for n in plain.timing_notes)


def test_memory_estimate_counts_gradients_the_step_gave():
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.spare = nn.Linear(8, 4), nn.Linear(100, 100)
            self.extra = nn.Parameter(torch.randn(7))

        def forward(self, x):
            return self.a(x)

    model = Unused()
    est = profile(
        model, (8,), batch_size=2, backward=True, optimizer="adamw", **COUNT
    ).memory_estimate()
    # a only: (8 x 4 + 4) x 4 B = 144 B of gradients; AdamW's exp_avg and exp_avg_sq of them
    # (2 x 144) and a 4-byte step per tensor (2 x 4): 296 B; spare (10,100) and extra (7) none
    assert est.loc["gradients", "training_step"] == 144
    assert est.loc["optimizer state", "training_step"] == 296
    assert "the profiled step gave one" in est.loc["gradients", "how"]
    # no step profiled: every trainable parameter is assumed to get one, (36 + 10,100 + 7) x 4
    plain = profile(model, (8,), batch_size=2, **COUNT).memory_estimate()
    assert plain.loc["gradients", "training_step"] == 10_143 * 4
    assert "no step profiled" in plain.loc["gradients", "how"]


class _MatricesOnly(torch.optim.SGD):
    """An optimizer that, as torch's Muon, refuses a parameter that is not 2-D when built."""

    def __init__(self, params, lr=0.1):
        params = list(params)
        if any(p.dim() != 2 for p in params):
            raise ValueError("only 2-D parameters")
        super().__init__(params, lr=lr)


def test_an_optimizer_that_refuses_the_parameters_shapes_is_refused_before_the_model_runs():
    ran = []

    class Net(nn.Sequential):
        def forward(self, x):
            ran.append(x.shape)
            return super().forward(x)

    # Linear(4, 3)'s (3,) bias: refused before the counted forward, as a refusal (no raised
    # cause) the command line exits 2 on; it ran the forward and backward first before
    with pytest.raises(
        ModelProfError,
        match=r"optimizer=_MatricesOnly refuses the parameters "
        r"of Net \(their shapes, before anything ran\): ValueError: only 2-D",
    ) as refused:
        profile(Net(nn.Linear(4, 3)), (4,), backward=True, optimizer=_MatricesOnly, **COUNT)
    assert ran == [] and refused.value.__cause__ is None
    # bias-free, every parameter 2-D: it runs, SGD's 2 FLOPs per element of the 4 x 3 weight
    report = profile(
        Net(nn.Linear(4, 3, bias=False)), (4,), backward=True, optimizer=_MatricesOnly, **COUNT
    )
    assert ran and report.to_dataframe().set_index("module").loc["(optimizer)", "flops"] == 24


class _ReadsValues(torch.optim.SGD):
    """An optimizer whose constructor reads its parameters' values (a norm as a number)."""

    def __init__(self, params, lr=0.1):
        params = list(params)
        self.start_norm = sum(float(p.detach().norm()) for p in params)
        super().__init__(params, lr=lr)


def test_an_optimizer_that_reads_values_when_built_is_not_refused_by_the_shape_check():
    # the shape check builds the class on meta stand-ins, which hold no values: float() of a
    # meta tensor raises (not a refusal of the shapes), and the step runs it on the real ones.
    # Linear(4, 3): SGD's 2 FLOPs per element of its 12 + 3 parameters = 30
    report = profile(nn.Linear(4, 3), (4,), backward=True, optimizer=_ReadsValues, **COUNT)
    assert report.to_dataframe().set_index("module").loc["(optimizer)", "flops"] == 30
