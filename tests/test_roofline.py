"""Roofline: per-row closed forms, device table look-ups and the measured probe."""

from __future__ import annotations

import dataclasses
import math
import time
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from test_render_fixture import report_frame

from modelprof.errors import ModelProfError
from modelprof.report.roofline import (
    ROOFLINE_COLUMNS,
    add_roofline,
    compute_roofs,
    judged_levels,
    observed_peaks,
    peak_notes,
    run_peaks,
    scattered,
    with_read_times,
)
from modelprof.runtime import env
from modelprof.timing.peaks import (
    KNOWN_DEVICES,
    MemoryLevel,
    Peaks,
    cache_levels,
    lookup_peaks,
    match_device,
    probe_peaks,
)

PEAKS = Peaks(peak_flops=1e12, peak_bytes=1e11, source="user", device="toy", dtype="float32")


def _rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "module": ["mem", "compute", "untimed", "empty", "flops_only"],
            "flops": [2_000_000_000, 20_000_000_000, 2_000_000_000, 0, 1_000_000_000],
            "read_bytes": [600_000_000, 60_000_000, 600_000_000, 0, 0],
            "write_bytes": [400_000_000, 40_000_000, 400_000_000, 0, 0],
            "latency_ms": [20.0, 40.0, np.nan, 0.5, 0.0],
        }
    )


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


@pytest.mark.parametrize(
    "field, value", [("peak_flops", 0.0), ("peak_bytes", -1.0), ("peak_flops", math.nan)]
)
def test_peaks_must_be_positive(field: str, value: float) -> None:
    kwargs = {"peak_flops": 1e12, "peak_bytes": 1e11, field: value}
    with pytest.raises(ModelProfError, match=field):
        Peaks(**kwargs)


def test_peaks_source_is_checked() -> None:
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
    # the probe's own work, not the wall clock (other processes on the machine stretch that):
    # a ~1 s budget plus set-up on each of the intra-op threads at most
    start = time.process_time()
    peaks = probe_peaks("cpu", torch.float32)
    cpu_s = time.process_time() - start
    assert cpu_s < 3.0 * torch.get_num_threads()
    assert peaks.source == "probe" and peaks.dtype == "float32" and peaks.device
    # any CPU that runs the suite: between 0.1 GFLOP/s and 100 TFLOP/s, 0.1 GB/s and 10 TB/s
    assert 1e8 < peaks.peak_flops < 1e14
    assert 1e8 < peaks.peak_bytes < 1e13


def test_probe_peaks_with_fixed_sizes_and_a_tf32_request() -> None:
    peaks = probe_peaks("cpu", "tf32", matmul_size=128, copy_bytes=1 << 20, repeats=2)
    assert peaks.dtype == "tf32"
    assert torch.get_float32_matmul_precision() == "highest"  # restored after the probe


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"device": "meta"}, "meta"),
        ({"device": "nonsense"}, "nonsense"),
        ({"dtype": torch.int32}, "int32"),
        ({"repeats": 0}, "repeats"),
        ({"budget_s": 0.0}, "budget_s"),
    ],
)
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


# --------------------------------------------------------------------------- memory levels

LEVELS = (
    MemoryLevel("L1", 64 * 1024, 400e9),
    MemoryLevel("L2", 1 << 20, 200e9),
    MemoryLevel("L3", 8 << 20, 100e9),
    MemoryLevel("DRAM", None, 10e9),
)
LEVEL_PEAKS = Peaks(peak_flops=1e12, peak_bytes=10e9, levels=LEVELS)


def _level_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "module": ["l1", "l2", "l3", "dram", "fast_l3", "untimed", "nothing"],
            "flops": [1000, 1000, 1000, 1000, 1000, 1000, 0],
            # working sets (read + write): 32 KiB, 512 KiB, 4 MiB, 64 MiB, 4 MiB, 512 KiB, 0
            "read_bytes": [16 << 10, 256 << 10, 2 << 20, 32 << 20, 2 << 20, 256 << 10, 0],
            "write_bytes": [16 << 10, 256 << 10, 2 << 20, 32 << 20, 2 << 20, 256 << 10, 0],
            # fast_l3 moves 4 MiB in 0.02 ms = 210 GB/s: more than L3 allows (100 GB/s)
            "latency_ms": [1.0, 1.0, 1.0, 100.0, 0.02, np.nan, 1.0],
        }
    )


def test_each_row_is_judged_against_the_level_its_working_set_fits_in() -> None:
    out = add_roofline(_level_rows(), LEVEL_PEAKS).set_index("module")
    assert list(out["memory_level"][["l1", "l2", "l3", "dram", "untimed"]]) == [
        "L1",
        "L2",
        "L3",
        "DRAM",
        "L2",
    ]
    assert pd.isna(out.loc["nothing", "memory_level"])  # no traffic: no level
    # l3: 4 MiB = 4194304 B at 100 GB/s = 0.0419 ms (compute 1000 / 1e12 s is negligible)
    assert out.loc["l3", "roofline_ms"] == pytest.approx(4194304 / 100e9 * 1e3)
    # dram: 64 MiB = 67108864 B at 10 GB/s = 6.71 ms
    assert out.loc["dram", "roofline_ms"] == pytest.approx(67108864 / 10e9 * 1e3)
    assert out.loc["l1", "roofline_ms"] == pytest.approx(32768 / 400e9 * 1e3)


