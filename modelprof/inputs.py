"""Turn what the user passed (an input size, tensors, a dict) into call arguments on the right
device and dtype, and walk whatever a model returns.

Everything here is shared by the static analyser, the timer and the command line, so that
``profile``, ``measure_latency`` and ``measure_throughput`` accept exactly the same inputs.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .device import normalize_device, same_device
from .errors import ModelProfError

__all__ = [
    "ModelInputs",
    "iter_tensors",
    "make_inputs",
    "map_tensors",
    "model_placement",
    "moved_model",
    "parse_device",
    "parse_dtype",
    "parse_input_size",
    "shape_str",
    "tensor_bytes",
    "tensor_shape",
]

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


@dataclasses.dataclass
class ModelInputs:
    """Positional and keyword arguments for one forward call, already on ``device``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    device: torch.device
    dtype: torch.dtype
    batch_size: int

    def shapes(self) -> str:
        return shape_str((self.args, self.kwargs))


def parse_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``None``, a ``torch.dtype`` or a name such as ``"fp16"``/``"bfloat16"``."""
    if dtype is None or isinstance(dtype, torch.dtype):
        if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
            raise ModelProfError(f"dtype={dtype} is not a floating-point dtype; "
                                 "pass integer inputs through inputs= instead")
        return dtype
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
    raise ModelProfError(f"dtype={dtype!r} is not understood; use one of "
                         f"{sorted(set(_DTYPE_NAMES))} or a torch.dtype")


def parse_device(device: torch.device | str | int | None) -> torch.device | None:
    """``None``, a ``torch.device``, ``"cuda:0"``, ``"cpu"``, ``"meta"`` or a CUDA index."""
    if device is None:
        return None
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelProfError(f"device={device!r} is not a device: {e}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelProfError(f"device={device!r}: CUDA is not available on this machine "
                             "(use 'cpu', or 'meta' to analyse shapes alone)")
    return normalize_device(dev)


def parse_input_size(input_size: Any) -> list[tuple[int, ...]]:
    """One shape (``(3, 224, 224)``) or several (``[(3, 224, 224), (10,)]``), batch excluded."""
    if isinstance(input_size, torch.Size):
        input_size = tuple(input_size)
    if not isinstance(input_size, Sequence) or isinstance(input_size, (str, bytes)):
        raise ModelProfError(f"input_size={input_size!r} must be a tuple of ints such as "
                             "(3, 224, 224), or a list of such tuples")
    if all(_is_int(d) for d in input_size):
        shapes = [tuple(input_size)]
    elif all(isinstance(s, (Sequence, torch.Size)) and not isinstance(s, (str, bytes))
             and all(_is_int(d) for d in s) for s in input_size) and len(input_size) > 0:
        shapes = [tuple(s) for s in input_size]
    else:
        raise ModelProfError(f"input_size={input_size!r} must be a tuple of ints such as "
                             "(3, 224, 224), or a list of such tuples")
    for shape in shapes:
        if any(int(d) <= 0 for d in shape):
            raise ModelProfError(f"input_size={input_size!r} has a dimension <= 0 in {shape}")
    return [tuple(int(d) for d in s) for s in shapes]


def _is_int(d: Any) -> bool:
    return isinstance(d, int) and not isinstance(d, bool)


def model_placement(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device of the model's first parameter or buffer, and its first floating dtype."""
    device, dtype = None, None
    for t in _model_tensors(model):
        if device is None:
            device = t.device
        if dtype is None and t.is_floating_point():
            dtype = t.dtype
        if device is not None and dtype is not None:
            break
    return device or torch.device("cpu"), dtype or torch.get_default_dtype()


def _model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


