"""Language models from a command-line SPEC, never downloading weights: a transformers config
class with overrides (``LlamaConfig:hidden_size=256,num_hidden_layers=2``), a ``config.json``
path, or a factory in a Python file (``my_lm.py:build``). Config-built models get random weights,
made directly on the device asked (``meta``: no memory at all)."""

from __future__ import annotations

import ast
import contextlib
import difflib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError, error_line, is_int
from modelprof.generation.lm import is_config
from modelprof.models import config_names_near, load_spec
from modelprof.runtime.tensors import brief

__all__ = [
    "check_counts",
    "load_language_model",
    "load_sized_model",
    "load_spec_config",
    "parse_overrides",
]


def parse_overrides(text: str) -> dict[str, Any]:
    """``"a=1,b=x,c=[1, 2]"`` -> ``{"a": 1, "b": "x", "c": [1, 2]}`` (Python literals, else
    strings); commas inside brackets stay inside their value."""
    out: dict[str, Any] = {}
    depth, items = 0, [""]
    for ch in text:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append("")
        else:
            items[-1] += ch
    for part in filter(None, (i.strip() for i in items)):
        key, sep, value = part.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ModelProfError(f"override {part!r} must be NAME=VALUE (e.g. num_hidden_layers=2)")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def _config(spec: str) -> Any:
    """A transformers config from ``Class[:overrides]`` or a ``.json`` path; None otherwise."""
    try:
        import transformers
    except ImportError as e:
        raise ModelProfError(f"SPEC {spec!r} needs transformers: pip install transformers") from e
    if spec.endswith(".json"):
        path = Path(spec)
        if not path.is_file():
            raise ModelProfError(f"SPEC {spec!r}: no such config file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ModelProfError(f"SPEC {spec!r} is not valid JSON: {e}") from e
        kind = data.pop("model_type", None)
        if kind is None:
            raise ModelProfError(f"SPEC {spec!r} has no 'model_type' (e.g. \"llama\")")
        try:
            known = transformers.AutoConfig.for_model(kind)
        except ValueError as e:
            raise ModelProfError(
                f"SPEC {spec!r}: model_type {kind!r} is unknown to "
                f"transformers {transformers.__version__}"
            ) from e
        # (a real file's values as it has them: Llama 3.1's eos_token_id is a list where the
        # class default is an int, so no override's kind check; its counts are checked)
        return check_counts(_made(spec, type(known), data), f"SPEC {spec!r}")
    name, _, overrides = spec.partition(":")
    near = config_names_near(name, transformers)
    if not name.endswith("Config") and not (near and name[:1].isupper()):
        return None
    cls = getattr(transformers, name, None) if name.endswith("Config") else None
    if cls is None:
        raise ModelProfError(
            f"SPEC {spec!r}: transformers has no {name} (version {transformers.__version__})"
            + (f"; did you mean {' or '.join(near)}?" if near else "")
        )
    kwargs = parse_overrides(overrides)
    known = _made(spec, cls, {})  # a config keeps unknown keywords as attributes
    takes = _attributes_taken(cls, known, transformers)
    unknown = [k for k in kwargs if k not in takes and not hasattr(known, k)]
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(takes), n=1, cutoff=0.8)
        raise ModelProfError(
            f"SPEC {spec!r}: {name} has no attribute {unknown[0]!r}"
            + (f"; did you mean {near[0]!r}?" if near else "")
        )
    for key, value in kwargs.items():
        _check_kind(spec, key, value, getattr(known, key, None))
    return check_counts(_made(spec, cls, kwargs), f"SPEC {spec!r}")


#: a config's integer fields that count things (layers, heads, widths, the vocabulary)
_COUNTS = re.compile(r"^(num_|n_)|_size$")


def check_counts(config: Any, who: str, prefix: str = "") -> Any:
    """``config``, whose fields that count things are not negative (where its class's defaults
    are not: Vilt's ``num_images=-1`` means "any") and whose ``vocab_size`` is not 0: either
    fails far from the value, in the model's build, its cache or its embedding. Its sub-configs
    (a multimodal config's ``text_config``) too, a field named by its dotted key (``prefix``)."""
    defaults: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # (a config class that takes no defaults)
        defaults = type(config)().to_dict()
    for key, value in config.to_dict().items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and is_config(sub := getattr(config, key, None)):
            check_counts(sub, who, f"{name}.")
        if not is_int(value) or not _COUNTS.search(key):
            continue
        if value < 0 <= (defaults.get(key) if is_int(defaults.get(key)) else 0):
            raise ModelProfError(f"{who}: {name}={value} counts something and cannot be negative")
        if key == "vocab_size" and value == 0:
            raise ModelProfError(f"{who}: {name}=0 leaves no token id to feed the model")
    return config


def _attributes_taken(cls: Any, known: Any, transformers: Any) -> set[str]:
    """Every attribute a config class takes: its and its bases' parameters and fields, its
    default instance's, and the generation settings (transformers 5 declares those on the
    generation config only, yet models read them from the config)."""
    takes = set(vars(known)) | set(getattr(known, "attribute_map", {}) or {})
    for klass in inspect.getmro(cls):
        init = vars(klass).get("__init__")
        if init is not None:
            with contextlib.suppress(TypeError, ValueError):
                takes |= set(inspect.signature(init).parameters)
        takes |= set(getattr(klass, "__dataclass_fields__", {}) or {})
    generation = getattr(transformers, "GenerationConfig", None)
    if generation is not None:
        takes |= {k for k in vars(generation()) if not k.startswith("_")}
    return {k for k in takes if k.isidentifier() and k not in ("self", "args", "kwargs")}


