"""One registry of table formats: each is one function in its own file under
``modelprof/render/``, registered with :func:`register_format` (a human table: its layout,
with :func:`register_table`), so adding a format is adding that file. A result with
``export(name, path, **options)`` inherits :class:`Exports` for a ``to_<name>`` per format.

A format function takes ``(df, totals=None, *, end_to_end=None, env=None, path=None, view=None,
**options)``: the numeric frame, the total and end-to-end rows, the environment, where to write
(None: return the text) and the view options; it ignores what it does not show.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelprof.errors import ModelProfError
from modelprof.render._output import emit
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.views import Table, prepare_table

__all__ = [
    "Exports",
    "Format",
    "export",
    "get_format",
    "is_figure_format",
    "needs_package",
    "register_format",
    "register_table",
    "table_formats",
]


@dataclasses.dataclass(frozen=True)
class Format:
    """A registered format: ``human`` units (the compact columns by default) or raw numbers
    (every column, read back exactly); ``needs``: its optional package; ``doc``: the
    docstring of a result's ``to_<name>``."""

    name: str
    suffix: str
    write: Callable[..., str | Path]
    human: bool
    needs: str | None = None
    aliases: tuple[str, ...] = ()
    doc: str | None = None

    def names(self) -> tuple[str, ...]:
        return (self.name, self.suffix, *self.aliases)


_FORMATS: dict[str, Format] = {}
_loaded: list[bool] = []


def needs_package(what: str, package: str) -> ModelProfError:
    """The error for ``what`` (``"plotting"``) without its optional ``package``: how to get it."""
    return ModelProfError(
        f"{what} needs {package}: pip install {package} (in a clone of modelprof: "
        "pip install -e '.[all]')"
    )


def register_format(
    name: str,
    *,
    suffix: str,
    human: bool,
    needs: str | None = None,
    aliases: tuple[str, ...] = (),
    doc: str | None = None,
) -> Callable[[Callable], Callable]:
    """Register the decorated function as format ``name``; a taken name or suffix is refused."""

    def decorate(write: Callable) -> Callable:
        fmt = Format(name, suffix, write, human, needs, tuple(aliases), doc)
        taken = {n for f in _FORMATS.values() for n in f.names()}
        clash = [n for n in fmt.names() if n in taken]
        if clash:
            raise ModelProfError(f"format {name!r}: {clash[0]!r} names a registered format")
        _FORMATS[name] = fmt
        return write

    return decorate


def register_table(
    name: str,
    layout: Callable[[Table, ViewOptions, bool], str],
    *,
    summary: str,
    default_units: str = "human",
    check: Callable[[Any, ViewOptions], None] = lambda df, view: None,
    **registration: Any,
) -> Callable[..., str | Path]:
    """Register format ``name`` as a human table and return its writer (``summary``: its
    docstring): the frame, once ``check(df, view)`` passes it (the options only this format
    reads), prepared by :func:`~modelprof.render.views.prepare_table` in ``default_units``
    where none is asked, laid out by ``layout(table, view, to_file)``."""

    def write(
        df: Any,
        totals: Any = None,
        *,
        end_to_end: Any = None,
        env: Any = None,
        path: str | Path | None = None,
        view: ViewOptions | None = None,
        **options: Any,
    ) -> str | Path:
        check_read_by(name, options)  # the keywords it does not read, refused
        view = ViewOptions.parse(view, **options)
        check(df, view)
        table = prepare_table(
            df, totals, end_to_end=end_to_end, view=view, default_units=default_units
        )
        return emit(layout(table, view, path is not None), path)

    write.__name__ = write.__qualname__ = f"to_{name}"
    write.__module__ = layout.__module__  # where the format is written, for help() and pickle
    write.__doc__ = summary
    return register_format(name, human=True, **registration)(write)


def _load() -> None:
    """Import every module of ``modelprof.render`` once: each registers its format."""
    if _loaded:
        return
    _loaded.append(True)
    package = importlib.import_module("modelprof.render")
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"modelprof.render.{info.name}")


def table_formats() -> list[Format]:
    """Every registered format, in registration order."""
    _load()
    return list(_FORMATS.values())


def get_format(name: str) -> Format:
    """The format called ``name`` (its name, file suffix or an alias, any case)."""
    key = str(name).strip().lower().lstrip(".")
    for fmt in table_formats():
        if key in fmt.names():
            return fmt
    known = ", ".join(f.name for f in table_formats())
    if is_figure_format(key):
        raise ModelProfError(
            f"format {name!r} is a figure, not a table ({known}): a profile report writes the "
            "figures --format png does with report.export('png', 'out/model.png'); the other "
            "results' are drawn with save='out/name.png' by a generation report's "
            "plot_decode_growth and plot_phase_share, and by modelprof.report.plots' "
            "plot_compare(comparison, save=...) and plot_throughput(curve.to_dataframe(), "
            "save=...)"
        )
    raise ModelProfError(f"format {name!r} is not one of {known}")


def is_figure_format(name: Any) -> bool:
    """``name`` is ``png`` (any case, a leading dot): the figures, not a table format."""
    return str(name).strip().lower().lstrip(".") == "png"


def export(
    name: str,
    df: Any,
    totals: Any = None,
    *,
    end_to_end: Any = None,
    env: Any = None,
    path: str | Path | None = None,
    view: Any = None,
    **options: Any,
) -> str | Path:
    """Write ``df`` as format ``name`` (see the module doc for the arguments); every writer
    is handed all four, so one registered with its own defaults for them sees None."""
    fmt = get_format(name)  # (each writer refuses a keyword only other formats read)
    return fmt.write(df, totals, end_to_end=end_to_end, env=env, path=path, view=view, **options)


class Exports:
    """``to_<name>(path=None, **options)``, i.e. ``self.export(name, path, **options)``, for
    every format: a method per format registered when the subclass is defined (unless it
    defines its own), a later one reached by name."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for fmt in table_formats():
            if not hasattr(cls, f"to_{fmt.name}"):
                setattr(cls, f"to_{fmt.name}", _to_format(fmt))

    def __getattr__(self, attr: str) -> Any:
        if not attr.startswith("to_"):
            raise AttributeError(attr)
        try:
            fmt = get_format(attr.removeprefix("to_"))
        except ModelProfError:
            known = ", ".join(f"to_{f.name}" for f in table_formats())
            raise AttributeError(
                f"{type(self).__name__} has no {attr}: no format {attr.removeprefix('to_')!r} is "
                f"registered (modelprof.render.formats.register_format); the formats: {known}"
            ) from None
        return _to_format(fmt).__get__(self)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(f"to_{f.name}" for f in table_formats())})


def _to_format(fmt: Format) -> Callable[..., Any]:
    def to_format(self: Any, path: str | Path | None = None, **options: Any) -> Any:
        return self.export(fmt.name, path, **options)

    to_format.__name__ = to_format.__qualname__ = f"to_{fmt.name}"
    to_format.__doc__ = fmt.doc or fmt.write.__doc__
    return to_format
