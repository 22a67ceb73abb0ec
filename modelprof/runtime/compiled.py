"""A ``torch.compile``'d model, however it was compiled and wherever: the model itself or any of
its modules, by ``torch.compile(module)`` (a wrapper module around it,
``compat.compiled_original``) or ``module.compile()`` (its call compiled in place,
``compat.compiled_in_place``). Its clean runs call it as it is, compiled; the passes that hook
its modules (the counted pass, the per-layer passes, a training step's instrumented passes)
run its eager modules inside :func:`eager_view`, where every call fires the hooks and dynamo
traces none of them (a compiled graph fires no hook inside it, tracing the hooks breaks the
graph at each one, and a wrapper called while hooks are on warns that they fire twice)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

from torch import nn

from modelprof.runtime import compat
from modelprof.runtime.guard import rescan_active

__all__ = ["compiled_words", "eager_module", "eager_view"]

#: the most compiled modules a note names one by one
NAMED_IN_NOTE = 3


def eager_module(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile(module)`` wraps; any other model itself."""
    original = compat.compiled_original(model)
    return model if original is None else original


def _compiled(
    root: nn.Module,
) -> tuple[list[tuple[nn.Module, str, nn.Module, str]], list[tuple[nn.Module, str]]]:
    """The compiled modules under ``root``, named as in its eager view: the wrappers
    (``torch.compile(child)``: parent, key, wrapper, name) and those compiled in place (module,
    name). One walk of the tree (a wrapper's original in its place, under its name), top level
    first."""
    wrapped: list[tuple[nn.Module, str, nn.Module, str]] = []
    in_place: list[tuple[nn.Module, str]] = []
    todo, seen = collections.deque([("", root)]), set()
    while todo:
        prefix, module = todo.popleft()
        if id(module) in seen:
            continue
        seen.add(id(module))
        if compat.compiled_in_place(module):
            in_place.append((module, prefix))
        for key, child in module._modules.items():
            if child is None:
                continue
            name = f"{prefix}.{key}" if prefix else key
            original = compat.compiled_original(child)
            if original is not None:
                wrapped.append((module, key, child, name))
            todo.append((name, child if original is None else original))
    return wrapped, in_place


def compiled_words(model: nn.Module) -> str | None:
    """What of ``model`` is compiled, for a note (None: nothing is)."""
    parts = []
    if compat.compiled_original(model) is not None:
        parts.append("the model is torch.compile'd")
    wrapped, in_place = _compiled(eager_module(model))
    if any(name == "" for _, name in in_place):
        parts.append("the model is compiled in place (model.compile())")
    named = [f"{name!r} (torch.compile)" for *_, name in wrapped]
    named += [f"{name!r} ({name}.compile())" for _, name in in_place if name]
    if named:
        more = len(named) - NAMED_IN_NOTE
        shown = ", ".join(named[:NAMED_IN_NOTE]) + (f" and {more} more" if more > 0 else "")
        parts.append(f"its compiled module{'s' if len(named) > 1 else ''} {shown}")
    return "; ".join(parts) or None


@contextlib.contextmanager
def eager_view(model: nn.Module) -> Iterator[nn.Module]:
    """The eager module of ``model`` (:func:`eager_module`) for the block: each module that
    ``torch.compile(child)`` wrapped has its original in the wrapper's place (named as the
    eager model's), each compiled in place runs its eager call; all put back after. A state
    guard active on the model reads its tree again on entering and on leaving."""
    root = eager_module(model)
    wrapped, in_place = _compiled(root)
    for parent, key, wrapper, _ in wrapped:
        parent._modules[key] = compat.compiled_original(wrapper)
    try:
        if wrapped:
            rescan_active(root)
        with compat.eager_calls(m for m, _ in in_place):
            yield root
    finally:
        for parent, key, wrapper, _ in reversed(wrapped):
            parent._modules[key] = wrapper
        if wrapped:
            rescan_active(root)
