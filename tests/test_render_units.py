"""Human units: closed forms for every formatter (modelprof.render.units)."""

from __future__ import annotations

import math

import pytest

from modelprof.errors import ModelProfError
from modelprof.render.units import (
    IEC_PREFIXES,
    SI_PREFIXES,
    TIME_UNITS,
    format_bytes,
    format_count,
    format_percent,
    format_rate,
    format_time_ms,
    pick_scale,
)


@pytest.mark.parametrize(
    "value, expected",
    [
        (1_814_073_344, "1.81 G"),  # resnet18 MACs: 1.814073344e9 -> 1.81 G
        (11_689_512, "11.69 M"),  # resnet18 params: 11.689512e6 -> 11.69 M
        (512, "512"),  # below 1000 an integer prints as is
        (0, "0"),
        (999, "999"),
        (1000, "1.00 K"),  # 1000 / 1e3 = 1.00
        (999_999, "1.00 M"),  # 999.999 K rounds to 1000.00 K, so the next prefix: 1.00 M
        (1.5, "1.50"),  # a non-integer keeps 2 decimals
        (2.5e15, "2.50 P"),
        (3e18, "3000.00 P"),  # P is the last prefix
        (-2048, "-2.05 K"),  # -2.048 K
    ],
)
def test_format_count(value: float, expected: str) -> None:
    assert format_count(value) == expected


def test_format_count_unit_and_decimals() -> None:
    assert format_count(1.2e12, unit="FLOP") == "1.20 TFLOP"  # 1.2e12 / 1e12
    assert format_count(12_345, decimals=1) == "12.3 K"  # 12.345 K to 1 decimal
    assert format_count(7, unit="B") == "7 B"


@pytest.mark.parametrize("missing", [None, math.nan, float("nan")])
def test_missing_values_print_n_a(missing: object) -> None:
    assert format_count(missing) == "n/a"  # type: ignore[arg-type]
    assert format_bytes(missing) == "n/a"  # type: ignore[arg-type]
    assert format_time_ms(missing) == "n/a"  # type: ignore[arg-type]
    assert format_percent(missing) == "n/a"  # type: ignore[arg-type]
    assert format_rate(missing, "B/s") == "n/a"  # type: ignore[arg-type]


def test_non_numbers_are_an_error_naming_the_value() -> None:
    with pytest.raises(ModelProfError, match="'abc'"):
        format_count("abc")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value, expected",
    [
        (3_211_264, "3.06 MiB"),  # 64*112*112*4 B / 2**20 = 3.0625 MiB (torchstat's 3.06)
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1_048_575, "1.00 MiB"),  # 1023.999 KiB rounds to 1024.00 KiB -> 1.00 MiB
        (46_758_048, "44.59 MiB"),  # resnet18 fp32 weights: 11689512*4 / 2**20 = 44.592 MiB
        (3 * 2**30, "3.00 GiB"),
        (5 * 2**40, "5.00 TiB"),
    ],
)
def test_format_bytes_uses_binary_prefixes(value: int, expected: str) -> None:
    assert format_bytes(value) == expected


def test_format_rate_uses_decimal_prefixes() -> None:
    assert format_rate(1.2e12, "B/s") == "1.20 TB/s"  # 1.2e12 / 1e12
    assert format_rate(5e10, "FLOP/s") == "50.00 GFLOP/s"  # 5e10 / 1e9
    assert format_rate(999, "B/s") == "999 B/s"


@pytest.mark.parametrize(
    "ms, expected",
    [
        (3.1, "3.10 ms"),  # 3 significant figures, trailing zero kept
        (0.85, "850 µs"),  # 0.85 ms = 850 µs
        (1250.0, "1.25 s"),
        (12.48, "12.5 ms"),
        (0.9996, "1.00 ms"),  # 999.6 µs rounds to 1000 µs at 3 s.f. -> the next unit
        (0.0, "0 ms"),
        (0.0005, "500 ns"),  # 5e-4 ms = 500 ns
        (5e-7, "0.500 ns"),  # below 1 ns stays in ns
        (123_456.0, "123 s"),
        (2e6, "2000 s"),  # s is the largest unit
    ],
)
def test_format_time_ms(ms: float, expected: str) -> None:
    assert format_time_ms(ms) == expected


def test_format_percent() -> None:
    assert format_percent(12.4816) == "12.48%"
    assert format_percent(100) == "100.00%"
    assert format_percent(0.5, decimals=1) == "0.5%"
    # a share that rounds to 0.00 is no true zero (fc's 0.0031 % read "0.00%"; a trial), as
    # to_latex's and the fixed units' "<0.01" say
    assert format_percent(0.0031) == "<0.01%" and format_percent(-0.0031) == "-<0.01%"
    assert format_percent(0) == "0.00%" and format_percent(0.03, decimals=1) == "<0.1%"


def test_pick_scale() -> None:
    assert pick_scale([128, 11_689_512], SI_PREFIXES) == (1e6, "M")  # max 11.7e6 >= 1e6
    assert pick_scale([0, 0], SI_PREFIXES) == (1.0, "")  # nothing reaches 1e3
    assert pick_scale([], IEC_PREFIXES) == (1.0, "B")
    assert pick_scale([3_211_264, math.nan], IEC_PREFIXES) == (2.0**20, "MiB")  # NaN ignored
    # TIME_UNITS is largest first; order does not matter: 0.5 ms -> µs (1e-3 ms <= 0.5 < 1 ms)
    assert pick_scale([0.5], TIME_UNITS) == (1e-3, "µs")
    assert pick_scale([1e-9], TIME_UNITS) == (1e-6, "ns")  # below every unit: the smallest


@pytest.mark.parametrize(
    "value, text",
    [
        (1, "1.00×"),
        (0.5, "0.500×"),
        (0.0328, "0.0328×"),
        (0.00328, "0.00328×"),
        (12.5, "12.50×"),
        (150.2, "150×"),
        (0, "0×"),
        (None, "n/a"),
        (float("nan"), "n/a"),
    ],
)
def test_format_multiple_keeps_three_significant_figures(value, text) -> None:
    from modelprof.render.units import format_multiple

    assert format_multiple(value) == text
