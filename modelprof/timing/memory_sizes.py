"""Device memory from the datasheets: the ``memory_bytes`` of
:data:`modelprof.timing.peaks.KNOWN_DEVICES` (where the binary sizes and the V100's two variants
are explained), by the same keys."""

from __future__ import annotations

from modelprof.errors import ModelProfError
from modelprof.timing.peaks import KNOWN_DEVICES, match_device

__all__ = ["DEVICE_MEMORY_BYTES", "device_memory", "memory_variants"]

DEVICE_MEMORY_BYTES: dict[str, int] = {k: s.memory_bytes for k, s in KNOWN_DEVICES.items()}


def memory_variants(key: str) -> dict[str, int]:
    """The table's entries of ``key``'s family (its first word) whose memory differs."""
    family = key.split()[0]
    mine = DEVICE_MEMORY_BYTES[key]
    return {k: v for k, v in DEVICE_MEMORY_BYTES.items() if k.split()[0] == family and v != mine}


def device_memory(name: str) -> tuple[str, int]:
    """``(datasheet entry, memory bytes)`` for a device name; an unknown name lists the known
    ones. The entry says which variant a family name (``"A100"``) was taken as."""
    if not isinstance(name, str):
        raise ModelProfError(f"device={name!r} must be a device name such as 'H100 SXM'")
    key = match_device(name)
    if key is None or key not in DEVICE_MEMORY_BYTES:
        raise ModelProfError(
            f"device={name!r} is not in the datasheet table; known: "
            f"{sorted(KNOWN_DEVICES)} (or pass memory_bytes=)"
        )
    return key, DEVICE_MEMORY_BYTES[key]
