"""Human units for rendered tables: the one place where numbers become text.

- Counts: decimal SI prefixes, 2 decimals (``1.82 G``); an integer below 1000 as is (``512``).
- Bytes: binary IEC prefixes, always with the ``i`` (``3.06 MiB``); below 1024 ``512 B``.
- Rates: decimal SI prefixes, as vendors quote peaks (``1.20 TB/s``).
- Times: given in ms, 3 significant figures in the unit with a mantissa in [1, 1000)
  (``3.10 ms``, ``850 µs``, ``1.25 s``).
- Percentages: 2 decimals (``12.48%``).
- Multiples (ratios to a baseline): 3 significant figures, at least 2 decimals (``1.00×``,
  ``0.0328×``, ``150×``).

Every formatter returns ``"n/a"`` for a missing value (``None`` or NaN): not measured (a failed
model), or no figure to state (an interval of one block, a rank withheld), one spelling for all.
"""

from __future__ import annotations

import math
from typing import Sequence

from modelprof.errors import ModelProfError

__all__ = [
    "MISSING",
    "SI_PREFIXES",
    "IEC_PREFIXES",
    "TIME_UNITS",
    "format_count",
    "format_bytes",
    "format_rate",
    "format_time_ms",
    "format_percent",
    "format_multiple",
    "pick_scale",
]

MISSING = "n/a"
"""What every formatter prints for ``None`` or NaN."""

SI_PREFIXES: tuple[tuple[float, str], ...] = tuple(
    (1e3**i, p) for i, p in enumerate(["", "K", "M", "G", "T", "P"])
)
IEC_PREFIXES: tuple[tuple[float, str], ...] = tuple(
    (1024.0**i, p) for i, p in enumerate(["B", "KiB", "MiB", "GiB", "TiB"])
)
# (milliseconds per unit, symbol), largest first.
TIME_UNITS: tuple[tuple[float, str], ...] = ((1e3, "s"), (1.0, "ms"), (1e-3, "µs"), (1e-6, "ns"))


def _missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return math.isnan(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ModelProfError(f"cannot format {value!r} as a number") from None


def _scaled(value: float, prefixes: Sequence[tuple[float, str]], decimals: int) -> tuple[str, str]:
    """Mantissa text and prefix symbol, the prefix chosen *after* rounding (999.999 K -> 1.00 M)."""
    if not math.isfinite(value):
        return ("inf" if value > 0 else "-inf"), prefixes[0][1]
    base_scale, base_symbol = prefixes[0]
    step = prefixes[1][0] / base_scale
    if abs(value) < step and value.is_integer():
        return str(int(value)), base_symbol
    for scale, symbol in prefixes:  # (the last prefix takes any size)
        mantissa = round(value / scale, decimals)
        if abs(mantissa) < step:
            break
    return f"{mantissa:.{decimals}f}", symbol


def format_count(value: float | int | None, *, decimals: int = 2, unit: str = "") -> str:
    """``1814073344 -> "1.81 G"``, ``512 -> "512"``; ``unit`` is appended to the prefix (``"1.81 GFLOP"``)."""
    if _missing(value):
        return MISSING
    text, prefix = _scaled(float(value), SI_PREFIXES, decimals)  # type: ignore[arg-type]
    suffix = f"{prefix}{unit}"
    return f"{text} {suffix}" if suffix else text


def format_bytes(value: float | int | None, *, decimals: int = 2) -> str:
    """``3211264 -> "3.06 MiB"``, ``512 -> "512 B"`` (binary IEC prefixes)."""
    if _missing(value):
        return MISSING
    text, unit = _scaled(float(value), IEC_PREFIXES, decimals)  # type: ignore[arg-type]
    return f"{text} {unit}"


def format_rate(per_second: float | int | None, unit: str, *, decimals: int = 2) -> str:
    """A rate with decimal SI prefixes: ``format_rate(1.2e12, "B/s") -> "1.20 TB/s"``."""
    return format_count(per_second, decimals=decimals, unit=unit)


def format_time_ms(ms: float | int | None) -> str:
    """A duration given in milliseconds: ``3.1 -> "3.10 ms"``, ``0.85 -> "850 µs"``, ``1250 -> "1.25 s"``."""
    if _missing(ms):
        return MISSING
    value = float(ms)  # type: ignore[arg-type]
    if value == 0:
        return "0 ms"
    if not math.isfinite(value):
        return f"{'inf' if value > 0 else '-inf'} ms"
    for scale, symbol in TIME_UNITS:  # (the last unit takes any size)
        mantissa = float(f"{value / scale:.3g}")  # 3 significant figures
        if abs(mantissa) >= 1:
            break
    # the trailing zeros of the 3 significant figures kept: 3.1 -> 3.10
    decimals = max(0, 2 - math.floor(math.log10(abs(mantissa))))
    return f"{mantissa:.{decimals}f} {symbol}"


def format_percent(percent: float | int | None, *, decimals: int = 2) -> str:
    """A value already in percent: ``12.4816 -> "12.48%"``, ``0.0031 -> "<0.01%"``."""
    if _missing(percent):
        return MISSING
    text = f"{float(percent):.{decimals}f}"  # type: ignore[arg-type]
    if float(text) == 0 and percent != 0:  # 0.0031 %: "<0.01%", not a true zero's "0.00%"
        text = ("<" if percent > 0 else "-<") + f"{10.0**-decimals:.{decimals}f}"  # type: ignore
    return f"{text}%"


def format_multiple(ratio: float | int | None) -> str:
    """A ratio to a baseline: ``1 -> "1.00×"``, ``0.0328 -> "0.0328×"``, ``150.2 -> "150×"``."""
    if _missing(ratio):
        return MISSING
    value = float(ratio)  # type: ignore[arg-type]
    size = abs(value)
    if size == 0:
        return "0×"
    if not math.isfinite(value):
        return f"{'inf' if value > 0 else '-inf'}×"
    if size >= 100:
        return f"{value:.0f}×"
    decimals = 2 if size >= 1 else min(8, 2 - math.floor(math.log10(size)))
    return f"{value:.{decimals}f}×"


def pick_scale(values: Sequence[float], prefixes: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The largest ``(scale, symbol)`` not above the largest magnitude in ``values`` (``prefixes``
    in any order), else the smallest; missing values are ignored."""
    finite = [abs(float(v)) for v in values if v is not None and math.isfinite(float(v))]
    top = max(finite, default=0.0)
    ordered = sorted(prefixes, key=lambda p: p[0])
    fits = [p for p in ordered if p[0] <= top]
    return fits[-1] if fits else ordered[0]
