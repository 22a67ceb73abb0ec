"""A device's peaks: FLOP/s and the bandwidth of each memory level, from a short probe
(:func:`probe_peaks`) or the datasheet table :data:`KNOWN_DEVICES` (:func:`lookup_peaks`, DRAM
only). Their join with a table's rows is :mod:`modelprof.report.roofline`.
"""

from __future__ import annotations

import functools
import math
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from modelprof.errors import ModelProfError, check_int
from modelprof.runtime.device import mig_refusal, mig_slice, tf32_enabled
from modelprof.runtime.env import MachineShare, cpu_name
from modelprof.runtime.inputs import DTYPE_NAMES
from modelprof.timing.clock import CudaEventClock, HostSyncClock, cpu_time_source
from modelprof.timing.measurement import load_reason

__all__ = [
    "DeviceSpec",
    "KNOWN_DEVICES",
    "MemoryLevel",
    "Peaks",
    "autocast_dtype",
    "cache_levels",
    "last_level_cache_bytes",
    "conv_uses_other_precision",
    "lookup_peaks",
    "match_device",
    "parse_cache_size",
    "peak_dtype",
    "probe_peaks",
]


_SOURCES = ("probe", "table", "user")


def _positive(value: object) -> bool:
    """A finite number above 0 (``True`` is not a number here)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy: its name (``L1``, ``L2``, ``L3``, ``DRAM``), how many
    bytes it holds for the threads in use (``None``: unbounded, main memory) and its bandwidth
    in bytes/s (read + write traffic)."""

    name: str
    capacity_bytes: int | None
    bandwidth: float

    def __post_init__(self) -> None:
        if not _positive(self.bandwidth):
            raise ModelProfError(
                f"MemoryLevel {self.name!r}: bandwidth must be a positive number, "
                f"got {self.bandwidth!r}"
            )
        cap = self.capacity_bytes
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
            raise ModelProfError(
                f"MemoryLevel {self.name!r}: capacity_bytes must be a positive "
                f"integer or None, got {cap!r}"
            )


@dataclass(frozen=True)
class Peaks:
    """A device's peak compute and memory bandwidth at one dtype.

    ``peak_flops`` in FLOP/s, ``peak_bytes`` in bytes/s (read + write traffic) of main memory,
    ``levels`` the hierarchy from the smallest cache to main memory (empty: main memory only),
    ``source`` one of ``"probe"``, ``"table"``, ``"user"``. ``conv_peak_flops``: the roof of
    convolutions where it differs from the matmuls' (float32 on CUDA, where cuDNN and cuBLAS
    may differ on TF32); ``None``: they share ``peak_flops``. ``raised``: the roofs a table's
    rows proved higher than probed (``"compute"``, ``"conv compute"``, a level's name:
    ``observed_peaks``). ``wall_over_cpu``: a CPU probe's wall over CPU time; above
    ``LOADED_WALL_OVER_CPU``, or with other work on ``competing_cores`` of the cores it needed
    (``Measurement``'s rule), the machine was busy and the probed roofs are low (``loaded``).
    """

    peak_flops: float
    peak_bytes: float
    source: str = "user"
    device: str = ""
    dtype: str = "float32"
    levels: tuple[MemoryLevel, ...] = ()
    conv_peak_flops: float | None = None
    raised: tuple[str, ...] = ()
    wall_over_cpu: float | None = None
    competing_cores: float | None = None
    #: how far a short probe's ticks can move ``competing_cores`` (``MachineShare.margin``)
    competing_cores_margin: float = 0.0

    @property
    def loaded(self) -> bool:
        """A probe that ran on a busy machine (``load_reason`` says how it showed)."""
        return bool(self.load_reason)

    @property
    def load_reason(self) -> str:
        """What showed that the probe's machine was busy, in words ("" when it was not)."""
        wall = "its wall time was {:.2f}x its CPU time"
        return load_reason(
            self.wall_over_cpu, self.competing_cores, wall, self.competing_cores_margin
        )

    def __post_init__(self) -> None:
        for name in ("peak_flops", "peak_bytes", "conv_peak_flops"):
            value = getattr(self, name)
            if not _positive(value) and not (name == "conv_peak_flops" and value is None):
                raise ModelProfError(f"Peaks.{name} must be a positive number, got {value!r}")
        if self.source not in _SOURCES:
            raise ModelProfError(
                f"Peaks.source must be one of {list(_SOURCES)}, got {self.source!r}"
            )
        levels = tuple(self.levels)
        object.__setattr__(self, "levels", levels)
        if levels:
            if any(not isinstance(lv, MemoryLevel) for lv in levels):
                raise ModelProfError(
                    "Peaks.levels must hold modelprof.timing.peaks.MemoryLevel items"
                )
            caps = [lv.capacity_bytes for lv in levels]
            if caps[-1] is not None or any(c is None for c in caps[:-1]):
                raise ModelProfError(
                    "Peaks.levels: only the last level (main memory) may be "
                    "unbounded (capacity_bytes=None), and it must be"
                )
            if any(a >= b for a, b in zip(caps[:-2], caps[1:-1])):
                raise ModelProfError(f"Peaks.levels must grow in capacity, got {caps}")
            if levels[-1].bandwidth != self.peak_bytes:
                raise ModelProfError(
                    f"Peaks.peak_bytes ({self.peak_bytes!r}) must be the last "
                    f"level's bandwidth ({levels[-1].bandwidth!r})"
                )
        raised = tuple(self.raised)
        if any(not isinstance(r, str) for r in raised):
            raise ModelProfError(f"Peaks.raised must hold roof names, got {self.raised!r}")
        object.__setattr__(self, "raised", raised)

    @property
    def memory_levels(self) -> tuple[MemoryLevel, ...]:
        """``levels``, or main memory alone (``DRAM`` at ``peak_bytes``) when none were given."""
        return self.levels or (MemoryLevel("DRAM", None, self.peak_bytes),)


