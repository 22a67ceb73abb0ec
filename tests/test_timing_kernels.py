"""per_layer="kernels" on the CPU (where it is tested without a GPU): op time per module call from
torch.profiler ranges pushed by the hooks, exact sums, launch-bound layers named; and the
latency/pipelined modes of the CUDA event clock through measure_latency, with fakes."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

from modelprof import profile
from modelprof.errors import ModelProfError
from modelprof.render.csvio import read_csv
from modelprof.runtime.inputs import make_inputs
from modelprof.timing import clock as clock_mod
from modelprof.timing import runner as runner_mod
from modelprof.timing.calibration import spin
from modelprof.timing.kernels import KERNEL_COLUMNS, time_kernels
from modelprof.timing.latency import measure_latency, pipeline_group
from modelprof.timing.options import TimingOptions

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


class PythonLoop(nn.Module):
    """Spins 3 ms in Python around one tiny op: almost none of its time is inside ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spin(3.0)
        return x + 1


class MatMul(nn.Module):
    """A 256 x 256 matmul: its time is its op's."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(8):
            y = y @ self.w
        return y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loop = PythonLoop()
        self.mm = MatMul()
        self.block = nn.Sequential(nn.ReLU(), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(self.mm(self.loop(x)))
        return y * 2  # the model's own op: its (self) row


def test_time_kernels_on_the_cpu_sums_exactly_and_names_the_python_bound_layer(one_thread):
    model = Net()
    kt = time_kernels(model, make_inputs(model, (256,), batch_size=256), repeat=5, warmup=1)
    assert kt.n == 5 and kt.busy_ms.shape == (5, len(kt.order) + 1)
    m = kt.medians()
    where = {k: i for i, k in enumerate(kt.order)}
    root, loop, mm, block = (where[k] for k in [("", 1), ("loop", 1), ("mm", 1), ("block", 1)])
    # inclusive = own + children, exactly (sums of the same medians)
    leaves = [i for i in range(len(kt.order)) if i not in set(kt.parent_index) - {None}]
    parents = set(kt.parent_index) - {None}
    total = sum(m["kernel"][i] for i in leaves) + sum(m["kernel_self"][i] for i in parents)
    assert total == pytest.approx(m["kernel"][root], rel=1e-12)
    assert m["kernel"][block] >= m["kernel"][block + 1]  # never below a child
    # the Python loop's 3 ms spin runs no op: its op time is a sliver of its call's time; the
    # matmul's call is its ops' (both within one call, so load on the machine reaches both)
    assert m["kernel"][loop] < 0.5 * m["host"][loop]
    assert m["kernel"][mm] > 0.5 * m["host"][mm]
    bound = kt.launch_bound_calls()
    assert ("loop", 1) in bound and ("mm", 1) not in bound
    # pass by pass, a call's host range holds its children's (ranges nest as the calls do)
    raw = kt.raw_samples
    assert (raw[("", 1)] >= raw[("loop", 1)] + raw[("mm", 1)]).all()


def test_profile_with_kernels_gives_the_columns_in_every_view_and_the_csv(one_thread, tmp_path):
    model = Net()
    r = profile(model, (256,), batch_size=64, per_layer="kernels", repeat=5, roofline=False)
    df = r.to_dataframe()
    for c in KERNEL_COLUMNS:
        assert c in df.columns, c
    body = df[df.leaf]
    root = df[df.module == ""].iloc[0]
    # the leaf and (self) rows add up to the root's kernel and timeline times exactly
    assert body.kernel_ms.sum() == pytest.approx(root.kernel_ms, rel=1e-9)
    assert body.timeline_ms.sum() == pytest.approx(root.timeline_ms, rel=1e-9)
    assert (df.timeline_ms == df.kernel_ms + df.idle_ms).all()
    loop = df[df.module == "loop"].iloc[0]
    assert bool(loop.launch_bound)
    notes = " ".join(r.timing_notes)
    assert (
        "launch-bound" in notes
        and "loop" in notes
        and "op time (kernel_ms) from torch.profiler" in notes
    )
    # on the CPU the per-layer latency is the call's host time
    assert loop.latency_ms == pytest.approx(loop.host_ms)
    path = tmp_path / "k.csv"
    r.to_csv(path)
    back = read_csv(path)
    assert back["launch_bound"].dtype == bool and back["kernel_ms"].dtype == np.float64
    np.testing.assert_allclose(back["kernel_ms"].to_numpy(), df["kernel_ms"].to_numpy())
    # the compact view (terminal, notebook, Markdown) shows the idle time and the verdict;
    # every column is there when asked for
    assert "device idle" in r.to_markdown() and "launch-bound" in r.to_html()
    assert "kernel time" in r.to_markdown(columns="all")


def test_the_stamps_stay_the_cpu_default():
    opts = TimingOptions.parse()
    assert opts.layer_instrument(torch.device("cpu")) == "stamps"
    assert opts.layer_instrument(torch.device("cuda")) == "kernels"
    assert TimingOptions.parse(per_layer="stamps").layer_instrument(torch.device("cuda")) == (
        "stamps"
    )


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"per_layer": "events"}, "per_layer='events'"),
        ({"latency_mode": "stream"}, "latency_mode='stream'"),
        ({"latency_mode": "pipelined", "transfer": True}, "pipelined"),
    ],
)
def test_bad_modes_are_refused_by_name(kw, word):
    with pytest.raises(ModelProfError, match=word):
        TimingOptions.parse(**kw)


def test_pipeline_group_sizes_samples():
    # about 20 ms of calls per sample, 2 to 64 calls: 1 ms calls -> 20; 0.01 ms -> 64 (cap);
    # 15 ms -> 2 (floor); unknown -> 8 (the H200's 4.3 ms resnet50 got 2 of 5 ms' worth)
    assert pipeline_group(1.0) == 20
    assert pipeline_group(0.01) == 64
    assert pipeline_group(15.0) == 2
    assert pipeline_group(None) == 8


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0

    def record(self, stream=None) -> None:
        import time

        self.t = time.perf_counter_ns()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) / 1e6


@pytest.fixture
def fake_gpu(monkeypatch):
    """The CUDA event clock for the CPU device, with fake events; counts synchronizes."""
    syncs: list = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(1))
    monkeypatch.setattr(
        runner_mod, "clock_for", lambda device, mode="auto": clock_mod.CudaEventClock(device)
    )
    return syncs


def test_measure_latency_modes_synchronize_per_sample_or_per_block(fake_gpu):
    calls = []

    def work() -> None:
        calls.append(1)
        spin(0.5)

    m = measure_latency(work, warmup=0, repeat=6)
    # the latency mode: one synchronize after each of the 6 samples, one call each
    assert m.n == 6 and len(fake_gpu) == 6 and len(calls) == 6
    fake_gpu.clear()
    calls.clear()
    p = measure_latency(work, warmup=2, repeat=6, latency_mode="pipelined")
    # pipelined: 2 warm-up calls (which size the group: about 20 ms of calls per sample, so
    # 2 to 40 of these 0.5 ms calls), then 6 samples of `group` back-to-back calls, one
    # synchronize per block; each sample is the span over `group`, never below the spin
    group = p.env["calls_per_sample"]
    assert p.env["latency_mode"] == "pipelined" and 2 <= group <= 40
    assert p.n == 6 and len(calls) == 2 + 6 * group
    assert len(fake_gpu) == len(set(p.blocks.tolist()))
    assert (p.samples_ms >= 0.5 - 1e-6).all()


def test_what_helps_times_the_variants_interleaved_and_says_what_was_left_out(monkeypatch):
    # CUDA graphs and the compiler stand in as a faster spin and a failure: the comparison is
    # interleaved, the ratio below 1 with its interval, the failed variant named with its reason
    from modelprof.runtime.execution import RunMode
    from modelprof.runtime.inputs import ModelInputs
    from modelprof.timing import helps

    class Slow(nn.Module):
        def forward(self, x):
            spin(1.0)
            return x

    monkeypatch.setattr(helps, "_graphed", lambda call: lambda: spin(0.25))

    def no_compiler(*a):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(helps, "_compiled", no_compiler)
    # the variants are timed by the GPU's clock (fake events here), as the model would be
    syncs: list = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(1))
    monkeypatch.setattr(torch.cuda, "device", lambda device=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # the variants give back the device's random state too (measure_latencies): a fake one
    rng: list = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: torch.zeros(1))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: rng.append(1))
    monkeypatch.setattr(
        runner_mod, "clock_for", lambda device, mode="auto": clock_mod.CudaEventClock(device)
    )
    mi = ModelInputs((torch.zeros(2),), {}, torch.device("cuda"), torch.float32, 3, None)
    result, left_out = helps.what_helps(
        Slow(), mi, RunMode(), TimingOptions.parse(repeat=12, warmup=1, warn=False)
    )
    assert set(result.measurements) == {"eager", "cuda_graph"}
    assert rng  # the device's random state was put back
    for m in result.measurements.values():  # on the device's clock, at the inputs' batch
        # "cuda" here, "cuda:0" where a real GPU makes its device current
        assert m.env["mode"]["clock"] == "cuda_event" and m.batch_size == 3
        assert torch.device(m.device).type == "cuda"
    assert len(syncs) >= 2 * 12  # a synchronize after every timed call (the latency mode)
    ratio, lo, hi = result.ratios["cuda_graph"]
    # a 0.25 ms spin against a 1 ms one: about 0.25x; load only lengthens either, so the
    # ratio stays well below 1 (the graph's spin is 4x shorter); its interval, the per-round
    # ratios' own, need not hold it (a ratio that agrees may lie just outside)
    assert ratio < 0.75 and not lo > hi
    assert left_out == ["compile: RuntimeError: no compiler here"]
    note = helps.helps_note(result, left_out)
    assert "cuda_graph" in note and "x eager (95% CI" in note and "left out: compile" in note


def test_the_latency_share_of_a_kernels_run_divides_by_the_root(one_thread):
    # the shares are of the root's time (its kernels on a GPU, where the pass's wall also holds
    # the GPU's idle waits; the H200's resnet50 root read 11.59 % of the wall): the root row is
    # 100 %, and each row's share is its latency over the root's
    model = Net()
    r = profile(model, (256,), batch_size=64, per_layer="kernels", repeat=5, roofline=False)
    df = r.to_dataframe()
    root = df[df.module == ""].iloc[0]
    assert root.latency_pct == pytest.approx(100.0)
    np.testing.assert_allclose(df.latency_pct, 100.0 * df.latency_ms / root.latency_ms)


def test_a_profiler_already_running_is_not_cancelled():
    # starting a second profiler session cancels the user's own (kineto: "Cancelling current
    # trace request"); the kernels instrument refuses instead, naming the way out
    model = nn.Sequential(nn.Linear(4, 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with pytest.raises(ModelProfError, match="per_layer='stamps'"):
            time_kernels(model, make_inputs(model, (4,)), repeat=2, warmup=0)
        model(torch.zeros(1, 4))
    assert any(e.key == "aten::linear" for e in prof.key_averages())  # the user's trace kept


def test_backward_time_goes_to_the_forward_calls_and_the_gradients_come_back(one_thread):
    # a 512 x 512 matmul layer and a relu: the matmul's backward (two matmuls) is charged to
    # the linear's call, the relu's to the relu's; the root's backward is their sum exactly
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU())
    marker = torch.ones(512)
    model[0].bias.grad = marker  # a gradient the user had: given back as it was
    kt = time_kernels(
        model, make_inputs(model, (512,), batch_size=64), repeat=3, warmup=1, backward=True
    )
    bwd = kt.backward_kernel_ms()
    assert bwd[("0", 1)] > bwd[("1", 1)] > 0.0
    assert bwd[("", 1)] == pytest.approx(
        bwd[("0", 1)] + bwd[("1", 1)] + float(np.median(kt.backward_busy_ms, axis=0)[0]), rel=1e-12
    )
    assert model[0].bias.grad is marker and model[0].weight.grad is None
    with pytest.raises(ModelProfError, match="backward=True"):
        time_kernels(model, make_inputs(model, (512,)), repeat=2).backward_kernel_ms()


def test_pipelined_refuses_what_needs_work_between_calls(fake_gpu):
    # a cold cache is flushed before every call: back to back there is no "before"
    with pytest.raises(ModelProfError, match="latency_mode='pipelined'.*cold_cache"):
        measure_latency(
            lambda: spin(0.1), warmup=1, repeat=3, latency_mode="pipelined", cold_cache=True
        )


class Scale(nn.Module):
    """An op on a tensor that needs no gradient: it makes no autograd node, yet records the
    number the next node will get."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class MM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w)


