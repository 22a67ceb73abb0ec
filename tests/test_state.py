"""The user's model comes back as it went in: buffers, parameters, slots and attributes a pass
changed are restored (also on errors and interrupts), lazy modules are refused untouched, models
that cannot be deep-copied still profile, deep nesting works, and errors in the end-to-end timing
name the module."""

from __future__ import annotations

import random
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from modelprof import ModelProfError, ModelProfWarning, compare, profile
from modelprof.runtime import placement as placement_mod
from modelprof.runtime.guard import StateGuard, preserved_state

# a few samples are enough: these tests check state, not timing
FAST = dict(repeat=5, warmup=1, roofline=False)
pytestmark = pytest.mark.filterwarnings("ignore:noisy timing")


class CallCount:
    """Counts forwards outside the model, so that restoring the model cannot reset it."""

    def __init__(self) -> None:
        self.n = 0


class Counting(nn.Module):
    """An eval forward that keeps a step count in a buffer."""

    def __init__(self, calls: CallCount) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.calls = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.n += 1
        self.n += 1
        return self.fc(x)


def test_buffer_changed_by_the_eval_forward_reads_the_same_after_a_timed_profile() -> None:
    calls = CallCount()
    model = Counting(calls)
    buffer = model.n
    profile(model, (4,), **FAST)
    # static pass + discovery + warm-up + 5 samples (end to end and per layer): many forwards
    assert calls.n > 10
    assert model.n is buffer and model.n.item() == 0  # 0 before, 0 after


class Rebinding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n = self.n + 1  # a new tensor registered in the buffer slot
        self.fc = nn.Linear(3, 3)  # a submodule replaced
        self.note = "ran"  # an attribute added
        return x * self.n


def test_rebound_slots_and_added_attributes_are_put_back() -> None:
    model = Rebinding()
    n, fc = model.n, model.fc
    profile(model, (3,), **FAST)
    assert model.n is n and n.item() == 0
    assert model.fc is fc
    assert not hasattr(model, "note")
    assert sorted(dict(model.named_buffers())) == ["n"]


class EMA(nn.Module):
    """Parameters written in place by the forward: through ``.data`` (no version bump) and
    under no_grad (a version bump)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.v = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.w.data.mul_(0.5)
        with torch.no_grad():
            self.v.add_(1.0)
        return x * self.w + self.v


def test_parameters_written_in_place_are_restored() -> None:
    model = EMA()
    profile(model, (4,), **FAST)
    assert model.w.tolist() == [1.0] * 4
    assert model.v.tolist() == [1.0] * 4
    assert model.w.requires_grad and model.v.requires_grad


class SwapData(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.w.data = torch.full((2,), 7.0)  # a new storage, no version bump
        return x * self.w


def test_a_parameter_pointed_at_new_data_gets_its_storage_back() -> None:
    model = SwapData()
    ptr = model.w.data_ptr()
    profile(model, (2,), timing=False)
    assert model.w.data_ptr() == ptr and model.w.tolist() == [1.0, 1.0]


class HiddenBatchNorm(nn.Module):
    """Updates running statistics from an eval forward, through ``native_batch_norm``, whose
    schema does not declare that it writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("var", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.mean, self.var, training=True, momentum=0.5)


@pytest.mark.parametrize("limit", [0, 2**20], ids=["watched", "copied up front"])
def test_running_statistics_are_restored_with_and_without_the_up_front_copy(limit: int) -> None:
    model = HiddenBatchNorm()
    x = torch.arange(6.0).reshape(2, 3)
    with preserved_state(model, buffer_copy_limit_bytes=limit) as guard:
        with guard.watch_writes():  # the static pass: copy on first write
            model(x)
        for _ in range(3):  # the timed passes
            model(x)
        assert model.mean.tolist() != [0.0, 0.0, 0.0]  # the forwards did write
    assert model.mean.tolist() == [0.0, 0.0, 0.0]
    assert model.var.tolist() == [1.0, 1.0, 1.0]
    assert sorted(guard.restored) == ["mean", "var"]


def test_a_tensor_written_only_after_the_watched_pass_is_reported() -> None:
    model = EMA()
    with pytest.warns(ModelProfWarning, match="changed v in place"):
        with preserved_state(model):  # no watched pass: parameters have no copy
            model(torch.ones(4))
    assert model.v.tolist() == [2.0] * 4  # not restorable, and said so
    # a write through .data bumps no version counter: only the watched pass can see it
    assert model.w.tolist() == [0.5] * 4