def test_a_row_faster_than_its_level_is_judged_against_a_faster_one() -> None:
    out = add_roofline(_level_rows(), LEVEL_PEAKS).set_index("module")
    # fast_l3 reached 4194304 B / 0.02 ms = 209.7 GB/s > L3's 100 and L2's 200 -> L1 (400)
    assert out.loc["fast_l3", "memory_level"] == "L1"
    assert out.loc["fast_l3", "roofline_ms"] == pytest.approx(4194304 / 400e9 * 1e3)
    # no timed row is above the roof it is judged against
    assert (out["efficiency"].dropna() <= 1.0).all()


def test_judged_levels_directly() -> None:
    traffic = np.array([0.0, 1000.0, 2e6, 1e9])
    rate = np.array([np.nan, 1e9, 150e9, np.nan])
    # 0 B: -1; 1000 B fits L1; 2 MB fits L3 but 150 GB/s beats L3 -> L2 (200); 1 GB: DRAM
    assert judged_levels(traffic, rate, LEVELS) == [-1, 0, 1, 3]


def test_peaks_without_levels_judge_everything_against_main_memory() -> None:
    out = add_roofline(_level_rows(), PEAKS)
    assert set(out["memory_level"].dropna()) == {"DRAM"}
    assert PEAKS.memory_levels == (MemoryLevel("DRAM", None, 1e11),)


@pytest.mark.parametrize(
    "levels, fragment",
    [
        ((MemoryLevel("L1", 1024, 1e9),), "only the last level"),
        (
            (
                MemoryLevel("L2", 2048, 1e9),
                MemoryLevel("L1", 1024, 1e9),
                MemoryLevel("DRAM", None, 1e9),
            ),
            "grow in capacity",
        ),
        ((MemoryLevel("DRAM", None, 5e9),), "last level's bandwidth"),
    ],
)
def test_peaks_reject_inconsistent_levels(levels, fragment: str) -> None:
    with pytest.raises(ModelProfError, match=fragment):
        Peaks(peak_flops=1e12, peak_bytes=1e9, levels=levels)


def test_memory_level_rejects_bad_values() -> None:
    with pytest.raises(ModelProfError, match="bandwidth"):
        MemoryLevel("L1", 1024, 0.0)
    with pytest.raises(ModelProfError, match="capacity_bytes"):
        MemoryLevel("L1", -5, 1e9)


def test_probe_measures_every_cache_level_and_keeps_them_ordered() -> None:
    peaks = probe_peaks("cpu", torch.float32, budget_s=0.5)
    levels = peaks.levels
    assert levels[-1].name == "DRAM" and levels[-1].capacity_bytes is None
    assert levels[-1].bandwidth == peaks.peak_bytes
    assert [lv.name for lv in levels[:-1]] == [name for name, _ in cache_levels("cpu")]
    # a cache is never slower than the memory behind it (the envelope the probe applies)
    rates = [lv.bandwidth for lv in levels]
    assert rates == sorted(rates, reverse=True)


def test_sysfs_cache_sizes_scale_with_the_threads_sharing_them() -> None:
    from modelprof.timing.peaks import _count_cpus, parse_cache_size

    assert parse_cache_size("32K") == 32768 and parse_cache_size("8192K") == 8 << 20
    assert parse_cache_size("1M") == 1 << 20 and parse_cache_size("512") == 512
    assert _count_cpus("0-3,8-11") == 8 and _count_cpus("5") == 1


def test_probe_leaves_the_global_rng_alone() -> None:
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    probe_peaks("cpu", torch.float32, matmul_size=64, copy_bytes=1 << 20, repeats=1, budget_s=0.2)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    if cuda_states is not None:
        probe_peaks("cuda", torch.float32, matmul_size=64, copy_bytes=1 << 20, repeats=1)
        after = torch.cuda.get_rng_state_all()
        assert all(torch.equal(a, b) for a, b in zip(after, cuda_states))


# -- convolutions under cuDNN TF32 ---------------------------------------------------------------
def test_convolutions_are_judged_against_their_own_compute_roof() -> None:
    peaks = Peaks(peak_flops=1e12, peak_bytes=1e11, conv_peak_flops=8e12)
    df = pd.DataFrame(
        {
            "module": ["conv", "fc", "tconv"],
            "type": ["Conv2d", "Linear", "ConvTranspose3d"],
            "flops": [16_000_000_000] * 3,
            "read_bytes": [1000] * 3,
            "write_bytes": [1000] * 3,
            "latency_ms": [4.0] * 3,
        }
    )
    out = add_roofline(df, peaks)
    # conv: 1.6e10 / 8e12 = 2 ms (the TF32 roof); fc: 1.6e10 / 1e12 = 16 ms (the matmul roof)
    assert out["roofline_ms"].tolist() == pytest.approx([2.0, 16.0, 2.0])
    assert out["efficiency"].tolist() == pytest.approx([0.5, 4.0, 0.5])  # 2/4, 16/4, 2/4
    # without a conv roof every row shares peak_flops
    same = add_roofline(df, Peaks(peak_flops=1e12, peak_bytes=1e11))
    assert same["roofline_ms"].tolist() == pytest.approx([16.0] * 3)