#: every name of a floating dtype (``runtime.inputs.DTYPE_NAMES``) to its canonical one, and tf32
_DTYPE_NAMES: dict[str, str] = {
    **{alias: str(dtype).removeprefix("torch.") for alias, dtype in DTYPE_NAMES.items()},
    "tf32": "tf32",
}


def _dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical name: float32, tf32, float16, bfloat16 or float64."""
    if not isinstance(dtype, (torch.dtype, str)):
        raise ModelProfError(f"dtype must be a torch.dtype or a name, got {dtype!r}")
    key = _plain_name(str(dtype).lower())  # (a dtype's str: "torch.float32")
    if key not in _DTYPE_NAMES:
        raise ModelProfError(
            f"dtype {dtype!r} has no roofline peak; use one of float32, tf32, float16, bfloat16, float64"
        )
    return _DTYPE_NAMES[key]


def autocast_dtype(dtype: Any, amp: Any) -> str | None:
    """The name of the dtype autocast (``amp``: a ``torch.dtype`` or its name, as a report's
    ``env["mode"]["amp"]`` holds it) ran the matmuls and convolutions of a run of ``dtype`` in:
    ``amp``'s, for float32 and float16/bfloat16 tensors; None without autocast or for a float64
    run (autocast leaves float64 as it is)."""
    if amp is None or amp is False or _plain_name(dtype) == "float64":
        return None
    return _plain_name(amp)


def refuse_idle_amp(dtype: Any, amp: Any) -> None:
    """Refuse ``amp`` on a float64 run, as ``amp='int8'`` is: autocast leaves float64 as it
    is, so nothing would run at half precision while the run said it did."""
    if amp is not None and amp is not False and autocast_dtype(dtype, amp) is None:
        raise ModelProfError(
            f"amp={str(amp).removeprefix('torch.')} on a float64 run (dtype=, else the "
            "model's): autocast leaves float64 as it is, so nothing would run at half "
            "precision; pass dtype=torch.float32 with amp=, or drop amp="
        )


def peak_dtype(dtype: Any, amp: Any = None, *, tf32: bool = False) -> str:
    """The name of the dtype a run's peak is of, a matmul of the dtype its matmuls ran in:
    under autocast its dtype (:func:`autocast_dtype`), else the run's ``dtype``; float32 with
    ``tf32`` (TF32 matmuls on, on a GPU) is ``"tf32"``. The one rule of the probe, the datasheet
    lookup and ``Report.utilization``; a name with no peak is returned as it is."""
    name = autocast_dtype(dtype, amp) or _plain_name(dtype)
    return "tf32" if name == "float32" and tf32 else name


def _plain_name(dtype: Any) -> str:
    """``torch.bfloat16`` or ``"torch.bfloat16"`` as ``"bfloat16"``."""
    return str(dtype).strip().removeprefix("torch.")


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
    #: the device's memory (``timing.memory_sizes``)
    memory_bytes: int | None = None


TB = 1e12
GB = 1e9
GiB = 2**30


def _spec(
    float32: float,
    tf32: float | None,
    float16: float | None,
    bfloat16: float | None,
    bandwidth: float,
    memory_bytes: int,
    source: str,
) -> DeviceSpec:
    """A ``DeviceSpec`` from datasheet rates in TFLOP/s (``None``: no tensor-core path)."""
    rates = (None if r is None else r * 1e12 for r in (float32, tf32, float16, bfloat16))
    return DeviceSpec(*rates, bandwidth, source, memory_bytes)


# NVIDIA datasheets quote tensor-core rates "with sparsity"; the dense rates below are half of
# those. FP16 rates are with FP32 accumulate (what PyTorch uses). Memory: datasheets say "80 GB"
# for 80 GiB of HBM, the values are those binary sizes; V100 SXM2 and PCIe come with 16 or 32
# GB: the smaller is listed (pass ``memory_bytes=`` for the other).
KNOWN_DEVICES: dict[str, DeviceSpec] = {
    "H100 SXM": _spec(67, 494.7, 989.4, 989.4, 3.35 * TB, 80 * GiB, "NVIDIA H100 datasheet"),
    "H100 PCIe": _spec(51, 378, 756, 756, 2.0 * TB, 80 * GiB, "NVIDIA H100 datasheet"),
    "H100 NVL": _spec(60, 417.5, 835.5, 835.5, 3.9 * TB, 94 * GiB, "NVIDIA H100 datasheet"),
    "H200 SXM": _spec(67, 494.7, 989.4, 989.4, 4.8 * TB, 141 * GiB, "NVIDIA H200 datasheet"),
    "H200 NVL": _spec(60, 417.5, 835.5, 835.5, 4.8 * TB, 141 * GiB, "NVIDIA H200 datasheet"),
    # bandwidth differs per memory / form factor
    "A100 SXM 80GB": _spec(19.5, 156, 312, 312, 2039 * GB, 80 * GiB, "NVIDIA A100 datasheet"),
    "A100 PCIe 80GB": _spec(19.5, 156, 312, 312, 1935 * GB, 80 * GiB, "NVIDIA A100 datasheet"),
    "A100 SXM 40GB": _spec(19.5, 156, 312, 312, 1555 * GB, 40 * GiB, "NVIDIA A100 datasheet"),
    "A100 PCIe 40GB": _spec(19.5, 156, 312, 312, 1555 * GB, 40 * GiB, "NVIDIA A100 datasheet"),
    "L4": _spec(30.3, 60, 121, 121, 300 * GB, 24 * GiB, "NVIDIA L4 datasheet"),
    "L40S": _spec(91.6, 183, 362, 362, 864 * GB, 48 * GiB, "NVIDIA L40S datasheet"),
    "A10": _spec(31.2, 62.5, 125, 125, 600 * GB, 24 * GiB, "NVIDIA A10 datasheet"),
    # no NVIDIA datasheet for the A10G
    "A10G": _spec(35, 35, 70, 70, 600 * GB, 24 * GiB, "AWS G5 figures (approximate)"),
    # Turing / Volta: no TF32 or BF16 tensor cores (float32 matmuls run on CUDA cores).
    "T4": _spec(8.1, None, 65, None, 320 * GB, 16 * GiB, "NVIDIA T4 datasheet"),
    "V100 SXM2": _spec(15.7, None, 125, None, 900 * GB, 16 * GiB, "NVIDIA V100 datasheet"),
    "V100 PCIe": _spec(14, None, 112, None, 900 * GB, 16 * GiB, "NVIDIA V100 datasheet"),
    "V100S PCIe": _spec(16.4, None, 130, None, 1134 * GB, 32 * GiB, "NVIDIA V100S datasheet"),
    "RTX 4090": _spec(82.6, 82.6, 165.2, 165.2, 1008 * GB, 24 * GiB, "NVIDIA Ada whitepaper"),
    "RTX 3090": _spec(35.6, 35.6, 71, 71, 936 * GB, 24 * GiB, "NVIDIA GA102 whitepaper"),
}


# First match wins: every token of a rule must appear among the name's tokens. A rule names one
# variant (form factor, memory): a key's own words, then the other names torch and vendors use.
# A family name alone ("A100") is ambiguous and refused.
_MATCH_RULES: tuple[tuple[frozenset[str], str], ...] = tuple(
    (frozenset(tokens.lower().split()), key)
    for tokens, key in (
        *((key, key) for key in KNOWN_DEVICES),
        ("h100 sxm5", "H100 SXM"),
        ("h100 hbm3", "H100 SXM"),  # torch: "NVIDIA H100 80GB HBM3"
        ("nvidia h200", "H200 SXM"),  # torch: "NVIDIA H200"
        ("a100 sxm4 40gb", "A100 SXM 40GB"),
        ("a100 sxm4 80gb", "A100 SXM 80GB"),
        ("v100s", "V100S PCIe"),
        ("4090", "RTX 4090"),
        ("3090", "RTX 3090"),
    )
)
# families with several variants in the table, by the token that names the family
_FAMILIES = ("h100", "h200", "a100", "v100")


def match_device(name: str) -> str | None:
    """The :data:`KNOWN_DEVICES` key for a device name as torch reports it, or None.

    ``"NVIDIA A100-SXM4-40GB" -> "A100 SXM 40GB"``; a key itself matches too. A name that fits
    several variants (``"A100"``) raises ``ModelProfError`` listing them; so does a MIG slice's,
    whose share of the GPU no entry lists.
    """
    if not isinstance(name, str):
        raise ModelProfError(f"device name must be a string, got {name!r}")
    if mig_slice(name) is not None:
        raise mig_refusal(name, "device", "measure the slice (a probe) or pass its figures")
    if name in KNOWN_DEVICES:
        return name
    tokens = set(re.split(r"[\s\-_/,()]+", name.lower()))
    for rule, key in _MATCH_RULES:
        if rule <= tokens:
            return key
    for family in _FAMILIES:
        if family in tokens:
            variants = [k for k in KNOWN_DEVICES if k.lower().split()[0] == family]
            raise ModelProfError(
                f"device name {name!r} is ambiguous: it fits "
                f"{', '.join(map(repr, variants))}; name one of them"
            )
    return None


def lookup_peaks(
    device_name: str, dtype: torch.dtype | str = "float32", *, conv_tf32: bool | None = None
) -> Peaks | None:
    """Datasheet peaks for a device (:func:`match_device`) at ``dtype``, or None when it is not
    in :data:`KNOWN_DEVICES` or has no rate for that dtype (bfloat16 on a T4). ``"tf32"``: float32
    matmuls with TF32 enabled (the float32 rate without TF32). ``conv_tf32`` (float32 and tf32):
    whether cuDNN convolutions use TF32, sets ``conv_peak_flops`` where that differs."""
    name = _dtype_name(dtype)
    key = match_device(device_name)
    if key is None:
        return None
    spec = KNOWN_DEVICES[key]
    flops = {  # float64: no tensor-core rate in the table
        "float32": spec.float32,
        "tf32": spec.tf32 or spec.float32,
        "float16": spec.float16,
        "bfloat16": spec.bfloat16,
    }.get(name)
    if flops is None:
        return None
    conv = None
    if conv_tf32 is not None and name in ("float32", "tf32") and conv_tf32 != (name == "tf32"):
        conv = (spec.tf32 or spec.float32) if conv_tf32 else spec.float32
    return Peaks(
        peak_flops=flops,
        peak_bytes=spec.bandwidth,
        source="table",
        device=key,
        dtype=name,
        conv_peak_flops=conv if conv != flops else None,
    )


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
    """Seconds for one call by the device's clock: CUDA events on CUDA, else ``perf_counter_ns``
    between synchronizes."""
    clock = CudaEventClock(dev) if dev.type == "cuda" else HostSyncClock(dev)
    return float(clock.time([fn], 1)[0, 0]) / 1e3


def _best_of(fn: Callable[[], object], dev: torch.device, tries: int, deadline: float) -> float:
    """Fastest of up to ``tries`` timed calls (seconds), at least one, none started after
    ``deadline`` (``time.perf_counter``): the run least disturbed by other work."""
    best = math.inf
    for _ in range(tries):
        best = min(best, _time_once(fn, dev))
        if time.perf_counter() > deadline:
            break
    return best


@contextmanager
def _matmul_precision(tf32: bool, exact: bool = False) -> Iterator[None]:
    """TF32 float32 matmuls for the block (``exact``: plain FP32; neither: as the user has it),
    restored after. Through ``fp32_precision`` where this torch has it (the legacy getters raise
    once a user has set it)."""
    if not tf32 and not exact:
        yield
        return
    backend = torch.backends.cuda.matmul
    if isinstance(getattr(backend, "fp32_precision", None), str):
        previous, value = backend.fp32_precision, "tf32" if tf32 else "ieee"
        put = functools.partial(setattr, backend, "fp32_precision")
    else:
        previous, value = torch.get_float32_matmul_precision(), "high" if tf32 else "highest"
        put = torch.set_float32_matmul_precision
    put(value)
    try:
        yield
    finally:
        put(previous)


def _probe_matmul(
    dev: torch.device, dtype: torch.dtype, size: int | None, repeats: int, budget_s: float
) -> float:
    """FLOP/s of an n x n matmul (2 n^3 FLOP). Without ``size``: 4096 on CUDA; elsewhere n doubles
    from 256 while a call fits half the per-run budget, up to 1024 on CPU (2048 on other devices)."""
    per_run = budget_s / (repeats + 2)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)

    def make(n: int) -> Callable[[], object]:
        a = torch.randn(n, n, device=dev, generator=gen).to(dtype)
        b = torch.randn(n, n, device=dev, generator=gen).to(dtype)
        out = torch.empty(n, n, device=dev, dtype=dtype)
        return lambda: torch.matmul(a, b, out=out)

    if size is None and dev.type == "cuda":
        size = 4096
    if size is not None and size < 1:
        raise ModelProfError(f"matmul_size must be positive, got {size!r}")
    n = size or 256
    max_n = 1024 if dev.type == "cpu" else 2048
    run = make(n)
    _time_once(run, dev)  # warm-up
    # small CPU matmuls are dominated by fixed costs (thread wake-up), not n^3
    while size is None and n < max_n and _time_once(run, dev) * 2 <= per_run:
        n *= 2
        run = make(n)
        _time_once(run, dev)  # warm-up
    seconds = _best_of(run, dev, 10 * repeats, time.perf_counter() + budget_s)
    return 2.0 * n**3 / seconds


def _sysfs_caches(threads: int) -> list[tuple[str, int]]:
    """Linux: CPU 0's data/unified cache levels as (name, bytes for ``threads`` threads: the
    per-instance size times the instances they spread over)."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    found: dict[int, int] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    for entry in entries:
        if not entry.startswith("index"):
            continue
        read = lambda name: Path(root, entry, name).read_text("ascii").strip()  # noqa: E731
        try:
            if read("type") == "Instruction":
                continue
            level = int(read("level"))
            size = parse_cache_size(read("size"))
            sharing = _count_cpus(read("shared_cpu_list"))
        except (OSError, ValueError):
            continue
        instances = max(1, -(-threads // max(sharing, 1)))  # ceil(threads / cpus per instance)
        found[level] = max(found.get(level, 0), size * instances)
    return [(f"L{level}", found[level]) for level in sorted(found)]


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes() -> int | None:
    """The CPU's largest cache (L3 usually) from sysfs, one instance's bytes; None when unread."""
    return max((size for _, size in _sysfs_caches(1)), default=None)


def parse_cache_size(text: str) -> int:
    """``"32K"`` -> 32768, ``"8192K"`` -> 8 MiB, ``"1M"``, or plain bytes."""
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _count_cpus(text: str) -> int:
    """Number of CPUs in a list such as ``"0-3,8-11"``."""
    n = 0
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def _sysctl_caches() -> list[tuple[str, int]]:
    """macOS: per-core L1d/L2 and the L3 when present (``sysctl hw.l*cachesize``)."""
    out = []
    for level, key in ((1, "hw.l1dcachesize"), (2, "hw.l2cachesize"), (3, "hw.l3cachesize")):
        try:
            value = subprocess.run(
                ["sysctl", "-n", key], capture_output=True, text=True, timeout=2, check=False
            ).stdout.strip()
            size = int(value)
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
        if size > 0:
            out.append((f"L{level}", size))
    return out


def cache_levels(device: torch.device | str | None = None) -> list[tuple[str, int]]:
    """The caches in front of ``device``'s main memory, smallest first, as (name, bytes).

    CPU: L1 data, L2, L3 from ``/sys`` (Linux) or ``sysctl`` (macOS), each sized for the threads
    torch uses (two cores with private 512 KiB L2s hold 1 MiB). CUDA: the L2. Empty when unknown.
    """
    dev = _device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        size = int(getattr(props, "L2_cache_size", 0) or 0)
        return [("L2", size)] if size > 0 else []
    if dev.type != "cpu":
        return []
    threads = torch.get_num_threads()
    caches = _sysfs_caches(threads) if sys.platform.startswith("linux") else _sysctl_caches()
    # growing capacities only: a bogus report must not make the levels overlap
    out: list[tuple[str, int]] = []
    for name, size in caches:
        if size > 0 and (not out or size > out[-1][1]):
            out.append((name, size))
    return out


def _copy_rate(dev: torch.device, working_set: int, repeats: int, deadline: float) -> float:
    """Bytes/s (read + write) of copying ``working_set / 2`` bytes, best of ``repeats`` blocks of
    about 0.5 ms each, so the clock's resolution does not limit small working sets."""
    n = max(1, working_set // 2)
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    once = _time_once(lambda: dst.copy_(src), dev)  # warm-up: page faults
    once = min(once, _time_once(lambda: dst.copy_(src), dev))
    k = max(1, min(10_000, int(0.5e-3 / max(once, 1e-9))))

    def block() -> None:
        for _ in range(k):
            dst.copy_(src)

    return 2.0 * n / (_best_of(block, dev, repeats, deadline) / k)


def _probe_levels(
    dev: torch.device, nbytes: int | None, repeats: int, budget_s: float
) -> tuple[MemoryLevel, ...]:
    """The memory hierarchy of ``dev`` with a measured bandwidth per level.

    Working sets double from 16 KiB; each goes to the level it fits with room to spare (at most
    half its capacity, above half the previous one's); DRAM's is ``nbytes`` (64 MiB on CPU, 256
    MiB on CUDA) or four times the last cache. A level's bandwidth is its best working set's, never
    below the next slower level's (tiny copies are limited by per-call overhead, not the cache).
    """
    if nbytes is None:
        nbytes = (256 if dev.type == "cuda" else 64) * 2**20
    if nbytes < 1:
        raise ModelProfError(f"copy_bytes must be positive, got {nbytes!r}")
    caches = cache_levels(dev)
    dram_ws = max(2 * nbytes, 4 * caches[-1][1] if caches else 0)
    deadline = time.perf_counter() + budget_s
    # DRAM first: it sets the floor, measured even when the budget runs short
    best = {len(caches): _copy_rate(dev, dram_ws, repeats, deadline)}
    ws, lower = 16 * 1024, 0
    for i, (_, capacity) in enumerate(caches):
        while ws <= capacity // 2 and time.perf_counter() < deadline:
            if ws > lower:
                best[i] = max(best.get(i, 0.0), _copy_rate(dev, ws, repeats, deadline))
            ws *= 2
        lower = capacity // 2
    levels: list[MemoryLevel] = []
    floor = best[len(caches)]
    for i in range(len(caches), -1, -1):  # slowest first: each level at least the one behind it
        floor = max(floor, best.get(i, 0.0))
        name, capacity = caches[i] if i < len(caches) else ("DRAM", None)
        levels.append(MemoryLevel(name, capacity, floor))
    return tuple(reversed(levels))


def probe_peaks(
    device: torch.device | str | None = None,
    dtype: torch.dtype | str = torch.float32,
    *,
    budget_s: float | None = None,
    repeats: int = 5,
    matmul_size: int | None = None,
    copy_bytes: int | None = None,
) -> Peaks:
    """Measure peak FLOP/s (an n x n matmul at ``dtype``) and the bandwidth of each memory
    level (copies sized to each cache, and one for DRAM) on ``device``.

    Best of ``repeats`` timed runs after a warm-up. ``matmul_size``: 4096 on CUDA; on CPU it
    grows from 256 to at most 1024 within the budget. The DRAM copy moves at least
    ``copy_bytes`` (64 MiB on CPU, 256 MiB on CUDA) and four times the last cache. ``budget_s``
    (1 s on CPU, 5 s elsewhere): 60 % for the matmul, 40 % for the copies. ``dtype="tf32"``
    enables TF32 for the probe only; float32 on CUDA reports ``"tf32"`` when TF32 is already on.
    The operands come from a private generator: the global RNG is left as it was.
    """
    dev = _device(device)
    name = _dtype_name(dtype)
    repeats = check_int("repeats", repeats)
    if budget_s is None:
        budget_s = 1.0 if dev.type == "cpu" else 5.0
    if not budget_s > 0:
        raise ModelProfError(f"budget_s must be positive, got {budget_s!r}")
    torch_dtype = torch.float32 if name == "tf32" else getattr(torch, name)
    # events record on the current device's stream
    on_device = torch.cuda.device(dev) if dev.type == "cuda" else nullcontext()
    conv_tf32 = conv_uses_other_precision(dev, name)
    cpu_now = cpu_time_source()[1]
    conv, machine = None, MachineShare(on=dev.type == "cpu")
    with machine:
        wall0, cpu0 = time.perf_counter_ns(), cpu_now()
        with on_device, torch.inference_mode(), _matmul_precision(name == "tf32"):
            if name == "float32" and dev.type == "cuda" and tf32_enabled("matmul"):
                name = "tf32"
            share = 0.3 if conv_tf32 is not None else 0.6
            flops = _probe_matmul(dev, torch_dtype, matmul_size, repeats, share * budget_s)
            levels = _probe_levels(dev, copy_bytes, repeats, 0.4 * budget_s)
        if conv_tf32 is not None:  # cuDNN's float32 convolutions run at the other precision:
            # a matmul at it is their roof
            precision = _matmul_precision(conv_tf32, exact=not conv_tf32)
            with on_device, torch.inference_mode(), precision:
                conv = _probe_matmul(dev, torch_dtype, matmul_size, repeats, 0.3 * budget_s)
        wall, cpu = time.perf_counter_ns() - wall0, cpu_now() - cpu0
    return Peaks(
        peak_flops=flops,
        peak_bytes=levels[-1].bandwidth,
        source="probe",
        device=_device_name(dev),
        dtype=name,
        levels=levels,
        conv_peak_flops=conv,
        wall_over_cpu=wall / cpu if dev.type == "cpu" and cpu > 0 else None,
        competing_cores=machine.competing_cores,
        competing_cores_margin=machine.margin,
    )


def conv_uses_other_precision(device: torch.device, dtype_name: str) -> bool | None:
    """For float32 on CUDA, whether cuDNN convolutions use TF32 (True) or FP32 (False) where
    that differs from cuBLAS matmuls; None where both agree or the question does not arise."""
    if device.type != "cuda" or dtype_name not in ("float32", "tf32"):
        return None
    matmul = dtype_name == "tf32" or tf32_enabled("matmul")
    conv = tf32_enabled("conv")
    return conv if conv != matmul else None
