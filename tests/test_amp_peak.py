"""Under autocast (``amp=``) the peak is of the dtype the matmuls ran in: the datasheet lookup,
the probe and ``Report.utilization`` take autocast's dtype, not the inputs' float32 (a user's
bf16 training step on an H100 was judged against the 67 TFLOP/s float32 figure, its MFU ~15x
high, and a CPU probe ran in float32, read low beside the bf16 layers and was blamed as
disturbed). Runs without ``amp`` keep the inputs' dtype (and TF32 where it is on)."""

from __future__ import annotations

import importlib
import types

import pytest
import torch
from torch import nn

import modelprof
from modelprof.timing.peaks import Peaks, autocast_dtype, peak_dtype

# The H100 SXM datasheet's dense rates (modelprof.timing.peaks.KNOWN_DEVICES, NVIDIA's sheet):
# FP32 67 TFLOP/s (no tensor cores), TF32 494.7 and BF16 989.4 TFLOP/s (the "with sparsity"
# 989.4 and 1979 halved: the table holds dense rates only).
H100_FP32, H100_TF32, H100_BF16 = 67e12, 494.7e12, 989.4e12
H100 = "NVIDIA H100 80GB HBM3"  # torch's name for an H100 SXM


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))


def _step(**kw) -> modelprof.Report:
    """The user's mixed-precision training step, counted only (no probe, no time)."""
    return modelprof.profile(_mlp(), torch.randn(64, 512), backward=True, timing=False, **kw)


@pytest.mark.parametrize(
    ("dtype", "amp", "tf32", "expected"),
    [
        (torch.float32, torch.bfloat16, False, "bfloat16"),  # autocast runs the matmuls in bf16
        ("float32", "torch.float16", False, "float16"),  # a report's env holds the names
        (torch.float32, torch.bfloat16, True, "bfloat16"),  # TF32 is for float32 matmuls only
        (torch.float32, None, False, "float32"),  # no autocast: the inputs' dtype, as before
        (torch.float32, False, True, "tf32"),  # as before: float32 on TF32 tensor cores
        (torch.bfloat16, None, False, "bfloat16"),
        (torch.float64, torch.bfloat16, False, "float64"),  # autocast leaves float64 alone
    ],
)
def test_peak_dtype_is_autocasts_dtype_under_amp(dtype, amp, tf32, expected) -> None:
    assert peak_dtype(dtype, amp, tf32=tf32) == expected
    assert autocast_dtype(dtype, amp) == (expected if amp and expected != "float64" else None)


def test_an_amp_training_step_is_judged_against_the_bfloat16_datasheet_peak() -> None:
    amp = _step(amp=torch.bfloat16).utilization(peak="H100 SXM")
    # the peak of the dtype the matmuls ran in (bf16), as a bf16 model's: 989.4 TFLOP/s, not 67
    assert amp.convention.peaks.peak_flops == H100_BF16
    assert amp.convention.peaks.dtype == "bfloat16"
    assert amp.by_peak.keys() == {"datasheet"}
    line = amp.convention.describe()
    assert "peak 989.40 TFLOP/s bfloat16 (the autocast dtype the matmuls ran in)" in line
    cast = _step(dtype=torch.bfloat16).utilization(peak="H100 SXM")
    assert cast.convention.peaks == amp.convention.peaks
    assert "autocast" not in cast.convention.describe()
    plain = _step().utilization(peak="H100 SXM")  # without amp: float32, as before
    assert plain.convention.peaks.peak_flops == H100_FP32
    assert "peak 67.00 TFLOP/s float32, " in plain.convention.describe()


