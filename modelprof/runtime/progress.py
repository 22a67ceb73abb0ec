"""Progress bars for long work (timing passes, comparisons, throughput searches, checks).

One helper, :func:`progress_bar`, returns a tqdm bar with a total (so it shows an ETA) when
progress is wanted and tqdm is installed, and a do-nothing bar otherwise; :func:`sampling_bar`
wraps one for a timing pass (its total: the sample target or the time budget). tqdm is imported only
when a bar is wanted, so a library call with progress off never touches it (no "IProgress not
found" in a notebook). In a Jupyter kernel with ipywidgets the notebook widget is used; everywhere
else the plain text bar on stderr (``tqdm.tqdm``, never ``tqdm.auto``, which warns without
ipywidgets).
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


def progress_bar(
    total: float | None,
    *,
    enabled: bool,
    desc: str | None = None,
    unit: str = "it",
    leave: bool = False,
    bar_format: str | None = None,
) -> Any:
    """A progress bar over ``total`` steps (``None`` when unknown: no ETA), or a no-op.

    ``enabled=False`` returns :class:`NoProgress` without importing tqdm; so does a missing tqdm,
    and so does a rank that does not speak under torchrun (one voice:
    ``modelprof.runtime.group.is_speaker``).
    The bar writes to stderr and is removed when closed unless ``leave=True``. Use it as a context
    manager or call ``close()``. ``bar_format``: tqdm's, for totals that are not counts.
    """
    if not enabled or not is_speaker():
        return NoProgress()
    cls = _tqdm_class()
    if cls is None:
        return NoProgress()
    extra: dict[str, Any] = {} if bar_format is None else {"bar_format": bar_format}
    if cls.__module__ == "tqdm.notebook":
        return cls(total=total, desc=desc, unit=unit, leave=leave, **extra)
    return cls(
        total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr, dynamic_ncols=True, **extra
    )


# seconds are floats: tqdm's default "n/total" would print 1.2345678/5.0
_SECONDS_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]"


class SamplingBar:
    """The bar of one sampling loop, called after each block with (samples so far, seconds of
    sampling so far): it counts samples against a fixed sample target, else seconds against the
    time budget (the adaptive stop may end sooner, so its ETA is the most sampling can take)."""

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
    """A :class:`SamplingBar` for a sampling loop under the stop rule ``stop`` (a
    ``modelprof.timing.sampler.StopRule``): over ``stop.repeat`` samples (per candidate), or
    without it (the adaptive stop) over the time budget, ``stop.budget_s`` per candidate of an
    interleaved loop; a no-op when not ``enabled`` or without tqdm."""
    if stop.repeat is not None:
        return SamplingBar(
            progress_bar(stop.repeat, enabled=enabled, desc=desc, unit="sample"), True
        )
    return SamplingBar(
        progress_bar(
            stop.budget_s * candidates,
            enabled=enabled,
            desc=desc,
            unit="s",
            bar_format=_SECONDS_FORMAT,
        ),
        False,
    )