def _made(spec: str, cls: Any, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)``; a refusal (``hidden_size=30`` with 4 heads) named in one line."""
    try:
        return cls(**kwargs)
    except Exception as e:  # noqa: BLE001 - the config class's validation, in any form
        raise ModelProfError(f"SPEC {spec!r}: {cls.__name__} refuses it: {error_line(e)}") from e


def _check_kind(spec: str, key: str, value: Any, default: Any) -> None:
    """An override of a number must be a number (else it fails deep in the model's build)."""
    if value is None:
        return
    if isinstance(default, bool):
        wrong = not isinstance(value, bool)
    elif isinstance(default, int):
        wrong = isinstance(value, bool) or not isinstance(value, int)
    elif isinstance(default, float):
        wrong = isinstance(value, bool) or not isinstance(value, (int, float))
    else:
        wrong = False
    if wrong:
        kind = {bool: "True or False", int: "an integer"}.get(type(default), "a number")
        raise ModelProfError(
            f"SPEC {spec!r}: {key}={value!r} must be {kind}, like its default {default!r}"
        )


#: the transformers auto classes that build a language model, tried in order: an
#: encoder-decoder (Whisper: speech; T5, BART: text) has no causal-LM class, and a
#: vision-language decoder (LLaVA) maps the image-text one only
_LM_AUTO = {
    True: ("AutoModelForSpeechSeq2Seq", "AutoModelForSeq2SeqLM"),
    False: ("AutoModelForCausalLM", "AutoModelForImageTextToText"),
}


def lm_auto_class(config: Any, who: str, hint: str, *also: str) -> tuple[str, Any]:
    """The name and class of the first auto class of ``_LM_AUTO`` (then ``also``) that maps
    ``config``'s class: ``modelprof fit`` and ``modelprof generate`` build the same model for
    one config. ``who`` starts the error where none does, ``hint`` ends it."""
    import transformers

    tried = (*_LM_AUTO[bool(getattr(config, "is_encoder_decoder", False))], *also)
    for name in tried:
        auto = getattr(transformers, name, None)
        if auto is not None and type(config) in auto._model_mapping:
            return name, auto
    raise ModelProfError(
        f"{who}: transformers {transformers.__version__} has no model class for "
        f"{type(config).__name__} (tried {', '.join(tried)}); {hint}"
    )


def load_language_model(
    spec: str,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    trust_pickle: bool = False,
) -> tuple[nn.Module, str]:
    """The model and a display name for ``spec`` (see the module docstring); ``trust_pickle``
    as :func:`modelprof.models.load_spec`'s."""
    model, name, _ = load_sized_model(spec, device, dtype, trust_pickle=trust_pickle)
    return model, name


def load_sized_model(
    spec: str,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    trust_pickle: bool = False,
) -> tuple[nn.Module, str, tuple[Any, ...] | None]:
    """:func:`load_language_model`'s model and name, with the input size (batch excluded) the
    spec records (a torchvision or timm model's, a file's ``INPUT_SIZE``); None for a config,
    which is fed token ids, and for a spec that records none."""
    named, spec = load_spec_config(spec), spec.strip()
    if named is None:
        loaded = load_spec(spec, trust_pickle=trust_pickle)
        model, size = loaded.model, None if loaded.size_defaulted else loaded.input_size
        return (
            (model.to(device=device, dtype=dtype) if device or dtype else model),
            loaded.name,
            size,
        )
    config, name = named
    _, auto = lm_auto_class(config, f"SPEC {spec!r}", "build it in file.py:factory")
    with torch.device(device or "cpu"):
        try:
            model = auto.from_config(config)
        except Exception as e:  # noqa: BLE001 - an override the checks above let through
            raise ModelProfError(
                f"SPEC {spec!r}: the model cannot be built from this config: {error_line(e)}"
            ) from e
    if dtype is not None:
        model = model.to(dtype)
    return model.eval(), name, None


def load_spec_config(spec: str) -> tuple[Any, str] | None:
    """A config SPEC's transformers config (its counts checked) and display name, no model
    built: ``modelprof fit`` hands the config to ``fit()``, which builds the model its Python
    API builds. None for another SPEC (a model name, a file's factory)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelProfError(
            f"SPEC {brief(spec)} must be a config class, a config.json or file.py:factory"
        )
    config = _config(spec.strip())
    return None if config is None else (config, _config_name(spec.strip()))


def _config_name(spec: str) -> str:
    """A config spec's display name (the stem of files written for it): ``LlamaConfig:...``
    -> ``Llama``, ``qcfg.json`` -> ``qcfg``, ``models/tiny/config.json`` -> ``tiny``."""
    head = spec.partition(":")[0]
    if head.lower().endswith(".json"):
        path = Path(head)
        return path.parent.name if path.stem == "config" and path.parent.name else path.stem
    return head.removesuffix("Config") or spec
