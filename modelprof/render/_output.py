"""Where a rendered string goes: back to the caller, or into a file."""

from __future__ import annotations

import os
from pathlib import Path

from modelprof.errors import ModelProfError

__all__ = ["checked_path", "emit"]


def checked_path(name: str, path: object) -> str:
    """``path`` (a ``str`` or ``os.PathLike``) as a string; anything else refused, named."""
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    raise ModelProfError(f"{name}={path!r} must be a file path (a str or os.PathLike)")


def emit(text: str, path: str | os.PathLike[str] | None) -> str | Path:
    """Return ``text`` when ``path`` is None; otherwise write it (UTF-8, parent folders created,
    line endings as given) and return the path."""
    if path is None:
        return text
    target = Path(checked_path("path", path))
    if target.is_dir():
        raise ModelProfError(f"path {str(target)!r} is a directory; give a file name")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8", newline="")
    return target
