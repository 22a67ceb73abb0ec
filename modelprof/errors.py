"""The one exception type modelprof raises for anything the user can cause, its warnings, and
the argument checks written the same everywhere. It imports nothing of modelprof's, so any
module may import it without a cycle."""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = [
    "DriftWarning",
    "FewSamplesWarning",
    "GpuClockWarning",
    "LoadedMachineWarning",
    "ModelProfError",
    "ModelProfWarning",
    "NoisyMeasurementWarning",
    "SamplingPastBudgetWarning",
    "TimingDisagreementWarning",
    "a_type",
    "check_flag",
    "check_callback",
    "check_int",
    "error_line",
    "is_int",
    "keywords_named",
    "nearest_keywords",
    "warn_user",
    "with_article",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def nearest_keywords(unknown: Sequence[str], names: Sequence[str], mark: str = "=") -> str:
    """`` (devce=: did you mean device=?)`` for each of ``unknown`` near one of ``names``: how
    every refusal of a misspelt keyword names the one meant; ``mark=""`` for names that are
    no keywords (a column: `` (mac: did you mean macs?)``)."""
    near = [(k, difflib.get_close_matches(k, names, n=1, cutoff=0.75)) for k in unknown]
    return "".join(f" ({k}{mark}: did you mean {n[0]}{mark}?)" for k, n in near if n)


def keywords_named(fn: _F) -> _F:
    """``fn`` (of no ``**kwargs``) refusing a keyword it does not take as a ModelProfError
    that names the nearest it does (``fit(devce=...)``: did you mean device=?), as the entry
    points that take options do, where Python's TypeError names only the one refused. Every
    parameter ``fn`` takes by name is taken, ``self`` too (``Report.diff(self=a, other=b)``);
    one given both positionally and by name is refused naming it."""
    params = inspect.signature(fn).parameters.values()
    keywords = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    taken = [k for k in keywords if k != "self"]  # (what the message lists)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in keywords]
        if unknown:
            raise ModelProfError(
                f"{fn.__qualname__}() takes no keyword(s) {unknown}"
                f"{nearest_keywords(unknown, taken)}; it takes {taken}"
            )
        twice = [k for k in positional[: len(args)] if k in kwargs]
        if twice:
            raise ModelProfError(
                f"{fn.__qualname__}() got {twice[0]}= twice, positionally and as a keyword; "
                "give it once"
            )
        return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


def a_type(obj: Any) -> str:
    """``obj``'s type as an error names it, with its article: ``an int``, ``a list``, ``an
    OrderedDict`` (:func:`with_article`)."""
    return with_article(type(obj).__name__)


def with_article(name: str) -> str:
    """``name`` after ``a`` or, where it starts with a vowel sound, ``an``: by its first letter,
    a, e, i or o (a ``u`` mostly reads "you": ``a uint8``, ``a UserDict``)."""
    return f"{'an' if name[:1].lower() in 'aeio' else 'a'} {name}"


def error_line(error: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of the error at the root of ``error``'s causes, at most ``limit``
    characters: how a refusal by the user's code or a library is quoted in one of ours."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:limit]


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` at the first frame outside modelprof (and ``contextlib``): the user's
    line that called into modelprof, however deep inside it the warning is raised."""
    frame, level = sys._getframe(1), 2  # level 2: warn_user's caller
    while frame is not None and (
        frame.f_code.co_filename.startswith(_PACKAGE_DIR)
        or frame.f_code.co_filename == contextlib.__file__
        or _generated_in_package(frame)
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _generated_in_package(frame: Any) -> bool:
    """A frame of code modelprof generated (a dataclass's ``__init__``, which calls its
    ``__post_init__``): its file is ``<string>``, its globals a modelprof module's."""
    module = str(frame.f_globals.get("__name__", ""))
    generated = frame.f_code.co_filename.startswith("<")
    return generated and (module == "modelprof" or module.startswith("modelprof."))


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # modelprof/


def check_flag(name: str, value: Any) -> bool:
    """``value``, refused (named ``name``) unless it is True or False."""
    if not isinstance(value, bool):
        raise ModelProfError(f"{name}={value!r} must be True or False")
    return value


def is_int(value: Any) -> bool:
    """A Python or numpy integer (``np.int64(224)`` from an array), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int, refused (named ``name``) unless an integer of at least ``minimum``."""
    if not is_int(value) or value < minimum:
        raise ModelProfError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


def check_callback(name: str, value: Any) -> Any:
    """``value``, refused (named ``name``) unless callable or None: before any work is done,
    not when first called."""
    if value is not None and not callable(value):
        raise ModelProfError(f"{name}={value!r} must be a callable or None")
    return value


class ModelProfError(Exception):
    """A bad argument, input or model. The message names the offending value."""


class ModelProfWarning(UserWarning):
    """Something the numbers do not cover (ops with no formula), said once per profile."""


class NoisyMeasurementWarning(UserWarning):
    """Issued once per measurement whose spread makes its median less trustworthy."""


class DriftWarning(NoisyMeasurementWarning):
    """Issued once per measurement whose blocks drift beyond its confidence interval."""


class GpuClockWarning(DriftWarning):
    """Issued once per CUDA measurement whose GPU changed its SM clock by more than 5 % between
    blocks (``Measurement.clock_moved``)."""


class FewSamplesWarning(NoisyMeasurementWarning):
    """Issued once per measurement that a time budget stopped below its minimum sample count."""


class LoadedMachineWarning(NoisyMeasurementWarning):
    """Issued once per measurement whose wall time the machine's load stretched (well above the
    CPU time of the same work); it names the CPU-time figure to quote."""


class SamplingPastBudgetWarning(ModelProfWarning):
    """Said as a long sampling floor begins, where no progress bar shows it: the budget is spent
    below ``min_samples`` and the call goes on for seconds more (``floor_extend_s=``,
    ``layer_extend_s=`` cap it; ``progress=True`` with tqdm shows a bar instead). A rank that
    does not speak, as for every ``ModelProfWarning``, says nothing."""


class TimingDisagreementWarning(ModelProfWarning):
    """Issued where two timed figures that must agree do not, beyond their intervals (per-layer
    passes against clean runs or identical layers, a series point above one doing more work, a
    ratio of medians against its rounds); the figure is marked rough wherever exported."""