class FailsOnCall(nn.Module):
    """Increments its buffer, then raises (or is interrupted) on call ``when``."""

    def __init__(self, when: int, exc: BaseException) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))
        self.fc = nn.Linear(2, 2)
        self.inner = nn.Sequential(nn.Identity())
        self.when, self.exc, self.calls = when, exc, CallCount()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.n += 1
        self.n += 1
        y = self.inner(self.fc(x))
        if self.calls.n == self.when:
            raise self.exc
        return y


def test_state_is_restored_when_the_static_pass_raises() -> None:
    model = FailsOnCall(1, ValueError("boom"))
    with pytest.raises(ModelProfError, match="boom"):
        profile(model, (2,), timing=False)
    assert model.n.item() == 0


def test_state_is_restored_when_interrupted() -> None:
    model = FailsOnCall(4, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        profile(model, (2,), **FAST)
    assert model.calls.n == 4 and model.n.item() == 0  # interrupted in the timing, restored


def test_a_failure_in_the_end_to_end_timing_names_the_module() -> None:
    # call 1 is the static pass (fine); call 3 is inside the end-to-end timing's warm-up
    model = FailsOnCall(3, RuntimeError("late failure"))
    with pytest.raises(ModelProfError) as e:
        profile(model, (2,), **FAST)
    message = str(e.value)
    assert "during the end-to-end timing in module '(root)' (FailsOnCall)" in message
    assert "late failure" in message and "Inputs were 1x2" in message
    assert model.n.item() == 0


class FailsInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(2, 2), _Late())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class _Late(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = CallCount()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.n += 1
        if self.calls.n >= 2:
            raise RuntimeError("inner failure")
        return x


def test_the_end_to_end_failure_names_the_innermost_running_module() -> None:
    with pytest.raises(
        ModelProfError,
        match=r"in module 'block\.1' \(_Late\); running: "
        r"\(root\) > block > block\.1\.",
    ):
        profile(FailsInside(), (2,), **FAST)


def test_nested_guards_restore_once_at_the_outermost() -> None:
    model = Counting(CallCount())
    with preserved_state(model) as outer:
        with preserved_state(model) as inner:
            assert inner is outer
            model(torch.ones(1, 4))
        assert model.n.item() == 1  # the inner guard restored nothing
    assert model.n.item() == 0


def test_lazy_buffers_are_refused_and_the_module_stays_lazy() -> None:
    model = nn.Sequential(nn.LazyBatchNorm1d(affine=False))  # lazy buffers, no parameters
    with pytest.raises(ModelProfError, match="lazy parameters or buffers .'0.running_mean'"):
        profile(model, (8,))
    assert type(model[0]) is nn.LazyBatchNorm1d
    assert isinstance(model[0].running_mean, nn.parameter.UninitializedBuffer)


def test_train_mode_dropout_leaves_the_users_random_state_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    state = torch.get_rng_state()
    profile(model, (4,), training=True, timing=False)  # the static pass draws a dropout mask
    profile(model, (4,), training=True, **FAST)  # so does every timed pass
    assert torch.equal(torch.get_rng_state(), state)


class Locked(nn.Module):
    """Holds a lock: ``copy.deepcopy`` raises TypeError on it."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.bn(self.fc(x))


def test_a_model_holding_a_lock_profiles_converted_and_in_train_mode() -> None:
    model = Locked()
    weight = model.fc.weight.detach().clone()
    mean = model.bn.running_mean.clone()
    report = profile(model, (3,), dtype=torch.float64, batch_size=4, **FAST)
    assert report.dtype == "float64" and report.latency is not None
    report = profile(model, (3,), training=True, batch_size=4, **FAST)
    assert report.latency is not None
    assert model.fc.weight.dtype == torch.float32 and torch.equal(model.fc.weight, weight)
    assert torch.equal(model.bn.running_mean, mean)  # train-mode passes left no trace
    assert model.bn.num_batches_tracked.item() == 0


def test_a_model_that_cannot_be_copied_at_all_gets_a_clear_error(monkeypatch) -> None:
    def fail(model: nn.Module) -> nn.Module:
        raise RuntimeError("no copy either")

    monkeypatch.setattr(placement_mod, "_structural_copy", fail)
    with pytest.raises(
        ModelProfError,
        match=r"cannot copy the model \(Locked\) to convert it "
        r"to dtype torch.float64: copy.deepcopy failed "
        r"\(TypeError: cannot pickle '_thread.lock'",
    ):
        profile(Locked(), (3,), dtype=torch.float64, batch_size=2, **FAST)


class Deep(nn.Module):
    def __init__(self, levels: int) -> None:
        super().__init__()
        self.inner = Deep(levels - 1) if levels > 1 else nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_nesting_200_deep_profiles_like_it_runs_plain() -> None:
    model = Deep(200)
    model(torch.ones(1, 3))  # runs plain within the default recursion limit
    limit = sys.getrecursionlimit()
    report = profile(model, (3,), **FAST)
    # 200 Deep calls + the Linear; Linear(3, 2) at batch 1: 3*2 = 6 MACs
    assert len(report.rows) == 201
    assert report.totals["macs"] == 6
    assert sys.getrecursionlimit() == limit
    report = profile(model, (3,), dtype=torch.float64, timing=False)  # a deep copy, too
    assert report.totals["macs"] == 6


def test_guard_costs_no_copy_of_parameters() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64))
    guard = StateGuard(model)
    snapshots = {t.name for t in guard.tracked if t.snapshot is not None}
    # only the buffers are copied up front: running_mean, running_var, num_batches_tracked
    assert snapshots == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.restore()
    assert guard.restored == []


class FrozenNorm(nn.Module):
    """A train() override that keeps its batch norm in eval mode (detection backbones do)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.seen: list[bool] = []

    def train(self, mode: bool = True):
        super().train(mode)
        self.bn.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.bn.training)
        return self.bn(self.lin(x))


