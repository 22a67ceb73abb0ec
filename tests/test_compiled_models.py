"""``torch.compile``'d models: the clean runs (forward and training step) run what the user's
model runs, compiled, and the per-layer passes its eager modules, with a note that says so.

Which code ran is told by a backend that counts the calls of its compiled forward and backward
graphs (``aot_autograd`` with counting compilers): nothing here rests on a duration."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd

from modelprof import compare, profile

pytestmark = pytest.mark.filterwarnings(
    "ignore::modelprof.errors.NoisyMeasurementWarning",
    "ignore::modelprof.errors.TimingDisagreementWarning",
    "ignore::modelprof.errors.FewSamplesWarning",
)

FAST = dict(repeat=3, warmup=1, roofline=False)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles afresh: dynamo's cache would run another test's counting graphs."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def counting_backend() -> tuple[object, collections.Counter]:
    """A torch.compile backend (AOT autograd, graphs run as traced) and the calls of its
    compiled ``forward`` and ``backward`` graphs."""
    calls: collections.Counter = collections.Counter()

    def compiler(kind: str):
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> object:
            def run(*args: object) -> object:
                calls[kind] += 1
                return gm(*args)

            return make_boxed_func(run)

        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward")), calls


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def test_profile_times_a_compiled_models_training_step_compiled() -> None:
    backend, calls = counting_backend()
    model = _mlp()
    r = profile(torch.compile(model, backend=backend), (8,), backward=True, **FAST)
    # the clean steps ran the compiled backward (the eager steps of before ran none of it)
    assert calls["backward"] >= r.training_step.backward_latency.n > 0
    df = r.to_dataframe().set_index("module")
    # the per-layer backward rows are the eager modules', said in a note, not marked rough
    assert df.loc[["0", "1", "2"], "backward_latency_ms"].notna().all()
    notes = " ".join(r.timing_notes)
    assert "per-layer backward times are of the eager model" in notes
    assert r.training_step.agreement.regimes == "torch.compile"


def test_compare_times_a_compiled_models_training_step_compiled() -> None:
    backend, calls = counting_backend()
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = torch.compile(model, backend=backend)
    df = compare(
        {"eager": model, "compiled": compiled}, (8,), backward=True, optimizer="sgd", **FAST
    )
    assert calls["backward"] > 0  # the compiled model's steps ran its compiled backward
    assert (df["step_latency_median_ms"] > 0).all()
    # the steps ran on a copy: the user's parameters are as they were
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())


def test_the_backward_check_names_a_compiled_models_two_regimes() -> None:
    from modelprof.timing.agreement import judge_backward
    from modelprof.timing.measurement import Measurement

    clean, passes = Measurement(np.full(12, 1.0)), Measurement(np.full(12, 1.3))
    # 1.5 us a node over 200 nodes: without regimes the stamps would be blamed
    assert judge_backward(clean, passes, 200).verdict == "stamps"
    a = judge_backward(clean, passes, 200, regimes="torch.compile")
    assert a.verdict == "disagree" and a.between_regimes
    assert (
        "as the clean runs use torch.compile and the per-layer passes do not (they run the "
        "eager model, or an exported program's layers unflattened); quote the clean backward "
        "1.000 ms for the model as it runs, and the per-layer backward rows by their backward "
        "latency share" in a.note()
    )
    assert not judge_backward(clean, passes, 200, True).between_regimes  # one regime: load


# -- module.compile(): the call compiled in place -----------------------------------------------
def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def test_a_model_compiled_in_place_is_profiled_as_a_compiled_one() -> None:
    backend, calls = counting_backend()
    model = _mlp().eval()
    model.compile(backend=backend)
    compiled_call = model._compiled_call_impl
    breaks = _graph_breaks()
    r = profile(model, (8,), **FAST)
    # the per-layer passes ran the eager modules: dynamo traced none of modelprof's hooks
    assert _graph_breaks() == breaks
    notes = " ".join(r.timing_notes)
    assert "per-layer times are of the eager model" in notes and "model.compile()" in notes
    assert r.to_dataframe()["latency_ms"].notna().all()
    assert calls["forward"] >= r.latency.n  # the clean runs ran the compiled graph
    assert model._compiled_call_impl is compiled_call  # and the model is compiled as it was


def test_a_copy_of_a_model_compiled_in_place_runs_compiled() -> None:
    # a float64 copy to time, and a copy to train: copy.deepcopy drops the compiled call
    backend, calls = counting_backend()
    model = _mlp().eval()
    model.compile(backend=backend)
    r = profile(model, (8,), dtype=torch.float64, **FAST)
    assert calls["forward"] >= r.latency.n > 0
    r = profile(model, (8,), backward=True, **FAST)
    assert calls["backward"] >= r.training_step.backward_latency.n > 0
    assert "per-layer backward times are of the eager model" in " ".join(r.timing_notes)


# -- a compiled module inside an eager model ----------------------------------------------------
class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(self.a(x)))


@pytest.mark.parametrize("how", ["torch.compile", "in place"])
def test_a_compiled_child_is_profiled_through_its_eager_modules(how: str, recwarn) -> None:
    backend, calls = counting_backend()
    model = _Outer()
    if how == "in place":
        model.body.compile(backend=backend)
    else:
        model.body = torch.compile(model.body, backend=backend)
    body = model.body
    r = profile(model, (8,), backward=True, **FAST)
    df = r.to_dataframe().set_index("module")
    # the rows are the eager model's, named as its modules are, each one timed and counted
    assert [n for n in df.index if n.startswith("body")] == ["body", "body.0", "body.1", "body.2"]
    assert df.loc[["a", "body.0", "body.1", "body.2", "out"], "latency_ms"].notna().all()
    assert df.loc[["body.0", "body.2"], "backward_latency_ms"].notna().all()
    assert df.loc["body.0", "macs"] == 16 * 16 and df.loc["body", "type"] == "Sequential"
    # the clean runs and steps ran the compiled child, forward and backward
    assert (
        calls["forward"] >= r.latency.n and calls["backward"] >= r.training_step.backward_latency.n
    )
    notes = " ".join(r.timing_notes)
    expected = "'body' (torch.compile)" if how == "torch.compile" else "'body' (body.compile())"
    assert f"per-layer times are of the eager model (its compiled module {expected}" in notes
    assert "per-layer backward times are of the eager model" in notes
    # no torch warning that global hooks fire twice, and the model is as it was
    assert not [w for w in recwarn if "global hooks" in str(w.message)]
    assert model.body is body
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_model_compiled_with_disable_runs_and_copies_as_the_eager_one() -> None:
    # compile(disable=True) leaves the module's own bound _call_impl as its compiled call: it
    # runs eager, so the training step's copy needs no compiling (it refused, "cannot compile
    # a copy"), and no note calls it compiled
    model = _mlp()
    model.compile(disable=True)
    r = profile(model, (8,), backward=True, **FAST)  # the timed steps run on a copy
    assert r.totals["macs"] == profile(_mlp(), (8,), timing=False).totals["macs"]
    assert not any("compiled" in note for note in r.timing_notes)
