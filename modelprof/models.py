"""Turn a model *spec* from the command line (``resnet18``, ``timm:convnext_tiny``,
``net.py:build``, ``model.pt``) into an ``nn.Module``, a name and a default input size.

Weights are never downloaded (``weights=None`` / ``pretrained=False``): profiling needs the
architecture, not trained values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import inspect
import io
import logging
import pickle
import sys
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

from modelprof.errors import ModelProfError, a_type
from modelprof.runtime.archive import check_pt2_file, inspect_pt2
from modelprof.runtime.exported import arranged, exported_layers, input_names
from modelprof.runtime.names import factory_name
from modelprof.runtime.tensors import brief

__all__ = [
    "DEFAULT_INPUT_SIZE",
    "InputSize",
    "LoadedModel",
    "config_names_near",
    "load_model",
    "load_spec",
]

InputSize = tuple[Any, ...]
"""One shape without the batch dimension, ``(3, 224, 224)``, or a tuple of such shapes."""

DEFAULT_INPUT_SIZE: tuple[int, ...] = (3, 224, 224)
_VIDEO_FRAMES = 16  # the clip length torchvision's published video ``_ops`` are counted at
_FILE_SUFFIXES = (".pt", ".pth", ".pt2")


@dataclasses.dataclass
class LoadedModel:
    """A model built from a spec, with its input size (batch excluded) and the inputs a
    ``.pt2`` archive recorded (batch included, real dtypes), or None."""

    model: nn.Module
    name: str
    input_size: InputSize
    example_args: tuple[Any, ...] | None = None
    example_kwargs: dict[str, Any] | None = None
    #: why ``input_size`` is ``DEFAULT_INPUT_SIZE``: the spec records none (else None)
    size_defaulted: str | None = None
    #: a ``.pt2``'s ``ExportedProgram`` whose layers ``model`` is (unflattened), else None:
    #: what timing it end to end runs is its flat ``module()``, not ``model``
    program: Any = None
    #: a ``.pt2``'s positional and keyword input names (``exported.input_names``), else None
    input_names: tuple[tuple[str, ...], tuple[str, ...]] | None = None


def load_model(spec: str, *, trust_pickle: bool = False) -> tuple[nn.Module, str, InputSize]:
    """Build the model named by ``spec``; return ``(model in eval mode, name, input_size)``.

    ``spec`` is one of

    - a torchvision model name, ``resnet18``, or ``torchvision:resnet18``;
    - ``timm:NAME`` (needs ``pip install timm``);
    - ``path/to/file.py:factory``: the file is imported by path and ``factory()`` must return an
      ``nn.Module``; a module-level ``INPUT_SIZE`` in the file sets the default input size; it is
      named ``file_factory``;
    - a ``.pt``/``.pth`` file holding a whole pickled module. Unpickling a module can run
      arbitrary code, so it needs ``trust_pickle=True`` (``--trust-pickle``); a bare
      ``state_dict`` is refused, since it lacks the architecture;
    - a ``.pt2`` file written by ``torch.export.save``. Its weights and recorded inputs load
      without running code; an archive holding anything that only full unpickling (or a
      compiled library) can load needs ``trust_pickle=True`` too.

    ``input_size`` excludes the batch dimension: the evaluation crop of the model's torchvision
    weights (``(3, 299, 299)`` for inception_v3), the timm default config, the shapes a ``.pt2``
    recorded, or ``(3, 224, 224)``.
    """
    loaded = load_spec(spec, trust_pickle=trust_pickle)
    return loaded.model, loaded.name, loaded.input_size


def load_spec(spec: str, *, trust_pickle: bool = False) -> LoadedModel:
    """Like :func:`load_model`, with the inputs a ``.pt2`` archive recorded."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelProfError(
            f"model spec {brief(spec)} must be a non-empty string such as 'resnet18'"
        )
    spec = spec.strip()
    prefix, _, rest = spec.partition(":")
    if prefix == "torchvision" and rest:
        return LoadedModel(*_load_torchvision(rest))
    if prefix == "timm" and rest:
        return LoadedModel(*_load_timm(rest))
    path_part, sep, factory = spec.rpartition(":")
    if sep and path_part.endswith(".py"):
        model, name, size = _load_factory(Path(path_part), factory)
        return _sized(model, name, size, f"{path_part} sets no INPUT_SIZE")
    if spec.endswith(".py"):
        raise ModelProfError(
            f"model spec {spec!r} names a Python file but no factory; "
            f"write it as '{spec}:FUNCTION', a function returning an nn.Module"
        )
    if spec.endswith(".pt2"):
        return _load_pt2(Path(spec), trust_pickle=trust_pickle)
    if spec.endswith(_FILE_SUFFIXES):
        model, name = _load_file(Path(spec), trust_pickle=trust_pickle)
        return _sized(model, name, None, "a saved module records no input size")
    _refuse_config_spec(spec)
    if "/" in spec or "\\" in spec or Path(spec).suffix:  # torchvision names hold neither
        _refuse_other_path(spec)
    try:
        return LoadedModel(*_load_torchvision(spec))
    except ModelProfError:
        if _probe(Path(spec), "exists"):  # not a torchvision name, but a file or directory
            _refuse_other_path(spec)
        raise