def test_table_peaks_give_convolutions_the_tf32_rate_when_only_cudnn_uses_it() -> None:
    # H100 SXM datasheet: FP32 67 TFLOP/s, TF32 494.7 (dense)
    p = lookup_peaks("NVIDIA H100 80GB HBM3", "float32", conv_tf32=True)
    assert p.peak_flops == 67e12 and p.conv_peak_flops == pytest.approx(494.7e12)
    # matmuls in TF32 too: one roof for both
    assert lookup_peaks("NVIDIA H100 80GB HBM3", "tf32", conv_tf32=True).conv_peak_flops is None
    # matmuls in TF32, convolutions forced to FP32
    q = lookup_peaks("NVIDIA H100 80GB HBM3", "tf32", conv_tf32=False)
    assert q.peak_flops == pytest.approx(494.7e12) and q.conv_peak_flops == 67e12
    assert lookup_peaks("NVIDIA H100 80GB HBM3", "bfloat16", conv_tf32=True).conv_peak_flops is None


@pytest.mark.parametrize(
    "matmul, conv, dtype, expected",
    [
        (False, True, "float32", True),  # PyTorch's defaults: cuBLAS FP32, cuDNN TF32
        (True, True, "float32", None),  # both TF32: one roof
        (False, False, "float32", None),
        (True, False, "float32", False),
        (False, True, "tf32", None),  # the tf32 dtype means matmuls in TF32
        (False, True, "bfloat16", None),  # TF32 concerns float32 only
    ],
)
def test_which_precision_convolutions_use(monkeypatch, matmul, conv, dtype, expected) -> None:
    import modelprof.timing.peaks as roofline

    monkeypatch.setattr(
        roofline, "tf32_enabled", lambda kind: {"matmul": matmul, "conv": conv}[kind]
    )
    assert roofline.conv_uses_other_precision(torch.device("cuda", 0), dtype) is expected
    assert roofline.conv_uses_other_precision(torch.device("cpu"), dtype) is None


def test_conv_peak_must_be_positive() -> None:
    with pytest.raises(ModelProfError, match="conv_peak_flops must be a positive number, got -1"):
        Peaks(peak_flops=1e12, peak_bytes=1e11, conv_peak_flops=-1.0)


# ------------------------------------------------------------- probed roofs raised by the rows

PROBED = Peaks(peak_flops=1e12, peak_bytes=10e9, source="probe", levels=LEVELS)


def _fast_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "module": ["fast_compute", "fast_l1", "slow", "parent"],
            "type": ["Linear", "ReLU", "Linear", "Sequential"],
            "leaf": [True, True, True, False],
            # fast_compute: 3e9 FLOP in 1 ms = 3e12 FLOP/s, 3x the probed 1e12
            # fast_l1: 32 KiB = 32768 B in 0.5e-4 ms = 655.36e9 B/s, over L1's 400e9
            # parent: 4e9 FLOP in 2 ms = 2e12 FLOP/s, under the raised roof
            "flops": [3_000_000_000, 0, 1_000_000, 4_000_000_000],
            "read_bytes": [1000, 16 << 10, 1000, 1000],
            "write_bytes": [1000, 16 << 10, 1000, 1000],
            "latency_ms": [1.0, 0.5e-4, 1.0, 2.0],
        }
    )


def test_probed_roofs_rise_to_what_a_row_achieved() -> None:
    df = _fast_rows()
    seen = observed_peaks(df, PROBED)
    assert seen.raised == ("compute", "L1")
    assert seen.peak_flops == pytest.approx(3e12)  # 3e9 FLOP / 1e-3 s
    assert seen.levels[0].bandwidth == pytest.approx(32768 / 0.5e-7)  # 655.36e9 B/s
    assert seen.levels[1:] == LEVELS[1:] and seen.peak_bytes == PROBED.peak_bytes
    out = add_roofline(df, PROBED).set_index("module")
    # the rows that set a roof sit on it; the others are judged against the raised roofs
    assert out.loc["fast_compute", "efficiency"] == pytest.approx(1.0)
    assert out.loc["fast_l1", ["memory_level", "efficiency"]].tolist() == ["L1", pytest.approx(1.0)]
    # slow: 1e6 FLOP / 3e12 = 3.33e-7 s (its 2000 B at L1: 3.05e-9 s) -> 3.33e-4 ms of 1 ms
    assert out.loc["slow", "efficiency"] == pytest.approx(1e6 / 3e12 * 1e3 / 1.0)
    # parent: 4e9 / 3e12 = 1.33 ms of 2 ms
    assert out.loc["parent", "efficiency"] == pytest.approx(4e9 / 3e12 * 1e3 / 2.0)
    # a parent faster than every leaf raises the roof too: 4e9 FLOP in 1 ms = 4e12
    faster = df.assign(latency_ms=[1.0, 0.5e-4, 1.0, 1.0])
    assert observed_peaks(faster, PROBED).peak_flops == pytest.approx(4e12)
    assert (add_roofline(faster, PROBED)["efficiency"] <= 1 + 1e-12).all()


