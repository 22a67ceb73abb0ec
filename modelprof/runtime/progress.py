"""Progress bars for long work: a tqdm bar with a total (an ETA), or a do-nothing bar. tqdm is
imported only when a bar is wanted (no "IProgress not found"); never ``tqdm.auto``, which warns
without ipywidgets.
"""

from __future__ import annotations

import sys
from typing import Any

from modelprof.runtime.group import is_speaker

__all__ = ["NoProgress", "SamplingBar", "progress_bar", "sampling_bar"]


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
    """tqdm's notebook widget in a Jupyter kernel with ipywidgets, else the text bar, or None."""
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


def progress_bar(
    total: float | None,
    *,
    enabled: bool,
    desc: str | None = None,
    unit: str = "it",
    leave: bool = False,
    bar_format: str | None = None,
) -> Any:
    """A tqdm bar over ``total`` steps (``None``: no ETA), removed when closed unless ``leave``;
    :class:`NoProgress` when not ``enabled``, without tqdm or on a rank that does not speak."""
    cls = _tqdm_class() if enabled and is_speaker() else None
    if cls is None:
        return NoProgress()
    extra: dict[str, Any] = {} if bar_format is None else {"bar_format": bar_format}
    if cls.__module__ != "tqdm.notebook":
        extra.update(file=sys.stderr, dynamic_ncols=True)
    return cls(total=total, desc=desc, unit=unit, leave=leave, **extra)


# seconds are floats: tqdm's default "n/total" would print 1.2345678/5.0
_SECONDS_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]"


class SamplingBar:
    """The bar of a sampling loop, called with (samples, seconds) so far: samples against a
    fixed target, else seconds against the budget."""

    def __init__(self, bar: Any, by_samples: bool) -> None:
        self.bar = bar
        self.by_samples = by_samples

    def __call__(self, n_samples: int, elapsed_s: float) -> None:
        bar = self.bar
        done = n_samples if self.by_samples else elapsed_s
        if bar.total is not None:
            done = min(done, bar.total)
        if done > bar.n:
            bar.update(done - bar.n)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> SamplingBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sampling_bar(stop: Any, *, enabled: bool, desc: str, candidates: int = 1) -> SamplingBar:
    """A :class:`SamplingBar` under the ``StopRule`` ``stop``: over ``stop.repeat`` samples,
    else over ``stop.budget_s`` per candidate."""
    by_samples = stop.repeat is not None
    total = stop.repeat if by_samples else stop.budget_s * candidates
    unit = {"unit": "sample"} if by_samples else {"unit": "s", "bar_format": _SECONDS_FORMAT}
    return SamplingBar(progress_bar(total, enabled=enabled, desc=desc, **unit), by_samples)
