"""A ``.pt2`` too large for this process is refused from its zip directory, before the file is
read (a 3 GiB sparse archive under a tight ``ulimit -v`` ended in a MemoryError traceback)."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from modelprof.cli import main
from modelprof.runtime import archive

MEMBER = 3 << 30  # 3 GiB: under the 8 GiB member cap and the 4 GiB of a zip without zip64
NAME = b"model/data/weights/weight_0"


def _sparse_pt2(path: Path, size: int = MEMBER) -> int:
    """A zip whose one stored member declares ``size`` bytes, left as a hole (the file takes
    no disk); its length in bytes."""
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, 0, size, size, len(NAME), 0)
    central = (
        struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            20,
            20,
            0,
            0,
            0,
            0x21,
            0,
            size,
            size,
            len(NAME),
            0,
            0,
            0,
            0,
            0,
            0,
        )
        + NAME
    )
    with open(path, "wb") as f:
        f.write(local + NAME)
        f.seek(size, 1)
        offset = f.tell()
        f.write(central)
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), offset, 0))
    return path.stat().st_size


def test_the_directory_alone_refuses_what_cannot_fit(tmp_path, monkeypatch, capsys):
    path = tmp_path / "big.pt2"
    file_bytes = _sparse_pt2(path)
    # 30 + 27 (local header and name) + 3 GiB + 46 + 27 (central entry) + 22 (end record)
    assert file_bytes == 3_221_225_472 + 152
    assert [i.file_size for i in zipfile.ZipFile(path).infolist()] == [MEMBER]
    monkeypatch.setattr(archive, "loadable_bytes", lambda: (2 << 30, "ulimit -v"))
    read = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or b"")
    assert main(["profile", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelprof: error: ")
    # needed: the file read once (3,221,225,624 B) and its member inflated (3,221,225,472 B)
    # = 6,442,451,096 B, "6.4 GB"; the room 2 GiB = 2,147,483,648 B, "2.1 GB"
    assert "needs about 6.4 GB to load" in err[0]
    assert "more than the 2.1 GB this process can take (ulimit -v)" in err[0]
    assert read == []  # not a byte of it read


def test_a_non_zip_is_refused_without_being_read(tmp_path, monkeypatch, capsys):
    path = tmp_path / "sparse.pt2"
    with open(path, "wb") as f:
        f.truncate(MEMBER)  # 3 GiB of hole, no zip directory
    read = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or b"")
    assert main(["profile", str(path)]) == 2
    assert "not a torch.export archive (not a zip file" in capsys.readouterr().err
    assert read == []


def test_ulimit_v_is_the_room_the_command_line_checks(tmp_path):
    """The issue's case as it happens: a process under ``ulimit -v`` (RLIMIT_AS), the file far
    larger than the room left; before, ``read_bytes`` raised MemoryError (exit 1)."""
    pytest.importorskip("resource")
    if not Path("/proc/self/status").exists():
        pytest.skip("reads VmSize from /proc")
    path = tmp_path / "big.pt2"
    _sparse_pt2(path)
    code = textwrap.dedent(
        f"""
        import resource, sys
        from modelprof.cli import main
        import modelprof.models, torchvision  # what the command loads, before the limit
        held = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
                    if l.startswith("VmSize:"))
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (held + (1 << 30), hard))
        sys.exit(main(["profile", {str(path)!r}]))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "(ulimit -v)" in lines[0] and "needs about 6.4 GB" in lines[0]
