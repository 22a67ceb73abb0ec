"""time_layers on CPU: per-layer spins read back, keys and call indices, no hooks left,
peak-memory nesting with fake allocator statistics."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.inputs import make_inputs
from modelprof.timing import LayerTiming, MemoryStats, measure_latency, time_layers
from modelprof.timing.calibration import spin_model
from modelprof.timing.layers import PeakTracker

pytestmark = pytest.mark.filterwarnings(
    "ignore::modelprof.timing.measurement.NoisyMeasurementWarning")


def _hooks_left(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


SPIN_MS = {("0", 1): 2.0, ("1", 1): 5.0, ("2", 1): 10.0, ("", 1): 17.0}   # root: 2 + 5 + 10
ATTEMPTS = 3  # other jobs on a shared 2-core machine only ever lengthen a spin: retry afresh


def _spin_layers() -> tuple[nn.Module, LayerTiming]:
    model = spin_model((2.0, 5.0, 10.0))
    return model, time_layers(model, make_inputs(model, (4,)), warmup_s=0.05, budget_s=2.0)


@pytest.fixture(scope="module")
def spin_timing() -> tuple[nn.Module, LayerTiming]:
    return _spin_layers()


def test_spin_layers_read_back_their_durations(spin_timing):
    model, lt = spin_timing
    for _ in range(ATTEMPTS):
        med = lt.median_ms()
        if all(med[k] == pytest.approx(v, rel=0.03) for k, v in SPIN_MS.items()):
            break
        model, lt = _spin_layers()
    for key, ms in SPIN_MS.items():
        assert med[key] == pytest.approx(ms, rel=0.03), key
        # the fastest pass cannot be slowed by contention's absence: never short, barely long
        assert ms <= lt.samples[key].min() <= ms * 1.03, key
    assert float(np.median(lt.passes_ms)) == pytest.approx(17.0, rel=0.03)
    assert lt.leaves() == [("0", 1), ("1", 1), ("2", 1)]
    # leaves cover the pass: (2 + 5 + 10) / 17 minus the hooks' few microseconds
    assert lt.coverage() == pytest.approx(1.0, abs=0.01)


def test_instrumentation_overhead_below_5_percent(spin_timing):
    model, lt = spin_timing
    for _ in range(ATTEMPTS):
        clean = measure_latency(model, torch.zeros(1, 4), warmup_s=0.05, budget_s=2.0)
        if 0.97 < lt.overhead(clean) < 1.05:
            break
        model, lt = _spin_layers()
    assert 0.97 < lt.overhead(clean) < 1.05          # instrumented / clean, same work
    assert lt.passes_ms.min() / clean.min_ms < 1.05


def test_samples_are_aligned_by_pass_and_dataframe_is_numeric(spin_timing):
    _, lt = spin_timing
    assert {v.shape for v in lt.samples.values()} == {(lt.n,)}
    assert lt.order == [("", 1), ("0", 1), ("1", 1), ("2", 1)]
    df = lt.to_dataframe()
    assert list(df.columns) == ["name", "call", "latency_ms", "latency_std_ms", "latency_pct",
                                "peak_memory_bytes"]
    assert df["latency_pct"].iloc[0] == pytest.approx(100.0, rel=0.01)
    assert lt.peak_memory_bytes is None                        # CPU: no allocator statistics
    assert "4 calls" in repr(lt) and "(model)" in repr(lt)


class Shared(nn.Module):
    """relu called twice in one forward: keys ("act", 1) and ("act", 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.lin2 = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.act(self.lin2(self.act(self.lin1(x))))


def test_keys_call_indices_parents_and_exact_counts():
    model = Shared().train()
    lt = time_layers(model, make_inputs(model, (4,)), warmup=4, repeat=6)
    assert lt.order == [("", 1), ("lin1", 1), ("act", 1), ("lin2", 1), ("act", 2)]
    assert lt.parents[("act", 2)] == ("", 1) and lt.parents[("", 1)] is None
    assert lt.n == 6 and lt.stop_reason == "repeat"
    assert model.calls == 1 + 4 + 6                            # discovery + warm-up + samples
    assert lt.warmup == 1 + 4
    assert model.training and _hooks_left(model) == 0


def test_modules_map_limits_and_names_the_hooked_calls():
    model = Shared()
    names = {model: "", model.lin1: "first"}
    lt = time_layers(model, make_inputs(model, (4,)), warmup=0, repeat=3, modules=names)
    assert lt.order == [("", 1), ("first", 1)]


def test_forward_failure_names_the_module_and_leaves_no_hooks():
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.armed = False

        def forward(self, x):
            if self.armed:
                raise ValueError("bad value inside")
            return x

    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), Boom())).train()
    model[1][1].armed = True
    with pytest.raises(ModelProfError, match=r"module '1\.1'.*ValueError: bad value") as info:
        time_layers(model, make_inputs(model, (4,)), warmup=0, repeat=2)
    assert isinstance(info.value.__cause__, ValueError)
    assert _hooks_left(model) == 0
    assert all(m.training for m in model.modules())


