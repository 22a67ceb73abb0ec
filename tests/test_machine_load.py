"""Load that wall/CPU cannot see: torch's threads spin while one of them waits for a core, so
with several threads their CPU time grows with the wall time (a resnet18 on two threads of this
2-core VM read wall/CPU 0.50 quiet and 1.00 beside two busy loops, its median 23.9 against
951.2 ms: benchmarks/machine_load.py, docs/timing.md). What other
processes took of the cores (``/proc/stat``) shows it: ``competing_cores``, ``loaded``, and a
CPU work quoted only where it is one thread's."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from fake_clock import VirtualSpin, hit_and_spared, install
from helpers import Fn

from modelprof import compare, measure_latencies, measure_latency
from modelprof.errors import LoadedMachineWarning
from modelprof.report.roofline import peak_notes
from modelprof.runtime import env
from modelprof.runtime.env import MachineShare, busy_ns
from modelprof.timing.clock import thread_share
from modelprof.timing.measurement import (
    CPU_ONE_THREAD_SHARE,
    LOADED_COMPETING_CORES,
    SHARED_CORE_WALL_OVER_CPU,
    Measurement,
    load_stretch,
    unquotable,
)

# fields: user nice system idle iowait irq softirq steal guest guest_nice
_STAT = (
    "cpu  11 22 33 4400 55 66 77 88 0 0\n"
    "cpu0 1 2 3 400 5 6 7 8 9 10\n"
    "cpu1 10 20 30 4000 50 60 70 80 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 678\n"
)


def test_busy_time_is_the_usable_cores_user_system_irq_and_steal():
    # cpu0: 1 + 2 + 3 + 6 + 7 + 8 = 27 ticks busy (idle 400, iowait 5 and the guest time, in
    # user already, left out); cpu1: 10 + 20 + 30 + 60 + 70 + 80 = 270; at 10 ms a tick
    assert busy_ns(_STAT, {0}, 1e7) == 27 * 10**7
    assert busy_ns(_STAT, {1}, 1e7) == 270 * 10**7
    # every core: the per-core lines (the summed "cpu" line is not counted twice)
    assert busy_ns(_STAT, None, 1e7) == busy_ns(_STAT, {0, 1}, 1e7) == 297 * 10**7
    assert busy_ns(_STAT, {5}, 1e7) == 0  # a core the file does not list


def test_competing_cores_is_other_work_over_wall_time_beyond_the_idle_cores(monkeypatch):
    share = MachineShare()
    share.spare = 0
    readings = iter(
        [
            (0, 0, 0),  # (busy ns of the cores, this process's CPU ns, wall ns)
            (2_000_000_000, 1_000_000_000, 1_000_000_000),
            (10_000_000_000, 5_000_000_000, 5_000_000_000),
            (10_500_000_000, 5_500_000_000, 5_500_000_000),
            (20_000_000_000, 9_000_000_000, 9_000_000_000),
            None,  # /proc/stat unreadable at the end of a window: it counts nothing
        ]
    )
    monkeypatch.setattr(share, "_now", lambda: next(readings))
    assert share.competing_cores is None  # no window yet
    with share:
        pass
    # 2 s busy, 1 s of it this process's, over 1 s of wall time: 1 core of other work
    assert share.competing_cores == pytest.approx(1.0)
    with share:
        pass
    # a second window: 0.5 s busy, all of it this process's; (1 + 0) s over (1 + 0.5) s
    assert share.competing_cores == pytest.approx(1.0 / 1.5)
    with share:
        pass
    assert share.competing_cores == pytest.approx(1.0 / 1.5)
    # one idle core beside torch's threads takes up to 1 core of other work: 0.667 - 1 -> 0
    share.spare = 1
    assert share.competing_cores == 0.0


def test_no_share_off_linux_or_switched_off_and_a_short_window_carries_its_ticks(monkeypatch):
    short = MachineShare()
    short.spare, short.usable, short.tick_ns = 0, 2, 1e7
    readings = iter([(0, 0, 0), (4 * 10**8, 10**8, 4 * 10**8)])  # 0.4 s: 0.75 core of others
    monkeypatch.setattr(short, "_now", lambda: next(readings))
    assert short.competing_cores is None and short.margin == 0.0  # nothing read yet
    with short:
        pass
    # under MIN_SHARE_S (0.5 s) the 10 ms ticks of /proc/stat are a margin on the figure (a
    # throughput point sampled for 0.14 s had none and escaped the load its neighbours read):
    # a tick on each of the 2 cores over 0.4 s
    assert env.MIN_SHARE_S == 0.5 and short.wall_ns == 4 * 10**8
    assert short.competing_cores == pytest.approx(0.75)
    assert short.margin == pytest.approx(2 * 1e7 / 4e8)
    off = MachineShare(on=False)  # a device run, or the CPU time as the clock
    assert off._now() is None
    monkeypatch.setattr(env, "_PROC_STAT", "/nonexistent/proc/stat")
    assert MachineShare()._now() is None


def _measured(cpu_clock: str, competing: float | None, share: float | None = None) -> Measurement:
    # 40 samples of 10 ms whose CPU time equals the wall time (wall/CPU 1.00: several
    # threads that spin while they wait read so under load), in 8 blocks
    cpu = 10.0 + np.random.default_rng(0).normal(0.0, 0.01, 40)
    blocks = np.repeat(np.arange(8), 5)
    return Measurement(
        cpu.copy(),
        blocks=blocks,
        timestamps_s=blocks * 0.1,
        cpu_ms=cpu,
        cpu_clock=cpu_clock,
        competing_cores=competing,
        cpu_thread_share=share,
    )


def test_other_work_on_the_needed_cores_is_load_and_several_threads_cpu_work_is_not_quoted():
    m = _measured("process_time", 1.03, share=0.5)  # the calling thread did half the work
    assert m.wall_over_cpu == pytest.approx(1.0) and m.loaded and not m.cpu_holds
    with pytest.warns(LoadedMachineWarning) as rec:
        assert m.warn_if_noisy()
    text = str(rec[0].message)
    assert "other work took 1.03 cores' worth of the cores it needed" in text
    assert "is several threads', which load stretches too" in text
    assert "torch.set_num_threads(k) for k cores left idle" in text  # no thread count read
    assert "quote the CPU work" not in text
    # with torch's thread count read: 4 threads less 1.03 cores of other work leave
    # floor(2.97) = 2; 2 threads leave floor(0.97) = 0, so 1 (the least, whose CPU work
    # waiting cannot stretch); 1 thread has no fewer to ask for: there the advice is only a
    # quieter machine, never the thread count already in use
    for threads, advice in (
        (4, "torch.set_num_threads(2): other work took 1.03 of the cores its 4 threads need"),
        (2, "torch.set_num_threads(1): other work took 1.03 of the cores its 2 threads need"),
        (1, "time again on a quieter machine"),
    ):
        counted = dataclasses.replace(m, env={"torch_num_threads": threads})
        with pytest.warns(LoadedMachineWarning) as rec:
            counted.warn_if_noisy()
        assert advice in str(rec[0].message)
        assert (threads == 1) == ("set_num_threads" not in str(rec[0].message))
    assert "loaded: other work took 1.03" in repr(m)
    # the figure is kept through to_dict and back
    back = Measurement.from_dict(m.to_dict())
    assert back.competing_cores == pytest.approx(1.03) and back.loaded
    assert back.cpu_thread_share == pytest.approx(0.5) and not back.cpu_holds
    assert m.stats()["competing_cores"] == pytest.approx(1.03) and m.stats()["loaded"]
    # a process time the calling thread did 90 % or more of is one thread's work: it holds
    assert _measured("process_time", 1.03, share=CPU_ONE_THREAD_SHARE).cpu_holds
    assert not _measured("process_time", 1.03, share=0.89).cpu_holds
    assert not _measured("process_time", 1.03).cpu_holds  # no share read: not known to hold


def test_one_threads_cpu_work_is_quoted_under_load_and_a_little_other_work_is_none():
    m = _measured("thread_time", 0.5)
    assert m.loaded and m.cpu_holds
    with pytest.warns(LoadedMachineWarning) as rec:
        m.warn_if_noisy()
    assert "quote the CPU work, median" in str(rec[0].message)
    # below a quarter core of other work (and wall = CPU time): a quiet machine's daemons
    quiet = _measured("process_time", LOADED_COMPETING_CORES - 0.01)
    assert not quiet.loaded and quiet.load_reason == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not quiet.warn_if_noisy()
    assert not _measured("thread_time", None).loaded  # none read (off Linux): wall/CPU alone


def test_a_loaded_comparison_of_several_threads_ranks_by_latency_and_says_why(
    monkeypatch, torch_threads
):
    # the honesty test's two identical 1 ms models, "load" hitting the first (wall 3x its CPU
    # time), but timed with two intra-op threads that share the work: process_time, half of it
    # on the calling thread, which load stretches too
    clock = install(monkeypatch)
    clock.thread_share = 0.5
    models = hit_and_spared(clock)
    torch_threads(2)
    with pytest.warns(LoadedMachineWarning, match="several threads'"):
        df = compare(models, (4,), repeat=12, warmup=1, roofline=False)
    assert df.loc["hit", "wall_over_cpu"] == pytest.approx(3.0)
    # the table says which run was loaded: the hit one's wall 3x its CPU time, the other 1x
    assert df["loaded"].tolist() == [True, False]
    assert df.attrs["ranked_by"] == "latency"
    assert df["rank"].tolist() == [2, 1]  # wall: 3 ms against 1 ms
    notes = [n for n in df.attrs["notes"] if n.startswith("ranked by latency on a loaded")]
    assert len(notes) == 1 and "wall/CPU 3.00" in notes[0]
    assert not any(n.startswith("ranked by CPU work") for n in df.attrs["notes"])


def test_several_threads_that_left_the_work_to_the_calling_one_rank_by_cpu_work(
    monkeypatch, torch_threads
):
    # the same, but torch's second thread did none of the work (a model of small ops, or pure
    # Python): the process time is the calling thread's, which waiting for a core cannot stretch
    models = hit_and_spared(install(monkeypatch))
    torch_threads(2)
    with pytest.warns(LoadedMachineWarning, match="quote the CPU work"):
        df = compare(models, (4,), repeat=12, warmup=1, roofline=False)
    assert df.attrs["ranked_by"] == "cpu_work" and df["rank"].tolist() == [1, 1]
    assert any(n.startswith("ranked by CPU work (process_time)") for n in df.attrs["notes"])


def test_a_python_loop_timed_with_several_threads_is_the_calling_threads_work(torch_threads):
    # 2 ms of this thread's CPU time a call, spun in Python: torch's second thread has nothing
    # to do, so the process time is the calling thread's (its share ~1, whatever the load)
    def spin():
        end = time.thread_time_ns() + 2_000_000
        while time.thread_time_ns() < end:
            pass

    torch_threads(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = measure_latency(spin, repeat=30, warmup=2)
    assert m.cpu_clock == "process_time"
    assert m.cpu_thread_share >= CPU_ONE_THREAD_SHARE and m.cpu_holds


@pytest.mark.skipif(
    not (os.path.exists("/proc/stat") and hasattr(os, "sched_getaffinity")),
    reason="the other work's share is read from Linux's /proc/stat",
)
def test_busy_processes_on_every_core_read_as_competing_cores(torch_threads):
    # as many spinning processes as usable cores, and torch on as many threads: on n cores each
    # of the 2n gets about half a core, so the others' share is about n / 2 >= 0.5 core, above
    # the quarter core that is load, whatever else the machine runs (more load: more share)
    cores = len(os.sched_getaffinity(0))
    spin = "import sys\nprint('go', flush=True)\nwhile True:\n    pass\n"
    procs = [
        subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        for _ in range(cores)
    ]
    try:
        for p in procs:  # each is spinning before the timing starts
            assert p.stdout.readline() == "go\n"
        torch_threads(cores)
        x = torch.randn(768, 768)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wall0, own0 = time.perf_counter(), time.process_time()
            # 2 x 768^3 = 0.9 GFLOP a call: 100 calls outlast MIN_SHARE_S on any CPU here
            m = measure_latency(lambda: x @ x, repeat=100, warmup=3)
            own = (time.process_time() - own0) / (time.perf_counter() - wall0)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)
            p.stdout.close()
    assert m.competing_cores is not None and m.competing_cores >= LOADED_COMPETING_CORES
    assert m.loaded and "other work took" in m.load_reason
    # this process's own CPU time is not counted as other work: the cores' busy time less it
    # (own: its share of the cores over the same run, warm-up in it too) is all others can have
    assert m.competing_cores <= cores - own + 0.25


def test_a_short_windows_reading_is_load_beyond_its_ticks_margin():
    # 0.50 cores read over 0.14 s on 2 cores (a tick each: +-0.14) is load; 0.30 is not
    # beyond its ticks, but what it can stretch is judged at its most (0.44: 2.57x)
    m = dataclasses.replace(_measured("thread_time", 0.50), competing_cores_margin=0.14)
    assert m.loaded and "other work took 0.50 (±0.14 in its ticks) cores' worth" in m.load_reason
    assert m.to_dict()["competing_cores_margin"] == 0.14
    assert Measurement.from_dict(m.to_dict()).competing_cores_margin == 0.14
    low = _waiting(0.30, wall_over_cpu=2.5)  # at most 1.86x from 0.30 cores: waited
    assert low.waited and not dataclasses.replace(low, competing_cores_margin=0.14).waited
    assert not dataclasses.replace(
        _measured("thread_time", 0.30), competing_cores_margin=0.14
    ).loaded
    from modelprof.timing.peaks import Peaks

    probe = Peaks(1e11, 1e10, source="probe", wall_over_cpu=1.0, competing_cores=0.30)
    assert probe.loaded and not dataclasses.replace(probe, competing_cores_margin=0.14).loaded


def _other_work(monkeypatch, cores: float) -> None:
    """``/proc/stat`` as if other work took ``cores`` of the cores torch's threads need: the
    cores' busy time is this process's CPU time plus that work and the idle cores' worth."""
    spare = MachineShare().spare
    monkeypatch.setattr(env, "_PROC_STAT", __file__)  # any file that reads
    monkeypatch.setattr(
        env,
        "busy_ns",
        lambda *_: int(time.process_time_ns() + (spare + cores) * time.perf_counter_ns()),
    )