def test_a_row_whose_passes_scatter_wider_than_its_median_proves_no_roof() -> None:
    # a loaded resnet18's layer3.1.conv1 read 0.43 ms (std 40 ms) beside its twin's 7.87 ms:
    # 231 MFLOP "proved" 539 GFLOP/s on a 2-core CPU. Proving by the median plus the spread
    # instead, a loaded CLI run's layer1.1 (465 MFLOP, 1.60 ms, std 3.88 ms) raised compute to
    # 465e6 / 5.48 ms = 84.84 GFLOP/s while its row read 290 GFLOP/s, efficiency 3.4, rough: a
    # roof no row of the table reached. Here fast_compute (3e9 FLOP in 1 ms = 3e12 FLOP/s)
    # scatters by 2 ms: it proves nothing
    from modelprof.report.report import _short_own_rows

    df = _fast_rows().assign(latency_std_ms=[2.0, 1e-5, 0.1, 0.2])
    assert scattered(df).tolist() == [True, False, False, False]  # 2 > 1; the rest below
    seen = observed_peaks(df, PROBED)
    # the parent's 4e9 FLOP in 2 ms = 2e12 FLOP/s raises compute instead; L1 as before
    assert seen.raised == ("compute", "L1")
    assert seen.peak_flops == pytest.approx(2e12)
    # every row scattered but fast_l1 (its std 1e-5 under its 0.5e-4 ms): compute stays
    wide = df.assign(latency_std_ms=[2.0, 1e-5, 2.0, 3.0])
    assert observed_peaks(wide, PROBED).raised == ("L1",)
    # a probe far below (a busy machine's 1e6 FLOP/s): still no scattered row raises it, and
    # each row above it is marked rough; the roof raised (L1) is the rate its row reads
    low = dataclasses.replace(PROBED, peak_flops=1e6)
    assert observed_peaks(wide, low).peak_flops == pytest.approx(1e6)
    out = add_roofline(wide, low)
    rough = _short_own_rows(out)
    # fast_compute 3e9 / 1e6 = 3000 s of roofline time in 1 ms; slow 1e6 / 1e6 = 1 s in 1 ms;
    # parent 4e9 / 1e6 s in 2 ms: all above, all scattered: rough
    assert rough.tolist() == [True, False, True, True]
    assert (out["efficiency"][~rough] <= 1 + 1e-12).all()
    # fast_l1's 32768 B in 0.5e-4 ms = 655.36 GB/s: its row's rate, the L1 roof raised
    assert out.loc[1, "achieved_gbps"] == pytest.approx(655.36)
    assert observed_peaks(wide, low).levels[0].bandwidth == pytest.approx(655.36e9)
    # no spread column (a frame of the user's, a single pass): the median as ever
    assert observed_peaks(_fast_rows(), PROBED).peak_flops == pytest.approx(3e12)


def test_a_row_marked_rough_raises_no_roof() -> None:
    # a loaded CLI run's layers were rough as a whole (every row latency_rough), yet its
    # layer1.1.relu #2 raised the L1 roof (efficiency exactly 1, marked rough). A row marked
    # rough proves nothing: here fast_compute (3e12 FLOP/s over the probed 1e12) is rough, the
    # parent's 4e9 FLOP in 2 ms = 2e12 FLOP/s raises compute instead
    df = _fast_rows().assign(latency_rough=[True, False, False, False])
    seen = observed_peaks(df, PROBED)
    assert seen.raised == ("compute", "L1") and seen.peak_flops == pytest.approx(2e12)
    # every row rough: the probe's roofs stand
    assert observed_peaks(df.assign(latency_rough=True), PROBED) == PROBED


def test_a_report_whose_layers_are_rough_marks_every_timed_row_so_for_its_roofs() -> None:
    # with_read_times is what a report's rows prove its roofs by (run_peaks, to_dataframe,
    # plot_roofline): layers rough as a whole mark every timed row rough, which proves nothing
    from types import SimpleNamespace

    rows = [SimpleNamespace(latency_read_ms=t) for t in (1.0, 0.5e-4, 1.0, 2.0)]
    df = _fast_rows()
    df.loc[2, "latency_ms"] = np.nan  # an untimed row is never rough
    rough = with_read_times(df, SimpleNamespace(rows=rows, layers_rough=True))
    assert rough["latency_rough"].tolist() == [True, True, False, True]
    assert observed_peaks(rough, PROBED) == PROBED
    quiet = with_read_times(df, SimpleNamespace(rows=rows, layers_rough=False))
    assert "latency_rough" not in quiet.columns
    assert observed_peaks(quiet, PROBED).raised == ("compute", "L1")


def test_a_self_row_proves_no_roof_and_reads_rough_above_it() -> None:
    # a loaded resnet18's (3x112x112) layer2.0.(self), its parent's span less its children's,
    # read 0.18 us: 25,088 FLOP at 139 GFLOP/s over a 101 GFLOP/s probe, which raised the
    # compute roof by 38 %, dividing every MFU by 1.38. Here: a (self) row of 3e9 FLOP in
    # 0.5 ms = 6e12 FLOP/s, over the probed 1e12 and over the 3e12 a measured leaf proved
    from modelprof.report.report import _short_own_rows

    own = pd.DataFrame(
        {
            "module": ["parent.(self)"],
            "type": ["Sequential"],
            "leaf": [True],
            "flops": [3_000_000_000],
            "read_bytes": [1000],
            "write_bytes": [1000],
            "latency_ms": [0.5],
        }
    )
    df = pd.concat([_fast_rows(), own], ignore_index=True)
    seen = observed_peaks(df, PROBED)
    assert seen.peak_flops == pytest.approx(3e12)  # the leaf's, not the (self) row's 6e12
    out = add_roofline(df, PROBED)
    # 3e9 / 3e12 = 1 ms of roofline time over its 0.5 ms: efficiency 2, its time rough
    assert out["efficiency"].iloc[-1] == pytest.approx(2.0)
    assert _short_own_rows(out).tolist() == [False] * 4 + [True]
    # and at 0 ms though it did work (the correction took its time), rough too; without
    # work, 0 ms is its time
    zero = out.assign(latency_ms=[1.0, 0.5e-4, 1.0, 2.0, 0.0], efficiency=np.nan)
    assert _short_own_rows(zero).tolist() == [False] * 4 + [True]
    idle = zero.assign(flops=0, read_bytes=0, write_bytes=0)
    assert not _short_own_rows(idle).any()


