"""The environment a measurement was taken in: device, versions, precision flags, clocks.

``collect_env`` never fails (what cannot be read is left out or None); every value is JSON.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from modelprof.errors import ModelProfError
from modelprof.runtime.device import tf32_enabled
from modelprof.runtime.tensors import brief

__all__ = [
    "MachineShare",
    "collect_env",
    "cpu_name",
    "gpu_state",
    "jsonable",
    "oversubscribed_note",
    "sm_clock_reader",
]

#: nvidia-smi's query fields and the keys ``gpu_state`` gives them
_NVSMI_FIELDS = {
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.max.mem": "max_mem_clock_mhz",
    "temperature.gpu": "temperature_c",
    "power.draw": "power_w",
    "pstate": "pstate",
    "driver_version": "driver_version",
}


#: Linux's per-core time counters, in ticks of ``SC_CLK_TCK``
_PROC_STAT = "/proc/stat"
#: the busy fields of a ``cpuN`` line: user, nice, system, irq, softirq, steal (not idle, iowait)
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
#: from this much wall time in all, ``/proc/stat``'s ticks (10 ms) are taken as small beside the
#: figure; a shorter reading carries them as its margin (``MachineShare.margin``)
MIN_SHARE_S = 0.5


def busy_ns(stat: str, cpus: set[int] | None, tick_ns: float) -> int:
    """Nanoseconds the cores ``cpus`` (None: all) have been busy since boot, from the text of
    ``/proc/stat``; a hypervisor's steal counts as busy (the core ran something else)."""
    total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit():
            continue
        if cpus is None or int(name[3:]) in cpus:
            fields = rest.split()
            total += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return int(total * tick_ns)


class MachineShare:
    """What other work took of the cores torch's threads needed while a run was timed.

    In each window (``with share:``, any number of them) the usable cores' busy time in
    ``/proc/stat`` less this process's own CPU time is the other work's; over the wall time it
    is cores' worth, and what of it the cores torch's threads leave idle cannot hold is
    ``competing_cores``. None where ``/proc/stat`` cannot be read (not Linux) or was not read.
    Windows under ``MIN_SHARE_S`` in all are read too (a throughput point sampled for 0.14 s
    escaped the load its neighbours showed), with ``margin``: what the ticks can move the
    figure by. The usable cores are the calling thread's affinity, or every core where that
    holds fewer than torch's threads (an OpenMP binding pins each thread to a core of its own).
    """

    def __init__(self, on: bool = True) -> None:
        self.on = on  # off: nothing is read (a device run, or the CPU time as the clock)
        threads = torch.get_num_threads()
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.cpus = set(cpus) if cpus and len(cpus) >= threads else None
        self.usable = len(self.cpus) if self.cpus else os.cpu_count() or 1
        self.spare = max(0, self.usable - threads)
        self.tick_ns = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7
        self.others_ns = self.wall_ns = self.windows = 0
        self._from: tuple[int, int, int] | None = None

    def _now(self) -> tuple[int, int, int] | None:
        if not self.on:
            return None
        try:
            with open(_PROC_STAT) as f:
                busy = busy_ns(f.read(), self.cpus, self.tick_ns)
        except (OSError, ValueError, IndexError):
            return None
        return busy, time.process_time_ns(), time.perf_counter_ns()

    def __enter__(self) -> MachineShare:
        self._from = self._now()
        return self

    def __exit__(self, *exc: Any) -> None:
        end, begin, self._from = self._now(), self._from, None
        if begin is not None and end is not None:
            self.others_ns += (end[0] - begin[0]) - (end[1] - begin[1])
            self.wall_ns += end[2] - begin[2]
            self.windows += 1

    @property
    def competing_cores(self) -> float | None:
        """Cores' worth of other work beyond the idle ones, over the windows (>= 0; None
        where no window was read)."""
        if self.wall_ns <= 0:
            return None
        return max(0.0, self.others_ns / self.wall_ns - self.spare)

    @property
    def margin(self) -> float:
        """How far ``/proc/stat``'s ticks can move ``competing_cores`` under ``MIN_SHARE_S``:
        each usable core's count may be off by a tick at each window's ends, so a tick per core
        per window over the wall time (2 cores over 0.14 s: 0.14 cores); 0 from
        ``MIN_SHARE_S`` on (0.04 cores there, for 2: taken as small, as it always was)."""
        if self.wall_ns <= 0 or self.wall_ns >= MIN_SHARE_S * 1e9:
            return 0.0
        return self.usable * self.windows * self.tick_ns / self.wall_ns


