"""Roofline: per-row closed forms, device table look-ups and the measured probe."""
from __future__ import annotations

import math
import time
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from modelprof.errors import ModelProfError
from modelprof.roofline import (
    KNOWN_DEVICES,
    ROOFLINE_COLUMNS,
    Peaks,
    add_roofline,
    lookup_peaks,
    match_device,
    probe_peaks,
)
from test_render_fixture import report_frame

PEAKS = Peaks(peak_flops=1e12, peak_bytes=1e11, source="user", device="toy", dtype="float32")


def _rows() -> pd.DataFrame:
    return pd.DataFrame({
        "module": ["mem", "compute", "untimed", "empty", "flops_only"],
        "flops": [2_000_000_000, 20_000_000_000, 2_000_000_000, 0, 1_000_000_000],
        "read_bytes": [600_000_000, 60_000_000, 600_000_000, 0, 0],
        "write_bytes": [400_000_000, 40_000_000, 400_000_000, 0, 0],
        "latency_ms": [20.0, 40.0, np.nan, 0.5, 0.0],
    })


def test_memory_bound_row_closed_form() -> None:
    row = add_roofline(_rows(), PEAKS).iloc[0]
    # bytes 6e8 + 4e8 = 1e9; compute 2e9 / 1e12 = 2 ms; memory 1e9 / 1e11 = 10 ms -> 10 ms, memory
    assert row["roofline_ms"] == pytest.approx(10.0)
    assert row["bound"] == "memory"
    assert row["intensity"] == pytest.approx(2.0)  # 2e9 FLOP / 1e9 B
    assert row["achieved_gflops"] == pytest.approx(100.0)  # 2e9 FLOP / 20 ms = 1e11 FLOP/s
    assert row["achieved_gbps"] == pytest.approx(50.0)  # 1e9 B / 20 ms = 5e10 B/s
    assert row["efficiency"] == pytest.approx(0.5)  # 10 ms roof / 20 ms measured


def test_compute_bound_row_closed_form() -> None:
    row = add_roofline(_rows(), PEAKS).iloc[1]
    # compute 2e10 / 1e12 = 20 ms; memory 1e8 / 1e11 = 1 ms -> 20 ms, compute bound
    assert row["roofline_ms"] == pytest.approx(20.0)
    assert row["bound"] == "compute"
    assert row["intensity"] == pytest.approx(200.0)  # 2e10 / 1e8, above the ridge 1e12/1e11 = 10
    assert row["achieved_gflops"] == pytest.approx(500.0)  # 2e10 / 40 ms = 5e11 FLOP/s
    assert row["efficiency"] == pytest.approx(0.5)  # 20 / 40


def test_rows_without_latency_keep_the_static_columns_only() -> None:
    row = add_roofline(_rows(), PEAKS).iloc[2]
    assert math.isnan(row["achieved_gflops"]) and math.isnan(row["achieved_gbps"])
    assert math.isnan(row["efficiency"])
    assert row["roofline_ms"] == pytest.approx(10.0) and row["bound"] == "memory"


def test_zero_rows_give_nan_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = add_roofline(_rows(), PEAKS)
    empty, flops_only = out.iloc[3], out.iloc[4]
    assert empty["roofline_ms"] == 0.0 and pd.isna(empty["bound"])  # no work: no bound
    assert math.isnan(empty["intensity"])
    assert empty["achieved_gflops"] == 0.0  # 0 FLOP in 0.5 ms
    assert math.isnan(flops_only["intensity"])  # no bytes: intensity undefined
    assert flops_only["bound"] == "compute"  # 1 ms of compute, 0 ms of traffic
    assert math.isnan(flops_only["efficiency"])  # latency 0 is not a measurement


def test_add_roofline_appends_columns_without_touching_the_input() -> None:
    df = _rows()
    before = df.copy()
    out = add_roofline(df, PEAKS)
    pd.testing.assert_frame_equal(df, before)
    assert list(out.columns) == list(df.columns) + list(ROOFLINE_COLUMNS)
    again = add_roofline(out, PEAKS)  # replaces rather than duplicates
    pd.testing.assert_frame_equal(again, out)


def test_add_roofline_on_an_untimed_report() -> None:
    out = add_roofline(report_frame(timed=False), PEAKS)
    assert out["achieved_gflops"].isna().all() and out["efficiency"].isna().all()
    # conv1: 13824 FLOP / 1e12 = 1.38e-8 s; (1200 + 1024) B / 1e11 = 2.22e-8 s -> memory bound
    conv1 = out.iloc[1]
    assert conv1["bound"] == "memory"
    assert conv1["roofline_ms"] == pytest.approx(2224 / 1e11 * 1e3)


def test_add_roofline_errors() -> None:
    with pytest.raises(ModelProfError, match=r"\['read_bytes', 'write_bytes'\]"):
        add_roofline(pd.DataFrame({"flops": [1]}), PEAKS)
    with pytest.raises(ModelProfError, match="Peaks"):
        add_roofline(_rows(), {"peak_flops": 1.0})  # type: ignore[arg-type]


