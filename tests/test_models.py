"""``load_model``: every kind of spec, the safe-loading rules and the default input sizes."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.models import DEFAULT_INPUT_SIZE, load_model, load_spec

pytest.importorskip("torchvision")


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU())


def test_torchvision_name() -> None:
    model, name, size = load_model("resnet18")
    assert name == "resnet18"
    assert type(model).__name__ == "ResNet"
    assert not model.training
    # resnet18 has 11,689,512 parameters (torchvision's published num_params)
    assert sum(p.numel() for p in model.parameters()) == 11_689_512
    assert size == (3, 224, 224)


def test_torchvision_prefix_gives_the_same_model() -> None:
    model, name, size = load_model("torchvision:mobilenet_v3_small")
    assert (name, size) == ("mobilenet_v3_small", (3, 224, 224))
    assert type(model).__name__ == "MobileNetV3"


@pytest.mark.parametrize(
    "name, size",
    [
        ("inception_v3", (3, 299, 299)),  # Inception_V3_Weights crop_size [299]
        ("efficientnet_b3", (3, 300, 300)),  # EfficientNet_B3_Weights crop_size [300]
        ("efficientnet_b1", (3, 240, 240)),  # DEFAULT = IMAGENET1K_V2, crop_size [240]
        ("r3d_18", (3, 16, 112, 112)),  # video: 16 frames at crop 112
    ],
)
def test_default_input_size_is_the_weights_crop(name: str, size: tuple) -> None:
    assert load_model(name)[2] == size


def test_vit_is_built_for_its_weights_resolution() -> None:
    # vit_h_14's only weights are SWAG at 518 px; the class token plus (518/14)^2 = 37^2 = 1369
    # patches give a 1370-long position embedding, which only image_size=518 builds.
    from torchvision.models import get_model_weights

    weights = get_model_weights("vit_h_14").DEFAULT
    assert weights.transforms().crop_size == [518]
    # Building the 632 M-parameter model is slow; check the builder arguments instead.
    from torchvision.models import get_model_builder

    from modelprof.models import _builder_kwargs

    assert _builder_kwargs(get_model_builder("vit_h_14"), 518)["image_size"] == 518
    vit_b, _, size = load_model("vit_b_32")
    assert size == (3, 224, 224)
    # (224/32)^2 = 49 patches + 1 class token
    assert vit_b.encoder.pos_embedding.shape[1] == 50


def test_detection_backbone_weights_are_not_downloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried to download weights")

    import torchvision.models._api as tv_api

    monkeypatch.setattr(tv_api, "load_state_dict_from_url", refuse)  # what weights use
    model, _, size = load_model("fcn_resnet50")
    assert type(model).__name__ == "FCN"
    assert size == (3, 520, 520)  # FCN weights resize to 520


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(ModelProfError, match=r"unknown model 'resnet1800'; did you mean") as e:
        load_model("resnet1800")
    assert "resnet18," in str(e.value) and "resnet101" in str(e.value)


def test_unknown_name_without_close_names_says_where_to_look() -> None:
    with pytest.raises(ModelProfError, match="list_models"):
        load_model("qqqqqq")


def test_timm_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # makes `import timm` raise ImportError
    with pytest.raises(ModelProfError, match="pip install timm"):
        load_model("timm:resnet18")


def test_python_file_factory(tmp_path: Path) -> None:
    f = tmp_path / "my_net.py"
    f.write_text(
        textwrap.dedent("""
        from torch import nn
        INPUT_SIZE = (10,)
        def build():
            return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))
        def not_a_model():
            return 42
    """)
    )
    model, name, size = load_model(f"{f}:build")
    assert name == "my_net_build"  # its file and factory: two files' build() keep apart
    assert size == (10,)
    # 10*20 + 20 + 20*2 + 2 = 262
    assert sum(p.numel() for p in model.parameters()) == 262
    with pytest.raises(ModelProfError, match="returned int, not a torch.nn.Module"):
        load_model(f"{f}:not_a_model")
    with pytest.raises(ModelProfError, match="no callable 'missing'; it defines build"):
        load_model(f"{f}:missing")
    with pytest.raises(ModelProfError, match="no factory"):
        load_model(str(f))


def test_python_file_errors_name_the_file(tmp_path: Path) -> None:
    f = tmp_path / "broken.py"
    f.write_text("raise ValueError('boom')\n")
    with pytest.raises(ModelProfError, match=r"broken\.py.*ValueError: boom"):
        load_model(f"{f}:build")
    with pytest.raises(ModelProfError, match="does not exist"):
        load_model(f"{tmp_path / 'nope.py'}:build")


def test_python_file_default_input_size(tmp_path: Path) -> None:
    f = tmp_path / "plain.py"
    f.write_text("from torch import nn\ndef make():\n    return nn.Conv2d(3, 8, 3)\n")
    assert load_model(f"{f}:make")[2] == DEFAULT_INPUT_SIZE
    # and it says why the size is the default, where INPUT_SIZE gives it nothing to say
    assert load_spec(f"{f}:make").size_defaulted == f"{f} sets no INPUT_SIZE"
    f.write_text(f.read_text() + "INPUT_SIZE = (3, 32, 32)\n")
    loaded = load_spec(f"{f}:make")
    assert loaded.input_size == (3, 32, 32) and loaded.size_defaulted is None


def test_state_dict_needs_the_architecture(tmp_path: Path) -> None:
    path = tmp_path / "weights.pth"
    torch.save(_tiny().state_dict(), path)
    with pytest.raises(ModelProfError, match=r"state_dict \(2 entries\).*architecture"):
        load_model(str(path))  # 2 entries: 0.weight, 0.bias


def test_pickled_module_needs_trust(tmp_path: Path) -> None:
    path = tmp_path / "whole.pt"
    torch.save(_tiny(), path)
    with pytest.raises(ModelProfError, match="--trust-pickle"):
        load_model(str(path))
    model, name, size = load_model(str(path), trust_pickle=True)
    assert name == "whole"
    assert isinstance(model, nn.Sequential) and not model.training
    # 4*3 + 3 = 15 parameters
    assert sum(p.numel() for p in model.parameters()) == 15
    assert size == DEFAULT_INPUT_SIZE
    loaded = load_spec(str(path), trust_pickle=True)
    assert loaded.size_defaulted == "a saved module records no input size"


def test_torch_export_archive(tmp_path: Path) -> None:
    path = tmp_path / "exported.pt2"
    program = torch.export.export(_tiny(), (torch.randn(2, 4),))
    torch.export.save(program, path)
    model, name, size = load_model(str(path))
    assert name == "exported"
    assert size == (4,)  # the recorded (2, 4) input without its batch, not (3, 224, 224)
    assert model(torch.ones(2, 4)).shape == (2, 3)


def test_torch_export_archive_profiles_on_its_recorded_inputs(tmp_path: Path) -> None:
    from modelprof import profile

    path = tmp_path / "exported.pt2"
    torch.export.save(torch.export.export(_tiny(), (torch.randn(5, 4),)), path)
    loaded = load_spec(str(path))
    assert [tuple(t.shape) for t in loaded.example_args] == [(5, 4)]
    assert loaded.example_kwargs == {}
    report = profile(loaded.model, inputs=loaded.example_args, timing=False)
    # the unflattened program keeps the module hierarchy: root, Linear "0", ReLU "1"
    assert [r.module for r in report.rows] == ["", "0", "1"]
    # typed as the eager modules (nn_module_stack), not as torch.export's InterpreterModule
    assert [r.type for r in report.rows] == ["Sequential", "Linear", "ReLU"]
    # Linear(4, 3) on 5 rows: 5*4*3 = 60 MACs; 4*3 + 3 = 15 parameters
    assert report.totals["macs"] == 60 and report.totals["params"] == 15


def test_exported_module_profiles_with_timing() -> None:
    from modelprof import profile

    module = torch.export.export(_tiny(), (torch.randn(2, 4),)).module()
    with pytest.raises(NotImplementedError):
        module.eval()  # what made profile() fail: the flag is set directly instead
    report = profile(module, inputs=(torch.randn(2, 4),), repeat=3, warmup=1, roofline=False)
    assert report.totals["macs"] == 24  # 2*4*3
    assert report.latency is not None and report.latency.n == 3


class _RunsCode:
    """Unpickling this touches ``marker`` (the proof that code ran) and returns valid inputs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        source = (
            f"__import__('pathlib').Path({str(self.marker)!r}).touch() "
            "or ((__import__('torch').ones(2, 4),), {})"
        )
        return (eval, (source,))


