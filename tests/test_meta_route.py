"""A counting-only CPU profile counted on meta (counting/meta_route.py) gives the very report
the real kernels give — every row, count, op name and note, on the CPU — and falls back to the
real pass wherever meta cannot be trusted, with no trace of the attempt. (The torchvision zoo:
tests/test_leaves.py, ``-m slow``.)"""
from __future__ import annotations

import collections
import threading
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modelprof import ModelProfError, profile
from modelprof.counting import meta_route
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
    """Warns ``own`` in its forward; with ``other``, has another thread warn that meanwhile."""

    def __init__(self, own: str = "from the model", other: str | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.own, self.other = own, other

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn(self.own)
        if self.other is not None:
            t = threading.Thread(target=warnings.warn, args=(self.other,))
            t.start()
            t.join(timeout=60)
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


def test_the_meta_route_is_the_default_and_real_turns_it_off(monkeypatch) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    assert profile(model, (8,), timing=False).env["static_route"] == "meta"
    monkeypatch.setenv(ROUTE_ENV, "real")
    assert profile(model, (8,), timing=False).env["static_route"] == "real"
    monkeypatch.setenv(ROUTE_ENV, "meta")
    assert profile(model, (8,), timing=False).env["static_route"] == "meta"
    # a timed profile, or one on another device, never takes it
    monkeypatch.delenv(ROUTE_ENV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (three samples: a noisy-timing warning, maybe)
        timed = profile(model, (8,), repeat=3, warmup=1, roofline=False)
    assert timed.env["static_route"] == "real"


# -- the twin: the meta forward runs on a structural copy, never on the user's module ---------

class _Hooked(nn.Module):
    """A forward hook bound to the module itself, keeping what it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)
        self.seen: list = []
        self.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.seen.append(output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


def test_a_model_with_forward_hooks_is_counted_on_the_real_kernels(monkeypatch) -> None:
    # the user's hook would see (and keep) meta tensors
    model = _Hooked().eval()
    first, real, caught = _both(model, torch.randn(3, 8), monkeypatch)
    assert first.env["static_route"] == "real" and caught == []
    _equal(first, real)
    assert [t.device.type for t in model.seen] == ["cpu", "cpu"]


class _Caches(nn.Module):
    """Fills a dict and a list of its own in the forward (a memo of position tables)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.table: dict = {}
        self.log: list = [[]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if n not in self.table:
            self.table[n] = torch.arange(n, device=x.device, dtype=x.dtype)[:, None]
        self.log[0].append(n)
        return self.fc(x + self.table[n])


class _Stores(nn.Module):
    """Stores tensors in mutable objects the twin shares with it (not copied: a defaultdict,
    a deque, a plain object), which another thread also changes meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.memo = collections.defaultdict(dict)
        self.recent = collections.deque([torch.zeros(1)], maxlen=4)
        self.state = types.SimpleNamespace(last=torch.zeros(1), steps=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if n not in self.memo["pos"]:
            self.memo["pos"][n] = torch.arange(n, device=x.device, dtype=x.dtype)[:, None]
        y = self.fc(x + self.memo["pos"][n])
        self.recent.append(y)
        self.state.last = y
        t = threading.Thread(target=lambda: setattr(self.state, "steps", 7))   # (another
        t.start()                                                               # thread's)
        t.join(timeout=60)
        return y


def test_what_the_twin_shares_keeps_no_meta_tensor(monkeypatch) -> None:
    # what the attempt put there is taken out (the value before put back); what another
    # thread changed meanwhile stays
    model = _Stores().eval()
    x = torch.randn(3, 8)
    before = (model.recent[0], model.state.last)
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    assert profile(model, inputs=x, timing=False).env["static_route"] == "meta"
    assert dict(model.memo) == {} and list(model.recent) == [before[0]]
    assert model.state.last is before[1] and model.state.steps == 7
    assert model(x).device.type == "cpu"


def test_what_the_forward_stores_on_the_twin_stays_there(monkeypatch) -> None:
    model = _Caches().eval()
    x = torch.randn(3, 8)
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    assert profile(model, inputs=x, timing=False).env["static_route"] == "meta"
    # the twin filled copies of the dict and the nested list: the user's are as they were
    assert model.table == {} and model.log == [[]]
    assert model(x).device.type == "cpu"


class _Cases(nn.Module):
    """One way each in which a meta forward would differ from the CPU's unseen."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.fc = nn.Linear(8, 8)
        self.conv = nn.Conv2d(2, 2, 1)
        self.bn = nn.BatchNorm1d(8)
        self.bag = nn.EmbeddingBag(10, 8, mode="mean")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        case = self.case
        if case == "device_branch":     # the CPU branch on the CPU
            return self.fc(x) if x.is_cpu else self.fc(self.fc(x))
        if case == "cpu_only":          # raises off the CPU (x.is_cpu read: not trusted)
            if not x.is_cpu:
                raise ValueError("this model only runs on the CPU")
            return self.fc(x)
        if case == "channels_last":     # the CPU's conv keeps the layout, meta's does not
            y = self.conv(x.reshape(2, 2, 2, 4).contiguous(memory_format=torch.channels_last))
            return self.fc(y.flatten(2).transpose(1, 2).reshape(-1, 8))
        if case == "functional_bn":     # eval batch norm's saved statistics: empty on the CPU
            return F.batch_norm(self.fc(x), self.bn.running_mean, self.bn.running_var)
        if case == "scalar_to":         # on the CPU, .to(x.device) returns the tensor itself
            return self.fc(x) * torch.tensor(2.0).to(x.device)
        if case == "bag":
            return self.bag(torch.arange(4, device=x.device).reshape(2, 2)).sum() + x
        if case == "scalar_copy":       # copy=True: the CPU copies too
            return self.fc(x) * torch.tensor(2.0).to(x.device, copy=True)
        if case == "as_tensor":         # made from the data without an op on the CPU
            return self.fc(x) * torch.as_tensor(2.0, device=x.device)
        if case == "group_norm":        # on a channels-last tensor: the CPU keeps the layout
            y = x.reshape(2, 2, 2, 4).contiguous(memory_format=torch.channels_last)
            return self.fc(F.group_norm(y, 2).flatten(2).transpose(1, 2).reshape(-1, 8))
        if case == "get_device":
            return self.fc(x) if x.get_device() < 0 else self.fc(self.fc(x))
        return self.fc(x)


@pytest.mark.parametrize("case, route", [
    ("device_branch", "real"), ("cpu_only", "real"), ("channels_last", "meta"),
    ("functional_bn", "meta"), ("scalar_to", "meta"), ("bag", "real"), ("plain", "meta"),
    ("scalar_copy", "meta"), ("as_tensor", "meta"), ("group_norm", "real"),
    ("get_device", "real"),
    ("slots", "real"), ("grad_input", "real"), ("inference_input", "real")])
def test_a_meta_forward_that_could_differ_is_not_trusted(case, route, monkeypatch) -> None:
    model, x = _Cases(case).eval(), torch.randn(4, 8)
    if case == "slots":   # a twin copies the __dict__, not the slots
        class Slotted(_Cases):
            __slots__ = ("extra",)
        model = Slotted("plain").eval()
    elif case == "grad_input":    # a forward may branch on x.requires_grad
        x.requires_grad_()
    elif case == "inference_input":
        with torch.inference_mode():
            x = torch.randn(4, 8)
    first, real, caught = _both(model, x, monkeypatch)
    assert first.env["static_route"] == route and caught == []
    _equal(first, real)   # and meta, where it ran, gave the CPU's report (bytes included)


def test_the_users_warning_filters_hold_during_and_after_the_attempt(monkeypatch) -> None:
    # another thread's warning the user filtered out stays out; the model's own warning is
    # re-emitted under its module's name, so a module= filter holds for it too
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    for ignore_module in (False, True):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", message="filtered out")
            if ignore_module:
                warnings.filterwarnings("ignore", module=__name__)
            report = profile(_Warns(other="filtered out").eval(), (4,), timing=False)
            assert report.env["static_route"] == "meta"
        assert [str(w.message) for w in seen] == ([] if ignore_module else ["from the model"])


@pytest.mark.parametrize("action", ["once", "default"])
def test_a_warning_the_filters_show_once_is_shown(action: str, monkeypatch) -> None:
    # recorded in the attempt, it must not count as shown already when it is re-emitted
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter(action)
        model = _Warns(f"shown {action}, from the model").eval()
        assert profile(model, (4,), timing=False).env["static_route"] == "meta"
    assert [str(w.message) for w in seen] == [f"shown {action}, from the model"]


def test_another_threads_warnings_are_shown_while_the_twin_counts(monkeypatch) -> None:
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = profile(_Warns(other="from another thread").eval(), (4,), timing=False)
    assert report.env["static_route"] == "meta"
    # the model's warning once (re-emitted after the count), the other thread's as it came
    assert sorted(str(w.message) for w in seen) == ["from another thread", "from the model"]


class _Unfollowed(nn.Module):
    """Layers reached through a plain list, or a head that reads another module's weight
    through a closure: what the twin does not make its own."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8, bias=False)
        self.fc = nn.Linear(8, 8)
        weight = self.embed.weight
        self.head = (lambda x: torch.nn.functional.linear(x, weight)) if how == "closure" \
            else None
        self.layers = [self.fc] if how == "list" else None   # (nn.Module registers no list)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x) if self.layers is None else self.layers[0](x)
        return self.head(x) if self.head is not None else self.embed(x)


@pytest.mark.parametrize("how", ["closure", "list", "control"])
def test_what_the_twin_cannot_follow_runs_the_real_kernels(how: str, monkeypatch) -> None:
    # a closure's CPU weight beside meta tensors, or the model's own fc called: either would
    # be counted silently on meta (mm and addmm take a CPU operand there), so the attempt is
    # dropped; the real pass counts both as the user's forward runs them
    first, real, caught = _both(_Unfollowed(how).eval(), torch.randn(2, 8), monkeypatch)
    assert first.env["static_route"] == ("meta" if how == "control" else "real")
    assert caught == []
    _equal(first, real)
    # embed's 64 weights and fc's 72 charged once each, in every case: embed's to embed's
    # call, or to the root's op that reads it
    assert int(first.to_dataframe().params.iloc[0]) == 64 + 72


class _Peeks(nn.Module):
    """In the profiling thread, has a second thread forward the same model (held in a plain
    list, as a server would hold it), and keeps what that thread saw."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.served: list = []   # [the model]
        # per forward of the other thread: what it saw, or its error (in an object the twin
        # shares: a list attribute of its own would be the twin's copy)
        self.peer = types.SimpleNamespace(seen=[])
        self.owner = threading.get_ident()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.get_ident() == self.owner and self.peer.seen == []:
            model = self.served[0]

            def other() -> None:
                try:
                    with torch.no_grad():
                        out = model(torch.ones(1, 4))
                    self.peer.seen.append((model.fc.weight.is_meta, out))
                except Exception as e:   # noqa: BLE001 - kept for the test to show
                    self.peer.seen.append(e)
            t = threading.Thread(target=other)
            t.start()
            t.join(timeout=60)
        return self.fc(x)


def test_another_thread_sees_the_model_as_it_is_while_meta_counts(monkeypatch) -> None:
    # the old route swapped meta stand-ins into the user's module (functional_call), for every
    # thread; the twin leaves it alone: the other thread's one forward runs on the real weights
    # and gives their output, and the profile is refused as the real pass refuses it
    # (profiling puts the model's state back at the end, over what the other thread does)
    model = _Peeks().eval()
    model.served.append(model)
    expected = model.fc(torch.ones(1, 4)).detach()
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    with pytest.raises(ModelProfError, match="another thread called the modules of _Peeks "
                                             "2 times"):
        profile(model, (4,), timing=False)
    assert len(model.peer.seen) == 1, model.peer.seen   # one forward, in the meta attempt
    on_meta, output = model.peer.seen[0]
    assert on_meta is False and torch.equal(output, expected)


def test_a_model_that_fell_back_once_is_counted_on_the_real_kernels_next(monkeypatch) -> None:
    model = _Branches().eval()   # (a data-dependent branch: the meta attempt falls back)
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    attempts: list = []
    real_twin = meta_route.meta_twin
    monkeypatch.setattr(meta_route, "meta_twin", lambda guard: attempts.append(1) or
                        real_twin(guard))
    reports = [profile(model, (4,), timing=False) for _ in range(3)]
    assert [r.env["static_route"] for r in reports] == ["real"] * 3
    assert attempts == [1]          # one attempt, then straight to the real kernels
    assert reports[0].totals == reports[2].totals
    other = _Branches().eval()      # another model is tried as before
    profile(other, (4,), timing=False)
    assert attempts == [1, 1]


def test_torchvision_detectors_are_not_tried(monkeypatch) -> None:
    # their NMS (torchvision::nms) has no meta kernel and runs after the backbone: an attempt
    # would fail late and cost about one meta forward; a module of that package is enough
    class Head(nn.Linear):
        pass

    Head.__module__ = "torchvision.models.detection.roi_heads"
    attempts: list = []
    real_twin = meta_route.meta_twin
    monkeypatch.setattr(meta_route, "meta_twin", lambda guard: attempts.append(1) or
                        real_twin(guard))
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    detector = nn.Sequential(nn.Linear(4, 4), Head(4, 2)).eval()
    assert profile(detector, (4,), timing=False).env["static_route"] == "real"
    plain = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).eval()   # (the control)
    assert profile(plain, (4,), timing=False).env["static_route"] == "meta"
    assert attempts == [1]


class _ChecksDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":   # what the route cannot see (README)
            raise ValueError("this model only runs on the CPU")
        return self.fc(x)


def test_the_models_own_error_on_meta_is_raised_with_a_note_on_the_route(monkeypatch) -> None:
    # raised as the model's (a model may count its calls: a second forward could pass), with
    # the way out in a note; =real counts it
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    with pytest.raises(ModelProfError, match="only runs on the CPU") as e:
        profile(_ChecksDevice().eval(), (4,), timing=False)
    assert any("MODELPROF_STATIC_ROUTE=real" in note for note in e.value.__notes__)
    monkeypatch.setenv(ROUTE_ENV, "real")
    assert profile(_ChecksDevice().eval(), (4,), timing=False).totals["macs"] == 16
