"""What modelprof needs to know about a device: canonical names, synchronisation, out-of-memory
detection, the allocator-peak tracker and the TF32 flags that decide a float32 kernel's peak.
Nothing here measures time (that is ``modelprof.timing.clock``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import torch

from modelprof.errors import ModelProfError
from modelprof.runtime import compat

__all__ = [
    "MemoryStats",
    "PeakTracker",
    "device_synchronize",
    "is_oom",
    "mig_refusal",
    "mig_slice",
    "normalize_device",
    "same_device",
    "tf32_enabled",
]

#: a MIG slice in a device name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", or "MIG 1c.3g.20gb" for a
#: compute instance smaller than its GPU instance
_MIG = re.compile(r"\bMIG[\s-]+((?:\d+c\.)?\d+g\.\d+gb)\b", re.IGNORECASE)


def mig_slice(name: Any) -> str | None:
    """The MIG profile (``"1g.5gb"``) a device name carries, or None for a whole GPU."""
    match = _MIG.search(name) if isinstance(name, str) else None
    return None if match is None else match[1].lower()


def mig_refusal(name: str, what: str, instead: str) -> ModelProfError:
    """The refusal of a MIG slice's name where a whole GPU's datasheet figure would be taken."""
    return ModelProfError(
        f"{what}={name!r} is a MIG slice ({mig_slice(name)}), not the whole GPU: it has a "
        "share of the GPU's compute, memory and bandwidth that the datasheet does not list, "
        f"so the whole GPU's figures would be wrong; {instead}"
    )


#: Substrings of allocation failures that are not ``OutOfMemoryError`` (cuBLAS/cuDNN, the CPU);
#: "alloc_failed" also finds cuBLAS's and cuDNN's ``STATUS_ALLOC_FAILED``
_OOM_MESSAGES = (
    "out of memory",
    "can't allocate",
    "cannot allocate",
    "alloc_failed",
    "failed to allocate",
)


def normalize_device(device: torch.device | str | int) -> torch.device:
    """A device with its index spelt out (``cuda`` -> ``cuda:<current>``), so spellings compare."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.index is None and dev.type not in ("cpu", "meta"):
        current = getattr(getattr(torch, dev.type, None), "current_device", None)
        if current is not None:
            try:
                return torch.device(dev.type, int(current()))
            except Exception:  # no such backend initialised: keep the name as given
                return dev
    return dev


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """``a`` and ``b`` name the same device (``cuda`` and ``cuda:0`` do when 0 is current)."""
    return normalize_device(a) == normalize_device(b)


def device_synchronize(device: torch.device) -> None:
    """Wait for all work queued on ``device`` (a no-op on CPU and meta)."""
    kind = device.type
    if kind in ("cpu", "meta"):
        return
    sync = getattr(getattr(torch, kind, None), "synchronize", None)  # torch.cuda's among them
    if sync is not None:
        try:
            sync(device)
        except TypeError:
            sync()
        return
    torch.accelerator.synchronize(device)


def is_oom(e: BaseException | None) -> bool:
    """An allocation failure anywhere in ``e``'s chain of causes and contexts."""
    seen: set[int] = set()
    kinds = compat.oom_errors()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (*kinds, MemoryError)):
            return True
        if isinstance(e, RuntimeError) and any(s in str(e).lower() for s in _OOM_MESSAGES):
            return True
        e = e.__cause__ or e.__context__
    return False


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Reads and resets the allocator peak; injectable so the nesting logic is testable on CPU."""

    max_allocated: Callable[[], int]
    reset_peak: Callable[[], None]

    @classmethod
    def for_device(cls, device: torch.device) -> MemoryStats | None:
        """The CUDA allocator's statistics on a CUDA device, else None (no allocator peak)."""
        if device.type != "cuda":
            return None
        return cls(
            lambda: torch.cuda.max_memory_allocated(device),
            lambda: torch.cuda.reset_peak_memory_stats(device),
        )

    @classmethod
    def parse(cls, memory_stats: Any, device: torch.device) -> MemoryStats | None:
        """A ``memory_stats=`` argument: None (the default), False (off) or a ``MemoryStats``."""
        if memory_stats is None:
            return cls.for_device(device)
        if memory_stats is not False and not isinstance(memory_stats, cls):
            raise ModelProfError(
                f"memory_stats={memory_stats!r} must be None, False or a MemoryStats"
            )
        return None if memory_stats is False else memory_stats


class PeakTracker:
    """Allocator peak of each (nested) call, by call index, from the memory in use when it
    begins; a child's reset folds the peak so far into its parent first."""

    def __init__(self, stats: MemoryStats) -> None:
        self.stats = stats
        self.peak: dict[int, int] = {}
        self.stack: list[int] = []

    def enter(self, i: int) -> None:
        stats, stack, peak = self.stats, self.stack, self.peak
        if stack:
            top = stack[-1]
            peak[top] = max(peak.get(top, 0), stats.max_allocated())
        stats.reset_peak()
        peak[i] = max(peak.get(i, 0), stats.max_allocated())
        stack.append(i)

    def exit(self) -> int:
        """Close the innermost open call; returns its index."""
        stack, peak = self.stack, self.peak
        i = stack.pop()
        peak[i] = max(peak.get(i, 0), self.stats.max_allocated())
        if stack:
            top = stack[-1]
            peak[top] = max(peak.get(top, 0), peak[i])
        return i


def tf32_enabled(kind: str) -> bool:
    """Whether float32 ``"matmul"`` (cuBLAS) or ``"conv"`` (cuDNN) kernels may use TF32: the
    newer ``fp32_precision`` where set (the legacy getters then raise), else the legacy flags."""
    if kind not in ("matmul", "conv"):
        raise ValueError(f"kind={kind!r} must be 'matmul' or 'conv'")
    try:
        cudnn = torch.backends.cudnn
        legacy = torch.backends.cuda.matmul if kind == "matmul" else cudnn
        for backend in (legacy,) if kind == "matmul" else (getattr(cudnn, "conv", None), cudnn):
            new = getattr(backend, "fp32_precision", None)  # "tf32", "ieee", "none", or absent
            if isinstance(new, str) and new != "none":
                return new == "tf32"
        try:
            return bool(legacy.allow_tf32)
        except Exception:
            return kind == "matmul" and torch.get_float32_matmul_precision() != "highest"
    except Exception:
        return False
