"""The GPU's SM clock read after every block (issue 36, point 5): a GPU that changes speed
while measuring (power or thermal limits; clocks that drop while it waits on the host: the
H200 read 345 MHz idle against 1,980 MHz at most) warns once, and the clocks travel in the JSON
export. The reader is NVML's (``runtime.env.sm_clock_reader``); here a fake stands in for it
on the CPU, so the wiring from the Runner to the Measurement is what is tested."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from helpers import blocked

from modelprof import GpuClockWarning, measure_latency
from modelprof.runtime.env import sm_clock_reader
from modelprof.timing import runner
from modelprof.timing.interleave import measure_latencies
from modelprof.timing.measurement import CLOCK_MOVED_FRACTION, Measurement


def _quiet(clocks: list[float]) -> Measurement:
    """Three blocks of identical samples: nothing else to warn of."""
    samples = np.full(30, 2.0)
    return Measurement(
        samples, device="cuda:0", blocks=np.repeat([0, 1, 2], 10), sm_clock_mhz=clocks
    )


def _warnings(m: Measurement) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m.warn_if_noisy()
        m.warn_if_noisy()  # once only
    return w


def test_a_clock_within_five_percent_does_not_warn() -> None:
    # 1980 / 1890 - 1 = 4.76 % <= 5 %
    m = _quiet([1980, 1890, 1980])
    assert m.sm_clock_moved == pytest.approx(1980 / 1890 - 1)
    assert not m.clock_moved and CLOCK_MOVED_FRACTION == 0.05
    assert _warnings(m) == []
    assert "SM clock 1890-1980 MHz" in repr(m) and "MOVED" not in repr(m)


def test_a_clock_that_moved_warns_once_with_both_readings() -> None:
    # 1980 / 1755 - 1 = 12.8 % > 5 %
    m = _quiet([1755, 1980, 1980])
    assert m.clock_moved
    got = _warnings(m)
    assert [type(w.message) for w in got] == [GpuClockWarning]
    text = str(got[0].message)
    assert "1755 to 1980 MHz over 3 blocks" in text and "cuda:0" in text
    assert "(MOVED)" in repr(m)


def test_no_clock_no_judgement_and_the_json_round_trip() -> None:
    m = _quiet([1755, 1980, 1980])
    d = m.to_dict()
    assert d["sm_clock_mhz"] == [1755.0, 1980.0, 1980.0]
    assert (d["sm_clock_min_mhz"], d["sm_clock_max_mhz"]) == (1755.0, 1980.0)
    back = Measurement.from_dict(d)
    assert back.sm_clock_mhz.tolist() == [1755.0, 1980.0, 1980.0] and back.clock_moved
    plain = Measurement(np.full(30, 2.0), blocks=np.repeat([0, 1, 2], 10))
    assert plain.sm_clock_moved is None and not plain.clock_moved
    assert "sm_clock_min_mhz" not in plain.stats() and "sm_clock_mhz" not in plain.to_dict()


def test_no_reader_off_cuda() -> None:
    assert sm_clock_reader(torch.device("cpu")) is None


def _fake_reader(monkeypatch: pytest.MonkeyPatch, readings: list[int | None]) -> list[str]:
    """Every device gets a reader giving ``readings`` in turn (the last one repeated); the
    devices asked for."""
    asked: list[str] = []

    def reader_for(device: torch.device):
        asked.append(str(device))
        it = itertools.chain(readings, itertools.repeat(readings[-1]))
        return lambda: next(it)

    monkeypatch.setattr(runner, "sm_clock_reader", reader_for)
    return asked


def test_the_runner_reads_the_clock_after_every_block(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_reader(monkeypatch, [1980, 1500])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m = measure_latency(lambda: None, repeat=40, warmup=1, min_blocks=4)
    assert asked == ["cpu"]
    # one reading per block taken, in order: the first block's, then 1500 for every later one
    assert m.n_blocks >= 2 and m.sm_clock_mhz.size == m.n_blocks
    assert m.sm_clock_mhz[0] == 1980 and set(m.sm_clock_mhz[1:].tolist()) == {1500}
    assert any(isinstance(x.message, GpuClockWarning) for x in w)


def test_a_failed_read_gives_no_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_reader(monkeypatch, [1980, None])
    m = measure_latency(lambda: None, repeat=40, warmup=1, min_blocks=4, warn=False)
    assert m.n_blocks >= 2 and m.sm_clock_mhz is None


def test_interleaved_candidates_each_get_their_blocks_clocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = _fake_reader(monkeypatch, [1980])
    ms = measure_latencies({"a": lambda: None, "b": lambda: None}, repeat=30, warmup=1, warn=False)
    assert asked == ["cpu", "cpu"]
    for m in ms.measurements.values():
        assert m.sm_clock_mhz.size == m.n_blocks and not m.clock_moved


def test_the_nvml_reader_leaves_the_models_warnings_shown_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NVML's reader itself (a stand-in pynvml module), read after every block: it must not
    # enter warnings.catch_warnings, whose exit forgets which warnings were shown, so a warning
    # the model gives on every call printed again after every block (54 times in 56 blocks)
    import sys
    import types

    from modelprof.runtime import env

    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(env, "gpu_uuid", lambda index: "GPU-0")
    reader = env._nvml_sm_clock.__wrapped__(0)
    assert reader() == 1980
    monkeypatch.setattr(runner, "sm_clock_reader", lambda device: reader)

    def warns() -> None:
        warnings.warn("the model's own warning", UserWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("default")  # once per place, as outside a test
        m = measure_latency(warns, repeat=40, warmup=1, min_blocks=4, warn=False)
    assert m.n_blocks >= 4 and m.sm_clock_mhz.size == m.n_blocks
    assert [str(w.message) for w in got] == ["the model's own warning"]


def test_no_reader_without_a_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML numbers the GPUs by PCI order, CUDA as CUDA_VISIBLE_DEVICES says: without the uuid
    # the index could name another GPU, so no clock is read at all
    from modelprof.runtime import env

    monkeypatch.setattr(env, "gpu_uuid", lambda index: None)
    assert env._nvml_sm_clock.__wrapped__(0) is None


def test_a_drift_with_a_moved_clock_is_a_clock_warning() -> None:
    # the drifting blocks of test_timing_measurement's ramp (levels 10 * 1.02^b, b = 0..9, 20
    # samples each: a +19.5 % trend beyond its +-8.9 % interval) beside a clock that read 1980
    # then 1500 MHz (1980 / 1500 - 1 = 32 % > 5 %): the one warning names both, and is a
    # GpuClockWarning (a DriftWarning too) whatever order the checks run in; the clock was
    # once dropped when the drift came first (8 in 400 no-op runs)
    m = blocked(10.0 * 1.02 ** np.arange(10), device="cuda:0", sm_clock_mhz=[1980] + [1500] * 9)
    assert m.stable is False and m.clock_moved
    got = _warnings(m)
    assert [type(w.message) for w in got] == [GpuClockWarning]
    text = str(got[0].message)
    assert "drifted by +19.5 %" in text and "1500 to 1980 MHz over 10 blocks" in text
