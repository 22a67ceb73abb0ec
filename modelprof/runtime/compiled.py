"""A ``torch.compile``'d model, however it was compiled: ``torch.compile(module)`` (a wrapper
module around it, ``compat.compiled_original``) or ``module.compile()`` (its call compiled in
place, ``compat.compiled_in_place``). Its clean runs call it as it is, compiled; the passes that
hook its modules (the counted pass, the per-layer passes, a training step's instrumented
passes) run its eager modules inside :func:`eager_view`, where every call fires the hooks and
dynamo traces none of them (a compiled graph fires no hook inside it, and tracing the hooks
breaks the graph at each one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from modelprof.runtime import compat

__all__ = ["compiled_words", "eager_module", "eager_view", "in_place_compiled"]


def eager_module(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile(module)`` wraps; any other model itself."""
    original = compat.compiled_original(model)
    return model if original is None else original


def in_place_compiled(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` compiled in place (``module.compile()``), the root's first."""
    return [m for m in eager_module(model).modules() if compat.compiled_in_place(m)]


def compiled_words(model: nn.Module) -> str | None:
    """How ``model`` is compiled, for a note (None: it is not)."""
    if compat.compiled_original(model) is not None:
        return "the model is torch.compile'd"
    if compat.compiled_in_place(model):
        return "the model is compiled in place (model.compile())"
    return None


@contextlib.contextmanager
def eager_view(model: nn.Module) -> Iterator[nn.Module]:
    """The eager module of ``model`` (:func:`eager_module`), every module under it compiled in
    place running its eager call in the block."""
    root = eager_module(model)
    with compat.eager_calls(list(root.modules())):
        yield root
