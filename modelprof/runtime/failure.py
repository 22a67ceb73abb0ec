"""Say where the user's forward failed, for passes that run without module hooks (the clean
end-to-end timing): the running modules are read from the exception's traceback, the frames
whose ``self`` is one of the model's modules. Nothing is paid until something fails.
:func:`refused_as` says what failed elsewhere in the user's code (a loss, an optimizer).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime.hooks import module_names
from modelprof.runtime.tensors import shape_str

__all__ = ["forward_failure", "module_path", "refused_as", "running_modules"]


def running_modules(
    exc: BaseException, model: nn.Module, names: dict[nn.Module, str] | None = None
) -> list[str]:
    """Names (root ``""``) of ``model``'s modules running when ``exc`` was raised, outermost
    first."""
    names = module_names(model) if names is None else names
    found: list[str] = []
    last: Any = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        if owner is not last and isinstance(owner, nn.Module) and owner in names:
            found.append(names[owner])
            last = owner
    return found


@contextlib.contextmanager
def refused_as(what: str, where: Callable[[Exception], str] | None = None) -> Iterator[None]:
    """Re-raise an exception from the block as a ``ModelProfError`` saying ``what`` failed
    (and ``where(error)`` after it, where given), then the error's type and message; a
    ``ModelProfError`` passes through as it is."""
    try:
        yield
    except ModelProfError:
        raise
    except Exception as e:
        place = "" if where is None else where(e)
        raise ModelProfError(f"{what}{place}: {type(e).__name__}: {e}") from e


def module_path(running: list[str]) -> str:
    """The running modules' names (root ``""``) as ``a > a.b``, a deep path shortened."""
    shown = [n or "(root)" for n in running]
    if len(shown) > 6:
        shown = [*shown[:2], f"... {len(shown) - 5} more", *shown[-3:]]
    return " > ".join(shown)


@contextlib.contextmanager
def forward_failure(model: Any, what: str, inputs: Any = None) -> Iterator[None]:
    """Re-raise an exception from inside ``model``'s forward as a ``ModelProfError`` naming
    ``what`` was running, the module and the inputs; other errors pass through."""
    try:
        yield
    except ModelProfError:
        raise
    except Exception as e:
        if not isinstance(model, nn.Module):
            raise
        names = module_names(model)
        running = running_modules(e, model, names)
        if not running:
            raise
        inner = running[-1]
        kind = type(next(m for m, n in names.items() if n == inner)).__name__
        shapes = shape_str(inputs, dtypes=True) if inputs is not None else ""
        raise ModelProfError(
            f"the forward pass failed during {what} in module {inner or '(root)'!r} ({kind}); "
            f"running: {module_path(running)}."
            + (f" Inputs were {shapes}." if shapes else "")
            + f" {type(e).__name__}: {e}"
        ) from e
