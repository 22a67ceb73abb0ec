"""What a model is called, one rule for the entry points and the sweep beneath them."""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path

__all__ = ["factory_name", "unique_name"]


def factory_name(path: Path | str, factory: str) -> str:
    """A factory's model by its file and name (``model.py:build`` -> ``model_build``): by the
    factory alone two files' ``build()`` were named alike, their ``--out`` files overwritten."""
    return f"{Path(path).stem}_{factory}"


def unique_name(name: str, taken: Container[str]) -> str:
    """``name``, or ``name (2)``, ``name (3)``... whichever is not in ``taken`` yet."""
    unique, i = name, 2
    while unique in taken:
        unique, i = f"{name} ({i})", i + 1
    return unique