@pytest.mark.parametrize("field, value", [("peak_flops", 0.0), ("peak_bytes", -1.0),
                                          ("peak_flops", math.nan)])
def test_peaks_must_be_positive(field: str, value: float) -> None:
    kwargs = {"peak_flops": 1e12, "peak_bytes": 1e11, field: value}
    with pytest.raises(ModelProfError, match=field):
        Peaks(**kwargs)


def test_peaks_source_and_ridge() -> None:
    assert PEAKS.ridge_intensity == pytest.approx(10.0)  # 1e12 / 1e11 FLOP per byte
    with pytest.raises(ModelProfError, match="'guess'"):
        Peaks(1.0, 1.0, source="guess")


@pytest.mark.parametrize(
    "torch_name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("H100 SXM", "H100 SXM"),
    ],
)
def test_match_device_names_as_torch_reports_them(torch_name: str, key: str) -> None:
    assert match_device(torch_name) == key


def test_unknown_devices_do_not_match() -> None:
    assert match_device("AMD EPYC 7R13 Processor") is None
    assert match_device("NVIDIA L40") is None  # not L4, not L40S
    assert lookup_peaks("AMD EPYC", "float32") is None


def test_lookup_peaks_values() -> None:
    h100 = lookup_peaks("NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert h100 is not None and h100.source == "table" and h100.dtype == "bfloat16"
    assert h100.peak_flops == pytest.approx(989.4e12)  # dense BF16, half the sparse 1979
    assert h100.peak_bytes == pytest.approx(3.35e12)
    a100 = lookup_peaks("NVIDIA A100-SXM4-80GB", "tf32")
    assert a100 is not None and a100.peak_flops == pytest.approx(156e12)
    assert a100.peak_bytes == pytest.approx(2039e9)
    fp32 = lookup_peaks("NVIDIA A100-SXM4-80GB", "fp32")
    assert fp32 is not None and fp32.peak_flops == pytest.approx(19.5e12)  # CUDA cores


def test_lookup_peaks_without_a_tensor_core_path() -> None:
    assert lookup_peaks("Tesla T4", "bfloat16") is None  # Turing has no BF16 tensor cores
    v100 = lookup_peaks("Tesla V100-SXM2-16GB", "tf32")
    assert v100 is not None and v100.peak_flops == pytest.approx(15.7e12)  # no TF32: fp32 rate
    with pytest.raises(ModelProfError, match="int8"):
        lookup_peaks("Tesla T4", torch.int8)


def test_known_devices_are_consistent() -> None:
    for key, spec in KNOWN_DEVICES.items():
        assert match_device(key) == key
        assert spec.bandwidth > 0 and spec.float32 > 0 and spec.source
        for rate in (spec.tf32, spec.float16, spec.bfloat16):
            assert rate is None or rate >= spec.float32, key  # tensor cores never slower


def test_probe_peaks_on_cpu_is_short_and_plausible() -> None:
    start = time.perf_counter()
    peaks = probe_peaks("cpu", torch.float32)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0  # ~1 s budget plus set-up
    assert peaks.source == "probe" and peaks.dtype == "float32" and peaks.device
    # any CPU that runs the suite: between 0.1 GFLOP/s and 100 TFLOP/s, 0.1 GB/s and 10 TB/s
    assert 1e8 < peaks.peak_flops < 1e14
    assert 1e8 < peaks.peak_bytes < 1e13


def test_probe_peaks_with_fixed_sizes_and_a_tf32_request() -> None:
    peaks = probe_peaks("cpu", "tf32", matmul_size=128, copy_bytes=1 << 20, repeats=2)
    assert peaks.dtype == "tf32"
    assert torch.get_float32_matmul_precision() == "highest"  # restored after the probe


@pytest.mark.parametrize("kwargs, fragment", [
    ({"device": "meta"}, "meta"),
    ({"device": "nonsense"}, "nonsense"),
    ({"dtype": torch.int32}, "int32"),
    ({"repeats": 0}, "repeats"),
    ({"budget_s": 0.0}, "budget_s"),
])
def test_probe_peaks_rejects_bad_options(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ModelProfError, match=fragment):
        probe_peaks(**{"device": "cpu", **kwargs})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_probe_peaks_on_cuda_is_below_the_datasheet() -> None:
    name = torch.cuda.get_device_name()
    peaks = probe_peaks("cuda", torch.bfloat16)
    assert peaks.device == name and peaks.source == "probe"
    table = lookup_peaks(name, torch.bfloat16)
    if table is not None:
        # a measurement cannot beat the datasheet by much, and a healthy GPU reaches a fair share
        assert 0.2 * table.peak_flops < peaks.peak_flops < 1.1 * table.peak_flops
        assert 0.3 * table.peak_bytes < peaks.peak_bytes < 1.1 * table.peak_bytes