def _spin(x):
    end = time.thread_time_ns() + 1_000_000  # 1 ms of this thread's CPU, no tensor op
    while time.thread_time_ns() < end:
        pass
    return x


def test_a_run_sampled_under_half_a_second_still_reads_the_load(monkeypatch, one_thread):
    # a throughput point sampled for 0.14 s (batch 8: 152 samples, wall/CPU 0.99 on one
    # thread) had competing_cores None and was not loaded while its neighbours were
    from modelprof import measure_throughput

    _other_work(monkeypatch, 0.9)
    # every window counts as short, however long a loaded VM stretches these runs (no
    # duration asserted): the ticks' margin is then read (2 cores over 0.2 s: 0.1, far from
    # 0.9 - 0.25; it stays below 0.65 for any window above 0.03 s)
    monkeypatch.setattr(env, "MIN_SHARE_S", 3600.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = measure_latency(_spin, inputs=torch.ones(1), budget_s=0.2, warmup=1)
        curve = measure_throughput(Fn(_spin), (1,), max_batch=2, budget_s=0.2, warmup=1)
    assert m.competing_cores == pytest.approx(0.9, abs=0.01)
    assert 0 < m.competing_cores_margin and m.loaded and "other work took 0.90" in m.load_reason
    for p in curve.points:
        assert p.measurement.competing_cores == pytest.approx(0.9, abs=0.01) and p.loaded
    assert curve.to_dataframe()["latency_rough"].all()


def test_a_roofline_probe_beside_other_work_is_loaded_and_says_so():
    from modelprof.timing.peaks import Peaks

    probed = Peaks(
        peak_flops=1e11, peak_bytes=1e10, source="probe", device="cpu", wall_over_cpu=1.0
    )
    busy = dataclasses.replace(probed, competing_cores=0.6)
    assert not probed.loaded and busy.loaded  # wall/CPU 1.00 alone says nothing
    assert busy.load_reason == "other work took 0.60 cores' worth of the cores it needed"
    assert dataclasses.replace(probed, competing_cores=0.2).load_reason == ""
    # the table's note names it, where it used to read a wall/CPU that had not moved
    df = pd.DataFrame({"latency_ms": [1.0], "flops": [1e6], "memory_bytes": [1e5]})
    assert (
        "The probe ran on a busy machine (other work took 0.60 cores' worth of the cores it "
        "needed): every roof it measured reads low." in peak_notes(df, busy)
    )


def _waiting(
    competing: float | None, share: float | None = None, wall_over_cpu: float = 100.0
) -> Measurement:
    # 40 samples of 10 ms of wall whose calling thread spent 0.1 ms of CPU (wall/CPU 100)
    wall = 10.0 + np.random.default_rng(1).normal(0.0, 0.01, 40)
    blocks = np.repeat(np.arange(8), 5)
    return Measurement(
        wall,
        blocks=blocks,
        cpu_ms=wall / wall_over_cpu,
        cpu_clock="thread_time",
        competing_cores=competing,
        cpu_thread_share=share,
    )


def test_a_caller_that_waits_on_free_cores_is_not_loaded_and_its_cpu_time_is_not_the_work():
    # wall/CPU 100 with other work on no core: another thread (or a sleep, a device) did the
    # work; neither load nor a CPU figure to quote (a newcomer's offloaded resnet18 read
    # "loaded, wall/CPU 417.96, quote the CPU work" and ranked 430x faster than itself)
    m = _waiting(0.0)
    assert m.wall_over_cpu == pytest.approx(100, rel=1e-3)
    assert m.waited and not m.loaded and not m.cpu_holds and m.load_reason == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not m.warn_if_noisy()
    assert "waited: wall/CPU 100.00 with the cores free" in repr(m)
    # other work on more than the whole core the call needed: any wall/CPU may be load, and
    # the wall/CPU says so too
    busy = _waiting(1.2)
    assert busy.loaded and not busy.waited and "wall/CPU 100.00" in busy.load_reason
    # the cores not read (off Linux, clock="cpu"): wall/CPU alone, as before
    assert _waiting(None).loaded and not _waiting(None).waited
    # a thread's CPU time that is a tenth of the process's is not the work, loaded or not
    assert not _waiting(1.2, share=0.1).cpu_holds and _waiting(1.2, share=0.95).cpu_holds


def test_a_wall_beyond_what_the_load_read_can_stretch_waited_and_is_no_reason_of_load():
    # a tester's 600 ms sleep on a busy 2-core VM read wall/CPU 5952.57 beside 0.75 cores of
    # other work and was called loaded, "quote the CPU work, median 100.82 us": 0.75 cores can
    # stretch a one-thread call's median at most (1 + 0.75) / (1 - 0.75) = 7 times
    assert load_stretch(0.0) == 1.0 and load_stretch(0.5) == pytest.approx(3.0)
    assert load_stretch(0.75) == pytest.approx(7.0)
    assert load_stretch(1.0) == load_stretch(None) == math.inf
    sleep = _waiting(0.75, wall_over_cpu=5952.57)
    assert sleep.waited and not sleep.cpu_holds
    # the other work's 0.75 cores still load the machine (work another thread does for the
    # caller is slowed by it); the wall/CPU is no reason, and no CPU work is to be quoted
    assert sleep.loaded
    assert sleep.load_reason == "other work took 0.75 cores' worth of the cores it needed"
    with pytest.warns(LoadedMachineWarning) as caught:
        assert sleep.warn_if_noisy()
    assert "quote the CPU work" not in str(caught[0].message)
    assert "the caller's CPU work is not the work's" in str(caught[0].message)
    assert (
        "waited: wall/CPU 5952.57 beyond what other work on 0.75 cores' worth of the cores can "
        "stretch (at most 7.00)" in repr(sleep)
    )
    # what that load can stretch is load: the docs' one thread beside two busy loops (wall/CPU
    # 1.45, 0.30 cores) and the same 0.75 cores at wall/CPU 5
    explained = _waiting(0.30, wall_over_cpu=1.45)
    assert explained.loaded and not explained.waited and "wall/CPU 1.45" in explained.load_reason
    assert _waiting(0.75, wall_over_cpu=5.0).loaded and _waiting(0.75, wall_over_cpu=5.0).cpu_holds
    # a probe's roofs are judged alike
    from modelprof.timing.peaks import Peaks

    probe = Peaks(1e11, 1e10, source="probe", wall_over_cpu=5952.57, competing_cores=0.75)
    assert probe.loaded  # by its 0.75 cores of other work, not its wall/CPU
    waiting = Peaks(1e11, 1e10, source="probe", wall_over_cpu=5952.57, competing_cores=0.1)
    assert not waiting.loaded  # 0.1 cores: no load, a wait


def test_a_sleeping_callable_beside_other_work_waited(monkeypatch, one_thread):
    # end to end: a 20 ms sleep spends microseconds of CPU (wall/CPU in the hundreds on any
    # machine) and the cores read 0.75 cores of other work, which can stretch it 7x at most;
    # the ticks' margin is held at 0 too (it is read from this run's windows: CI read 0.24,
    # and 0.99 cores can stretch it 199x, above the 172 that run's sleep read)
    monkeypatch.setattr(MachineShare, "competing_cores", property(lambda self: 0.75))
    monkeypatch.setattr(MachineShare, "margin", property(lambda self: 0.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = measure_latency(lambda x: (time.sleep(0.02), x)[1], inputs=torch.ones(1), repeat=4)
    assert m.competing_cores == 0.75 and m.wall_over_cpu > 7.0
    assert m.waited and not m.cpu_holds and "wall/CPU" not in m.load_reason
    loaded = [w for w in caught if issubclass(w.category, LoadedMachineWarning)]
    assert all("quote the CPU work" not in str(w.message) for w in loaded)
    assert "quote the CPU work" not in repr(m) and "waited: wall/CPU" in repr(m)


def test_the_thread_clock_reads_the_process_clock_beside_it_for_the_callers_share():
    # thread_time's samples beside the process's: 1 ms of 4 ms is a quarter; process_time's
    # beside the thread's: 3 of 4 ms; any other clock has none
    assert thread_share("thread_time", 1.0, 4.0) == pytest.approx(0.25)
    assert thread_share("process_time", 4.0, 3.0) == pytest.approx(0.75)
    assert thread_share("thread_time", 1.0, 0.0) is None and thread_share(None, 1.0, 1.0) is None


def test_work_another_thread_does_is_ranked_by_latency_whatever_the_load(one_thread):
    # the same 3 ms of thread CPU time, spun in Python by the calling thread or by a worker
    # thread it waits for: the offloaded one's caller did almost none of the process's CPU
    # time, so its CPU work is not offered and the comparison ranks by latency (before, the
    # caller's thread time ranked it hundreds of times faster, quiet or loaded)
    def spin() -> None:
        end = time.thread_time_ns() + 3_000_000
        while time.thread_time_ns() < end:
            pass

    def offloaded() -> None:
        worker = threading.Thread(target=spin)
        worker.start()
        worker.join()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = measure_latencies({"direct": spin, "offloaded": offloaded}, budget_s=1.0)
    off = t["offloaded"]
    assert off.cpu_clock == "thread_time" and off.cpu_thread_share < 0.5 and not off.cpu_holds
    assert t.ranked_by == "latency"


def test_more_threads_than_cores_is_said_and_one_a_core_is_not(torch_threads) -> None:
    from modelprof import profile

    cores = os.cpu_count()
    model = torch.nn.Linear(8, 8)
    torch_threads(cores + 2)  # two threads with no core of their own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (their turns may read as load: not the point)
        crowded = profile(model, (8,), repeat=3, warmup=1, budget_s=0.2)
    said = [n for n in crowded.timing_notes if "oversubscribed" in n]
    assert said == [
        f"torch ran {cores + 2} threads on {cores} cores (oversubscribed): they took turns on "
        "the cores, so each op waited for threads without one and the times read slower than "
        f"with torch.set_num_threads({cores}) or fewer"
    ]
    torch_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = profile(model, (8,), repeat=3, warmup=1, budget_s=0.2)
    assert not any("oversubscribed" in n for n in alone.timing_notes)
    # not timed: nothing ran to be slowed, nothing said
    torch_threads(cores + 2)
    assert profile(model, (8,), timing=False).timing_notes == []


def test_a_calling_threads_cpu_work_is_called_a_part_not_several_threads():
    # thread_time is one thread's clock (the median of 40 draws about 10 ms: 9.999 ms here,
    # a fixed seed): where the calling thread did half the process's CPU
    # time (a DDP reducer's or another helper thread's the rest), its figure is a part of the
    # work, not "several threads'"
    m = _measured("thread_time", 1.03, share=0.5)
    assert m.loaded and not m.cpu_holds and not m.waited
    with pytest.warns(LoadedMachineWarning) as rec:
        m.warn_if_noisy()
    text = str(rec[0].message)
    assert "the calling thread's CPU work, 9.999 ms (thread_time), is a part of the work" in text
    assert "several threads'" not in text


def test_the_ranking_note_gives_advice_that_fits_the_run():
    from modelprof.timing.interleave import loaded_latency_notes

    several = _measured("process_time", 1.03, share=0.5)  # loaded, several threads' CPU work
    one = dataclasses.replace(several, env={"torch_num_threads": 1})
    two = dataclasses.replace(several, env={"torch_num_threads": 2})
    (note,) = loaded_latency_notes([two])
    assert "so does the CPU work of several threads" in note
    # Measurement.threads_hint's rule: 2 threads less 1.03 cores of other work leave 1
    assert note.endswith(
        "or with torch.set_num_threads(1): other work took 1.03 of the cores its 2 threads need"
    )
    (note,) = loaded_latency_notes([one])  # already one thread: nothing fewer to ask for
    assert "so does the CPU work of several threads" in note
    assert "set_num_threads" not in note and note.endswith("time again on a quieter machine")
    # a caller that waited: wall 10 ms over 2 ms of CPU (5x) beside 0.5 cores of other work,
    # which can stretch a wall at most (1 + 0.5) / (1 - 0.5) = 3x; loaded by the 0.5 cores
    wall = np.full(40, 10.0)
    blocks = np.repeat(np.arange(8), 5)
    waited = Measurement(
        wall, blocks=blocks, timestamps_s=blocks * 0.1, cpu_ms=wall / 5,
        cpu_clock="thread_time", competing_cores=0.5, env={"torch_num_threads": 2},
    )  # fmt: skip
    assert waited.waited and waited.loaded and not waited.cpu_holds
    (note,) = loaded_latency_notes([waited])
    assert "the CPU work is no figure either (the timed thread waited on other work)" in note
    assert "several threads" not in note and "set_num_threads" not in note


def test_a_loaded_training_comparison_on_one_thread_advises_no_thread_count(
    monkeypatch, one_thread
):
    # a compare(backward=True) at torch.set_num_threads(1) beside 1.03 cores of other work, the
    # calling thread doing half of each spin's CPU time (another thread the rest): its CPU work
    # does not hold, so the notes say time again; never with the one thread already in use
    # (before, the training steps' note advised torch.set_num_threads(1) whatever the run used)
    clock = install(monkeypatch)
    clock.thread_share = 0.5
    monkeypatch.setattr(MachineShare, "competing_cores", property(lambda self: 1.03))
    monkeypatch.setattr(MachineShare, "margin", property(lambda self: 0.0))

    class SpunBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            clock.advance(1.0)
            return grad

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.spin = torch.nn.Linear(4, 4), VirtualSpin(clock, 1.0)

        def forward(self, x):
            return self.spin(SpunBackward.apply(self.linear(x)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = compare({"a": Model(), "b": Model()}, (4,), backward=True, repeat=12, warmup=1)
    loaded = [n for n in df.attrs["notes"] if "on a loaded machine" in n]
    assert any(n.startswith("the training steps ran on a loaded machine") for n in loaded)
    assert any(n.startswith("ranked by latency on a loaded machine") for n in loaded)
    for note in loaded:
        assert "set_num_threads" not in note and note.endswith("time again on a quieter machine")


def test_a_wall_far_above_the_cpu_beside_a_core_of_other_work_quotes_cpu_work_on_condition(
    monkeypatch, one_thread
):
    # a trial's 5 ms sleep on a 2-core VM beside a core of other work read "loaded (wall/CPU
    # 74.62: the work waited for a core) ... quote the CPU work, median 68.71 us", 1/75 of its
    # latency: from a whole core of other work on, load can stretch any wall/CPU
    # (load_stretch is unbounded), so it is not `waited`; but above SHARED_CORE_WALL_OVER_CPU
    # (4: three busy threads queued on its core throughout) a wait explains it as well, and the
    # CPU work is quoted only if the work waits on nothing but a core
    clock = install(monkeypatch)
    monkeypatch.setattr(MachineShare, "competing_cores", property(lambda self: 1.03))
    monkeypatch.setattr(MachineShare, "margin", property(lambda self: 0.0))

    class Sleep(torch.nn.Module):
        def forward(self, x):
            clock.advance(0.05)  # 50 us of CPU work (and of wall)
            clock.wall_ns += 5_000_000  # then a 5 ms sleep: wall alone
            return x

    def measured(model: torch.nn.Module) -> tuple[Measurement, str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = measure_latency(model, inputs=torch.ones(1), repeat=12, warmup=1)
        loaded = [str(w.message) for w in caught if issubclass(w.category, LoadedMachineWarning)]
        assert len(loaded) == 1
        return m, loaded[0]

    sleep, text = measured(Sleep())
    # wall/CPU = (0.05 + 5) / 0.05 = 101 per call, above 4: a wait explains it as well as load
    assert SHARED_CORE_WALL_OVER_CPU == 4.0 and sleep.wall_over_cpu == pytest.approx(101.0)
    assert sleep.loaded and not sleep.waited and sleep.cpu_holds and sleep.wait_unclear
    assert "quote the CPU work, median" not in text
    assert (
        "the CPU work, median 50.00 us (thread_time), is the work's only if the work waits on "
        "nothing but a core (no sleep, I/O, other thread or device): its wall/CPU 101.00 is "
        "above the 4 that sharing cores usually explains" in text
    )
    assert "or on other work (a sleep, I/O, another thread, a device)" in sleep.load_reason
    assert unquotable(sleep) == [
        "the machine was loaded (quote the CPU work only if it waits on nothing but a core)"
    ]
    # the same load stretching a 1 ms CPU-bound spin 2x (a core shared with one busy thread):
    # its CPU work is quoted outright, as before
    busy, text = measured(hit_and_spared(clock, ms=1.0, factor=2.0)["hit"])
    assert busy.wall_over_cpu == pytest.approx(2.0) and busy.cpu_holds and not busy.wait_unclear
    assert "quote the CPU work, median 1.000 ms (thread_time)" in text and "only if" not in text
    assert unquotable(busy) == ["the machine was loaded (quote the CPU work)"]


def test_a_loaded_figure_whose_cpu_work_does_not_hold_names_none_to_quote() -> None:
    # 2 threads' process CPU time, the caller's share 0.5 (< CPU_ONE_THREAD_SHARE 0.9): several
    # threads' work, which load stretches too; and a run whose CPU time was not read at all.
    # Both loaded by 1.5 cores of other work; neither has a CPU work to quote, so the reason a
    # report, a sweep or a comparison gives must not say "quote the CPU work"
    wall = [5.0, 5.1, 5.2, 5.0, 5.1, 5.3]
    threads = Measurement(
        wall,
        cpu_ms=[2.5, 2.5, 2.6, 2.5, 2.5, 2.6],
        cpu_clock="process_time",
        cpu_thread_share=0.5,
        competing_cores=1.5,
    )
    unread = Measurement(wall, competing_cores=1.5)
    for m in (threads, unread):
        assert m.loaded and not m.cpu_holds
        assert unquotable(m) == ["the machine was loaded (no CPU work to quote)"]
