"""Turn what the user passed (an input size, tensors, a dict) into call arguments on the right
device and dtype, and check that they fit in memory: one door, so every entry point accepts the
same inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import math
import numbers
import os
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from modelprof.errors import ModelProfError, check_int, is_int
from modelprof.runtime import compat
from modelprof.runtime.device import normalize_device
from modelprof.runtime.placement import model_placement, to_placement
from modelprof.runtime.tensors import brief, holds_tensors, iter_tensors, map_tensors, shape_str

__all__ = [
    "DTYPE_NAMES",
    "InputSpec",
    "ModelInputs",
    "available_memory_bytes",
    "batch_inputs",
    "build_inputs",
    "bytes_text",
    "parse_bytes",
    "check_forward_keys",
    "decoder_start",
    "check_input_bytes",
    "unread_key_hint",
    "forward_parameters",
    "inputs_in_size_place",
    "make_inputs",
    "parse_device",
    "parse_dtype",
    "parse_input_size",
    "refuse_beyond_memory",
    "split_inputs",
    "text_config",
    "token_inputs",
    "token_table",
    "vocab_size",
]

#: The floating dtypes a name may give (``dtype="fp16"``, a sweep's ``dtypes``, ``--input``).
DTYPE_NAMES: dict[str, torch.dtype] = {
    name: dtype
    for dtype, names in (
        (torch.float32, "float32 fp32 float"),
        (torch.float16, "float16 fp16 half"),
        (torch.bfloat16, "bfloat16 bf16"),
        (torch.float64, "float64 fp64 double"),
    )
    for name in names.split()
}


@dataclasses.dataclass
class ModelInputs:
    """Positional and keyword arguments for one forward call, already on ``device``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    #: puts the inputs back before each further pass (``Snapshot.between_passes``); None when
    #: a pass changes nothing in them
    reset: Callable[[], Any] | None = None
    notes: tuple[str, ...] = ()

    def shapes(self) -> str:
        return shape_str((self.args, self.kwargs))


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``None``, a ``torch.dtype`` or a name such as ``"fp16"``/``"bfloat16"``."""
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        raise ModelProfError(
            f"dtype={dtype} is not a floating-point dtype: dtype= casts the floating parameters "
            "and inputs, and integer inputs (token ids) keep their own"
        )
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = dtype.lower().removeprefix("torch.") if isinstance(dtype, str) else None
    if key in DTYPE_NAMES:
        return DTYPE_NAMES[key]
    raise ModelProfError(
        f"dtype={dtype!r} is not understood; use one of {sorted(DTYPE_NAMES)} or a torch.dtype"
    )


def parse_device(device: torch.device | str | int | None) -> torch.device | None:
    """``None``, a ``torch.device``, ``"cuda:0"``, ``"cpu"``, ``"meta"`` or a CUDA index."""
    if device is None:
        return None
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelProfError(f"device={device!r} is not a device: {e}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelProfError(
            f"device={device!r}: CUDA is not available on this machine "
            "(use 'cpu', or 'meta' to analyse shapes alone)"
        )
    if dev.type not in ("cpu", "cuda", "meta") and not _backend_available(dev):
        raise ModelProfError(
            f"device={device!r}: the {dev.type!r} backend is not available "
            "on this machine (use 'cpu', or 'meta' to analyse shapes alone)"
        )
    return normalize_device(dev)


def _backend_available(dev: torch.device) -> bool:
    """Whether torch can place a tensor on ``dev`` here (mps, xpu, privateuse, ...)."""
    probe = getattr(getattr(torch, dev.type, None), "is_available", None)
    try:
        if callable(probe) and not probe():
            return False
        torch.empty(0, device=dev)
    except Exception:  # noqa: BLE001 - a backend that cannot answer or allocate: not usable
        return False
    return True


def parse_input_size(input_size: Any) -> list[tuple[int, ...]]:
    """One shape (``(3, 224, 224)``) or several (``[(3, 224, 224), (10,)]``), batch excluded."""
    if isinstance(input_size, torch.Size):
        input_size = tuple(input_size)
    if isinstance(input_size, np.ndarray) and (
        input_size.ndim > 2 or (input_size.ndim == 2 and input_size.dtype.kind in "fc")
    ):  # data, not one shape or a list of them: said so, not its values printed
        shape = "x".join(map(str, input_size.shape))
        raise ModelProfError(
            f"input_size is a numpy array of {input_size.dtype} ({shape}), not a shape such as "
            "(3, 224, 224): to run the model on it, pass inputs=torch.from_numpy(array) "
            "(the batch included)"
        )
    if isinstance(input_size, np.ndarray) and input_size.ndim in (1, 2):
        input_size = input_size.tolist()
    elif isinstance(input_size, (list, tuple)) and any(
        isinstance(s, np.ndarray) for s in input_size
    ):
        input_size = [s.tolist() if isinstance(s, np.ndarray) else s for s in input_size]
    if _is_shape(input_size):
        shapes = [tuple(input_size)]
    elif (
        isinstance(input_size, Sequence)
        and len(input_size) > 0
        and all(_is_shape(s) for s in input_size)
    ):
        shapes = [tuple(s) for s in input_size]
    else:
        raise ModelProfError(
            f"input_size={brief(input_size)} must be a tuple of ints such as "
            "(3, 224, 224), or a list of such tuples"
        )
    for shape in shapes:
        if any(int(d) <= 0 for d in shape):
            raise ModelProfError(f"input_size={brief(input_size)} has a dimension <= 0 in {shape}")
    return [tuple(int(d) for d in s) for s in shapes]


def _is_shape(s: Any) -> bool:
    """A sequence of integers (not a string)."""
    return (
        isinstance(s, (Sequence, torch.Size))
        and not isinstance(s, (str, bytes))
        and all(is_int(d) for d in s)
    )


def inputs_in_size_place(input_size: Any, inputs: Any) -> tuple[Any, Any]:
    """``(input_size, inputs)``, where tensors given as ``input_size`` (a tensor, a tuple of
    them, a dict holding one) are taken as ``inputs``: torchinfo's and thop's habit,
    ``profile(model, x)`` / ``profile(model, {"input_ids": ids})``."""
    if inputs is None and holds_tensors(input_size):
        return None, input_size
    return input_size, inputs


def make_inputs(
    model: nn.Module,
    input_size: Any = None,
    *,
    inputs: Any = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> ModelInputs:
    """``input_size`` (random normal ``(batch_size, *input_size)``) or ``inputs``
    (:func:`split_inputs`) as call arguments for ``model`` on ``device``, floats as ``dtype``."""
    if isinstance(model, nn.Module):
        model_device, model_dtype = model_placement(model)
    elif callable(model):
        model_device, model_dtype = torch.device("cpu"), torch.get_default_dtype()
    else:
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module or callable")
    dev = parse_device(device) or model_device
    dt = parse_dtype(dtype)
    if batch_size is not None:
        batch_size = check_int("batch_size", batch_size)

    input_size, inputs = inputs_in_size_place(input_size, inputs)
    if (input_size is None) == (inputs is None):
        raise ModelProfError(
            "pass exactly one of input_size (e.g. (3, 224, 224)) or inputs= "
            f"(got input_size={brief(input_size)}, inputs of type "
            f"{type(inputs).__name__})"
        )
    if input_size is not None:
        shapes = parse_input_size(input_size)
        b = 1 if batch_size is None else batch_size
        make_dtype = dt or model_dtype
        check_input_bytes(input_size, shapes, b, make_dtype, dev)
        gen = _generator(dev)
        args = tuple(InputSpec("input", make_dtype, s).make(b, dev, gen) for s in shapes)
        return ModelInputs(args, {}, dev, make_dtype, b)

    args, kwargs = split_inputs(inputs)
    _refuse_call_keywords(model, kwargs)
    check_forward_keys(kwargs, model)
    _refuse_meta_inputs(args, kwargs, dev)
    _refuse_empty_inputs(args, kwargs)
    _check_given_ids(model, kwargs)
    kwargs, note = compat.meta_mask_dropped(model, kwargs, dev)
    move = functools.partial(to_placement, device=dev, dtype=dt)
    args, kwargs = map_tensors(args, move), map_tensors(kwargs, move)
    first = next(iter_tensors((args, kwargs)), None)
    inferred = _infer_batch(args, kwargs)
    if batch_size is not None and first is not None and batch_size != inferred:
        raise ModelProfError(
            f"batch_size={batch_size} contradicts inputs= whose batch is {inferred} (first "
            f"tensor of shape {tuple(first.shape)}); leave batch_size out with inputs=, or pass "
            "tensors of that batch"
        )
    batch_size = inferred if batch_size is None else batch_size
    in_dtype = dt or (
        first.dtype if first is not None and first.is_floating_point() else model_dtype
    )
    _refuse_unmoved(args, kwargs, dev)
    notes = (note,) if note else ()
    return ModelInputs(tuple(args), dict(kwargs), dev, in_dtype, batch_size, notes=notes)


def _refuse_call_keywords(model: Any, kwargs: dict[str, Any]) -> None:
    """Refuse a keyword input named as the parameter the module's own ``__call__`` binds the
    module to (``self``: ``Module.__call__(self, *args, **kwargs)``), which never reaches the
    forward: the same call fails in PyTorch itself (``got multiple values for argument
    'self'``). A plain callable gets every keyword, and a ``__call__`` of the model's own its
    other parameters."""
    if not isinstance(model, nn.Module) or not kwargs:
        return
    try:
        first = next(iter(inspect.signature(type(model).__call__).parameters.values()), None)
    except (TypeError, ValueError):  # a __call__ without a signature: nothing to tell
        return
    if first is None or first.kind is not first.POSITIONAL_OR_KEYWORD or first.name not in kwargs:
        return
    key, name = first.name, type(model).__name__
    raise ModelProfError(
        f"inputs key {key!r} cannot reach {name}.forward as a keyword: calling a module binds "
        f"{key}= to {name}.__call__'s own parameter (the module itself), so model({key}=...) "
        "fails in PyTorch too; give that input positionally, in its place among the forward's "
        f"parameters (inputs=((x, value),) for forward(this, x, {key})), or rename the "
        "forward's parameter"
    )


def _refuse_meta_inputs(args: tuple, kwargs: dict, dev: torch.device) -> None:
    """Refuse meta inputs (shapes without values) for a run on a real device: no copy of them
    to ``dev`` can be made."""
    first = next((t for t in iter_tensors((args, kwargs)) if t.is_meta), None)
    if first is None or dev.type == "meta":
        return
    raise ModelProfError(
        f"the inputs are on meta (a tensor of shape {tuple(first.shape)}: shapes without "
        f"values) and the model runs on {dev}: pass device='meta' to count from the shapes "
        f"alone, or pass inputs with values on {dev}"
    )


def _refuse_empty_inputs(args: tuple, kwargs: dict) -> None:
    """Refuse inputs whose every tensor is a batch of 0 (as ``batch_size=0`` is): the model
    would run on nothing and count 0. Some empty ones beside others are fine (an empty cache),
    and so are samples of no features (2 x 0: a zero-length contraction counts 0 as it should)."""
    tensors = list(iter_tensors((args, kwargs)))
    # (numel first: a nested tensor has one, and no sizes to read)
    if tensors and all(t.numel() == 0 and t.dim() > 0 and t.shape[0] == 0 for t in tensors):
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors[:4])
        raise ModelProfError(
            f"every input tensor is empty, a batch of 0 ({shapes}): the model would run on nothing "
            "and count 0; pass inputs of at least one sample"
        )


def batch_inputs(
    model: Any, input_size: Any, tokens: int | None, batch_size: int, device: torch.device
) -> ModelInputs:
    """The inputs of one batch size of a search: random ``input_size`` floats, or (``tokens``)
    :func:`token_inputs` of that length for a language model."""
    if tokens is None:
        return make_inputs(model, input_size, batch_size=batch_size, device=device)
    ids = token_inputs(model, tokens, batch_size, device=device)
    return make_inputs(model, inputs=ids, device=device)


def _generator(dev: torch.device) -> torch.Generator | None:
    """A private generator (seed 0) on ``dev``, so the user's RNG is not advanced; None on meta."""
    return torch.Generator(device=dev).manual_seed(0) if dev.type in ("cpu", "cuda") else None


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``inputs=`` as ``(args, kwargs)``: a tensor or a list is one argument, a tuple the
    arguments, a dict the keywords, a (tuple, dict) pair both (as ``torch.export`` takes them)."""
    if isinstance(inputs, (torch.Tensor, list)):
        return (inputs,), {}
    if isinstance(inputs, Mapping):
        return (), _keywords(inputs, "inputs")
    if (
        type(inputs) is tuple
        and len(inputs) == 2
        and type(inputs[0]) is tuple
        and isinstance(inputs[1], Mapping)
    ):
        return inputs[0], _keywords(inputs[1], "inputs[1]")
    if isinstance(inputs, tuple):
        return inputs, {}
    raise ModelProfError(
        f"inputs of type {type(inputs).__name__} not understood; pass a "
        "tensor, a tuple of positional arguments, a dict of keyword arguments "
        "or both as (args, kwargs)"
    )


def _keywords(mapping: Mapping, where: str) -> dict[str, Any]:
    bad = [k for k in mapping if not isinstance(k, str)]
    if bad:
        raise ModelProfError(f"{where} dict keys must be argument names; got {bad[0]!r}")
    return dict(mapping)


def _held_tensors(obj: Any, seen: set[int], depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors held in ``obj`` and its attributes (a ``DynamicCache``), a few levels deep."""
    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple, Mapping)):
        for item in obj.values() if isinstance(obj, Mapping) else obj:
            yield from _held_tensors(item, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, nn.Module)):
        for item in vars(obj).values():
            yield from _held_tensors(item, seen, depth + 1)


