"""Where a model lives (device, dtype), and moving or copying it without touching the user's
model: a deep copy where one works, a structural copy (shared tensors, fresh registries) where not.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.device import same_device
from modelprof.runtime.group import communicates
from modelprof.runtime.guard import MODULE_REGISTRIES

__all__ = [
    "copy_model",
    "meta_copy",
    "model_placement",
    "moved_model",
    "refuse_valueless",
    "runs_as_is",
]


def model_placement(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device of the model's first parameter or buffer, and its first floating dtype."""
    device = next((t.device for t in _model_tensors(model)), torch.device("cpu"))
    dtype = next((t.dtype for t in _model_tensors(model) if t.is_floating_point()), None)
    return device, dtype or torch.get_default_dtype()


def runs_as_is(model: nn.Module, device: torch.device, dtype: torch.dtype | None) -> bool:
    """``model`` lives on ``device`` in ``dtype`` (None: any) by :func:`model_placement`: it
    runs without a converted copy (the counting pass, the timed runs and generation's steps
    all judge so)."""
    cur_device, cur_dtype = model_placement(model)
    return same_device(cur_device, device) and (dtype is None or cur_dtype == dtype)


def _model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


def refuse_valueless(model: nn.Module, device: torch.device) -> None:
    """Refuse to copy ``model`` to a real ``device`` when a parameter or buffer of it is a meta
    tensor (built under ``torch.device("meta")``): it has a shape and no values to copy."""
    if device.type == "meta":
        return
    for kind, named in (("parameters", model.named_parameters), ("buffers", model.named_buffers)):
        name = next((n for n, t in named() if t.is_meta), None)
        if name is not None:
            raise ModelProfError(
                f"the model's {kind} are on meta ({name!r} among them) and have no values to "
                f"copy to {device}: count it with device='meta', or materialise them first "
                f"(model.to_empty(device={str(device)!r}), then initialise the weights)"
            )