def oversubscribed_note() -> str | None:
    """A note where torch runs more intra-op threads than the machine has cores: they take
    turns on the cores, so each op waits for threads that have none and times read slower than
    at one thread a core (an affinity narrower than the threads may be an OpenMP binding, which
    gives each thread a core of its own: not judged, as :class:`MachineShare`)."""
    threads, cores = torch.get_num_threads(), os.cpu_count()
    if not cores or threads <= cores:
        return None
    return (
        f"torch ran {threads} threads on {cores} cores (oversubscribed): they took turns on the "
        "cores, so each op waited for threads without one and the times read slower than with "
        f"torch.set_num_threads({cores}) or fewer"
    )


def jsonable(value: Any, nonfinite: str = "null", where: str | None = None) -> Any:
    """``value`` in plain JSON types: numpy scalars, arrays and tensors by ``tolist()``, tuples as
    lists, mapping keys as strings, paths as strings, pandas' NA as None. A NaN or infinity is
    None (``nonfinite="null"``), kept (``"keep"``), or None for a NaN and "inf"/"-inf" for an
    infinity (``"text"``). Anything else is its ``str()``; given ``where`` (the value's place,
    for the message), anything else but a torch dtype or device is a ModelProfError."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value) or nonfinite == "keep":
            return value
        return str(value) if nonfinite == "text" and math.isinf(value) else None
    if hasattr(value, "tolist"):
        return jsonable(value.tolist(), nonfinite, where)
    # ``where and ...``: None stays None (no place to name, nothing refused)
    if isinstance(value, Mapping):
        return {
            str(k): jsonable(v, nonfinite, where and f"{where}[{k!r}]") for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [jsonable(v, nonfinite, where and f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is pd.NA or value is pd.NaT:
        return None
    if where is None or isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    raise ModelProfError(
        f"{where} = {brief(value)} ({type(value).__name__}) cannot be written as JSON"
    )


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.lru_cache(maxsize=1)
def _modelprof_version() -> str:
    try:
        from importlib.metadata import version

        return version("modelprof")
    except Exception:
        pkg = sys.modules.get("modelprof")
        return str(getattr(pkg, "__version__", "unknown"))


def _read(fn: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return jsonable(fn(), "keep")
    except Exception:
        return None


def gpu_uuid(index: int) -> str | None:
    """The UUID of CUDA device ``index`` as torch numbers it (NVML numbers by PCI order), or
    None."""
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


@functools.cache
def _nvml_sm_clock(index: int) -> Any:
    """A reader of CUDA device ``index``'s SM clock through NVML, opened once; None without
    pynvml or the device."""
    try:
        import pynvml  # type: ignore[import-not-found]

        uuid = gpu_uuid(index)
        if uuid is None:  # NVML numbers devices otherwise than CUDA_VISIBLE_DEVICES does
            return None
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)  # it answers, or no reader
    except Exception:
        return None

    def read() -> int | None:
        # no warnings.catch_warnings here: leaving it resets which warnings were shown, and a
        # warning the model gives every call would print again after every block
        try:
            return int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
        except Exception:
            return None

    return read


def sm_clock_reader(device: torch.device) -> Any:
    """A call that reads the SM clock (MHz, None when a read fails) of the CUDA ``device``, a
    few microseconds each; None off CUDA or without pynvml (``nvidia-ml-py``)."""
    if device.type != "cuda":
        return None
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
    except Exception:  # CUDA asked for where it cannot start: no clock, and no failure
        return None
    return _nvml_sm_clock(index)


def gpu_state(index: int = 0, timeout_s: float = 2.0, uuid: str | None = None) -> dict[str, Any]:
    """Clocks (MHz), temperature (C), power (W), P-state of a GPU via pynvml, else
    ``nvidia-smi`` (empty if neither answers); found by ``uuid``, else by NVML's ``index``."""
    with contextlib.suppress(Exception):
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            h = (
                pynvml.nvmlDeviceGetHandleByUUID(uuid)
                if uuid is not None
                else pynvml.nvmlDeviceGetHandleByIndex(index)
            )
            out: dict[str, Any] = {
                "source": "pynvml",
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            }
            out["power_w"] = _read(lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1e3)
            out["pstate"] = _read(lambda: f"P{pynvml.nvmlDeviceGetPerformanceState(h)}")
            return out
        finally:
            pynvml.nvmlShutdown()
    try:
        res = subprocess.run(
            [
                "nvidia-smi",
                f"--id={uuid if uuid is not None else index}",
                f"--query-gpu={','.join(_NVSMI_FIELDS)}",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        values = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")]
    except Exception:
        return {}
    out = {"source": "nvidia-smi"}
    for k, v in zip(_NVSMI_FIELDS.values(), values):
        try:
            out[k] = float(v) if k not in ("pstate", "driver_version") else v
        except ValueError:
            out[k] = None
    return out


@functools.lru_cache(maxsize=1)
def _fixed_env() -> dict[str, Any]:
    """What cannot change within a process: read once."""
    return {
        "cpu_name": cpu_name(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": _read(torch.backends.cudnn.version),
        "modelprof_version": _modelprof_version(),
    }


def collect_env(
    device: torch.device | str | None = None,
    dtype: Any = None,
    batch_size: int | None = None,
    **mode_flags: Any,
) -> dict[str, Any]:
    """The environment record, ``mode_flags`` among it; an unreadable item is left None."""
    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
    except Exception:
        dev = torch.device("cpu")
    env: dict[str, Any] = {
        "device": str(dev),
        "device_type": dev.type,
        **_fixed_env(),
        "dtype": jsonable(dtype, "keep"),
        "batch_size": batch_size,
        "torch_num_threads": _read(torch.get_num_threads),
        "torch_num_interop_threads": _read(torch.get_num_interop_threads),
        "cudnn_enabled": _read(lambda: torch.backends.cudnn.enabled),
        "cudnn_benchmark": _read(lambda: torch.backends.cudnn.benchmark),
        "cudnn_deterministic": _read(lambda: torch.backends.cudnn.deterministic),
        "tf32_matmul": tf32_enabled("matmul"),
        "tf32_cudnn": tf32_enabled("conv"),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        "mode": jsonable(mode_flags, "keep"),
    }
    if dev.type == "cpu":
        env["device_name"] = env["cpu_name"]
    elif dev.type == "cuda":
        idx = dev.index if dev.index is not None else _read(torch.cuda.current_device) or 0
        env["device_name"] = _read(lambda: torch.cuda.get_device_name(idx))
        props = _read(
            lambda: {
                "capability": list(torch.cuda.get_device_capability(idx)),
                "total_memory_bytes": torch.cuda.get_device_properties(idx).total_memory,
                "multiprocessor_count": torch.cuda.get_device_properties(idx).multi_processor_count,
                "l2_cache_bytes": torch.cuda.get_device_properties(idx).L2_cache_size,
            }
        )
        if props:
            env.update(props)
        uuid = gpu_uuid(idx)
        env["gpu_uuid"] = uuid
        env["gpu_state"] = _read(lambda: gpu_state(idx, uuid=uuid)) or {}
    else:
        env["device_name"] = dev.type
    return env
