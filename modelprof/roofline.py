"""Roofline: join each row's cost (FLOPs, bytes) with its measured latency and the device's peaks.

Per row, :func:`add_roofline` derives

- ``achieved_gflops`` = flops / latency, in GFLOP/s (1e9 FLOP/s)
- ``achieved_gbps``   = (read_bytes + write_bytes) / latency, in GB/s (1e9 B/s)
- ``intensity``       = flops / (read_bytes + write_bytes), FLOP per byte
- ``roofline_ms``     = max(flops / peak_flops, bytes / peak_bytes), the least time the device
  needs for that row's work, in ms
- ``bound``           = ``"compute"`` when the FLOP term is the larger (or equal) one, else ``"memory"``
- ``efficiency``      = roofline_ms / latency_ms (1.0 = at the roof)

``intensity``, ``roofline_ms`` and ``bound`` need no timing; the achieved rates and the efficiency
are NaN on rows without a positive latency. A row with no bytes has NaN intensity; a row with
neither FLOPs nor bytes has no bound (missing).

Peaks come from a short measured probe (:func:`probe_peaks`: a matmul for FLOP/s, a large copy
for bytes/s) or from the table of datasheet values :data:`KNOWN_DEVICES` (:func:`lookup_peaks`).
"""
from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import torch

from modelprof.env import cpu_name
from modelprof.errors import ModelProfError
from modelprof.device import device_synchronize, tf32_enabled

__all__ = [
    "Peaks",
    "DeviceSpec",
    "KNOWN_DEVICES",
    "ROOFLINE_COLUMNS",
    "probe_peaks",
    "lookup_peaks",
    "match_device",
    "add_roofline",
]

ROOFLINE_COLUMNS: tuple[str, ...] = (
    "achieved_gflops", "achieved_gbps", "intensity", "roofline_ms", "bound", "efficiency",
)
_SOURCES = ("probe", "table", "user")


