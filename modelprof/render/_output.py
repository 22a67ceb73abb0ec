"""Where a rendered string goes: back to the caller, or into a file."""

from __future__ import annotations

import os
from pathlib import Path

from modelprof.errors import ModelProfError

__all__ = ["emit"]


def emit(text: str, path: str | os.PathLike[str] | None) -> str | Path:
    """Return ``text`` when ``path`` is None; otherwise write it (UTF-8, parent folders created,
    line endings as given) and return the path."""
    if path is None:
        return text
    target = Path(path)
    if target.is_dir():
        raise ModelProfError(f"path {str(target)!r} is a directory; give a file name")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    return target