def test_a_measured_row_at_zero_that_did_work_reads_rough() -> None:
    # a loaded resnet18's layer2.0.downsample.0 (a 6.4M-MAC conv, 0.229 ms as read) read 0
    # once 2 x 241 us a hooked call were taken off its parent and it was fitted in: with no
    # efficiency to judge (its time 0), nothing marked it. A measured row at 0 though it did
    # work is rough, with or without the roofline's columns; without work, 0 is its time
    from modelprof.report.report import _short_own_rows

    zero = _fast_rows().assign(latency_ms=[0.0, 0.5e-4, 1.0, 2.0])
    assert _short_own_rows(zero).tolist() == [True, False, False, False]
    assert _short_own_rows(add_roofline(zero, PROBED)).tolist()[0]
    idle = zero.assign(flops=0, read_bytes=0, write_bytes=0)
    assert not _short_own_rows(idle).any()


def test_a_short_self_row_is_named_in_the_caption(monkeypatch) -> None:
    # the rule is _short_own_rows' (tested above on constructed rows); here its wiring: a
    # report whose only rough rows are short (self) rows says why they are marked, where the
    # caption said nothing before
    from torch import nn

    import modelprof.report.report as report_module
    from modelprof import profile

    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + x  # the add: the (self) row's work

    r = profile(Residual(), (8,), repeat=12, warmup=1, warn=False)
    # (a loaded machine's own reasons, for the rows and the end-to-end row, are held off)
    monkeypatch.setattr(report_module.Report, "_rough_reason", lambda self: None)
    monkeypatch.setattr(report_module.Report, "latency_unquotable", property(lambda s: None))

    def causes(marked):
        return lambda df: {"own": marked(df), "cut": df["module"] == "nothing"}

    monkeypatch.setattr(report_module, "_short_row_causes", causes(lambda df: df["leaf"] & False))
    assert "marked ~" not in r._title()
    monkeypatch.setattr(
        report_module, "_short_row_causes", causes(lambda df: df["module"].str.endswith("(self)"))
    )
    assert r._title().endswith(
        ". Per-layer times marked ~ are rough: (self) rows (a parent's span less its "
        "children's) read faster than their roof"
    )
    df = r.to_dataframe().set_index("module")
    assert df.loc["(self)", "latency_rough"] and not df.loc["lin", "latency_rough"]


def test_the_caption_names_each_cause_of_the_short_rows_it_marks() -> None:
    # a trial's loaded run against a low given roof: conv rows above it whose passes scattered
    # wider than their medians were marked rough, and the caption said the hooks' cost took
    # more than half of their spans (it took 3 us of 160). Each cause is named by its own
    # words, only where a rough row has it. Here fast_compute (3e9 FLOP in 1 ms, 3x a given
    # 1e12 FLOP/s roof) scattered by 2 ms; the rest below their roofs
    from modelprof.report.report import _short_own_rows, _short_rows_reason

    given = dataclasses.replace(PROBED, source="user")
    df = add_roofline(_fast_rows().assign(latency_std_ms=[2.0, 1e-5, 0.1, 0.2]), given)
    df["latency_rough"] = _short_own_rows(df)
    assert df["latency_rough"].tolist() == [True, False, False, False]
    reason = _short_rows_reason(df)
    assert reason.startswith("rows faster than their roof whose passes scatter wider")
    assert "hooks" not in reason and "(self)" not in reason
    # read at 6 ms as spanned too (the hooks' correction took 5 of them): both causes named
    both = df.assign(latency_read_ms=[6.0, 0.5e-4, 1.0, 2.5])
    assert _short_rows_reason(both).split("; ")[0].startswith("rows read faster than their roof")
    assert "scatter" in _short_rows_reason(both).split("; ")[1]
    # no rough row: no reason
    assert _short_rows_reason(df.assign(latency_rough=False)) is None


def test_given_roofs_are_left_as_given() -> None:
    df = _fast_rows()
    for source in ("user", "table"):
        peaks = Peaks(peak_flops=1e12, peak_bytes=10e9, source=source, levels=LEVELS)
        assert observed_peaks(df, peaks) is peaks
        out = add_roofline(df, peaks).set_index("module")
        # a row above a datasheet or user roof shows it: 3e12 achieved over a 1e12 roof
        assert out.loc["fast_compute", "efficiency"] == pytest.approx(3.0)


def test_a_probed_convolution_roof_rises_on_its_own() -> None:
    peaks = Peaks(peak_flops=1e12, peak_bytes=10e9, source="probe", conv_peak_flops=2e12)
    df = pd.DataFrame(
        {
            "module": ["block", "conv", "mm"],
            "type": ["Block", "Conv2d", "Linear"],
            "leaf": [False, True, True],
            "flops": [5_500_000_000, 5_000_000_000, 500_000_000],
            "read_bytes": [2000, 1000, 1000],
            "write_bytes": [2000, 1000, 1000],
            "latency_ms": [2.0, 1.0, 1.0],
        }
    )
    # conv: 5e9 FLOP in 1 ms = 5e12 over its 2e12 roof; mm: 5e11 under 1e12, left alone;
    # block (conv + mm): 5.5e9 in 2 ms = 2.75e12, judged against the faster roof (5e12)
    assert list(compute_roofs(df, peaks)) == [2e12, 2e12, 1e12]
    seen = observed_peaks(df, peaks)
    assert seen.raised == ("conv compute",)
    assert (seen.conv_peak_flops, seen.peak_flops) == (pytest.approx(5e12), 1e12)
    assert (add_roofline(df, peaks)["efficiency"] <= 1 + 1e-12).all()
    # a parent above both roofs raises the faster one: 5.5e9 in 0.5 ms = 1.1e13
    fast_block = df.assign(latency_ms=[0.5, 1.0, 1.0])
    seen = observed_peaks(fast_block, peaks)
    assert (seen.conv_peak_flops, seen.peak_flops) == (pytest.approx(1.1e13), 1e12)
    assert observed_peaks(df.assign(latency_ms=np.nan), peaks) is peaks  # untimed: as probed