def test_the_default_datasheet_peak_under_amp_on_a_gpu_with_tf32_on() -> None:
    # the device's own datasheet peak (peak=None), a report said to have run on an H100 with
    # TF32 matmuls on: float32 is judged at TF32's 494.7, autocast's bf16 at 989.4 TFLOP/s
    for kw, flops, dtype in (({}, H100_TF32, "tf32"), ({"amp": "bf16"}, H100_BF16, "bfloat16")):
        report = _step(**kw)
        report.device = "cuda:0"
        report.env.update(device_name=H100, tf32_matmul=True)
        u = report.utilization()
        assert (u.convention.peaks.peak_flops, u.convention.peaks.dtype) == (flops, dtype)


def test_a_given_peak_of_another_dtype_says_which_dtype_the_matmuls_ran_in() -> None:
    given = Peaks(peak_flops=1e12, peak_bytes=1e11, source="user", dtype="float32")
    line = _step(amp=torch.float16).utilization(peak=given).convention.describe()
    assert "peak 1.00 TFLOP/s float32 (the matmuls ran in float16 under autocast), " in line


def _fake_probe(asked: list):
    def probe(device, dtype, **kw):
        asked.append(dtype)
        return Peaks(peak_flops=1e12, peak_bytes=1e11, source="probe", dtype=str(dtype))

    return probe


@pytest.mark.parametrize(
    ("amp", "dtype", "table_flops"),
    [(torch.bfloat16, "bfloat16", H100_BF16), (None, "float32", H100_FP32)],
)
def test_the_probe_and_the_table_peaks_are_of_the_autocast_dtype(
    monkeypatch, amp, dtype, table_flops
) -> None:
    profile_module = importlib.import_module("modelprof.profile")  # the module, not the function
    asked: list = []
    monkeypatch.setattr(profile_module, "probe_peaks", _fake_probe(asked))
    mi = types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
    env = {"device_name": H100}
    peaks = profile_module._peaks(None, mi, env, amp)
    assert asked == [dtype] and peaks.dtype == dtype
    assert env["roofline_peaks"]["dtype"] == dtype
    assert env["roofline_table_peaks"]["dtype"] == dtype
    assert env["roofline_table_peaks"]["peak_flops"] == table_flops


@pytest.mark.filterwarnings("ignore::modelprof.errors.NoisyMeasurementWarning")  # loaded
def test_a_timed_amp_profile_records_a_bfloat16_probe(monkeypatch) -> None:
    profile_module = importlib.import_module("modelprof.profile")
    asked: list = []
    monkeypatch.setattr(profile_module, "probe_peaks", _fake_probe(asked))
    report = modelprof.profile(nn.Linear(8, 8), (8,), amp=torch.bfloat16, repeat=3, warmup=1)
    assert asked == ["bfloat16"]
    assert report.env["roofline_peaks"]["dtype"] == "bfloat16"
    assert report.peaks.dtype == "bfloat16"


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_amp_on_a_float64_run_is_refused_naming_both(amp) -> None:
    # autocast leaves float64 alone: before, nothing ran at half precision while the caption
    # said "float64 under bfloat16 autocast"; refused as amp='int8' is, float64 from dtype=
    # or from the model's own parameters
    mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    for model, kw in ((mlp, {"dtype": torch.float64}), (mlp.double(), {})):
        with pytest.raises(modelprof.ModelProfError, match=r"amp=b?float16 on a float64 run"):
            modelprof.profile(model, (64,), batch_size=4, timing=False, amp=amp, **kw)
    report = modelprof.profile(mlp.float(), (64,), batch_size=4, timing=False, amp=amp)
    assert " under " in report._dtype_words()  # float32 under autocast: counted, as before
    # the timers refuse it too: measure_latency's, and each point of a throughput search
    double = mlp.double()
    with pytest.raises(modelprof.ModelProfError, match=r"amp=b?float16 on a float64 run"):
        modelprof.measure_latency(double, (64,), amp=amp, budget_s=0.05)
    with pytest.raises(modelprof.ModelProfError, match=r"amp=b?float16 on a float64 run"):
        modelprof.measure_throughput(double, (64,), amp=amp, max_batch=2, budget_s=0.05)