def _crafted_archive(tmp_path: Path, marker: Path) -> Path:
    """A real torch.export archive whose pickled sample inputs run code when unpickled."""
    import io
    import zipfile

    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(_tiny(), (torch.randn(2, 4),)), good)
    payload = io.BytesIO()
    torch.save(_RunsCode(marker), payload)
    crafted = tmp_path / "crafted.pt2"
    replaced = 0
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(crafted, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if "/data/sample_inputs/" in item.filename:
                data, replaced = payload.getvalue(), replaced + 1
            dst.writestr(item, data)
    assert replaced == 1
    return crafted


def test_pt2_whose_pickled_inputs_run_code_needs_trust_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    crafted = _crafted_archive(tmp_path, marker)
    with pytest.raises(ModelProfError, match=r"sample_inputs/model\.pt.*--trust-pickle"):
        load_model(str(crafted))
    assert not marker.exists()  # nothing was unpickled
    # the same archive, trusted, does run the code: the check above is what prevented it
    load_model(str(crafted), trust_pickle=True)
    assert marker.exists()


def test_pt2_with_compiled_code_needs_trust(tmp_path: Path) -> None:
    import zipfile

    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(_tiny(), (torch.randn(2, 4),)), good)
    with zipfile.ZipFile(good, "a") as z:
        root = z.namelist()[0].split("/")[0]
        z.writestr(f"{root}/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(ModelProfError, match=r"aotinductor/model/model\.so \(compiled code\)"):
        load_model(str(good))


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".pt2"])
def test_empty_and_corrupt_files_are_called_corrupt(tmp_path: Path, suffix: str) -> None:
    empty = tmp_path / f"empty{suffix}"
    empty.write_bytes(b"")
    with pytest.raises(ModelProfError, match="is empty") as e:
        load_model(str(empty))
    assert "trust-pickle" not in str(e.value)
    good = tmp_path / f"good{suffix}"
    if suffix == ".pt2":
        torch.export.save(torch.export.export(_tiny(), (torch.randn(2, 4),)), good)
    else:
        torch.save(_tiny().state_dict(), good)
    truncated = tmp_path / f"truncated{suffix}"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelProfError, match="corrupt") as e:
        load_model(str(truncated))
    assert "trust-pickle" not in str(e.value)


@pytest.mark.parametrize("where", ["factory", "import"])
def test_sys_exit_in_the_model_file_is_an_error(tmp_path: Path, where: str) -> None:
    f = tmp_path / "quits.py"
    body = "import sys\nfrom torch import nn\n"
    body += "def build():\n    sys.exit(0)\n" if where == "factory" else "sys.exit(0)\n"
    f.write_text(body)
    with pytest.raises(ModelProfError, match=r"SystemExit\(0\)|SystemExit: 0"):
        load_model(f"{f}:build")


def test_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(ModelProfError, match="does not exist"):
        load_model(str(tmp_path / "nope.pt"))
    path = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path)
    with pytest.raises(ModelProfError, match="holds a Tensor, not a torch.nn.Module"):
        load_model(str(path))


@pytest.mark.parametrize("spec", ["", "   "])
def test_empty_spec(spec: str) -> None:
    with pytest.raises(ModelProfError, match="non-empty"):
        load_model(spec)
