"""How a model runs during any pass: eval/train flags, grad mode, autocast and memory layout.
One frozen :class:`RunMode`, parsed once at the boundary, and one context manager,
:func:`running`, that every pass enters; every flag set on a model is restored in ``finally``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from modelprof.errors import ModelProfError, check_flag, warn_user
from modelprof.runtime import compat
from modelprof.runtime.group import group_up
from modelprof.runtime.guard import set_training
from modelprof.runtime.inputs import parse_dtype
from modelprof.runtime.tensors import iter_tensors, map_tensors

__all__ = [
    "RunMode",
    "amp_context",
    "completed",
    "completing",
    "dispatch_modes_restored",
    "grad_context",
    "grad_switches",
    "legacy_eval_mode",
    "model_state",
    "parse_amp",
    "random_kept",
    "running",
    "to_channels_last",
]


@contextlib.contextmanager
def random_kept(device: torch.device | str | None = None) -> Iterator[None]:
    """torch's generators (the CPU's, and ``device``'s where it is a GPU; with no device, the
    current GPU's where CUDA is in use), Python's ``random`` and numpy's global state given
    back as they were on exit: the model's random ops (train-mode dropout) and its forward's
    own draws leave the caller's streams untouched."""
    device = torch.device(device) if isinstance(device, str) else device
    if device is None and torch.cuda.is_initialized():
        devices = [torch.cuda.current_device()]
    else:
        devices = [device] if device is not None and device.type == "cuda" else []
    py, npy = random.getstate(), np.random.get_state(legacy=False)  # (any bit generator's)
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


@contextlib.contextmanager
def dispatch_modes_restored() -> Iterator[None]:
    """torch's dispatch-mode stack and flags put back on every exit: a mode whose ``__exit__``
    failed before popping itself is not left to run the user's later eager code."""
    depth, flags = compat.dispatch_stack_state()
    try:
        yield
    finally:
        if compat.dispatch_stack_state() != (depth, flags):
            compat.restore_dispatch_stack(depth, flags)


@contextlib.contextmanager
def model_state(model: Any, modules: list[nn.Module] | None = None) -> Iterator[None]:
    """Every module's own ``training`` flag put back after the block. ``modules``:
    ``list(model.modules())`` where the caller has it."""
    if not isinstance(model, nn.Module):
        yield
        return
    flags = [(m, m.training) for m in (model.modules() if modules is None else modules)]
    try:
        yield
    finally:
        for m, flag in flags:
            if m.training is not flag:  # nn.Module.__setattr__ is slow: only what changed
                m.training = flag


def grad_switches(backward: bool, training: Any = None, no_grad: Any = None) -> tuple[bool, bool]:
    """``(training, no_grad)`` checked, by default train with grad when ``backward``."""
    check_flag("backward", backward)
    if backward and no_grad is True:
        raise ModelProfError("no_grad=True contradicts backward=True (the backward needs grad)")
    training = check_flag("training", backward if training is None else training)
    no_grad = check_flag("no_grad", not backward if no_grad is None else no_grad)
    return training, no_grad


def legacy_eval_mode(training: bool, options: dict[str, Any], where: str) -> bool:
    """``training``, or ``not eval_mode`` popped from ``options``, with a deprecation warning."""
    if "eval_mode" not in options:
        return training
    eval_mode = check_flag("eval_mode", options.pop("eval_mode"))
    warn_user(
        f"{where}(eval_mode={eval_mode}) is deprecated: pass training={not eval_mode}",
        DeprecationWarning,
    )
    return not eval_mode


def grad_context(no_grad: bool) -> contextlib.AbstractContextManager:
    """``torch.no_grad()`` when asked, else leave grad mode as the caller has it."""
    return torch.no_grad() if no_grad else contextlib.nullcontext()


def parse_amp(amp: Any) -> torch.dtype | None:
    """``None``, or ``torch.float16`` / ``torch.bfloat16`` (names accepted) for autocast."""
    if amp is None or amp is False:
        return None
    try:
        dt = parse_dtype(amp)
    except ModelProfError:
        dt = None
    if dt not in (torch.float16, torch.bfloat16):
        raise ModelProfError(
            f"amp={amp!r} must be torch.float16 or torch.bfloat16 (or 'fp16'/'bf16')"
        )
    return dt


def amp_context(
    device: torch.device, amp: torch.dtype | None, cache_enabled: bool = True
) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` at ``amp``, or nothing (no cache for CUDA graphs)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp, cache_enabled=cache_enabled)


def to_channels_last(obj: Any) -> Any:
    """A copy of ``obj`` with every 4-D tensor in channels_last layout (others untouched)."""
    return map_tensors(
        obj, lambda t: t.clone(memory_format=torch.channels_last) if t.dim() == 4 else t
    )


@dataclasses.dataclass(frozen=True)
class RunMode:
    """How the passes run the model: train flags, grad mode, autocast, the counted pass's
    memory layout, the inputs' device and the dtype asked for (None: the model's)."""

    training: bool = False
    no_grad: bool = True
    amp: torch.dtype | None = None
    memory_format: torch.memory_format | None = None
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype | None = None

    @classmethod
    def parse(
        cls,
        *,
        backward: bool = False,
        training: Any = None,
        no_grad: Any = None,
        amp: Any = None,
        channels_last: bool = False,
        device: torch.device | None = None,
        dtype: Any = None,
    ) -> RunMode:
        """The switches as ``profile`` and ``compare`` take them, checked."""
        training, no_grad = grad_switches(backward, training, no_grad)
        return cls(
            training,
            no_grad,
            parse_amp(amp),
            torch.channels_last if channels_last else None,
            torch.device("cpu") if device is None else device,
            parse_dtype(dtype),
        )

    def on(self, device: torch.device) -> RunMode:
        """This mode on ``device`` (where the inputs are)."""
        return self if device == self.device else dataclasses.replace(self, device=device)


@contextlib.contextmanager
def running(
    model: Any, mode: RunMode, modules: list[nn.Module] | None = None, cache_enabled: bool = True
) -> Iterator[None]:
    """Run ``model`` (any callable) in the block as ``mode`` says, each module's flag put back
    after; ``cache_enabled`` and ``modules`` as in :func:`amp_context` and :func:`model_state`."""
    with (
        model_state(model, modules=modules),
        grad_context(mode.no_grad),
        amp_context(mode.device, mode.amp, cache_enabled),
    ):
        if isinstance(model, nn.Module):
            set_training(model, mode.training, modules)
        yield


def completed(out: Any) -> Any:
    """``out``, every collective its tensors still wait for finished: a tensor-parallel layer's
    all-reduce (a functional collective) returns before its data has moved, so a call whose
    output is dropped would end, and be timed, before the work it started, and leave it
    unwaited (torch names each at exit)."""
    for t in iter_tensors(out):
        compat.finish_collective(t)
    return out


def completing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning its output :func:`completed`, where a process group is up (a
    functional collective needs one); elsewhere ``fn`` itself, which a timed call then runs
    without a step more."""
    if not group_up():
        return fn
    return lambda *args, **kwargs: completed(fn(*args, **kwargs))