def test_a_dram_roof_rises_to_what_a_leaf_moved_past_the_caches() -> None:
    # the caches in front of DRAM hold 64 KiB + 1 MiB + 8 MiB = 9,502,720 B. big (a leaf)
    # reads 41,445,376 B and writes 1000 in 1 ms: at least 41,445,376 - 9,502,720 =
    # 31,942,656 B came from DRAM in 1e-3 s = 31.94e9 B/s, over the probed 10e9
    df = pd.DataFrame(
        {
            "module": ["big", "parent"],
            "type": ["Linear", "Sequential"],
            "leaf": [True, False],
            "flops": [1000, 1000],
            "read_bytes": [41_445_376, 100 << 20],
            "write_bytes": [1000, 100 << 20],
            "latency_ms": [1.0, 50.0],
        }
    )
    seen = observed_peaks(df, PROBED)
    dram = 41_445_376 - (64 * 1024 + (1 << 20) + (8 << 20))
    assert seen.raised == ("DRAM",)
    assert seen.peak_bytes == pytest.approx(dram / 1e-3)
    # L3 (probed 100e9) stays above it; the parent's 200 MiB in 50 ms (4.19e9 B/s) proves
    # nothing: a parent's traffic counts its children's intermediates, which a cache keeps
    assert [lv.bandwidth for lv in seen.levels[:3]] == [400e9, 200e9, 100e9]
    notes = peak_notes(df, PROBED)
    assert notes == [
        "The probe measured the DRAM roof at 10.00 GB/s, but layer big moved data past the "
        "caches at 31.94 GB/s: the probe was disturbed and read low, so that roof is "
        "31.94 GB/s here."
    ]
    # each level is proved by the bytes past the caches in front of it, in 0.2 ms:
    # L2 (41,445,376 - 65,536) / 2e-4 = 206.90e9 over 200e9; L3 (... - 1,048,576) / 2e-4 =
    # 201.66e9 over 100e9; DRAM 31,942,656 / 2e-4 = 159.71e9 over 10e9; all of big's
    # 41,446,376 B in 0.2 ms, 207.2e9 B/s, stays under L1's 400e9
    fast = df.assign(latency_ms=[0.2, 50.0])
    seen = observed_peaks(fast, PROBED)
    assert [lv.bandwidth for lv in seen.levels] == pytest.approx(
        [400e9, 206.8992e9, 201.65632e9, dram / 2e-4]
    )
    assert seen.raised == ("L2", "L3", "DRAM")


def test_one_peak_per_run_for_the_mfu_the_table_and_the_plot() -> None:
    from torch import nn

    from modelprof import profile

    # a probe far below what any forward reaches: 1 MFLOP/s, 1 MB/s. Every figure of the run
    # is judged against the roofs its fastest layers proved, the same ones everywhere
    low = Peaks(peak_flops=1e6, peak_bytes=1e6, source="probe", device="cpu")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # noisy timing under load: not the point
        report = profile(
            model, (64,), batch_size=16, roofline=low, repeat=3, warmup=1, budget_s=0.3
        )
    df = report.to_dataframe()
    timed = df[df["latency_ms"] > 0]
    # the compute roof: the best FLOP/s a row proved, flops / its latency (ms -> s), of the
    # rows not marked rough (the layers rough as a whole mark all), not scattered wider than
    # their median (a loaded machine's 3 passes, one preempted) and not read at less than half
    # their span as read; the probe's where none proves more
    read = pd.Series([r.latency_read_ms for r in report.rows], index=df.index)[timed.index]
    proves = ~timed["latency_rough"] & ~pd.Series(scattered(timed), index=timed.index)
    proves &= ~(timed["latency_ms"] < read / 2)
    best = max([1e6, *(timed["flops"] / (timed["latency_ms"] * 1e-3))[proves]])
    u = report.utilization()
    assert u.convention.peaks.peak_flops == pytest.approx(best)
    assert u.by_peak == {"probe": u.mfu}
    # the table's MFU per row: 2 x MACs over its latency x that same peak
    expected = 2 * timed["macs"] / (timed["latency_ms"] * 1e-3 * best)
    assert timed["mfu"].to_numpy() == pytest.approx(expected.to_numpy())
    assert list(u.rows["mfu"].fillna(-1)) == list(df["mfu"].fillna(-1))
    # no row above the peak it is judged against, unless its time is marked rough (which
    # proves nothing)
    assert (timed["mfu"][~timed["latency_rough"]] <= 1 + 1e-9).all()
    assert timed["latency_rough"][timed["mfu"] > 1 + 1e-9].all()
    if best == 1e6:  # every row rough (a loaded machine's): nothing raised, nothing said
        assert "raised to what a layer" not in report.summary()
        return
    # the summary says in words where the peak came from
    assert "raised to what a layer of this run reached: the probe was disturbed" in (
        report.summary()
    )
    pytest.importorskip("matplotlib")
    fig = report.plot_roofline()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    from modelprof.render.units import format_count

    assert f"compute roof: {format_count(best, unit='FLOP/s')}" in legend
    title = fig.axes[0].get_title().replace("\n", " ")
    assert (
        f"drawn at what layers of this run reached: compute {format_count(best, unit='FLOP/s')}"
        in title
    )
    assert "The probe measured compute 1.00 MFLOP/s (layer" in (
        fig._supxlabel.get_text().replace("\n", " ")
    )