def _to(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    cast = dtype if (dtype is not None and t.is_floating_point()) else None
    if t.device == device and (cast is None or t.dtype == cast):
        return t
    return t.to(device=device, dtype=cast)


def map_tensors(obj: Any, fn) -> Any:
    """``obj`` with every tensor replaced by ``fn(tensor)`` (tuples, lists, dicts, namedtuples)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if isinstance(obj, Mapping):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def make_inputs(
    model: nn.Module,
    input_size: Any = None,
    *,
    inputs: Any = None,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> ModelInputs:
    """Normalise ``input_size``/``inputs`` into call arguments for ``model``.

    ``input_size`` excludes the batch dimension; random normal tensors of
    ``(batch_size, *input_size)`` are made. ``inputs`` is a tensor (the one argument), a tuple
    of positional arguments (which may hold lists), a list (one positional argument) or a dict
    of keyword arguments. Floating tensors are cast to ``dtype``; all move to ``device``.
    """
    if isinstance(model, nn.Module):
        model_device, model_dtype = model_placement(model)
    elif callable(model):
        model_device, model_dtype = torch.device("cpu"), torch.get_default_dtype()
    else:
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module or callable")
    dev = parse_device(device) or model_device
    dt = parse_dtype(dtype)
    if batch_size is not None and (not _is_int(batch_size) or batch_size < 1):
        raise ModelProfError(f"batch_size={batch_size!r} must be a positive int")

    if (input_size is None) == (inputs is None):
        raise ModelProfError("pass exactly one of input_size (e.g. (3, 224, 224)) or inputs= "
                             f"(got input_size={input_size!r}, inputs of type "
                             f"{type(inputs).__name__})")
    if input_size is not None:
        shapes = parse_input_size(input_size)
        b = 1 if batch_size is None else batch_size
        make_dtype = dt or model_dtype
        # a private generator: reproducible inputs, and the user's global RNG is not advanced
        gen = torch.Generator(device=dev).manual_seed(0) if dev.type in ("cpu", "cuda") else None
        args = tuple(torch.randn((b, *s), device=dev, dtype=make_dtype, generator=gen)
                     for s in shapes)
        return ModelInputs(args, {}, dev, make_dtype, b)

    move = lambda t: _to(t, dev, dt)  # noqa: E731
    if isinstance(inputs, torch.Tensor):
        args, kwargs = (move(inputs),), {}
    elif isinstance(inputs, Mapping):
        bad = [k for k in inputs if not isinstance(k, str)]
        if bad:
            raise ModelProfError(f"inputs dict keys must be argument names; got {bad[0]!r}")
        args, kwargs = (), map_tensors(dict(inputs), move)
    elif isinstance(inputs, tuple):
        args, kwargs = map_tensors(inputs, move), {}
    elif isinstance(inputs, list):
        args, kwargs = (map_tensors(inputs, move),), {}
    else:
        raise ModelProfError(f"inputs of type {type(inputs).__name__} not understood; pass a "
                             "tensor, a tuple of positional arguments or a dict of keyword "
                             "arguments")
    first = next(iter_tensors((args, kwargs)), None)
    inferred = _infer_batch(args, kwargs)
    if batch_size is not None and first is not None and batch_size != inferred:
        raise ModelProfError(
            f"batch_size={batch_size} contradicts inputs= whose batch is {inferred} (first "
            f"tensor of shape {tuple(first.shape)}); leave batch_size out with inputs=, or pass "
            "tensors of that batch")
    batch_size = inferred if batch_size is None else batch_size
    in_dtype = dt or (first.dtype if first is not None and first.is_floating_point()
                      else model_dtype)
    return ModelInputs(tuple(args), dict(kwargs), dev, in_dtype, batch_size)


def _infer_batch(args: tuple, kwargs: dict) -> int:
    """Leading dimension of the first tensor; for a list of per-sample tensors, its length."""
    for obj in (*args, *kwargs.values()):
        if isinstance(obj, torch.Tensor):
            return int(obj.shape[0]) if obj.dim() > 0 else 1
        if isinstance(obj, (list, tuple)) and obj and all(isinstance(o, torch.Tensor) for o in obj):
            return len(obj)
    return 1


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nest of tuples, lists, dicts, dataclasses (``ModelOutput`` too)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from iter_tensors(o)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            yield from iter_tensors(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None))


def tensor_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape; a nested (ragged) tensor's is its components' stacked, the ragged dimension
    summed: ``[(5, 8), (3, 8)] -> (2, 8, 8)``."""
    if getattr(t, "is_nested", False):
        parts = [tuple(c.shape) for c in t.unbind()]
        if not parts:
            return (0,)
        return (len(parts), *(sum(d) if len(set(d)) > 1 else d[0] for d in zip(*parts)))
    return tuple(t.shape)


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of the elements (a nested tensor: of all its components)."""
    if getattr(t, "is_nested", False):
        return sum(c.numel() for c in t.unbind()) * t.element_size()
    return t.numel() * t.element_size()


def shape_str(obj: Any) -> str:
    """Shapes of the tensors in ``obj``, ``x``-joined, comma-separated: ``1x3x224x224, 1x10``."""
    return ", ".join("x".join(str(d) for d in tensor_shape(t)) if t.dim() else "()"
                     for t in iter_tensors(obj))


def tensor_bytes(obj: Any) -> int:
    """Bytes of the distinct tensors in ``obj`` (a tensor returned twice counts once)."""
    seen: set[int] = set()
    total = 0
    for t in iter_tensors(obj):
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_nbytes(t)
    return total


def _in_format(model: nn.Module, memory_format: torch.memory_format) -> bool:
    """Every 4-D parameter and buffer of ``model`` is already laid out in ``memory_format``."""
    return all(t.dim() != 4 or t.is_contiguous(memory_format=memory_format)
               for t in _model_tensors(model))


def moved_model(model: nn.Module, device: torch.device, dtype: torch.dtype | None,
                memory_format: torch.memory_format | None = None) -> nn.Module:
    """``model`` itself when it already lives on ``device``/``dtype``; otherwise a converted copy.

    The user's model is never converted in place.
    """
    cur_device, cur_dtype = model_placement(model)
    same = same_device(cur_device, device) and (dtype is None or cur_dtype == dtype)
    if same and (memory_format is None or _in_format(model, memory_format)):
        return model
    clone = copy.deepcopy(model)
    # one conversion: no intermediate copy in the old dtype on the new device
    return clone.to(device=device, dtype=dtype, memory_format=memory_format)
