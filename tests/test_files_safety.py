"""Files the user points modelprof at: a ``.pt2`` archive must not run code unless trusted (every
member any torch version deserializes, every string that reaches an evaluator), a zip bomb is
refused before it is inflated, and a bad path or file gives one clean error, never a traceback."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from modelprof.cli import main
from modelprof.errors import ModelProfError
from modelprof.models import load_spec


class _Touch:
    """A pickle that creates ``path`` when unpickled: the proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def plain_pt2() -> bytes:
    """A genuine archive with a dynamic batch (so that it holds ``as_expr`` sizes)."""
    program = torch.export.export(
        _Tiny(), (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("b", min=2, max=64)},)
    )
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def _rewrite(data: bytes, edit) -> bytes:
    """The archive with each member's bytes passed through ``edit(name, bytes)``."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            z.writestr(info.filename, edit(info.filename, src.read(info.filename)))
    return out.getvalue()


_SYMBOL = b"Symbol('s77', positive=True, integer=True)"


def _sympy_payload(data: bytes, marker: Path) -> bytes:
    """An ``as_expr`` size holding a Python expression that opens ``marker`` for writing."""
    assert _SYMBOL in b"".join(
        zipfile.ZipFile(io.BytesIO(data)).read(n)
        for n in zipfile.ZipFile(io.BytesIO(data)).namelist()
    )
    code = (
        f"{_SYMBOL.decode()} + __import__('builtins').len(__import__('builtins')"
        f".open({str(marker)!r}, 'w').name) * 0"
    ).encode()
    return _rewrite(
        data, lambda n, b: b.replace(_SYMBOL, code, 1) if n.endswith("models/model.json") else b
    )


def _old_layout(data: bytes, marker: Path) -> bytes:
    """The torch <= 2.7 layout, whose ``serialized_constants.json`` torch.load unpickles with a
    full-unpickling fallback."""
    from torch._export.serde.schema import SCHEMA_VERSION

    src = zipfile.ZipFile(io.BytesIO(data))
    program = next(n for n in src.namelist() if n.endswith("models/model.json"))
    state, example = io.BytesIO(), io.BytesIO()
    torch.save({}, state)
    torch.save(((torch.randn(2, 4),), {}), example)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        z.writestr("serialized_exported_program.json", src.read(program))
        z.writestr("serialized_state_dict.pt", state.getvalue())
        z.writestr("serialized_constants.json", pickle.dumps(_Touch(str(marker))))
        z.writestr("serialized_example_inputs.pt", example.getvalue())
    return out.getvalue()


def _guard_payload(data: bytes, marker: Path) -> bytes:
    """``guards_code``, which torch ``exec``s when the program's module is built."""
    code = f"\"__import__('builtins').open({str(marker)!r}, 'w') is None\""
    return _rewrite(
        data,
        lambda n, b: (
            b.replace(b'"guards_code": []', b'"guards_code": [' + code.encode() + b"]")
            if n.endswith("models/model.json")
            else b
        ),
    )


def _target_payload(data: bytes, marker: Path) -> bytes:
    """A node target resolved by name under ``torch`` (``torch.os.system``)."""
    return _rewrite(
        data,
        lambda n, b: (
            b.replace(b'"torch.ops.aten.linear.default"', b'"torch.os.system"', 1)
            if n.endswith("models/model.json")
            else b
        ),
    )


CRAFTED = {
    "sympy as_expr": _sympy_payload,
    "old layout pickle": _old_layout,
    "guards_code": _guard_payload,
    "node target": _target_payload,
}


@pytest.mark.parametrize("craft", list(CRAFTED))
def test_crafted_pt2_is_refused_without_trust_and_runs_nothing(plain_pt2, tmp_path, craft):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt2"
    path.write_bytes(CRAFTED[craft](plain_pt2, marker))
    with pytest.raises(ModelProfError, match="--trust-pickle"):
        load_spec(str(path))
    assert not marker.exists()
    err = io.StringIO()
    with _stderr(err):
        assert main(["profile", str(path), "--no-timing"]) == 2
    assert "Traceback" not in err.getvalue() and "--trust-pickle" in err.getvalue()
    assert not marker.exists()


def test_plain_pt2_still_loads(plain_pt2, tmp_path):
    path = tmp_path / "tiny.pt2"
    path.write_bytes(plain_pt2)
    loaded = load_spec(str(path))
    assert loaded.input_size == (4,)


class _stderr:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        self.old = sys.stderr
        sys.stderr = self.stream

    def __exit__(self, *exc):
        sys.stderr = self.old


