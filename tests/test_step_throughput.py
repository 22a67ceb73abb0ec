"""Throughput of whole training steps (compare(backward=True, throughput=True),
measure_throughput(measure=step_measure(...))): each point times forward, loss, backward and
the optimizer's step, never the forward alone. The lower bounds below come from spins in the
backward and the optimizer step (no tensor op: a loaded machine only lengthens them)."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from modelprof import ModelProfError, compare
from modelprof.runtime.execution import RunMode
from modelprof.step.spec import StepSpec
from modelprof.step.throughput import batch_rows, step_measure
from modelprof.timing import measure_throughput

BACKWARD_MS = 2.0  # each backward spins this long
OPTIMIZER_MS = 3.0  # each optimizer step too
POINTS = {"max_batch": 2, "budget_s": 0.2, "precision": 0.5}


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _spin(BACKWARD_MS)
        return grad


class _Model(nn.Module):
    """A Linear, then ``through`` (an autograd Function: by default a backward that spins)."""

    def __init__(self, through: type = _SlowBackward) -> None:
        super().__init__()
        self.fc, self.through = nn.Linear(4, 3), through

    def forward(self, x):
        return self.through.apply(self.fc(x))


class _SlowSGD(torch.optim.SGD):
    def step(self, closure=None):
        _spin(OPTIMIZER_MS)
        return super().step(closure)


def _slow_sgd(params):
    return _SlowSGD(params, lr=0.1)


def test_each_point_times_whole_steps_backward_and_optimizer_included():
    spec = StepSpec.parse(optimizer=_slow_sgd)
    measure = step_measure((4,), spec, RunMode(training=True, no_grad=False))
    curve = measure_throughput(_Model(), (4,), measure=measure, **POINTS)
    assert [p.batch_size for p in curve.points] == [1, 2]
    for p in curve.points:
        # a step spins 2 ms in its backward and 3 ms in its optimizer step: every sample is
        # at least 5 ms, so at most batch / 5 ms = 200 * batch samples/s (the forward alone
        # spins nothing and would read far above)
        assert p.latency_ms >= BACKWARD_MS + OPTIMIZER_MS
        assert p.samples_per_s <= p.batch_size * 1e3 / (BACKWARD_MS + OPTIMIZER_MS)
        assert p.measurement.label.endswith("step")
    # the curve's environment says what ran: a training step, not the forward in eval mode
    mode = curve.env["mode"]
    assert (mode["backward"], mode["eval_mode"], mode["no_grad"]) == (True, False, False)


def test_compare_backward_throughput_is_the_steps_and_leaves_the_model_as_it_was():
    model = _Model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # cross_entropy on 3 classes, its target given for batch 1: repeated to each batch size
    df = compare(
        {"m": model},
        (4,),
        backward=True,
        loss_fn=F.cross_entropy,
        target=torch.tensor([2]),
        optimizer=_slow_sgd,
        throughput=True,
        throughput_options=POINTS,
        timing=False,
        roofline=False,
    )
    row = df.loc["m"]
    assert row["throughput_batch_size"] in (1, 2)
    # as above: at least 5 ms a step, so at most 200 samples/s per sample in the batch
    limit = row["throughput_batch_size"] * 1e3 / (BACKWARD_MS + OPTIMIZER_MS)
    assert row["throughput_samples_per_s"] <= limit
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the steps ran on a copy
    assert df.attrs["notes"][0].startswith("throughput_samples_per_s: whole training steps")
    # the search went to its cap (max_batch=2) and the best was there: said, for it may lie past
    if row["throughput_batch_size"] == 2:
        assert any("m throughput: stopped at max_batch=2" in n for n in df.attrs["notes"])
    assert all(p.grad is None for p in model.parameters())


def test_a_target_is_repeated_row_by_row_to_each_batch_size():
    # three rows to five: rows 0, 1, 2, 0, 1
    assert batch_rows(torch.tensor([7, 8, 9]), 5).tolist() == [7, 8, 9, 7, 8]
    two_d = torch.arange(6).reshape(3, 2)
    assert batch_rows(two_d, 2).tolist() == [[0, 1], [2, 3]]
    assert batch_rows(None, 4) is None


@pytest.mark.parametrize(
    "target, named", [(torch.tensor(3), "a 0-d tensor"), ((torch.zeros(1),), "tuple")]
)
def test_a_target_without_rows_is_refused_by_name(target, named):
    with pytest.raises(ModelProfError, match=f"target={named}: a throughput search repeats"):
        batch_rows(target, 2)


class _Oom(torch.autograd.Function):
    """A backward that runs out of memory from batch 3 on (MemoryError: what the search reads
    as a batch that does not fit, on any device)."""

    @staticmethod
    def forward(ctx, x):
        ctx.rows = x.shape[0]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.rows >= 3:
            raise MemoryError("out of memory in the backward")
        return grad


def test_a_step_out_of_memory_ends_the_search_as_a_forward_would():
    measure = step_measure((4,), StepSpec.parse(), RunMode(training=True, no_grad=False))
    options = {**POINTS, "max_batch": 8}
    curve = measure_throughput(_Model(_Oom), (4,), measure=measure, **options)
    # doubling: 1, 2 fit, 4 fails; then the search between 2 and 4 tries 3, which fails too
    assert [p.batch_size for p in curve.points] == [1, 2]
    assert (curve.max_fit_batch, curve.oom_batch) == (2, 3)


_SPIN_FILE = """
import time
import torch
from torch import nn


