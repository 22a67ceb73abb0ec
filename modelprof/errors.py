"""The one exception type modelprof raises for anything the user can cause."""
from __future__ import annotations

__all__ = ["ModelProfError"]


class ModelProfError(Exception):
    """A bad argument, input or model. The message names the offending value."""