def _refuse_unmoved(args: tuple, kwargs: dict, device: torch.device) -> None:
    """Refuse an object holding tensors off ``device`` (a KV cache, not moved) by name."""
    named = [(f"inputs[{i}]", a) for i, a in enumerate(args)] + [
        (f"inputs[{k!r}]", v) for k, v in kwargs.items()
    ]
    for where, value in named:
        moved = isinstance(value, (torch.Tensor, list, tuple, Mapping))
        if moved or not hasattr(value, "__dict__"):
            continue
        for t in _held_tensors(value, set()):
            if t.device.type != device.type or (
                device.index is not None and t.device.index != device.index
            ):
                raise ModelProfError(
                    f"{where} ({type(value).__name__}) holds tensors on {t.device}, and "
                    f"modelprof moves only tensors (and lists, tuples and dicts of them) to "
                    f"device={str(device)!r}: the {type(value).__name__} was not moved. Build "
                    f"it on {device} (e.g. from a forward of the model there), or profile on "
                    f"{t.device}"
                )


def available_memory_bytes(device: torch.device) -> int | None:
    """Memory new tensors on ``device`` can take now; None where unknown."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # noqa: BLE001 - unknown is fine: the allocator will still say so
            return None
    if device.type != "cpu":
        return None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


_BYTES_RE = re.compile(
    r"^\s*([-+]?[\d.]+(?:e[-+]?\d+)?|inf|nan)\s*(?:([kmgtp])(i?)b?|b)?\s*$", re.I
)


def parse_bytes(text: str) -> float | None:
    """``24e9``, ``24GB`` or ``24G`` (powers of 1000), ``80GiB`` (1024) in bytes; None for
    text that is no number of bytes."""
    m = _BYTES_RE.match(text)
    try:
        number = float(m[1]) if m is not None else None
    except ValueError:  # digits and dots that are no number: 1.2.3
        return None
    if number is None:
        return None
    prefix, binary = m[2], m[3]
    power = "kmgtp".index(prefix.lower()) + 1 if prefix else 0
    return number * (1024 if binary else 1000) ** power


def memory_bytes_arg(memory_bytes: Any) -> int:
    """A memory size as given (``memory_bytes=``): a number of bytes, numpy's too, at least 1
    and below 2**63, or its text (``"24GB"``, ``"80GiB"``: :func:`parse_bytes`)."""
    if isinstance(memory_bytes, str):
        memory_bytes = parse_bytes(memory_bytes) or memory_bytes
    if (
        isinstance(memory_bytes, bool)
        or not isinstance(memory_bytes, numbers.Real)
        or not math.isfinite(memory_bytes)
        or not 1 <= memory_bytes < 2**63
    ):
        raise ModelProfError(
            f"memory_bytes={memory_bytes!r} must be a finite number of bytes, at least 1 "
            "and below 2**63 (or its text: '24GB', '80GiB')"
        )
    return int(memory_bytes)


def bytes_text(n: int) -> str:
    """``n`` bytes for a refusal's message: GB, or MB below 0.1 GB (decimal units)."""
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def check_input_bytes(
    input_size: Any,
    shapes: list[tuple[int, ...]],
    batch_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> int:
    """Bytes the random inputs for ``shapes`` will take, refused by :func:`refuse_beyond_memory`."""
    numels = [batch_size * int(np.prod(s, dtype=object)) for s in shapes]
    nbytes = sum(numels) * dtype.itemsize
    what = (
        f"input_size={brief(input_size)} at batch_size {batch_size} needs {bytes_text(nbytes)} "
        f"({str(dtype).removeprefix('torch.')}) for the input tensors alone"
    )
    refuse_beyond_memory(what, max(numels), nbytes, device)
    return nbytes


def refuse_beyond_memory(what: str, elements: int, nbytes: int, device: torch.device) -> None:
    """Refuse what ``what`` says needs ``nbytes``: a tensor of ``elements`` (2**63 or more), or
    more than ``device``'s free memory (as an ``OutOfMemoryError``, for a batch-size search)."""
    if elements >= 2**63:
        raise ModelProfError(f"{what}: more elements than a tensor can hold")
    available = available_memory_bytes(device)  # None on meta
    if available is not None and nbytes > available:
        msg = f"{what}, more than the {bytes_text(available)} available on {device}"
        raise ModelProfError(msg) from torch.OutOfMemoryError(msg)


def _infer_batch(args: tuple, kwargs: dict) -> int:
    """Leading dimension of the first tensor; for a list of per-sample tensors, its length."""
    for obj in (*args, *kwargs.values()):
        if isinstance(obj, torch.Tensor):
            return int(obj.size(0)) if obj.dim() > 0 else 1  # size(0): a nested tensor too
        if isinstance(obj, (list, tuple)) and obj and all(isinstance(o, torch.Tensor) for o in obj):
            return len(obj)
    return 1


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One named input: ``shape`` without the batch; uniform in ``[low, high)``, all ``value``,
    or (floats, neither given) standard normal."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    low: float | None = None
    high: float | None = None
    value: float | None = None

    def make(
        self, batch_size: int, device: torch.device, gen: torch.Generator | None
    ) -> torch.Tensor:
        size = (batch_size, *self.shape)
        if self.value is not None:
            return torch.full(size, self.value, dtype=self.dtype, device=device)
        if self.dtype.is_floating_point:
            if self.low is None:
                return torch.randn(size, dtype=self.dtype, device=device, generator=gen)
            t = torch.rand(size, dtype=self.dtype, device=device, generator=gen)
            return t * (self.high - self.low) + self.low
        if self.low is None:
            raise ModelProfError(
                f"input {self.name!r} ({str(self.dtype).removeprefix('torch.')})"
                " needs a value range such as 0-30522 or a constant such as 1"
            )
        return torch.randint(
            int(self.low), int(self.high), size, dtype=self.dtype, device=device, generator=gen
        )


def build_inputs(
    specs: Sequence[InputSpec], batch_size: int = 1, device: torch.device | str | None = None
) -> dict[str, torch.Tensor]:
    """Keyword inputs from ``specs`` at ``batch_size``, from a private generator (seed 0)."""
    dev = parse_device(device) or torch.device("cpu")
    gen = _generator(dev)
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ModelProfError(f"input {dup[0]!r} is given twice")
    return {s.name: s.make(batch_size, dev, gen) for s in specs}


def vocab_size(model: nn.Module) -> int:
    """The number of token ids ``model`` embeds: ``config.vocab_size``, else the rows of its
    ``get_input_embeddings()`` (a transformers model's), else of the token table among its
    ``nn.Embedding`` modules (:func:`token_table`)."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if is_int(size) and size > 0:
        return int(size)
    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except NotImplementedError:  # transformers' where the model has none (ResNetModel)
        emb = None
    if isinstance(emb, nn.Embedding):
        return emb.num_embeddings
    table = token_table(model)
    if table is None:
        raise ModelProfError(
            f"{type(model).__name__} has no nn.Embedding and no config.vocab_size to draw "
            "token ids from: give their range (vocab=1000; the CLI: --input "
            "input_ids:int64[128]:0-1000), or, for a model that takes no token ids, an input "
            "size instead of tokens"
        )
    return table.num_embeddings


#: name parts (split at ``_``, ``.`` and digits) of an embedding that holds positions, not tokens
_POSITION_WORDS = frozenset({"pos", "position", "positions", "positional", "wpe"})
#: name parts of a token table (``wte``, ``tok_emb``, ``word_embeddings``, ``embed_tokens``)
_TOKEN_WORDS = frozenset({"tok", "token", "tokens", "word", "words", "wte", "vocab"})
#: name parts of a table of token types or segments (BERT's ``token_type_embeddings``)
_TYPE_WORDS = frozenset({"type", "types", "segment", "segments"})


def token_table(model: nn.Module) -> nn.Embedding | None:
    """The ``nn.Embedding`` of ``model`` that embeds its token ids, by the names it is
    registered under: the first whose name says tokens (a part ``tok``, ``token``, ``word``,
    ``wte`` or ``vocab``, and none of ``type``, ``segment`` or a position's); else the first
    not named as a position table (a part ``pos``, ``position``, ``positional`` or ``wpe``),
    whichever order the tables were registered in; else the first registered; None without
    any."""
    tables = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Embedding)]
    words = [set(re.split(r"[\W_\d]+", name.lower())) for name, _ in tables]
    tokens = [
        m
        for (_, m), w in zip(tables, words)
        if w & _TOKEN_WORDS and not w & (_TYPE_WORDS | _POSITION_WORDS)
    ]
    others = [m for (_, m), w in zip(tables, words) if not w & _POSITION_WORDS]
    return next(iter(tokens or others or [m for _, m in tables]), None)


def reads_token_ids(model: nn.Module) -> bool:
    """Whether ``model`` is fed token ids: a transformers model whose main input is
    ``input_ids`` (BertModel, not ViTModel's ``pixel_values``), else a module with an
    ``nn.Embedding`` (:func:`token_table`); ``compare(tokens=)`` feeds these alone."""
    main = getattr(model, "main_input_name", None)
    return main == "input_ids" if main is not None else token_table(model) is not None


def check_positions(model: Any, seq_len: int, what: str) -> None:
    """Refuse a sequence longer than a model's learnt positions
    (``config.max_position_embeddings``: BERT's 512) before its forward, which fails deep in
    transformers ("The expanded size of the tensor (200) must match ..."); ``what`` names the
    length. A model without it (T5's relative positions) takes any length."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if is_int(positions) and seq_len > positions:
        raise ModelProfError(
            f"{what} is past the model's {positions} positions (config.max_position_embeddings)"
        )


def _check_given_ids(model: Any, kwargs: dict[str, Any]) -> None:
    """``input_ids`` given (the key transformers models read; its last dimension the
    sequence) held to the model's positions, as :func:`token_inputs` holds ``seq_len``, where
    they are a learnt table (:func:`_learnt_positions`): rotary and relative positions (Llama,
    T5) run past ``max_position_embeddings``, which a user may be measuring."""
    ids = kwargs.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() >= 1 and _learnt_positions(model):
        n = ids.shape[-1]
        check_positions(model, n, f"input_ids of length {n} (shape {tuple(ids.shape)})")


def _learnt_positions(model: Any) -> bool:
    """Whether ``model`` holds a position table of ``config.max_position_embeddings`` rows (an
    ``nn.Embedding`` other than its token table: BERT's ``position_embeddings``, GPT-2's
    ``wpe``), which no position past it can index."""
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not is_int(positions) or not isinstance(model, nn.Module):
        return False
    tokens = token_table(model)
    return any(
        isinstance(m, nn.Embedding) and m is not tokens and m.num_embeddings == positions
        for m in model.modules()
    )


def token_inputs(
    model: nn.Module,
    seq_len: int,
    batch_size: int = 1,
    *,
    vocab: int | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor] | tuple[torch.Tensor]:
    """Token inputs of shape ``(batch_size, seq_len)`` for ``inputs=``, as calflops builds them:
    ``input_ids`` from ``[0, vocab)`` (default: :func:`vocab_size`), positional for a forward
    without ``input_ids`` (:func:`_ids_go_positionally`), and an all-ones ``attention_mask``
    when the forward takes one, except on meta for a transformers model
    (``compat.mask_optional``): it reads a mask's values, which meta tensors do not have, and
    takes no mask as all ones (``compat.meta_mask_dropped`` leaves out such a mask given with
    values). ``device`` defaults to the CPU, or meta for a model on meta (a model costed from
    shapes alone, whose inputs need no memory either). An encoder-decoder (its config's
    ``is_encoder_decoder``) also gets ``decoder_input_ids`` (:func:`_decoder_ids`); a
    transformers model whose main input is not ``input_ids`` (Whisper's ``input_features``) is
    refused: the ids would land where it reads something else."""
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module")
    _refuse_no_token_ids(model)
    seq_len = check_int("seq_len", seq_len)
    batch_size = check_int("batch_size", batch_size)
    vocab = check_int("vocab", vocab_size(model) if vocab is None else vocab)
    check_positions(model, seq_len, f"seq_len={seq_len}")
    params = forward_parameters(model)
    specs = [InputSpec("input_ids", torch.int64, (seq_len,), 0, vocab)]
    if device is None and model_placement(model)[0].type == "meta":
        device = "meta"
    where = torch.device(device) if device is not None else torch.device("cpu")
    if "attention_mask" in params and not (where.type == "meta" and compat.mask_optional(model)):
        specs.append(InputSpec("attention_mask", torch.int64, (seq_len,), value=1))
    decoder = _reads_decoder_ids(model, params)
    if decoder:
        specs.append(InputSpec("decoder_input_ids", torch.int64, (seq_len,), 0, vocab))
    tokens = batch_size * seq_len
    need = tokens * torch.int64.itemsize * len(specs)  # int64 ids (and mask, decoder ids)
    what = f"token inputs of batch_size {batch_size} x seq_len {seq_len} need {bytes_text(need)}"
    refuse_beyond_memory(what, tokens, need, where)
    made = build_inputs(specs, batch_size, device)
    if decoder:
        _decoder_ids(model, made["decoder_input_ids"], vocab)
    if "input_ids" not in params and _ids_go_positionally(params):
        return (made["input_ids"],)
    return made


def _refuse_no_token_ids(model: nn.Module) -> None:
    """Refuse a transformers model that reads no token ids (:func:`reads_token_ids`, as
    ``compare(tokens=)`` tells them): its main input is another (Whisper's mel
    ``input_features``), where ids passed first would land. A module of one's own is judged by
    its forward alone (no ``nn.Embedding`` may still take ids, with ``vocab=``)."""
    main = getattr(model, "main_input_name", None)
    if main is None or reads_token_ids(model):
        return
    raise ModelProfError(
        f"{type(model).__name__} reads no token ids: its main input is {main!r}, which "
        "token_inputs (the CLI's --tokens) cannot make up; give its inputs with inputs= "
        "(the CLI: --input or --input-size)"
    )


def _reads_decoder_ids(model: nn.Module, params: dict[str, inspect.Parameter]) -> bool:
    """Whether ``model`` is an encoder-decoder (its config says ``is_encoder_decoder``, as
    ``generate`` and ``fit`` read it) whose forward takes ``decoder_input_ids``."""
    config = getattr(model, "config", None)
    return getattr(config, "is_encoder_decoder", False) is True and "decoder_input_ids" in params


def _decoder_ids(model: nn.Module, ids: torch.Tensor, vocab: int) -> None:
    """Make ``ids`` (drawn as the encoder's) a teacher-forced decoder input of the same length:
    a training step's, as ``fit`` counts one, its first token the decoder's start token
    (:func:`decoder_start`, as ``generate`` starts a prompt) where the configs name one within
    ``vocab``. The values change nothing counted or timed."""
    start = decoder_start(model)
    if start is not None and start < vocab:
        ids[:, 0] = start


def text_config(config: Any) -> Any:
    """A composite config's decoder text config, else the config."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def decoder_start(model: Any) -> int | None:
    """The token an encoder-decoder's decoder starts from, as ``generate`` picks it:
    ``decoder_start_token_id``, else ``bos_token_id``, else the pad token (T5's), else None."""
    configs = [getattr(model, "generation_config", None), getattr(model, "config", None)]
    # a composite config keeps its decoder's tokens in a sub-config
    configs.append(text_config(configs[1]))
    for name in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
        for config in configs:
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return None


def _ids_go_positionally(params: dict[str, inspect.Parameter]) -> bool:
    """A forward without an ``input_ids`` parameter takes the ids positionally, unless all it
    has for them is ``**kwargs`` (``forward(*args, **kwargs)``, a wrapper's): its first
    parameter a positional one (``forward(self, tokens, **kwargs)``), or no ``**kwargs``."""
    first = next(iter(params.values()), None)
    if first is not None and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        return True
    return not any(p.kind is p.VAR_KEYWORD for p in params.values())


def shape_as_inputs_hint(error: BaseException, args: Any, kwargs: Any = None) -> str:
    """The hint for a call whose arguments, given as ``inputs=``, are ints alone (``inputs=
    (16,)``: a shape, meant as ``input_size=``) refused with a TypeError (``must be Tensor, not
    int``; ``forward() takes 2 positional arguments but 3 were given``) or BatchNorm's
    AttributeError (``'int' object has no attribute 'dim'``); else "". The caller judges that
    the ints reached what refused them (a module given no tensor)."""
    shape = isinstance(args, (tuple, list)) and args and all(map(is_int, args))
    if not (shape and not kwargs and isinstance(error, (TypeError, AttributeError))):
        return ""
    size = tuple(args)
    return (
        f"\nhint: inputs={size!r} are the call's arguments, and these are no tensors: for a "
        f"random input of that shape pass input_size={size!r} (batch excluded)"
    )


def refuses_call(fn: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether the signature of ``fn`` (of its ``forward``, a module's) refuses these
    arguments; False where it takes them or no signature can be read (a builtin)."""
    try:
        inspect.signature(getattr(fn, "forward", fn)).bind(*args, **kwargs)
    except TypeError:
        return True
    except ValueError:
        return False
    return False


def check_forward_keys(inputs: Mapping[str, Any], model: Any) -> None:
    """Refuse a key the model's forward does not take: a misspelt ``input_id`` went to the
    forward's ``**kwargs`` unread (a generation's random prompt was profiled in its place; a
    forward failed on no ``input_ids`` without naming the key); a ``**kwargs`` of no declared
    keys takes any."""
    taken = _forward_keywords(model)
    unknown = [k for k in inputs if taken is not None and k not in taken]
    if unknown:
        near = difflib.get_close_matches(unknown[0], sorted(taken), n=1)
        said = f"did you mean {near[0]!r}?" if near else f"it takes {sorted(taken)}"
        raise ModelProfError(
            f"inputs[{unknown[0]!r}] is no input of {type(model).__name__}.forward; {said}"
        )


def unread_key_hint(model: Any, kwargs: Mapping[str, Any]) -> str:
    """After a failed forward: a keyword input that is none of the forward's parameters but
    near one (``input_idz``), which a plain ``**kwargs`` took unread while the forward went
    without the input it meant ("You have to specify either input_ids"); "" for none."""
    params = forward_parameters(model) if isinstance(model, nn.Module) else {}
    named = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return ""  # (the call itself refused the key, by its name)
    for key in kwargs:
        near = [] if key in named else difflib.get_close_matches(key, named, n=1)
        if near:
            return (
                f"\nhint: inputs[{key!r}] is no parameter of {type(model).__name__}.forward, "
                f"whose **kwargs took it unread: did you mean {near[0]!r}?"
            )
    return ""


def _forward_keywords(model: Any) -> set[str] | None:
    """The keywords the model's forward takes; None where it takes any (a ``**kwargs`` of no
    declared keys) or its signature cannot be read. A ``**kwargs: Unpack[SomeTypedDict]``, as
    transformers declares them, takes that dict's keys."""
    params = forward_parameters(model) if isinstance(model, nn.Module) else {}
    if not params:
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {n for n, p in params.items() if p.kind in named}
    for p in params.values():
        if p.kind is p.VAR_KEYWORD:
            keys = _declared_keys(p.annotation)
            if keys is None:
                return None
            names |= keys
    return names


def _declared_keys(annotation: Any) -> set[str] | None:
    """The keys of ``**kwargs: Unpack[SomeTypedDict]``; None for any other ``**kwargs``."""
    declared = typing.get_args(annotation)  # Unpack[SomeTypedDict] -> (SomeTypedDict,)
    if len(declared) != 1:
        return None
    keys = [getattr(declared[0], k, None) for k in ("__required_keys__", "__optional_keys__")]
    return None if None in keys else {*keys[0], *keys[1]}


def forward_parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    """The forward's parameters by name; none where its signature cannot be read."""
    try:
        return dict(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {}
