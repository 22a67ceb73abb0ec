"""Device memory from the datasheets, keyed as :data:`modelprof.timing.peaks.KNOWN_DEVICES`.
Datasheets say "80 GB" for 80 GiB of HBM: the values are those binary sizes. V100 SXM2 and PCIe
come with 16 or 32 GB: the smaller is listed (pass ``memory_bytes=`` for the other)."""

from __future__ import annotations

from modelprof.errors import ModelProfError
from modelprof.timing.peaks import KNOWN_DEVICES, match_device

__all__ = ["DEVICE_MEMORY_BYTES", "device_memory", "memory_variants"]

GiB = 2**30

DEVICE_MEMORY_BYTES: dict[str, int] = {
    "H100 SXM": 80 * GiB,
    "H100 PCIe": 80 * GiB,
    "H100 NVL": 94 * GiB,
    "H200 SXM": 141 * GiB,
    "H200 NVL": 141 * GiB,
    "A100 SXM 80GB": 80 * GiB,
    "A100 PCIe 80GB": 80 * GiB,
    "A100 SXM 40GB": 40 * GiB,
    "A100 PCIe 40GB": 40 * GiB,
    "L4": 24 * GiB,
    "L40S": 48 * GiB,
    "A10": 24 * GiB,
    "A10G": 24 * GiB,
    "T4": 16 * GiB,
    "V100 SXM2": 16 * GiB,
    "V100 PCIe": 16 * GiB,
    "V100S PCIe": 32 * GiB,
    "RTX 4090": 24 * GiB,
    "RTX 3090": 24 * GiB,
}


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
