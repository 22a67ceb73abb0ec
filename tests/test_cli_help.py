"""The command line's --version, help texts with defaults, and one-line warnings."""

from __future__ import annotations

import io
import re
import warnings

import pytest

from modelprof import __version__, cli
from modelprof.errors import NoisyMeasurementWarning


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(["--version"], capsys)
    assert status == 0
    assert re.fullmatch(
        rf"modelprof {re.escape(__version__)} \(torch [^,]+, Python 3\.\d+\)\n", out
    )


@pytest.mark.parametrize("command", ["profile", "compare", "throughput"])
def test_every_option_and_argument_has_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _run([command, "--help"], capsys)
    assert status == 0
    # every option line in the help has a description after its name (none left bare)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        assert action.help, f"{command}: {action.option_strings or action.dest} has no help"
    assert "torchvision name" in out  # MODEL says what it may be


def test_defaults_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(["profile", "--help"], capsys)
    flat = " ".join(out.split())
    assert "--batch-size N samples per forward pass" in flat and "(default: 1)" in flat
    assert "(default: modelprof)" in flat  # --style, added by the formatter
    assert "(default: 5 s per measurement" in flat  # --budget, said in words
    assert "(default: None)" not in flat and "(default: False)" not in flat
    _, out, _ = _run(["throughput", "--help"], capsys)
    assert "(default: 1024)" in " ".join(out.split())


def test_warnings_print_as_one_line_without_a_source_line() -> None:
    err = io.StringIO()
    before = warnings.showwarning
    with cli._one_line_warnings(err):
        warnings.warn("noisy timing of ResNet on cpu", NoisyMeasurementWarning, stacklevel=1)
    assert err.getvalue() == (
        "modelprof: warning: noisy timing of ResNet on cpu (NoisyMeasurementWarning)\n"
    )
    assert warnings.showwarning is before  # restored on the way out


@pytest.mark.parametrize("fmt, package", [("png", "matplotlib"), ("md", "tabulate")])
def test_a_format_without_its_package_fails_before_writing_anything(
    fmt: str,
    package: str,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    out = tmp_path / "out"
    status, _, err = _run(
        ["profile", "resnet18", "--no-timing", "--out", str(out), "--format", f"csv,{fmt}"], capsys
    )
    assert status == 2
    assert f"--format {fmt} needs {package}" in err and "pip install -e '.[all]'" in err
    assert not out.exists()  # refused before the model was loaded or --out created