def test_backward_goes_to_the_op_that_made_the_node_not_an_earlier_one(one_thread):
    # Scale's multiply and MM's mm record the same sequence number (only mm makes a node):
    # the mm's backward belongs to MM, the call that made the node (the review's repro gave
    # all of it to Scale)
    model = nn.Sequential(Scale(), MM())
    kt = time_kernels(
        model, make_inputs(model, (256,), batch_size=256), repeat=3, warmup=1, backward=True
    )
    bwd = kt.backward_kernel_ms()
    assert bwd[("1", 1)] > 0.0 and bwd[("0", 1)] == 0.0


class Annotated(nn.Module):
    """A block whose forward opens a record_function range around its children (as DDP's
    forward does): a range, not an op."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = MM(), MM()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("my_block"):
            return self.b(self.a(x))


def test_a_users_record_function_range_does_not_take_its_childrens_ops(one_thread):
    model = Annotated()
    kt = time_kernels(model, make_inputs(model, (256,), batch_size=256), repeat=3, warmup=1)
    m = kt.medians()
    where = {k: i for i, k in enumerate(kt.order)}
    # each matmul's op time is its own call's; the block's own part holds no matmul
    assert m["kernel"][where[("a", 1)]] > 0 and m["kernel"][where[("b", 1)]] > 0
    assert m["kernel_self"][where[("", 1)]] < 0.5 * m["kernel"][where[("a", 1)]]


def test_channels_last_with_named_modules(one_thread):
    # the modules named on the model are found on its channels_last copy
    from modelprof.runtime.hooks import module_names

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    kt = time_kernels(
        model,
        make_inputs(model, (3, 8, 8)),
        modules=module_names(model),
        channels_last=True,
        repeat=2,
        warmup=0,
    )
    assert kt.order == [("", 1), ("0", 1), ("1", 1)]


class Caught(nn.Module):
    """Its child raises on every call and it catches the error (a fallback path)."""

    def __init__(self) -> None:
        super().__init__()
        self.bad, self.good = Raises(), MM()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.bad(x)
        except RuntimeError:
            return self.good(x)


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no fast path")


def test_a_caught_error_leaves_the_ranges_nested_as_the_calls(one_thread):
    model = Caught()
    kt = time_kernels(model, make_inputs(model, (256,), batch_size=64), repeat=3, warmup=1)
    m = kt.medians()
    where = {k: i for i, k in enumerate(kt.order)}
    # the failed call's range was closed when it raised: the matmul after it is good's own
    assert m["kernel"][where[("good", 1)]] > 0 and m["kernel"][where[("bad", 1)]] == 0
    assert m["kernel_self"][where[("", 1)]] < m["kernel"][where[("good", 1)]]


def test_the_floor_extension_can_be_switched_off():
    # floor_extend_s=0: a budget that stops below min_samples is not extended (a run that is
    # undersampled on purpose, as the ranks' test worker's): said as undersampled, not extended
    m = measure_latency(lambda: spin(20.0), warmup=0, budget_s=0.05, floor_extend_s=0, warn=False)
    assert m.n < 10 and m.undersampled and not m.extended_s
    with pytest.raises(ModelProfError, match="floor_extend_s"):
        TimingOptions.parse(floor_extend_s=-1)
