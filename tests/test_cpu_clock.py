"""The CPU-time clock: ``clock="cpu"`` (thread CPU time for one intra-op thread, process CPU time
for several, stated which), and the CPU time read beside the wall clock by default. A FAKE clock
(virtual time: wall 3x the CPU time, as load would make it) stands in for a loaded machine."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from fake_clock import VirtualSpin, install
from torch import nn

import modelprof.timing.clock as clock_module
from modelprof.errors import ModelProfError
from modelprof.timing import measure_latency
from modelprof.timing.calibration import Spin
from modelprof.timing.clock import CpuClock, CpuTimeClock, clock_for
from modelprof.timing.options import TimingOptions

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")


def test_the_cpu_clock_is_named_by_the_thread_count():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert clock_for(torch.device("cpu"), "cpu").kind == "thread_time_ns"
        assert CpuClock(torch.device("cpu")).cpu_kind == "thread_time"
        torch.set_num_threads(2)
        assert clock_for(torch.device("cpu"), "cpu").kind == "process_time_ns"
    finally:
        torch.set_num_threads(threads)
    assert isinstance(clock_for(torch.device("cpu"), "cpu"), CpuTimeClock)


def test_the_cpu_clock_refuses_other_devices_and_bad_extension_is_named():
    opts = TimingOptions.parse(clock="cpu")
    with pytest.raises(ModelProfError, match="clock='cpu'.*meta"):
        opts.check_device(torch.device("meta"))
    with pytest.raises(ModelProfError, match="clock='cpu'"):
        clock_for(torch.device("meta"), "cpu")
    with pytest.raises(ModelProfError, match="layer_extend_s=-1"):
        TimingOptions.parse(layer_extend_s=-1)
    assert TimingOptions.parse(layer_extend_s=0).layer_extend_s == 0.0


def test_the_cpu_time_of_each_phase_is_read_outside_every_wall_span(monkeypatch):
    # a sample of two phases, 1 and 2 ms of work with the wall at 3x (load), after 5 ms of
    # untimed work: the wall reads 3 and 6 ms, the CPU time beside it 1 and 2 ms phase by phase
    # (3 ms the sample's). Each CPU-time read here, of either clock (the thread's, and the
    # process's for the thread's share), takes 1 ms of wall: none lands in a wall span
    clock = install(monkeypatch)
    clock.factor = 3.0
    fake = clock_module.time

    def slow(read):
        def reading() -> int:
            clock.wall_ns += 1_000_000
            return read()

        return reading

    monkeypatch.setattr(fake, "thread_time_ns", slow(fake.thread_time_ns))
    monkeypatch.setattr(fake, "process_time_ns", slow(fake.process_time_ns))
    timer = CpuClock(torch.device("cpu"))
    phases = [lambda: clock.advance(1.0), lambda: clock.advance(2.0)]
    got = timer.time(phases, 4, between=lambda: clock.advance(5.0))
    assert got.tolist() == [[3.0, 6.0]] * 4
    [parts] = timer.cpu_parts
    assert parts.tolist() == [[1.0, 2.0]] * 4 and parts.sum(axis=1).tolist() == [3.0] * 4
    assert timer.other_parts[0].tolist() == [[1.0, 2.0]] * 4  # the other clock, phase by phase


def test_cpu_time_beside_the_wall_clock_and_as_the_clock(monkeypatch):
    clock = install(monkeypatch)
    clock.factor = 3.0  # every virtual ms of work takes 3 ms of wall time
    model = nn.Sequential(VirtualSpin(clock, 2.0))
    x = torch.zeros(1, 4)
    wall = measure_latency(model, inputs=x, repeat=12, warmup=1)
    # the wall clock reads 3 x 2 ms; the CPU time beside it the work's 2 ms
    assert wall.median_ms == pytest.approx(6.0) and wall.cpu.median_ms == pytest.approx(2.0)
    assert wall.wall_over_cpu == pytest.approx(3.0) and wall.loaded
    assert wall.cpu_clock in ("thread_time", "process_time")
    assert "CPU work" in repr(wall) and "loaded" in repr(wall)
    assert wall.to_dict()["cpu_ms"] == pytest.approx([2.0] * 12)
    # clock="cpu": the samples are the CPU time itself, and the env says which clock
    cpu = measure_latency(model, inputs=x, repeat=12, warmup=1, clock="cpu")
    assert cpu.median_ms == pytest.approx(2.0)
    assert cpu.env["mode"]["clock"] in ("thread_time_ns", "process_time_ns")


def test_a_profile_on_the_cpu_clock_says_so():
    # clock="cpu": the report's env and its summary name the CPU clock the runs read, as
    # measure_latency's env does (docs/timing.md: env["mode"]["clock"])
    from modelprof import profile
    from modelprof.timing.clock import cpu_time_source

    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    r = profile(model, (16,), clock="cpu", repeat=12, warmup=1, roofline=False)
    name = cpu_time_source()[0]  # thread_time with one intra-op thread, else process_time
    assert r.env["mode"]["clock"] == r.latency.env["mode"]["clock"] == f"{name}_ns"
    # several threads' process time is their work, above the latency: said so
    tail = ")" if name == "thread_time" else ", all threads' work, not a latency)"
    assert f"(clean end-to-end runs, CPU time: {name}_ns{tail}" in r.summary()
    plain = profile(model, (16,), repeat=12, warmup=1, roofline=False)
    assert plain.env["mode"]["clock"] == "perf_counter_ns"  # the wall clock's, on the CPU
    assert "CPU time:" not in plain.summary()


class _VirtualBackward(torch.autograd.Function):
    """Identity forward; a backward of ``ms`` of virtual work."""

    @staticmethod
    def forward(ctx, x, clock, ms):
        ctx.clock, ctx.ms = clock, ms
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.advance(ctx.ms)
        return grad, None, None


class _SpinsBack(nn.Module):
    def __init__(self, clock, ms: float) -> None:
        super().__init__()
        self.clock, self.ms = clock, ms

    def forward(self, x):
        return _VirtualBackward.apply(x, self.clock, self.ms)


def test_a_loaded_training_step_states_its_backward_cpu_work(monkeypatch):
    # a backward of 2 ms of work with the wall at 3x (load): the clean backward reads 6 ms of
    # wall and, read phase by phase, 2 ms of CPU work; the summary states it, as the
    # loaded-machine warning tells the reader to quote it
    from modelprof import profile

    clock = install(monkeypatch)
    clock.factor = 3.0
    model = nn.Sequential(nn.Linear(4, 4), VirtualSpin(clock, 1.0), _SpinsBack(clock, 2.0))
    report = profile(model, (4,), backward=True, repeat=5, warmup=1, roofline=False, warn=False)
    backward = report.training_step.timing.backward
    assert backward.median_ms == pytest.approx(6.0) and backward.cpu.median_ms == 2.0
    assert backward.loaded and "backward CPU work 2.000 ms" in report.training_step.summary()


class _SharedBackward(_VirtualBackward):
    """A backward of ``ms`` of virtual work, half of it on another thread."""

    @staticmethod
    def backward(ctx, grad):
        ctx.clock.thread_share = 0.5
        ctx.clock.advance(ctx.ms)
        ctx.clock.thread_share = 1.0
        return grad, None, None


def test_each_phase_of_a_step_states_the_calling_threads_share_of_its_own_cpu_work(monkeypatch):
    # a forward of 1 ms of work all on the calling thread, a backward of 2 ms half on another:
    # the forward's share 1/1, the backward's 1/2, the step's (1 + 1) / (1 + 2) = 2/3; the loss
    # and the optimizer spin nothing on the virtual clock (no CPU time read: no share)
    from modelprof import profile

    clock = install(monkeypatch)
    spins_back = _SpinsBack(clock, 2.0)
    spins_back.forward = lambda x: _SharedBackward.apply(x, clock, 2.0)
    model = nn.Sequential(nn.Linear(4, 4), VirtualSpin(clock, 1.0), spins_back)
    report = profile(model, (4,), backward=True, repeat=5, warmup=1, roofline=False, warn=False)
    timing = report.training_step.timing
    assert timing.forward.cpu_thread_share == pytest.approx(1.0)
    assert timing.backward.cpu_thread_share == pytest.approx(0.5)
    assert timing.step.cpu_thread_share == pytest.approx(2 / 3)
    assert timing.loss.cpu_thread_share is None


def test_a_training_comparison_ranks_the_whole_steps_beside_the_forwards(monkeypatch):
    # "light": a 2 ms forward and a 1 ms backward, "heavy": 1 ms and 3 ms, on the virtual
    # clock (the Linears take none of it). The forwards rank heavy first (1 < 2 ms); the whole
    # steps light first (2 + 1 = 3 ms against 1 + 3 = 4 ms: 4/3, every round alike, an
    # interval of [4/3, 4/3] that excludes 1)
    from modelprof import compare

    clock = install(monkeypatch)

    def model(forward_ms, backward_ms):
        spins = (VirtualSpin(clock, forward_ms), _SpinsBack(clock, backward_ms))
        return nn.Sequential(nn.Linear(4, 4), *spins)

    def compared():
        models = {"light": model(2.0, 1.0), "heavy": model(1.0, 3.0)}
        return compare(models, (4,), backward=True, repeat=6, warmup=1, roofline=False, warn=False)

    df = compared()
    assert df["rank"].tolist() == [2, 1] and df["step_rank"].tolist() == [1, 2]
    assert df.loc["heavy", "step_latency_x"] == pytest.approx(4 / 3)
    assert df.attrs["step_ranked_by"] == "latency" and "step_tied" not in df.attrs
    # the readable table heads it by what it ranks; a loaded machine (every ms of work takes 3
    # of wall) ranks the steps by their CPU work, as the forwards (one thread's work: the
    # calling thread's CPU time is all of it)
    assert "step rank (1 = lowest step latency)" in df.render.export("markdown", standalone=False)
    clock.factor = 3.0
    loaded = compared()
    assert loaded.attrs["ranked_by"] == loaded.attrs["step_ranked_by"] == "cpu_work"
    assert loaded["step_rank"].tolist() == [1, 2]
    assert any(
        n.startswith("step_rank: by each whole training step's CPU work")
        for n in loaded.attrs["notes"]
    )


def _one_cpu_read_ms() -> float:
    """What one read of the calling thread's CPU clock costs here (ms; the least of five runs of
    1000 reads, so that load can only raise it)."""
    import timeit

    return min(timeit.repeat(time.thread_time_ns, number=1000, repeat=5)) / 1000 * 1e3


def test_the_cpu_work_of_a_busy_forward_covers_the_wall_span_and_no_more():
    # a forward that busy-spins 50 us: its thread's CPU time over a sample's wall span is at
    # most that wall time, and about all of it. The CPU clocks' reads around the span (one
    # thread_time_ns read, about 0.5 us, and the process clock's) are taken off: before, each
    # sample's CPU time read their cost above its wall time (wall/CPU 0.95 on a 28 us call).
    # Allowed: half of one such read (the reads' cost after real work varies by a fraction
    # of it); load only stretches the wall (CPU - wall lower still)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the thread's own CPU clock
    try:
        lat = measure_latency(nn.Sequential(Spin(0.05)), inputs=torch.zeros(1), repeat=300)
    finally:
        torch.set_num_threads(threads)
    slack = _one_cpu_read_ms() / 2
    assert lat.cpu_clock == "thread_time"
    assert np.median(lat.cpu_ms - lat.samples_ms) <= slack
    assert lat.cpu.median_ms <= lat.median_ms + slack
    assert lat.wall_over_cpu >= 1 - slack / lat.cpu.median_ms
    assert lat.cpu.median_ms >= 0.9 * lat.median_ms  # nearly all of the span was work


@pytest.mark.filterwarnings("ignore::modelprof.errors.LoadedMachineWarning")
def test_the_cpu_work_of_a_sleeping_forward_is_far_below_its_wall():
    # a forward that sleeps 2 ms: its thread works a few us of it (the call, the sleep's
    # syscall), its wall at least the 2 ms; a tenth bounds the CPU work at 200 us
    class Sleep(nn.Module):
        def forward(self, x):
            time.sleep(0.002)
            return x

    lat = measure_latency(Sleep(), inputs=torch.zeros(1), repeat=20)
    assert lat.cpu.median_ms < 0.1 * lat.median_ms


def test_an_empty_phases_cpu_work_is_never_below_zero(monkeypatch):
    # the tare (the reads' median cost) taken off leaves about half of an empty phase's
    # samples below its median: below 0 they would be CPU work less than nothing, and a
    # Measurement over them a negative median or interval; they read 0 there. A CPU clock
    # whose reads jitter by 0, 2 or 4 us (read i adds (i mod 3) x 2 us): an empty phase's CPU
    # time (two reads) then ranges -4 .. +4 us around its true ~0.1 us, its median near 0
    reads = iter(range(10**9))

    def jittery() -> int:
        return time.perf_counter_ns() + next(reads) % 3 * 2000

    monkeypatch.setattr(clock_module, "cpu_time_source", lambda: ("thread_time", jittery))
    clock = CpuClock(torch.device("cpu"))
    clock.time([lambda: None], 401)
    assert (clock.cpu_parts[-1] >= 0).all()
    assert (clock.cpu_parts[-1] > 0).any()  # (not all cut to 0: the upper half stands)