@pytest.mark.slow
def test_resnet18_on_cpu_no_row_is_above_the_roof_it_is_judged_against() -> None:
    import torchvision

    from modelprof import profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # noisy or drifting timing under load: not the point
        report = profile(torchvision.models.resnet18(), (3, 224, 224), budget_s=0.3)
    df = report.to_dataframe()
    roofs = run_peaks(report)  # the probe's roofs as the table's rows proved them
    assert report.peaks.source == "probe"
    bandwidth = {lv.name: lv.bandwidth for lv in roofs.memory_levels}
    timed = df[df["latency_ms"] > 0]
    # not judged vacuously: resnet18's 20 convolutions (each far above the hooks' calibrated
    # cost, which a load can raise until a short leaf reads 0), its 8 blocks, 4 stages and the
    # root: 33 rows at least
    assert (df[df["type"] == "Conv2d"]["latency_ms"] > 0).sum() == 20
    assert len(timed) >= 33
    # a latency is a measured time, or 0 where the hook correction left no time: never a
    # rounding residue (which made a (self) row 1e13 x its roof)
    assert not ((df["latency_ms"] > 0) & (df["latency_ms"] < 1e-6)).any()
    # every timed row with traffic is judged against a named level of the probe's hierarchy,
    # and neither a measured row's bandwidth nor its FLOP/s is above that level's roof or the
    # compute roof
    assert timed["memory_level"].isin(list(bandwidth)).all()
    own = timed["module"].str.endswith("(self)")
    spans = timed[~own]
    level_bw = spans["memory_level"].map(bandwidth).to_numpy(dtype=float)
    # (but for a span the hooks' measured cost took more than half of, a span whose passes
    # scatter wider than its median, and every span where the layers are rough as a whole (a
    # loaded machine's): they prove nothing, and above their roof they are marked rough)
    read = np.array([r.latency_read_ms for r in report.rows])[timed.index[~own]]
    cut = (spans["latency_ms"].to_numpy() < read / 2) | scattered(spans) | report.layers_rough
    above = (spans["efficiency"] > 1 + 1e-9).to_numpy()
    assert (cut[above]).all() and spans["latency_rough"].to_numpy()[above].all()
    spans, level_bw = spans[~cut], level_bw[~cut]
    assert (spans["achieved_gbps"].to_numpy() * 1e9 <= level_bw * (1 + 1e-9)).all()
    assert (spans["achieved_gflops"].to_numpy() * 1e9 <= roofs.peak_flops * (1 + 1e-9)).all()
    assert (spans["efficiency"] <= 1 + 1e-9).all()
    assert timed["efficiency"].gt(0).all()
    # a (self) row's time is a difference of spans, which proves no roof: where it reads faster
    # than its roof (or 0 for the residual add it ran) its time is marked rough instead
    measured = df[df["latency_ms"].notna()]
    work = (measured["flops"] > 0) | (measured["read_bytes"] + measured["write_bytes"] > 0)
    faster = (measured["efficiency"] > 1) | ((measured["latency_ms"] <= 0) & work)
    short = measured[measured["module"].str.endswith("(self)") & faster]
    assert short["latency_rough"].all()
    # and the caption says why they are marked, where nothing else marks the rows: each cause
    # its own words (above their roof; at 0 for work they did)
    if len(short) and not report.layers_rough:
        title = report._title()
        if (short["efficiency"] > 1).any():
            assert "(self) rows (a parent's span less its children's) read faster" in title
        if (short["latency_ms"] <= 0).any():
            assert "rows at 0 though they did work" in title


@pytest.mark.parametrize(
    "name, variants",
    [
        ("A100", ["A100 SXM 80GB", "A100 PCIe 80GB", "A100 SXM 40GB", "A100 PCIe 40GB"]),
        ("a100 80gb", ["A100 SXM 80GB", "A100 PCIe 80GB"]),  # the form factor is missing
        ("A100 PCIe", ["A100 PCIe 80GB", "A100 PCIe 40GB"]),  # the memory is missing
        ("H100", ["H100 SXM", "H100 PCIe", "H100 NVL"]),
        ("V100", ["V100 SXM2", "V100 PCIe"]),
    ],
)
def test_an_ambiguous_device_name_is_refused_with_its_variants(name, variants) -> None:
    # 40 GB and 80 GB A100s differ by 30 % in bandwidth (1,555 against 2,039 GB/s): a bound
    # against the wrong one is wrong by that much, so no variant is assumed
    with pytest.raises(ModelProfError, match="ambiguous") as e:
        lookup_peaks(name, "float16")
    for v in variants:
        assert repr(v) in str(e.value)


def test_a_named_variant_gives_its_own_bandwidth() -> None:
    assert lookup_peaks("A100 SXM 80GB", "float16").peak_bytes == pytest.approx(2039e9)
    assert lookup_peaks("A100 SXM 40GB", "float16").peak_bytes == pytest.approx(1555e9)
    assert lookup_peaks("a100 pcie 80gb", "float16").device == "A100 PCIe 80GB"