def test_a_train_override_is_called_even_when_every_flag_already_reads_the_mode() -> None:
    # freshly built, every module's flag is True: skipping train(True) because the flags already
    # agree would run the frozen batch norm in train mode (and count its running-stat updates)
    model = FrozenNorm()
    report = profile(model, (4,), batch_size=2, training=True, timing=False)
    assert model.seen == [False]
    # eval-mode batch norm: no num_batches_tracked += 1 (aten.add_) in the counted ops
    assert not any(op.startswith("aten.add_") for op in report.by_operator()["op"])
    assert model.bn.training is True  # the user's flags come back as they were


class SwapNames(nn.Module):
    """Exchanges two parameters, two submodules and two attributes through del and re-assignment:
    the same names and the same objects, in other slots."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2))
        self.b = nn.Parameter(torch.ones(2))
        self.f, self.g = nn.ReLU(), nn.Tanh()
        self.s, self.t = "S", "T"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for u, v in (("a", "b"), ("f", "g"), ("s", "t")):
            first, second = getattr(self, u), getattr(self, v)
            delattr(self, u)
            setattr(self, v, first)
            setattr(self, u, second)
        return x


def test_names_exchanged_through_del_are_put_back() -> None:
    model = SwapNames()
    a, b, f, g = model.a, model.b, model.f, model.g
    with preserved_state(model):
        model(torch.ones(1))
        assert model.a is b and model.s == "T"  # the forward did exchange them
    assert (model.a, model.b, model.f, model.g, model.s, model.t) == (a, b, f, g, "S", "T")
    assert list(model._parameters) == ["a", "b"]  # the registries' order too


def test_a_conjugate_view_pointed_elsewhere_comes_back_with_its_conjugate_bit() -> None:
    model = nn.Module()
    base = torch.tensor([1 + 2j, 3 - 4j])
    model.register_buffer("z", base.conj())  # a lazy conjugate view of base
    with preserved_state(model):
        model.z.data = torch.zeros(2, dtype=torch.cfloat)
    assert model.z.is_conj() and model.z.tolist() == [1 - 2j, 3 + 4j]
    assert base.tolist() == [1 + 2j, 3 - 4j]  # the storage it views is untouched


def test_a_reshaped_parameter_gets_its_shape_back_before_its_gradient() -> None:
    model = nn.Linear(2, 4)
    grad = torch.ones(4)
    model.bias.grad = grad
    with preserved_state(model) as guard:
        model.bias.grad = None
        model.bias.data = model.bias.data.view(2, 2)  # the entry gradient no longer fits
    assert model.bias.shape == (4,) and model.bias.grad is grad
    assert guard.restored == ["bias"]


def test_an_untouched_nan_buffer_is_not_reported_as_restored() -> None:
    model = nn.Module()
    model.register_buffer("buf", torch.tensor([float("nan"), 1.0]))
    with preserved_state(model) as guard:
        pass
    assert guard.restored == [] and guard.unrestored == []


class _QuietWriter(nn.Module):
    """Buffers of two dtypes (a transposed one, a 0-d one, a NaN one); the forward writes two
    of them through ``.data``, which bumps no version counter."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.arange(4.0))
        self.register_buffer("b", torch.tensor([[1.0, float("nan")], [3.0, 4.0]]).t())
        self.register_buffer("n", torch.tensor(3))
        self.register_buffer("k", torch.tensor([5, 6]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.b.data[0, 1] = 9.0  # b[0, 1] is 3.0 on entry (b is transposed)
        self.n.data += 1
        return x


def test_buffers_copied_up_front_are_compared_and_put_back_per_tensor() -> None:
    # the up-front copy is one flat tensor per dtype: a quiet write to one buffer of each
    # group is still found, put back and named alone, a NaN left alone is not reported
    model = _QuietWriter()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with preserved_state(model) as guard:
        assert guard.tracked[1].snapshot.tolist()[0][1] == 3.0  # the entry values, by index
        model(torch.zeros(1))
        assert model.b[0, 1] == 9.0 and model.n == 4
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v) or torch.allclose(
            model.state_dict()[k], v, rtol=0.0, atol=0.0, equal_nan=True
        ), k
    assert not model.b.is_contiguous()  # the same tensor, put back in place
    assert guard.restored == ["b", "n"] and guard.unrestored == []


def test_buffers_left_alone_are_not_reported_as_restored() -> None:
    model = _QuietWriter()
    with preserved_state(model) as guard:
        pass
    assert guard.restored == [] and guard.unrestored == []


def test_profile_inside_a_guard_of_the_caller_sees_the_model_as_it_is_now() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with preserved_state(model):
        model.add_module("2", nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)))
        report = profile(model, (4,), timing=False)
    assert [r.module for r in report.rows] == ["", "0", "1", "2", "2.0", "2.1"]
    # Linear(4,4) + Linear(4,8) + Linear(8,2): 20 + 40 + 18
    assert report.totals["params"] == report.model_params == 78