class _Spin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        end = time.perf_counter() + {ms} / 1e3
        while time.perf_counter() < end:
            pass
        return grad


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return _Spin.apply(self.fc(x))
"""


def test_the_cli_searches_training_steps_with_backward(tmp_path, capsys):
    from modelprof.cli import main

    f = tmp_path / "spin.py"
    f.write_text(_SPIN_FILE.format(ms=BACKWARD_MS))
    argv = ["throughput", f"{f}:Net", "--input-size", "4", "--max-batch", "2", "--budget", "0.2"]
    assert main([*argv, "--backward", "--optimizer", "sgd", "--out", str(tmp_path)]) == 0
    curve = pd.read_csv(tmp_path / "spin_Net_throughput.csv")  # (file_factory: spin_Net)
    # a step spins 2 ms in its backward: each point's median is at least that, its samples/s
    # at most batch / 2 ms (the forward alone spins nothing)
    assert list(curve["batch_size"]) == [1, 2]
    assert (curve["latency_ms"] >= BACKWARD_MS).all()
    assert (curve["samples_per_s"] <= curve["batch_size"] * 1e3 / BACKWARD_MS).all()
    assert "(whole training steps)" in capsys.readouterr().out.split("best:")[1].split("\n")[0]
    capsys.readouterr()
    assert main([*argv, "--optimizer", "sgd"]) == 2
    assert "--optimizer needs --backward" in capsys.readouterr().err


def _step_curve(model, **options):
    measure = step_measure((4,), StepSpec.parse(), RunMode(training=True, no_grad=False))
    return measure_throughput(model, (4,), measure=measure, **{**POINTS, **options})


@pytest.mark.parametrize(
    "options, said",
    [({"compile": "default"}, "compile='default'"), ({"transfer": True}, "transfer")],
)
def test_modes_a_training_step_does_not_run_in_are_refused(options, said):
    # the steps run eagerly, inputs already on the device: timed under these modes' names
    # they would be mislabelled
    with pytest.raises(ModelProfError, match=f"^{said} is not supported with backward=True"):
        _step_curve(nn.Linear(4, 3), **options)


class _Argmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).argmax(dim=-1)


def test_a_step_with_nothing_to_differentiate_is_said_before_any_is_timed():
    frozen = nn.Linear(4, 3).requires_grad_(False)
    with pytest.raises(ModelProfError, match="has no parameter that requires grad"):
        _step_curve(frozen)
    # an output of integers: no floating tensor for the default loss (it said
    # "AttributeError: 'NoneType' object has no attribute 'backward'")
    with pytest.raises(ModelProfError, match="no floating tensor that requires grad"):
        _step_curve(_Argmax())


def test_what_only_modelprof_holds_is_counted_for_the_peak():
    from modelprof.runtime.inputs import make_inputs
    from modelprof.step.timing import StepTimer
    from modelprof.timing.options import TimingOptions

    model = nn.Linear(4, 3)
    mi = make_inputs(model, (4,), batch_size=2)
    spec = StepSpec.parse(optimizer=_slow_sgd)
    options = TimingOptions.parse(repeat=1, warmup=0)
    with StepTimer(model, mi, spec, options=options) as timer:
        # Linear(4, 3): 12 + 3 = 15 float32 parameters, 60 bytes; the user's model left on
        # the device beside the step's copy (60) and the snapshot each block starts from (60)
        assert timer.held_bytes() == 60 + 60


def test_a_point_peak_leaves_out_what_the_measure_held(monkeypatch):
    from modelprof.timing import throughput as tp
    from modelprof.timing.measurement import Measurement

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda dev: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev: 1_000)

    def held_300(model, batch_size, device, opts):
        m = Measurement([1.0, 1.0, 1.0])
        m.env[tp.HELD_BYTES] = 300
        return m

    opts = tp.TimingOptions.parse()
    point = tp._Point(None, (4,), torch.device("cuda"), None, opts, {}, held_300)
    # the allocator's peak, 1,000 bytes, less the 300 the measure's runs held beside
    assert point.measure(2).peak_memory_bytes == 700


def test_the_cli_refuses_optimizer_without_backward_before_building_a_model(tmp_path, capsys):
    from modelprof.cli import main

    missing = tmp_path / "nowhere.py"
    assert main(["throughput", f"{missing}:Net", "--optimizer", "sgd"]) == 2
    assert "--optimizer needs --backward" in capsys.readouterr().err


def test_a_spec_built_directly_keeps_its_target_and_the_default_mode_trains():
    seen = []

    def loss(out, target):
        seen.append((out.shape[0], target.shape[0]))
        return F.cross_entropy(out, target)

    # StepSpec(loss_fn, target) without has_target=True dropped the target in silence
    spec = StepSpec(loss, torch.tensor([1]))
    assert spec.has_target
    curve = measure_throughput(_Model(), (4,), measure=step_measure((4,), spec), **POINTS)
    # the target's one row repeated to each batch, in train mode with grad by default
    assert {(1, 1), (2, 2)} <= set(seen)
    assert (curve.env["mode"]["training"], curve.env["mode"]["no_grad"]) == (True, False)


def test_a_search_bound_given_to_compare_itself_is_sent_where_it_goes():
    # a newcomer's compare(..., throughput=True, max_batch=64) was told only the timing options
    with pytest.raises(
        ModelProfError,
        match=r"^max_batch= bounds the throughput search: pass throughput_options="
        r"\{'max_batch': 64\} with throughput=True",
    ):
        compare({"m": _Model()}, (4,), throughput=True, max_batch=64)


def test_the_search_and_its_step_measure_run_one_size_the_one_the_curve_names():
    # measure_throughput((3, 64, 64), measure=step_measure((3, 32, 32))) timed 3x32x32 steps
    # and captioned them "input 3x64x64"; two sizes are refused before the model runs
    seen = []

    class Seen(_Model):
        def forward(self, x):
            seen.append(tuple(x.shape))
            return super().forward(x)

    refused = [
        (
            (5,),
            step_measure((4,)),
            r"input_size=\(5,\)\) with a measure= that runs input_size="
            r"\(4,\): the curve's env\['input'\] and caption would name 5, a size that never ran",
        ),
        (None, step_measure((4,)), r"tokens=8\) with a measure= that runs input_size=\(4,\)"),
        ((4,), step_measure(None, tokens=8), r"input_size=\(4,\)\) with a measure= that runs tok"),
    ]
    for size, measure, words in refused:
        given = {"input_size": size} if size is not None else {"tokens": 8}
        with pytest.raises(ModelProfError, match=words):
            measure_throughput(Seen(), **given, measure=measure, **POINTS)
    assert seen == []
    # one size, spelt two ways, runs and is the one named: batch 1 and 2 of 4 features
    curve = measure_throughput(Seen(), [4], measure=step_measure((4,)), **POINTS)
    assert set(seen) == {(1, 4), (2, 4)} and curve.env["input"] == "4"