def _cpu_clock(ns_per_call: int | None):
    """A CPU clock for the probe: the wall clock itself (an idle core) or one that advances
    ``ns_per_call`` per read (a process that got almost no CPU: a busy machine)."""
    import time as _time

    if ns_per_call is None:
        return lambda: ("thread_time", _time.perf_counter_ns)
    ticks = iter(range(0, 10**12, ns_per_call))
    return lambda: ("thread_time", lambda: next(ticks))


def test_a_probe_on_a_busy_machine_says_so(monkeypatch) -> None:
    import modelprof.timing.peaks as peaks_mod

    # the machine's real other work is not these fakes' (none read, as off Linux): read, on an
    # idle machine, it said the cores were free, so the fake's wall/CPU read as a wait
    monkeypatch.setattr(env, "_PROC_STAT", "/nonexistent/proc/stat")
    # the probe's CPU time 1 us against a wall time of at least the budget's share (tens of ms)
    monkeypatch.setattr(peaks_mod, "cpu_time_source", _cpu_clock(1000))
    busy = probe_peaks("cpu", budget_s=0.05, repeats=1)
    assert busy.wall_over_cpu > 1000 and busy.loaded
    # a CPU clock that runs with the wall clock: wall/CPU 1 (up to the reads' order), not busy
    monkeypatch.setattr(peaks_mod, "cpu_time_source", _cpu_clock(None))
    idle = probe_peaks("cpu", budget_s=0.05, repeats=1)
    assert idle.wall_over_cpu == pytest.approx(1.0, abs=0.01) and not idle.loaded


def test_every_efficiency_against_a_busy_probe_is_marked() -> None:
    from torch import nn

    from modelprof import profile

    busy = Peaks(
        peak_flops=2.75e9, peak_bytes=1.61e9, source="probe", device="cpu", wall_over_cpu=3.0
    )
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    r = profile(model, (64,), roofline=busy, repeat=3, warmup=1, budget_s=0.2)
    assert r.peaks.loaded and r.peaks.wall_over_cpu == 3.0
    df = r.to_dataframe()
    timed = df["efficiency"].notna()
    assert timed.any() and (df.loc[timed, "efficiency_loaded"]).all()
    assert (
        "the roofline probe ran on a busy machine (its wall time was 3.00x its CPU time)"
        in r.summary()
    )
    md = r.to_markdown(columns=["module", "efficiency"])
    rows = [line for line in md.splitlines() if line.startswith("|")][2:]  # below the header
    cells = [line.split("|")[2].strip() for line in rows]
    assert cells and all(c.startswith("~") for c in cells if c not in ("", "n/a"))
    pytest.importorskip("matplotlib")
    fig = r.plot_roofline()
    assert "(the machine was busy)" in fig.axes[0].get_title().replace("\n", " ")
    assert "The probe ran on a busy machine" in fig._supxlabel.get_text().replace("\n", " ")
    # the same peaks from a quiet probe: no flag anywhere
    quiet = dataclasses.replace(busy, wall_over_cpu=1.02)
    q = profile(model, (64,), roofline=quiet, repeat=3, warmup=1, budget_s=0.2)
    assert "efficiency_loaded" not in q.to_dataframe().columns
    assert "busy machine" not in q.summary()


def test_a_row_the_hooks_cost_took_over_half_of_proves_no_roof() -> None:
    # a newcomer's loaded resnet18: 187 us a hooked call taken off left downsample.0 at 9.6 us,
    # "proving" 1.34 TFLOP/s on a 2-core CPU probed at 156 GFLOP/s. Here fast_compute's 3e9
    # FLOP read 1 ms once the hooks' cost was taken off, 6 ms as spanned: the correction took
    # more than half of the span, so it proves nothing; the parent (4e9 FLOP, 8 ms as read,
    # 2 ms corrected) neither
    from modelprof.report.report import _short_own_rows

    df = _fast_rows().assign(latency_read_ms=[6.0, 0.5e-4, 1.0, 8.0])
    seen = observed_peaks(df, PROBED)
    assert seen.peak_flops == pytest.approx(PROBED.peak_flops) and seen.raised == ("L1",)
    # judged by its table time against that roof, fast_compute reads 3x faster than the roof
    # (3e9 / 1e12 s = 3 ms of roofline time in 1 ms): its time is marked rough
    out = add_roofline(df, PROBED)
    assert out.loc[0, "efficiency"] == pytest.approx(3.0)
    assert _short_own_rows(out).tolist() == [True, False, False, True]
    # a correction of under half the span (1.5 ms as read): the corrected 1 ms proves 3e12
    df = df.assign(latency_read_ms=[1.5, 0.5e-4, 1.0, 2.5])
    assert observed_peaks(df, PROBED).peak_flops == pytest.approx(3e12)
    assert not _short_own_rows(add_roofline(df, PROBED)).any()
    # a frame without the column (a table read back): its latencies, as before
    assert observed_peaks(_fast_rows(), PROBED).peak_flops == pytest.approx(3e12)
    # above a roof given (not a probe's, never raised), a span keeps its time unless the
    # correction took more than half of it: fast_compute, 3x a given 1e12 FLOP/s roof
    given = dataclasses.replace(PROBED, source="user")
    as_read = _fast_rows().assign(latency_read_ms=[1.5, 0.5e-4, 1.0, 2.5])
    assert not _short_own_rows(add_roofline(as_read, given)).any()
    halved = as_read.assign(latency_read_ms=[6.0, 0.5e-4, 1.0, 2.5])
    assert _short_own_rows(add_roofline(halved, given)).tolist() == [True, False, False, False]