class LateWriter(nn.Module):
    """Writes its parameter in place from its second call on: in the timed passes only."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.calls = CallCount()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.n += 1
        if self.calls.n > 1:
            with torch.no_grad():
                self.w.add_(1.0)
        return x * self.w


def test_the_unrestorable_write_warning_points_at_the_line_that_profiled() -> None:
    with pytest.warns(ModelProfWarning, match="changed w in place") as caught:
        profile(LateWriter(), (4,), **FAST)
    assert [w.filename for w in caught if "changed w" in str(w.message)] == [__file__]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.trace's deprecation notice
def test_a_traced_models_tensors_are_named_like_the_modules_they_sit_in() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).eval()
    traced = torch.jit.trace(net, torch.ones(3, 2))
    names = [t.name for t in StateGuard(traced).tracked]
    assert names[:5] == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean"]


def test_a_forwards_own_python_and_numpy_draws_are_given_back() -> None:
    class Jitter(nn.Module):  # draws from Python's and numpy's global generators each call
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * (random.random() + float(np.random.rand()))

    def streams() -> tuple:  # Python's state; numpy's key, position and cached gaussian
        _, key, *position = np.random.get_state()
        return random.getstate(), key.tobytes(), tuple(position), torch.get_rng_state()

    models = {"a": Jitter(), "b": Jitter()}  # (their initialisation draws from torch's)
    kept = streams()
    profile(models["a"], (4,), **FAST)  # the counting pass and every timed pass draw
    _unmoved(kept, streams())
    compare(models, (4,), repeat=5, warmup=1)
    _unmoved(kept, streams())
    # the training steps and the throughput search each time the model again
    compare(models, (4,), repeat=5, warmup=1, backward=True)
    _unmoved(kept, streams())
    search = {"max_batch": 2, "budget_s": 0.02}
    compare(models, (4,), repeat=5, warmup=1, throughput=True, throughput_options=search)
    _unmoved(kept, streams())


def _unmoved(before: tuple, after: tuple) -> None:
    names = ("python", "numpy key", "numpy position", "torch")
    moved = [n for n, a, b in zip(names, before, after) if not _same(a, b)]
    assert not moved, f"moved: {moved}"


def _same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


class FrozenNormDropout(FrozenNorm):
    """FrozenNorm with a dropout after it: a fine-tuning step's mix of eval and train modes."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.drop_seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.drop_seen.append(self.drop.training)
        return self.drop(super().forward(x))


def test_a_training_step_keeps_a_train_override_s_frozen_norm_beside_active_dropout() -> None:
    # backward=True puts the model in train mode through its own train(True): every pass, counted
    # and timed, runs the batch norm in eval mode (the override) and the dropout in train mode
    model = FrozenNormDropout()
    profile(model, (4,), batch_size=2, backward=True, repeat=3, warmup=1, roofline=False)
    assert model.seen and set(model.seen) == {False}
    assert set(model.drop_seen) == {True}
    assert model.bn.training is True and model.drop.training is True  # flags come back
