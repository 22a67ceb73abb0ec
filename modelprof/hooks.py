"""Observe every module call of a model, and always stop observing afterwards.

Both the static analyser (scope of each op) and the per-layer timer (timestamps) use this, so
the rule "nothing is left on the user's model" lives in one place.

The hooks are *global* module hooks filtered to the model's own modules, not hooks registered
on each module: PyTorch's fused fast paths refuse to run when a module carries hooks
(``nn.TransformerEncoderLayer`` checks ``_forward_hooks`` of its whole subtree), so per-module
hooks would profile a different code path than the one the user runs. The global hooks are
removed in ``finally``, also when the forward raises or is interrupted.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.nn.modules import module as _module

__all__ = ["module_hooks", "module_names"]

PreHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]
PostHook = Callable[..., None]

# Global forward hooks see the call's kwargs (and can be called when the forward raises) in
# recent torch; pre-hooks never see kwargs.
_GLOBAL_POST_PARAMS = inspect.signature(_module.register_module_forward_hook).parameters
_GLOBAL_POST_KWARGS = "with_kwargs" in _GLOBAL_POST_PARAMS and "always_call" in _GLOBAL_POST_PARAMS
_NO_KWARGS: dict[str, Any] = {}


def module_names(model: nn.Module) -> dict[nn.Module, str]:
    """Each distinct module object with its first qualified name; the root is ``""``."""
    names: dict[nn.Module, str] = {}
    for name, module in model.named_modules():
        names.setdefault(module, name)
    return names


@contextlib.contextmanager
def module_hooks(model: nn.Module, pre: PreHook, post: PostHook,
                 modules: dict[nn.Module, str] | None = None, *,
                 post_with_inputs: bool = False) -> Iterator[dict[nn.Module, str]]:
    """Call ``pre(module, args, kwargs)`` before and ``post(module, output)`` after the forward
    of every module of ``model``, for the duration of the ``with`` block; yields the
    module->name map. ``kwargs`` is empty in ``pre`` (PyTorch does not pass it to global
    pre-hooks). With ``post_with_inputs`` the post hook is
    ``post(module, args, kwargs, output, raised)`` and is also called, with ``raised=True``,
    when the module's forward raises (so a caller that catches the exception keeps a correct
    call stack).
    """
    names = module_names(model) if modules is None else modules

    def _pre(module: nn.Module, args: tuple) -> None:
        if module in names:
            pre(module, args, _NO_KWARGS)

    if post_with_inputs:
        def _post(module: nn.Module, args: tuple, *rest: Any) -> None:
            if module in names:
                if len(rest) == 2:
                    post(module, args, rest[0], rest[1], False)
                else:  # torch calls always-call hooks without kwargs only when forward raised
                    post(module, args, _NO_KWARGS, rest[0], _GLOBAL_POST_KWARGS)
    else:
        def _post(module: nn.Module, args: tuple, *rest: Any) -> None:
            if module in names:
                post(module, rest[-1])

    handles = []
    try:
        handles.append(_module.register_module_forward_pre_hook(_pre))
        if _GLOBAL_POST_KWARGS and post_with_inputs:
            handles.append(_module.register_module_forward_hook(_post, with_kwargs=True,
                                                                always_call=True))
        else:
            handles.append(_module.register_module_forward_hook(_post))
        yield names
    finally:
        for h in handles:
            h.remove()
            # RemovableHandle does not clear the with_kwargs registry of global hooks
            getattr(_module, "_global_forward_hooks_with_kwargs", {}).pop(h.id, None)