def _sized(model: nn.Module, name: str, size: InputSize | None, why: str) -> LoadedModel:
    """A model whose spec may record no input size (``why`` it records none)."""
    if size is None:
        return LoadedModel(model, name, DEFAULT_INPUT_SIZE, size_defaulted=why)
    return LoadedModel(model, name, size)


def config_names_near(name: str, transformers: Any) -> list[str]:
    """The transformers config classes spelled like ``name`` (``LlamaConfg``: LlamaConfig)."""
    if not name.isidentifier() or name.endswith("Config") and hasattr(transformers, name):
        return []
    configs = [n for n in dir(transformers) if n.endswith("Config")]
    return difflib.get_close_matches(name, configs, n=2, cutoff=0.85)


def _refuse_config_spec(spec: str) -> None:
    """Refuse a transformers config spec (``LlamaConfig:hidden_size=64``, capitalized as no
    torchvision name is) as one, a misspelt class with the classes it resembles."""
    name = spec.partition(":")[0]
    if not name.isidentifier() or not name[:1].isupper():
        return
    try:
        import transformers
    except ImportError:
        transformers = None
    near = config_names_near(name, transformers) if transformers is not None else []
    if not name.endswith("Config") and not near:
        return
    where = (
        "transformers configs are built by `modelprof generate` and `modelprof fit`; "
        "profile and compare take a torchvision name, timm:NAME, file.py:factory (one may "
        "build the model from a config) or a .pt/.pt2 file"
    )
    if transformers is not None and hasattr(transformers, name):
        raise ModelProfError(f"model {spec!r} is a transformers config: {where}")
    version = f" {transformers.__version__}" if transformers is not None else " (not installed)"
    raise ModelProfError(
        f"model {spec!r}: transformers{version} has no {name}"
        + (f"; did you mean {' or '.join(near)}? " if near else ". ")
        + where[0].upper()
        + where[1:]
    )


def _refuse_other_path(spec: str) -> None:
    """Refuse a spec naming a file or directory modelprof cannot load as one."""
    path = Path(spec)
    if _probe(path, "is_dir"):
        config = path / "config.json"
        raise ModelProfError(
            f"model {spec!r} is a directory, not a model file; give a .pt/.pth "
            "or .pt2 file in it, or file.py:factory"
            + (
                f"; `modelprof fit` and `generate` also take its transformers config, {config}"
                if _probe(config, "is_file")
                else ""
            )
        )
    if path.suffix.lower() == ".onnx":
        raise ModelProfError(
            f"model {spec!r} is an ONNX file: modelprof profiles PyTorch modules. Give the PyTorch "
            "model (a .pt2 from torch.export.save, file.py:factory), or time an ONNX Runtime "
            "session with modelprof.measure_latency"
        )
    if path.suffix:
        raise ModelProfError(
            f"model file {spec!r}: modelprof cannot load {path.suffix!r} files; it loads .pt/.pth "
            "(torch.save of a module), .pt2 (torch.export.save) and file.py:factory"
        )
    if not _probe(path, "exists"):
        raise ModelProfError(f"model file {spec!r} does not exist")
    raise ModelProfError(
        f"model file {spec!r} has no suffix; modelprof loads .pt/.pth, .pt2 and file.py:factory"
    )


