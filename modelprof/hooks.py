"""Attach forward pre/post hooks to every module of a model, and always take them off again.

Both the static analyser (scope of each op) and the per-layer timer (timestamps) use this, so
the rule "nothing is left on the user's model" lives in one place.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

__all__ = ["module_hooks", "module_names"]

PreHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]
PostHook = Callable[[nn.Module, Any], None]


def module_names(model: nn.Module) -> dict[nn.Module, str]:
    """Each distinct module object with its first qualified name; the root is ``""``."""
    names: dict[nn.Module, str] = {}
    for name, module in model.named_modules():
        names.setdefault(module, name)
    return names


@contextlib.contextmanager
def module_hooks(model: nn.Module, pre: PreHook, post: PostHook,
                 modules: dict[nn.Module, str] | None = None) -> Iterator[dict[nn.Module, str]]:
    """Call ``pre(module, args, kwargs)`` before and ``post(module, output)`` after every
    module's forward, for the duration of the ``with`` block. Yields the module->name map.

    The hooks are prepended so that they run before (pre) any hook of the user's and are
    removed in ``finally``, also when the forward raises or is interrupted.
    """
    names = module_names(model) if modules is None else modules
    handles = []

    def _pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        pre(module, args, kwargs)

    def _post(module: nn.Module, args: tuple, output: Any) -> None:
        post(module, output)

    try:
        for module in names:
            handles.append(module.register_forward_pre_hook(_pre, with_kwargs=True, prepend=True))
            handles.append(module.register_forward_hook(_post))
        yield names
    finally:
        for h in handles:
            h.remove()
