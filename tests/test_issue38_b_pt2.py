"""Issue 38 item 11, the class: a ``.pt2`` whose zip directory reads but whose members do not (a
member's bytes damaged: bad CRC-32; a local header's name garbled: not UTF-8) is refused in one
line, exit 2, not an internal error with a traceback (zipfile's BadZipFile and
UnicodeDecodeError escaped the member reader)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import torch

from modelprof.cli import main

MEMBER = "models/model.json"


def _saved(tmp_path: Path) -> tuple[Path, zipfile.ZipInfo]:
    path = tmp_path / "good.pt2"
    program = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    torch.export.save(program, path)
    info = next(i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith(MEMBER))
    return path, info


def _patched(path: Path, offset: int, data: bytes, name: str) -> Path:
    out = path.with_name(name)
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    out.write_bytes(bytes(raw))
    return out


def _one_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("modelprof: error: "), err
    return err[0]


def test_a_damaged_member_is_refused_in_one_line(tmp_path, capsys):
    path, info = _saved(tmp_path)
    assert main(["profile", str(path), "--no-timing"]) == 0
    capsys.readouterr()
    # the member's data starts after its local header: 30 bytes, its name, its extra field
    local = path.read_bytes()[info.header_offset : info.header_offset + 30]
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little")
    start += int.from_bytes(local[28:30], "little")
    bad = _patched(path, start + info.compress_size // 2, b"\x00\xff\x00\xff", "crc.pt2")
    assert main(["profile", str(bad), "--no-timing"]) == 2  # 1 before: an internal error
    line = _one_error(capsys)
    assert f"member '{info.filename}' cannot be read (BadZipFile: Bad CRC-32" in line


def test_a_garbled_member_name_is_refused_in_one_line(tmp_path, capsys):
    path, info = _saved(tmp_path)
    # the local header's copy of the name (after its 30 fixed bytes), made not UTF-8
    bad = _patched(path, info.header_offset + 30, b"\xff\xfe", "name.pt2")
    assert main(["profile", str(bad), "--no-timing"]) == 2
    line = _one_error(capsys)
    assert f"member '{info.filename}' cannot be read" in line


def test_a_damaged_archive_from_a_shell_prints_no_traceback(tmp_path):
    path, info = _saved(tmp_path)
    bad = _patched(path, info.header_offset + 30, b"\xff\xfe", "shell.pt2")
    args = [sys.executable, "-m", "modelprof", "profile", str(bad), "--no-timing"]
    run = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    err = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert sum(ln.startswith("modelprof: error: ") for ln in err) == 1
