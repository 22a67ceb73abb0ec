"""The CPU-time clock: ``clock="cpu"`` (thread CPU time for one intra-op thread, process CPU time
for several, stated which), and the CPU time read beside the wall clock by default. A FAKE clock
(virtual time: wall 3x the CPU time, as load would make it) stands in for a loaded machine."""

from __future__ import annotations

import pytest
import torch
from fake_clock import VirtualSpin, install
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.timing import measure_latency
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
    # (3 ms the sample's). Each CPU-time read here takes 1 ms of wall: none lands in a wall span
    clock = install(monkeypatch)
    clock.factor = 3.0
    timer = CpuClock(torch.device("cpu"))

    def slow_read() -> int:
        clock.wall_ns += 1_000_000
        return clock.thread_ns

    timer._cpu = slow_read
    phases = [lambda: clock.advance(1.0), lambda: clock.advance(2.0)]
    got = timer.time(phases, 4, between=lambda: clock.advance(5.0))
    assert got.tolist() == [[3.0, 6.0]] * 4
    [parts] = timer.cpu_parts
    assert parts.tolist() == [[1.0, 2.0]] * 4 and timer.cpu_ms[0].tolist() == [3.0] * 4


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