def _probe(path: Path, check: str) -> bool:
    """``path.exists()``/``is_file()``/``is_dir()``; a path the system refuses (too long, a
    NUL byte, no permission) is a ModelProfError naming it."""
    try:
        return bool(getattr(path, check)())
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        text = str(path)
        shown = text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)"
        raise ModelProfError(f"model file {shown!r} cannot be read: {reason}") from e


# --- torchvision ---------------------------------------------------------------------------------


def _load_torchvision(name: str) -> tuple[nn.Module, str, InputSize]:
    try:
        from torchvision import models as tvm
    except ImportError as e:
        raise ModelProfError(
            f"model {name!r} looks like a torchvision name, but torchvision is "
            "not installed; pip install torchvision"
        ) from e
    available = tvm.list_models()
    if name not in available:
        close = difflib.get_close_matches(name, available, n=4, cutoff=0.6)
        hint = (
            f"; did you mean {', '.join(close)}?"
            if close
            else (
                "; see torchvision.models.list_models() for the names, or use timm:NAME, "
                "file.py:factory or a .pt file"
            )
        )
        raise ModelProfError(f"unknown model {name!r}{hint}")

    builder = tvm.get_model_builder(name)
    kind, crop, resize = _weights_geometry(tvm, name)
    kwargs = _builder_kwargs(builder, crop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torchvision's init-scheme notices
        model = builder(weights=None, **kwargs)
    return model.eval(), name, _default_input_size(kind, crop, resize)


def _weights_geometry(tvm: Any, name: str) -> tuple[str, int | None, int | None]:
    """``(transform class name, crop size, resize size)`` of the evaluation transform of
    ``name``'s default weights, whose published numbers (crop size, ``_ops``) describe it."""
    try:
        transform = tvm.get_model_weights(name).DEFAULT.transforms()
    except Exception:  # noqa: BLE001 - no weights, or a transform we can't build: no hint
        return "", None, None
    crop = getattr(transform, "crop_size", None)
    resize = getattr(transform, "resize_size", None)
    first = lambda v: int(v[0]) if v else None  # noqa: E731 - [224] or [224, 224]
    return type(transform).__name__, first(crop), first(resize)


def _builder_kwargs(builder: Any, crop: int | None) -> dict[str, Any]:
    """Keyword arguments that build ``builder``'s model as its default weights expect it
    (torchvision sets them only when it loads weights)."""
    params = inspect.signature(builder).parameters
    kwargs: dict[str, Any] = {}
    if "weights_backbone" in params:
        kwargs["weights_backbone"] = None  # its default would download a backbone
    family = builder.__module__.rsplit(".", 1)[-1]
    if crop is not None and family == "vision_transformer":
        kwargs["image_size"] = crop  # the position embedding is sized for it (vit_h_14: 518)
    elif crop is not None and family == "maxvit":
        kwargs["input_size"] = (crop, crop)
    elif family in ("inception", "googlenet"):
        kwargs["init_weights"] = False  # as when weights are loaded; skips a slow scipy init
    return kwargs


def _default_input_size(kind: str, crop: int | None, resize: int | None) -> InputSize:
    if kind == "ImageClassification" and crop:
        return (3, crop, crop)
    if kind == "VideoClassification" and crop:
        return (3, _VIDEO_FRAMES, crop, crop)
    if kind == "SemanticSegmentation" and resize:
        return (3, resize, resize)
    if kind == "OpticalFlow":
        return (DEFAULT_INPUT_SIZE, DEFAULT_INPUT_SIZE)  # two frames
    return DEFAULT_INPUT_SIZE


# --- timm ----------------------------------------------------------------------------------------


def _load_timm(name: str) -> tuple[nn.Module, str, InputSize]:
    try:
        import timm
    except ImportError as e:
        raise ModelProfError(
            f"model 'timm:{name}' needs timm, which is not installed; pip install timm"
        ) from e
    try:
        model = timm.create_model(name, pretrained=False)
    except RuntimeError as e:
        if "Unknown model" not in str(e):
            raise
        close = difflib.get_close_matches(name, timm.list_models(), n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelProfError(f"unknown timm model {name!r}{hint}") from e
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    size = tuple(int(d) for d in cfg.get("input_size", DEFAULT_INPUT_SIZE))
    return model.eval(), name, size


# --- file.py:factory -----------------------------------------------------------------------------


def _load_factory(path: Path, factory: str) -> tuple[nn.Module, str, InputSize | None]:
    if not _probe(path, "is_file"):
        raise ModelProfError(f"model file {str(path)!r} does not exist")
    if not factory.isidentifier():
        raise ModelProfError(f"factory {factory!r} in '{path}:{factory}' is not a Python name")
    module_name = f"_modelprof_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelProfError(f"model file {str(path)!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up here
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # sys.exit() in the file is a failure, not a result
        sys.modules.pop(module_name, None)
        raise ModelProfError(
            f"importing model file {str(path)!r} failed: {type(e).__name__}: {e}"
        ) from e
    fn = getattr(module, factory, None)
    if not callable(fn):
        found = [
            n
            for n, v in vars(module).items()
            if callable(v)
            and not n.startswith("_")
            and getattr(v, "__module__", None) == module_name
        ]
        raise ModelProfError(
            f"{str(path)!r} has no callable {factory!r}"
            + (f"; it defines {', '.join(sorted(found))}" if found else "")
        )
    try:
        model = fn()
    except (Exception, SystemExit) as e:  # SystemExit(0) must not exit 0 with nothing profiled
        raise ModelProfError(
            f"{path}:{factory}() raised {type(e).__name__}({e!s}) instead of returning a model"
        ) from e
    if not isinstance(model, nn.Module):
        raise ModelProfError(
            f"{path}:{factory}() returned {type(model).__name__}, not a torch.nn.Module"
        )
    size = getattr(module, "INPUT_SIZE", None)
    return model.eval(), factory_name(path, factory), None if size is None else tuple(size)


# --- saved files ---------------------------------------------------------------------------------


def _load_file(path: Path, *, trust_pickle: bool) -> tuple[nn.Module, str]:
    _check_file(path)
    if _is_torchscript(path):
        raise ModelProfError(
            f"{str(path)!r} is a TorchScript archive; modelprof profiles eager "
            "modules (hooks cannot see inside scripted code). Save the module "
            "with torch.save(model) or torch.export.save, or pass file.py:factory"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - the weights-only unpickler refuses classes this way
        # a refused class (a whole module), not a bad opcode (a file that is no pickle at all)
        if not (isinstance(e, pickle.UnpicklingError) and "Unsupported global" in str(e)):
            raise ModelProfError(
                f"{str(path)!r} is corrupt or not a file torch.save wrote "
                f"({type(e).__name__}: {_reason(e)})"
            ) from e
        if not trust_pickle:
            raise ModelProfError(
                f"{str(path)!r} holds pickled Python objects (a whole module?), and unpickling "
                "them can run arbitrary code. If you trust the file, pass --trust-pickle "
                "(trust_pickle=True); otherwise give the architecture as file.py:factory"
            ) from e
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e2:
            raise ModelProfError(
                f"loading {str(path)!r} failed: {type(e2).__name__}: {e2}; a pickled module needs "
                "its class importable under the name it was saved with"
            ) from e2
    if isinstance(obj, nn.Module):
        return obj.eval(), path.stem
    if isinstance(obj, dict):
        raise ModelProfError(
            f"{str(path)!r} holds a state_dict ({len(obj)} entries), not a model: weights "
            "without the architecture cannot be profiled. Pass the architecture instead "
            "(a torchvision name, timm:NAME or file.py:factory), or save the whole module with "
            "torch.save(model) and use --trust-pickle"
        )
    raise ModelProfError(f"{str(path)!r} holds {a_type(obj)}, not a torch.nn.Module")


def _check_file(path: Path) -> None:
    if not _probe(path, "exists"):
        raise ModelProfError(f"model file {str(path)!r} does not exist")
    if not _probe(path, "is_file"):
        raise ModelProfError(f"model file {str(path)!r} is not a file")
    if path.stat().st_size == 0:
        raise ModelProfError(f"model file {str(path)!r} is empty (0 bytes)")


def _reason(e: BaseException) -> str:
    """The line of a torch.load error that says what was wrong (not its advice)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error" in line:
            detail = line.split("WeightsUnpickler error:", 1)[-1].strip()
            return detail or (lines[i + 1] if i + 1 < len(lines) else line)
    return lines[0] if lines else ""


# --- torch.export archives (.pt2) ----------------------------------------------------------------


@contextlib.contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Disable loggers for a while: torch.export.load logs tracebacks where modelprof
    reports."""
    with contextlib.ExitStack() as stack:
        for n in names:
            stack.enter_context(mock.patch.object(logging.getLogger(n), "disabled", True))
        yield


def _load_pt2(path: Path, *, trust_pickle: bool) -> LoadedModel:
    _check_file(path)
    # its zip directory first: a file that cannot fit is refused before it is read
    check_pt2_file(path, repr(str(path)))
    data = path.read_bytes()  # read once: what is checked is what is loaded
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ModelProfError(
            f"{str(path)!r} is corrupt or not a torch.export archive (not a zip file)"
        )
    # a zip bomb is refused even when trusted: torch.export.load would inflate every member
    unsafe = inspect_pt2(data, repr(str(path)), sizes_only=trust_pickle)
    if unsafe and not trust_pickle:
        more = f" and {len(unsafe) - 1} more" if len(unsafe) > 1 else ""
        raise ModelProfError(
            f"{str(path)!r} holds {unsafe[0]}{more}: loading it could run arbitrary code "
            "(full unpickling, a compiled library, or a string torch evaluates). If you trust "
            "the file, pass --trust-pickle (trust_pickle=True)"
        )
    try:
        with (
            _quiet_loggers("torch.export", "torch._export.serde.serialize"),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            program = torch.export.load(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - any failure here means the archive is unusable
        raise ModelProfError(
            f"{str(path)!r} is corrupt or not a torch.export archive: {type(e).__name__}: {e}"
        ) from e
    names = input_names(program)
    args, kwargs = _recorded_inputs(program, path, names)
    try:
        model, layered = exported_layers(program), program  # one row per layer
    except Exception:  # noqa: BLE001 - some programs cannot be unflattened: one flat graph
        model, layered = program.module(), None
    sizes = tuple(tuple(t.shape[1:]) for t in args if isinstance(t, torch.Tensor))
    size: InputSize = sizes[0] if len(sizes) == 1 else sizes or DEFAULT_INPUT_SIZE
    return LoadedModel(model, path.stem, size, args, kwargs, program=layered, input_names=names)


def _recorded_inputs(
    program: Any, path: Path, names: tuple[tuple[str, ...], tuple[str, ...]] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example inputs the archive recorded, else made from its user inputs' recorded
    shapes and dtypes (random floats, zero integers), its keyword inputs (``names``, from
    :func:`input_names`) as keywords."""
    example = getattr(program, "example_inputs", None)
    if example:
        if not (
            isinstance(example, (tuple, list))
            and len(example) == 2
            and isinstance(example[0], (tuple, list))
            and isinstance(example[1], dict)
        ):
            raise ModelProfError(
                f"{str(path)!r} records sample inputs that are not (args, "
                f"kwargs) but {a_type(example)}"
                f"{f' of {len(example)}' if isinstance(example, (tuple, list)) else ''}"
                "; re-save it with torch.export.save"
            )
        args, kwargs = example
        return tuple(args), dict(kwargs)
    by_name = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    made: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)  # the user's global RNG is not advanced
    for name in program.graph_signature.user_inputs:
        value = by_name[name].meta.get("val") if name in by_name else None
        if not isinstance(value, torch.Tensor):
            raise ModelProfError(
                f"{str(path)!r} records no example inputs and input {name!r} "
                "is not a tensor; pass --input-size"
            )
        try:
            shape = [int(d) for d in value.shape]
        except (TypeError, ValueError) as e:  # a dynamic dimension with no hint
            raise ModelProfError(
                f"{str(path)!r} records no example inputs and input {name!r} "
                f"has a dynamic shape {tuple(value.shape)}; pass --input-size"
            ) from e
        if value.dtype.is_floating_point:
            made[name] = torch.randn(shape, dtype=value.dtype, generator=gen)
        else:
            made[name] = torch.zeros(shape, dtype=value.dtype)
    if names is None:
        return tuple(made.values()), {}
    return arranged(names, made, repr(str(path)))


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.endswith("/constants.pkl") for n in z.namelist())