_BOMB_SCRIPT = textwrap.dedent("""
    import resource, sys
    import modelprof.models as models
    from modelprof.errors import ModelProfError
    def vm_bytes():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    limit = vm_bytes() + (160 << 20)   # what is mapped now, plus 160 MiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        models.load_spec(sys.argv[1])
    except ModelProfError as e:
        print("REFUSED", e)
    """)


def test_zip_bomb_is_refused_before_inflating_under_a_memory_limit(plain_pt2, tmp_path):
    # a 256 MiB member of zeros compresses to about 1 MB: inflating it would pass the limit
    path = tmp_path / "bomb.pt2"
    src = zipfile.ZipFile(io.BytesIO(plain_pt2))
    root = src.namelist()[0].split("/", 1)[0]
    with zipfile.ZipFile(path, "w") as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open(f"{root}/data/sample_inputs/bomb.pt", "w") as member:
            zeros = bytes(1 << 20)
            for _ in range(256):
                member.write(zeros)
    assert path.stat().st_size < 2 << 20
    run = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert "MemoryError" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "REFUSED" in run.stdout and "zip bomb" in run.stdout, run.stdout


# --- clean errors, no tracebacks, no misleading advice ---------------------------------------------


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with _stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    "spec",
    ["a" * 300 + ".pt", "a" * 300 + ".pt2", "a" * 300 + ".py:build", "/tmp/" + "b" * 300],
    ids=["pt", "pt2", "py", "dir"],
)
def test_a_path_the_system_refuses_is_a_clean_error(spec):
    code, err = _cli(["profile", spec, "--no-timing"])
    assert code == 2 and "Traceback" not in err
    assert "File name too long" in err and "chars)" in err  # the path is named, shortened


def test_sample_inputs_that_are_not_args_kwargs_are_a_clean_error(tmp_path):
    program = torch.export.export(_Tiny(), (torch.randn(2, 4),))
    buffer, sample = io.BytesIO(), io.BytesIO()
    torch.export.save(program, buffer)
    torch.save((torch.randn(2, 4),), sample)  # one element, not (args, kwargs)
    path = tmp_path / "odd.pt2"
    path.write_bytes(
        _rewrite(buffer.getvalue(), lambda n, b: sample.getvalue() if "sample_inputs" in n else b)
    )
    for extra in ([], ["--trust-pickle"]):
        code, err = _cli(["profile", str(path), "--no-timing", *extra])
        assert code == 2 and "Traceback" not in err
        assert "not (args, kwargs) but a tuple of 1" in err


def test_read_json_of_a_binary_file_is_a_clean_error(tmp_path):
    from modelprof.render import read_json

    path = tmp_path / "report.json"
    path.write_bytes(b"\xff\xfe\x00binary\x89PNG")
    with pytest.raises(ModelProfError, match="not UTF-8 text"):
        read_json(path)


def test_random_bytes_in_a_pt_do_not_advise_trusting_it(tmp_path):
    path = tmp_path / "noise.pt"
    path.write_bytes(bytes(range(256)) * 12)
    with pytest.raises(ModelProfError) as info:
        load_spec(str(path))
    assert "--trust-pickle" not in str(info.value) and "trust_pickle" not in str(info.value)
    assert "corrupt or not a file torch.save wrote" in str(info.value)


def test_a_pickled_module_still_asks_for_trust(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(_Tiny(), path)
    with pytest.raises(ModelProfError, match="--trust-pickle"):
        load_spec(str(path))


def test_onnx_file_and_directory_are_not_called_unknown_torchvision_names(tmp_path):
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"\x08\x07onnx")
    with pytest.raises(ModelProfError, match="is an ONNX file") as info:
        load_spec(str(onnx))
    assert "torchvision" not in str(info.value)
    with pytest.raises(ModelProfError, match="is a directory") as info:
        load_spec(str(tmp_path))
    assert "torchvision" not in str(info.value)
    with pytest.raises(ModelProfError, match="unknown model 'resnet1'; did you mean"):
        load_spec("resnet1")  # a torchvision-like name is still looked up there


def test_a_directory_named_like_a_torchvision_model_does_not_shadow_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "resnet18").mkdir()  # e.g. a folder of reports
    (tmp_path / "mynet").mkdir()
    assert load_spec("resnet18").name == "resnet18"
    with pytest.raises(ModelProfError, match="'mynet' is a directory") as info:
        load_spec("mynet")
    assert "config.json" not in str(info.value)
    # a HuggingFace folder: the error names its config.json, which fit and generate take
    (tmp_path / "mynet" / "config.json").write_text("{}")
    with pytest.raises(ModelProfError, match=r"also take its transformers config, mynet/config"):
        load_spec("mynet")
