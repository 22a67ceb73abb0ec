"""Progress bars for long work (timing passes, comparisons, throughput searches, checks).

One helper, :func:`progress_bar`, returns a tqdm bar with a total (so it shows an ETA) when
progress is wanted and tqdm is installed, and a do-nothing bar otherwise. tqdm is imported only
when a bar is wanted, so a library call with progress off never touches it (no "IProgress not
found" in a notebook). In a Jupyter kernel with ipywidgets the notebook widget is used; everywhere
else the plain text bar on stderr (``tqdm.tqdm``, never ``tqdm.auto``, which warns without
ipywidgets).
"""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["NoProgress", "progress_bar"]


class NoProgress:
    """The bar used when progress is off or tqdm is missing: every method does nothing."""

    total: int | None = None
    n: int = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None: ...

    def set_postfix(self, *args: Any, **kwargs: Any) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (not a terminal IPython); never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - an odd IPython: behave as in a terminal
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _tqdm_class() -> Any:
    """tqdm's notebook widget in a Jupyter kernel with ipywidgets, else the text bar; None
    without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401 - tqdm.notebook needs it; without, it warns
            from tqdm.notebook import tqdm as notebook_tqdm
        except ImportError:
            return tqdm
        return notebook_tqdm
    return tqdm


def progress_bar(total: int | None, *, enabled: bool, desc: str | None = None,
                 unit: str = "it", leave: bool = False) -> Any:
    """A progress bar over ``total`` steps (``None`` when unknown: no ETA), or a no-op.

    ``enabled=False`` returns :class:`NoProgress` without importing tqdm; so does a missing tqdm.
    The bar writes to stderr and is removed when closed unless ``leave=True``. Use it as a context
    manager or call ``close()``.
    """
    if not enabled:
        return NoProgress()
    cls = _tqdm_class()
    if cls is None:
        return NoProgress()
    if cls.__module__ == "tqdm.notebook":
        return cls(total=total, desc=desc, unit=unit, leave=leave)
    return cls(total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr, dynamic_ncols=True)