def test_changing_control_flow_is_reported():
    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.ReLU(), nn.Tanh()
            self.n = 0

        def forward(self, x):
            self.n += 1
            return self.a(x) if self.n % 2 else self.b(x)

    model = Flaky()
    with pytest.raises(ModelProfError, match="control flow"):
        time_layers(model, make_inputs(model, (4,)), warmup=2, repeat=2)
    assert _hooks_left(model) == 0


def test_oom_passes_through_unwrapped():
    class Oom(nn.Module):
        def forward(self, x):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    with pytest.raises(torch.OutOfMemoryError):
        time_layers(Oom(), make_inputs(nn.Linear(1, 1), (4,)), warmup=0, repeat=1)


def test_bad_options_are_rejected():
    model = Shared()
    mi = make_inputs(model, (4,))
    with pytest.raises(ModelProfError, match="repeat=-2"):
        time_layers(model, mi, repeat=-2)
    with pytest.raises(ModelProfError, match="memory_stats='yes'"):
        time_layers(model, mi, memory_stats="yes")
    with pytest.raises(ModelProfError, match="is not a torch.nn.Module"):
        time_layers(lambda x: x, mi)


class FakeAllocator:
    """Bytes in use and the peak since the last reset, like the CUDA caching allocator."""

    def __init__(self, base: int) -> None:
        self.cur = self.peak = base

    def alloc(self, n: int) -> None:
        self.cur += n
        self.peak = max(self.peak, self.cur)

    def free(self, n: int) -> None:
        self.cur -= n

    def stats(self) -> MemoryStats:
        def reset() -> None:
            self.peak = self.cur
        return MemoryStats(lambda: self.peak, reset)


class Leaf(nn.Module):
    def __init__(self, fake: FakeAllocator, n: int) -> None:
        super().__init__()
        self.fake, self.n = fake, n

    def forward(self, x):
        self.fake.alloc(self.n)
        self.fake.free(self.n)
        return x


class Mid(nn.Module):
    def __init__(self, fake: FakeAllocator) -> None:
        super().__init__()
        self.fake = fake
        self.a1 = Leaf(fake, 500)

    def forward(self, x):
        self.fake.alloc(300)
        x = self.a1(x)
        self.fake.free(300)
        return x


class Root(nn.Module):
    def __init__(self, fake: FakeAllocator) -> None:
        super().__init__()
        self.fake = fake
        self.a = Mid(fake)
        self.b = Leaf(fake, 50)

    def forward(self, x):
        self.fake.alloc(100)
        self.fake.alloc(2000)     # a spike before any child resets the peak
        self.fake.free(2000)
        x = self.b(self.a(x))
        self.fake.free(100)
        return x


def test_peak_memory_nesting_with_fake_allocator():
    fake = FakeAllocator(base=1000)
    model = Root(fake)
    lt = time_layers(model, make_inputs(model, (4,)), warmup=1, repeat=2,
                     memory_stats=fake.stats())
    assert lt.peak_memory_bytes == {
        ("", 1): 3100,        # 1000 + 100 + 2000: the spike survives the children's resets
        ("a", 1): 1900,       # 1000 + 100 + 300 + 500 (its child's peak handed up)
        ("a.a1", 1): 1900,    # 1100 + 300 in use at its start, + 500
        ("b", 1): 1150,       # 1100 + 50
    }
    assert lt.warmup == 1 + 1 + 1                             # discovery + warm-up + memory pass


def test_peak_tracker_hands_child_peaks_to_parents():
    fake = FakeAllocator(base=0)
    t = PeakTracker(fake.stats(), 3)
    t.enter(0)
    fake.alloc(10)
    t.enter(1)
    fake.alloc(5)
    fake.free(5)
    t.exit(1)
    t.enter(2)                 # sibling: resets the peak (15) that call 0 already saw
    t.exit(2)
    fake.free(10)
    t.exit(0)
    assert t.peak == [15, 15, 10]