@dataclass(frozen=True)
class Peaks:
    """A device's peak compute and memory bandwidth at one dtype.

    ``peak_flops`` in FLOP/s, ``peak_bytes`` in bytes/s (read + write traffic), ``source`` says
    where they came from (``"probe"``, ``"table"`` or ``"user"``).
    """

    peak_flops: float
    peak_bytes: float
    source: str = "user"
    device: str = ""
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("peak_flops", "peak_bytes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ModelProfError(f"Peaks.{name} must be a positive number, got {value!r}")
        if self.source not in _SOURCES:
            raise ModelProfError(f"Peaks.source must be one of {list(_SOURCES)}, got {self.source!r}")

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the two roofs meet: rows below it are memory bound."""
        return self.peak_flops / self.peak_bytes


# ------------------------------------------------------------------------------- dtype names

_DTYPE_NAMES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "tf32": "tf32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
}
_TORCH_DTYPES = {
    "float32": torch.float32, "tf32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float64": torch.float64,
}


def _dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical name: float32, tf32, float16, bfloat16 or float64."""
    if isinstance(dtype, torch.dtype):
        key = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
    else:
        raise ModelProfError(f"dtype must be a torch.dtype or a name, got {dtype!r}")
    if key not in _DTYPE_NAMES:
        raise ModelProfError(
            f"dtype {dtype!r} has no roofline peak; use one of float32, tf32, float16, bfloat16, float64"
        )
    return _DTYPE_NAMES[key]


# ------------------------------------------------------------------------------- known devices


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet peaks of one device: dense (no 2:4 sparsity) FLOP/s per dtype and bytes/s.

    ``None`` means the device has no tensor-core path for that dtype. ``tf32`` is the TF32
    tensor-core rate used for float32 matmuls when TF32 is enabled.
    """

    float32: float
    tf32: float | None
    float16: float | None
    bfloat16: float | None
    bandwidth: float
    source: str


T = 1e12
TB = 1e12
GB = 1e9

# NVIDIA datasheets quote tensor-core rates "with sparsity"; the dense rates below are half of
# those. FP16 rates are with FP32 accumulate (what PyTorch uses).
KNOWN_DEVICES: dict[str, DeviceSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5 / PCIe / NVL columns).
    "H100 SXM": DeviceSpec(67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 3.35 * TB, "NVIDIA H100 datasheet"),
    "H100 PCIe": DeviceSpec(51 * T, 378 * T, 756 * T, 756 * T, 2.0 * TB, "NVIDIA H100 datasheet"),
    "H100 NVL": DeviceSpec(60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 3.9 * TB, "NVIDIA H100 datasheet"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM / NVL).
    "H200 SXM": DeviceSpec(67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 4.8 * TB, "NVIDIA H200 datasheet"),
    "H200 NVL": DeviceSpec(60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 4.8 * TB, "NVIDIA H200 datasheet"),
    # NVIDIA A100 Tensor Core GPU datasheet (bandwidth differs per memory / form factor).
    "A100 SXM 80GB": DeviceSpec(19.5 * T, 156 * T, 312 * T, 312 * T, 2039 * GB, "NVIDIA A100 datasheet"),
    "A100 PCIe 80GB": DeviceSpec(19.5 * T, 156 * T, 312 * T, 312 * T, 1935 * GB, "NVIDIA A100 datasheet"),
    "A100 SXM 40GB": DeviceSpec(19.5 * T, 156 * T, 312 * T, 312 * T, 1555 * GB, "NVIDIA A100 datasheet"),
    "A100 PCIe 40GB": DeviceSpec(19.5 * T, 156 * T, 312 * T, 312 * T, 1555 * GB, "NVIDIA A100 datasheet"),
    # NVIDIA L4 / L40S / A10 datasheets.
    "L4": DeviceSpec(30.3 * T, 60 * T, 121 * T, 121 * T, 300 * GB, "NVIDIA L4 datasheet"),
    "L40S": DeviceSpec(91.6 * T, 183 * T, 362 * T, 362 * T, 864 * GB, "NVIDIA L40S datasheet"),
    "A10": DeviceSpec(31.2 * T, 62.5 * T, 125 * T, 125 * T, 600 * GB, "NVIDIA A10 datasheet"),
    # AWS's A10G has no NVIDIA datasheet; the commonly quoted AWS G5 figures (approximate).
    "A10G": DeviceSpec(35 * T, 35 * T, 70 * T, 70 * T, 600 * GB, "AWS G5 figures (approximate)"),
    # Turing / Volta: no TF32 or BF16 tensor cores (float32 matmuls run on CUDA cores).
    "T4": DeviceSpec(8.1 * T, None, 65 * T, None, 320 * GB, "NVIDIA T4 datasheet"),
    "V100 SXM2": DeviceSpec(15.7 * T, None, 125 * T, None, 900 * GB, "NVIDIA V100 datasheet"),
    "V100 PCIe": DeviceSpec(14 * T, None, 112 * T, None, 900 * GB, "NVIDIA V100 datasheet"),
    "V100S PCIe": DeviceSpec(16.4 * T, None, 130 * T, None, 1134 * GB, "NVIDIA V100S datasheet"),
    # Ada Lovelace architecture whitepaper, appendix (GeForce: FP16 with FP32 accumulate).
    "RTX 4090": DeviceSpec(82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T, 1008 * GB, "NVIDIA Ada whitepaper"),
    # Ampere GA102 whitepaper (GeForce RTX 3090).
    "RTX 3090": DeviceSpec(35.6 * T, 35.6 * T, 71 * T, 71 * T, 936 * GB, "NVIDIA GA102 whitepaper"),
}

# First match wins: every token of a rule must appear among the name's tokens.
_MATCH_RULES: tuple[tuple[frozenset[str], str], ...] = tuple(
    (frozenset(tokens.split()), key)
    for tokens, key in (
        ("h100 nvl", "H100 NVL"),
        ("h100 pcie", "H100 PCIe"),
        ("h100", "H100 SXM"),
        ("h200 nvl", "H200 NVL"),
        ("h200", "H200 SXM"),
        ("a100 pcie 40gb", "A100 PCIe 40GB"),
        ("a100 pcie", "A100 PCIe 80GB"),
        ("a100 80gb", "A100 SXM 80GB"),
        ("a100", "A100 SXM 40GB"),
        ("l40s", "L40S"),
        ("l4", "L4"),
        ("a10g", "A10G"),
        ("a10", "A10"),
        ("t4", "T4"),
        ("v100s", "V100S PCIe"),
        ("v100 pcie", "V100 PCIe"),
        ("v100", "V100 SXM2"),
        ("4090", "RTX 4090"),
        ("3090", "RTX 3090"),
    )
)


def match_device(name: str) -> str | None:
    """The :data:`KNOWN_DEVICES` key for a device name as torch reports it, or None.

    ``"NVIDIA H100 80GB HBM3" -> "H100 SXM"``, ``"NVIDIA A100-SXM4-40GB" -> "A100 SXM 40GB"``,
    ``"Tesla T4" -> "T4"``; a key itself matches too.
    """
    if not isinstance(name, str):
        raise ModelProfError(f"device name must be a string, got {name!r}")
    if name in KNOWN_DEVICES:
        return name
    tokens = set(re.split(r"[\s\-_/,()]+", name.lower()))
    # "A100 80GB PCIe" and "A100-PCIE-80GB" both carry "pcie": form factor decides first.
    for rule, key in _MATCH_RULES:
        if rule <= tokens:
            return key
    return None


def lookup_peaks(device_name: str, dtype: torch.dtype | str = "float32") -> Peaks | None:
    """Datasheet peaks for a known device at ``dtype``, or None when the device is not in
    :data:`KNOWN_DEVICES` or has no tensor-core rate for that dtype (bfloat16 on a T4). Use
    ``dtype="tf32"`` for float32 matmuls with TF32 enabled; on devices without TF32 it gives the
    float32 rate."""
    name = _dtype_name(dtype)
    key = match_device(device_name)
    if key is None:
        return None
    spec = KNOWN_DEVICES[key]
    if name == "float64":
        return None
    flops = {"float32": spec.float32, "tf32": spec.tf32 or spec.float32,
             "float16": spec.float16, "bfloat16": spec.bfloat16}[name]
    if flops is None:
        return None
    return Peaks(peak_flops=flops, peak_bytes=spec.bandwidth, source="table", device=key, dtype=name)


# ------------------------------------------------------------------------------- probe


def _device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelProfError(f"unknown device {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelProfError(f"device {device!r} asked for, but CUDA is not available")
    if dev.type == "meta":
        raise ModelProfError("cannot probe the 'meta' device: it does not compute")
    return dev


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_name() if dev.type == "cpu" else str(dev)


def _time_once(fn: Callable[[], object], dev: torch.device) -> float:
    """Seconds for one call: CUDA events on CUDA, perf_counter_ns (after a synchronize) elsewhere."""
    if dev.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    device_synchronize(dev)
    t0 = time.perf_counter_ns()
    fn()
    device_synchronize(dev)
    return (time.perf_counter_ns() - t0) / 1e9


def _best_of(fn: Callable[[], object], dev: torch.device, repeats: int, budget_s: float) -> float:
    """Fastest of up to ``repeats`` timed calls (at least one), stopping when ``budget_s`` is spent."""
    deadline = time.perf_counter() + budget_s
    best = math.inf
    for i in range(repeats):
        best = min(best, _time_once(fn, dev))
        if time.perf_counter() > deadline:
            break
    return best


@contextmanager
def _matmul_precision(tf32: bool) -> Iterator[None]:
    """TF32 float32 matmuls for the block. Through the newer ``fp32_precision`` setting where
    this torch has it (the legacy getters raise once a user has set it), else the legacy one;
    the previous value is restored either way."""
    if not tf32:
        yield
        return
    backend = torch.backends.cuda.matmul
    if isinstance(getattr(backend, "fp32_precision", None), str):
        previous = backend.fp32_precision
        backend.fp32_precision = "tf32"
        try:
            yield
        finally:
            backend.fp32_precision = previous
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _probe_matmul(dev: torch.device, dtype: torch.dtype, size: int | None,
                  repeats: int, budget_s: float) -> float:
    """FLOP/s of an n x n matmul (2 n^3 FLOP). Without ``size``: 4096 on CUDA; elsewhere n doubles
    from 256 while a call fits half the per-run budget, up to 1024 on CPU (2048 on other devices)."""
    per_run = budget_s / (repeats + 2)

    def make(n: int) -> Callable[[], object]:
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        out = torch.empty(n, n, device=dev, dtype=dtype)
        return lambda: torch.matmul(a, b, out=out)

    if size is None and dev.type == "cuda":
        size = 4096
    max_n = 1024 if dev.type == "cpu" else 2048
    if size is not None:
        if size < 1:
            raise ModelProfError(f"matmul_size must be positive, got {size!r}")
        run = make(size)
        _time_once(run, dev)  # warm-up: library heuristics, lazy init
        n = size
    else:
        n = 256
        run = make(n)
        _time_once(run, dev)  # warm-up: the first call at a size pays for setup
        last = _time_once(run, dev)
        # Small CPU matmuls are dominated by fixed costs (thread wake-up, scheduler quanta), so
        # time grows slower than n^3 there: double while a call takes at most half the budget.
        while n < max_n and last * 2 <= per_run:
            n *= 2
            run = make(n)
            _time_once(run, dev)
            last = _time_once(run, dev)
    seconds = _best_of(run, dev, repeats, budget_s)
    return 2.0 * n**3 / seconds


def _probe_copy(dev: torch.device, nbytes: int | None, repeats: int, budget_s: float) -> float:
    """Bytes/s of a device-to-device copy, counting the read and the write (2 x size)."""
    if nbytes is None:
        nbytes = (256 if dev.type == "cuda" else 64) * 2**20
    if nbytes < 1:
        raise ModelProfError(f"copy_bytes must be positive, got {nbytes!r}")
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    run = lambda: dst.copy_(src)  # noqa: E731
    _time_once(run, dev)  # warm-up: page faults on first touch
    seconds = _best_of(run, dev, repeats, budget_s)
    return 2.0 * nbytes / seconds


def probe_peaks(
    device: torch.device | str | None = None,
    dtype: torch.dtype | str = torch.float32,
    *,
    budget_s: float | None = None,
    repeats: int = 5,
    matmul_size: int | None = None,
    copy_bytes: int | None = None,
) -> Peaks:
    """Measure peak FLOP/s (an n x n matmul at ``dtype``) and bytes/s (a large copy) on ``device``.

    Best of ``repeats`` timed runs after a warm-up; CUDA events on CUDA, ``perf_counter_ns``
    elsewhere. Sizes: 4096^2 matmul and a 256 MiB copy on CUDA; on CPU the matmul size grows from
    256 to at most 1024 within the budget (slow dtypes such as CPU float16 stay smaller), and the
    copy is 64 MiB. ``budget_s`` (default 1 s on
    CPU, 5 s elsewhere) bounds the timed repetitions. ``dtype="tf32"`` times a float32 matmul with
    TF32 enabled for the probe only; float32 on CUDA reports ``"tf32"`` when TF32 is already on.
    """
    dev = _device(device)
    name = _dtype_name(dtype)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ModelProfError(f"repeats must be a positive integer, got {repeats!r}")
    if budget_s is None:
        budget_s = 1.0 if dev.type == "cpu" else 5.0
    if not budget_s > 0:
        raise ModelProfError(f"budget_s must be positive, got {budget_s!r}")
    torch_dtype = _TORCH_DTYPES[name]
    # Events record on the current device's stream: make the probed GPU the current one.
    on_device = torch.cuda.device(dev) if dev.type == "cuda" else nullcontext()
    with on_device, torch.inference_mode(), _matmul_precision(name == "tf32"):
        if name == "float32" and dev.type == "cuda" and tf32_enabled("matmul"):
            name = "tf32"
        flops = _probe_matmul(dev, torch_dtype, matmul_size, repeats, 0.7 * budget_s)
        bandwidth = _probe_copy(dev, copy_bytes, repeats, 0.3 * budget_s)
    return Peaks(
        peak_flops=flops, peak_bytes=bandwidth, source="probe", device=_device_name(dev), dtype=name
    )


# ------------------------------------------------------------------------------- per-row roofline


def add_roofline(df: pd.DataFrame, peaks: Peaks, *, latency_column: str = "latency_ms") -> pd.DataFrame:
    """A copy of ``df`` (modelprof view) with the roofline columns appended (replaced if present).

    Needs ``flops``, ``read_bytes`` and ``write_bytes``; ``latency_column`` is optional (without it
    the achieved rates and the efficiency are NaN).
    """
    if not isinstance(df, pd.DataFrame):
        raise ModelProfError(f"expected a pandas DataFrame, got {type(df).__name__}")
    if not isinstance(peaks, Peaks):
        raise ModelProfError(f"peaks must be a modelprof.roofline.Peaks, got {type(peaks).__name__}")
    missing = [c for c in ("flops", "read_bytes", "write_bytes") if c not in df.columns]
    if missing:
        raise ModelProfError(
            f"add_roofline needs column(s) {missing} (the modelprof view of the report); "
            f"the table has {list(map(str, df.columns))}"
        )
    flops = df["flops"].to_numpy(dtype=float)
    traffic = df["read_bytes"].to_numpy(dtype=float) + df["write_bytes"].to_numpy(dtype=float)
    if latency_column in df.columns:
        latency = df[latency_column].to_numpy(dtype=float)
    else:
        latency = np.full(len(df), np.nan)
    timed = np.isfinite(latency) & (latency > 0)
    safe_latency = np.where(timed, latency, 1.0)
    has_bytes = traffic > 0

    compute_ms = flops / peaks.peak_flops * 1e3
    memory_ms = traffic / peaks.peak_bytes * 1e3
    roofline_ms = np.maximum(compute_ms, memory_ms)
    working = (flops > 0) | has_bytes
    bound = np.where(compute_ms >= memory_ms, "compute", "memory").astype(object)
    bound[~working] = None

    out = df.drop(columns=[c for c in ROOFLINE_COLUMNS if c in df.columns])
    # flops / (ms * 1e-3) / 1e9 = flops / ms / 1e6
    out["achieved_gflops"] = np.where(timed, flops / safe_latency / 1e6, np.nan)
    out["achieved_gbps"] = np.where(timed, traffic / safe_latency / 1e6, np.nan)
    out["intensity"] = np.where(has_bytes, flops / np.where(has_bytes, traffic, 1.0), np.nan)
    out["roofline_ms"] = roofline_ms
    out["bound"] = pd.Series(list(bound), index=df.index, dtype=pd.Series(["x"]).dtype)
    out["efficiency"] = np.where(timed, roofline_ms / safe_latency, np.nan)
    return out
