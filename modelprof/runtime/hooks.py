"""Observe every module call of a model, and always stop observing afterwards.

The hooks are *global* hooks filtered to the model's modules: fused fast paths refuse to run
when a module carries hooks (``nn.TransformerEncoderLayer``), so per-module hooks would profile
another code path. Only the installing thread's calls are passed on; other threads' calls of
the model are counted and, unless ``exclusive=False``, raise at the end (profiling puts the
model's state back over their changes). The recursion limit is raised by the frames hooks add.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.nn.modules import module as _module

from modelprof.errors import ModelProfError
from modelprof.runtime import compat

__all__ = [
    "HookSession",
    "count_foreign_calls",
    "module_hooks",
    "module_names",
    "recursion_headroom",
]

PreHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]
PostHook = Callable[..., None]

_NO_KWARGS: dict[str, Any] = {}

# Frames the hooks add per module nesting level, and a margin for the innermost level
_FRAMES_PER_LEVEL = 3
_FRAMES_MARGIN = 200


def module_names(model: nn.Module) -> dict[nn.Module, str]:
    """Each distinct module object with its first qualified name; the root is ``""``."""
    return {module: name for name, module in model.named_modules()}  # it skips repeats


@dataclasses.dataclass(eq=False)
class HookSession:
    """What ``module_hooks`` yields: module names, its thread and other threads' calls."""

    names: dict[nn.Module, str]
    thread_id: int
    foreign_calls: int = 0


# sys.setrecursionlimit is process-wide: concurrent requests (threads) share one raise
_limit_lock = threading.Lock()
_limit_requests: list[int] = []
_limit_base: list[int] = []  # [the limit before the first request, the limit we set]


@contextlib.contextmanager
def recursion_headroom(extra_frames: int) -> Iterator[None]:
    """Raise Python's recursion limit by ``extra_frames`` for the block."""
    if extra_frames <= 0:
        yield
        return
    with _limit_lock:
        if not _limit_requests:
            _limit_base[:] = [sys.getrecursionlimit(), 0]
        _limit_requests.append(extra_frames)
        _limit_base[1] = _limit_base[0] + max(_limit_requests)
        sys.setrecursionlimit(_limit_base[1])
    try:
        yield
    finally:
        with _limit_lock:
            _limit_requests.remove(extra_frames)
            base, ours = _limit_base
            if sys.getrecursionlimit() == ours:
                target = base + max(_limit_requests, default=0)
                sys.setrecursionlimit(target)
                _limit_base[1] = target


@contextlib.contextmanager
def module_hooks(
    model: nn.Module,
    pre: PreHook,
    post: PostHook,
    modules: dict[nn.Module, str] | None = None,
    *,
    post_with_inputs: bool = False,
    exclusive: bool = True,
    any_thread: bool = False,
) -> Iterator[HookSession]:
    """Call ``pre(module, args, {})`` before and ``post(module, output)`` after the forward of
    every module of ``model`` this thread runs in the block. With ``post_with_inputs``:
    ``post(module, args, kwargs, output, raised)``, also when the forward raises. With
    ``any_thread``: every thread's calls (a backward's, which autograd runs on a device's own
    thread on CUDA)."""
    names = module_names(model) if modules is None else modules
    session = HookSession(names, threading.get_ident())
    owner = session.thread_id
    get_ident = (lambda: owner) if any_thread else threading.get_ident

    def _pre(module: nn.Module, args: tuple) -> None:
        if get_ident() != owner:
            if module in names:
                session.foreign_calls += 1
        elif module in names:
            pre(module, args, _NO_KWARGS)

    if post_with_inputs:

        def _post(module: nn.Module, args: tuple, *rest: Any) -> None:
            if module in names and get_ident() == owner:
                if len(rest) == 2:
                    post(module, args, rest[0], rest[1], False)
                else:  # torch calls always-call hooks without kwargs only when forward raised
                    post(module, args, _NO_KWARGS, rest[0], compat.GLOBAL_HOOKS_SEE_KWARGS)
    else:

        def _post(module: nn.Module, args: tuple, *rest: Any) -> None:
            if module in names and get_ident() == owner:
                post(module, rest[-1])

    handles = []
    depth = max((n.count(".") + 1 for n in names.values() if n), default=0) + 1  # the root's 1
    with recursion_headroom(_FRAMES_PER_LEVEL * depth + _FRAMES_MARGIN):
        try:
            handles.append(_module.register_module_forward_pre_hook(_pre))
            # with the kwargs, also when the forward raises
            always = compat.GLOBAL_HOOKS_SEE_KWARGS and post_with_inputs
            extra = {"with_kwargs": True, "always_call": True} if always else {}
            handles.append(_module.register_module_forward_hook(_post, **extra))
            yield session
        finally:
            for h in handles:
                h.remove()
                compat.forget_global_hook(h)
    if exclusive and session.foreign_calls:
        raise ModelProfError(
            f"another thread called the modules of {type(model).__name__} "
            f"{session.foreign_calls} times while modelprof profiled it: a model must not be "
            "used elsewhere (trained, served) while it is profiled, since profiling sets its "
            "mode and puts its state back at the end, over that thread's changes. Profile a "
            "copy (copy.deepcopy(model)), or profile when the other thread is done"
        )


def count_foreign_calls(model: nn.Module) -> contextlib.AbstractContextManager[HookSession]:
    """Only count other threads' calls of the model's modules (``session.foreign_calls``)."""
    return module_hooks(model, lambda *_: None, lambda *_: None, exclusive=False)