def to_placement(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    cast = dtype if (dtype is not None and t.is_floating_point()) else None
    if t.device == device and (cast is None or t.dtype == cast):
        return t
    return t.to(device=device, dtype=cast)


def _in_format(model: nn.Module, memory_format: torch.memory_format) -> bool:
    """Every 4-D parameter and buffer of ``model`` is already laid out in ``memory_format``."""
    return all(
        t.dim() != 4 or t.is_contiguous(memory_format=memory_format) for t in _model_tensors(model)
    )


def moved_model(
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype | None,
    memory_format: torch.memory_format | None = None,
) -> nn.Module:
    """``model`` itself when it already lives on ``device``/``dtype``, else a converted copy."""
    same = runs_as_is(model, device, dtype)
    if same and (memory_format is None or _in_format(model, memory_format)):
        return model
    refuse_valueless(model, device)
    cur_device, cur_dtype = model_placement(model)
    changes = (
        ("device", device if not same_device(cur_device, device) else None),
        ("dtype", dtype if dtype is not None and cur_dtype != dtype else None),
        ("memory format", memory_format),
    )
    wanted = ", ".join(f"{k} {v}" for k, v in changes if v is not None)
    clone = copy_model(model, f"convert it to {wanted}")
    try:
        # one conversion: no intermediate copy in the old dtype on the new device
        clone.to(device=device, dtype=dtype, memory_format=memory_format)
    except NotImplementedError as e:  # a torch.export module: its graph cannot be converted
        raise ModelProfError(
            f"cannot {wanted} a copy of {type(model).__name__}: "
            f"{type(e).__name__}: {e}. Export it again on that device/dtype, "
            "or profile it as it is"
        ) from e
    return clone


def meta_copy(model: nn.Module) -> nn.Module | None:
    """A copy of ``model`` whose parameters and buffers are meta tensors of their shapes and
    dtypes, made without copying a byte of them (``copy.deepcopy`` handed each one's meta
    twin); None where the model cannot be copied (a process group's, or deepcopy fails)."""
    if communicates(model):
        return None
    memo: dict[int, object] = {}
    for name, tensors in (("parameters", model.parameters()), ("buffers", model.buffers())):
        for t in tensors:
            twin = t.detach().to("meta")
            memo[id(t)] = nn.Parameter(twin, t.requires_grad) if name == "parameters" else twin
    try:
        return copy.deepcopy(model, memo)
    except Exception:  # noqa: BLE001 - TypeError (unpicklable), RecursionError, ...
        return None


def copy_model(model: nn.Module, why: str, *, own_parameters: bool = False) -> nn.Module:
    """A copy of ``model`` to convert or train: ``copy.deepcopy``, else (a lock, too deep) a
    structural copy (registries copied, parameters re-wrapped, buffers cloned, the rest shared;
    its parameters with memory of their own with ``own_parameters``). ``why``: for the error."""
    if communicates(model):  # a copy would share (or break) the process group's state
        raise ModelProfError(
            f"cannot copy the model ({type(model).__name__}) to {why}: it is "
            "sharded or replicated across a process group (DDP, FSDP2, "
            "DTensor), and modelprof never copies such a model; prepare it "
            "as it should run (device, dtype) and profile it as it is"
        )
    try:
        return _compiled_as(model, copy.deepcopy(model))
    except ModelProfError:
        raise
    except Exception as e:  # noqa: BLE001 - TypeError (unpicklable), RecursionError, ...
        deep_error = e
    try:
        clone = _structural_copy(model, own_parameters)
    except Exception as e:  # noqa: BLE001
        raise ModelProfError(
            f"cannot copy the model ({type(model).__name__}) to {why}: copy.deepcopy failed "
            f"({type(deep_error).__name__}: {deep_error}) and so did a module-by-module copy "
            f"({type(e).__name__}: {e}). Convert the model yourself (model.to(...)) and "
            "profile it as it is"
        ) from deep_error
    return _compiled_as(model, clone)


def _compiled_as(model: nn.Module, clone: nn.Module) -> nn.Module:
    """``clone`` with each module that ``model.compile()`` compiled in place compiled as its
    original is: a deep copy drops the compiled call (and a structural one would share it, the
    original's modules running), where the copy must run as the user's model does."""
    for original, twin in zip(model.modules(), clone.modules()):
        if compat.compiled_in_place(original):
            compat.compile_in_place_like(original, twin)
    return clone


def _structural_copy(model: nn.Module, own_parameters: bool = False) -> nn.Module:
    modules: dict[int, nn.Module] = {}
    tensors: dict[int, torch.Tensor] = {}

    def tensor(t: torch.Tensor, is_param: bool) -> torch.Tensor:
        if id(t) not in tensors:  # one copy per original: tied weights stay tied
            if is_param:
                data = t.detach().clone() if own_parameters else t.detach()
                tensors[id(t)] = nn.Parameter(data, requires_grad=t.requires_grad)
            else:
                tensors[id(t)] = t.detach().clone()
        return tensors[id(t)]

    todo = [model]
    while todo:  # iterative: any nesting depth
        m = todo.pop()
        if id(m) in modules:
            continue
        # a GraphModule's __new__ makes a class without its forward (that lives on the class
        # each instance gets): the copy keeps the original's class
        make = object.__new__ if isinstance(m, torch.fx.GraphModule) else m.__class__.__new__
        new = make(m.__class__)
        if type(new).forward is not type(m).forward:
            raise ModelProfError(
                f"a module-by-module copy of {type(m).__name__} would have no forward of its own"
            )
        state = dict(m.__dict__)
        for key in MODULE_REGISTRIES:
            if key in state:
                state[key] = state[key].copy()
        new.__dict__.update(state)
        modules[id(m)] = new
        todo.extend(c for c in m._modules.values() if c is not None)
    for new in modules.values():
        for registry, is_param in ((new._parameters, True), (new._buffers, False)):
            for key, t in registry.items():
                if t is not None:
                    registry[key] = tensor(t, is_param)
        for key, c in new._modules.items():
            if c is not None:
                new._modules[key] = modules[id(c)]
    return modules[id(model)]
