"""What a sweep runs: configurations (model × batch size × dtype × mode) read from a JSON or
TOML file, a dict or a list of dicts, checked at the boundary and expanded into a fixed order.
A *grid* maps ``models``, ``batch_sizes``, ``dtypes`` and ``modes`` (or ``model``...) to a value
or a list and stands for every combination, models outermost; a sweep is one grid or a list
(``[[grid]]`` tables in TOML). Errors name the entry (``grid 2``) and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from modelprof.errors import ModelProfError, a_type, check_int
from modelprof.runtime.inputs import DTYPE_NAMES
from modelprof.runtime.names import factory_name
from modelprof.runtime.tensors import brief
from modelprof.step.spec import functional_losses

__all__ = ["MODES", "STEP_OPTIONS", "SweepConfig", "expand_grids", "load_sweep"]

#: mode -> the ``profile()`` keywords it sets. ``forward``: eval mode, no grad (profile's
#: default); ``backward``: a training step (train mode, loss = sum of outputs, backward).
MODES: dict[str, dict[str, Any]] = {"forward": {}, "backward": {"backward": True}}
#: ``profile()`` keywords of the training step, which it refuses with ``backward=False``: a
#: grid's ``options`` give them to its backward configurations only
STEP_OPTIONS = frozenset({"loss_fn", "target", "optimizer"})

_LIST_KEYS = {"models": "model", "batch_sizes": "batch_size", "dtypes": "dtype", "modes": "mode"}
_SCALAR_KEYS = ("timing", "device", "input_size", "tokens", "options")
_KNOWN = (*_LIST_KEYS, *_LIST_KEYS.values(), *_SCALAR_KEYS)
_DEFAULTS = {"batch_size": [1], "dtype": ["float32"], "mode": ["forward"]}


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """What one ``profile()`` call measures (``timing=False``: counted on ``meta``, but for
    ``amp``: :attr:`on_meta`). ``options``
    are further ``profile()`` keywords as sorted pairs, so the configuration hashes stably."""

    model: str
    batch_size: int = 1
    dtype: str = "float32"
    mode: str = "forward"
    timing: bool = False
    device: str = "cpu"
    input_size: tuple[Any, ...] | None = None
    options: tuple[tuple[str, Any], ...] = ()
    #: a language model's sequence length: ``token_inputs`` of ``tokens`` ids a sequence
    tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples as lists, options as a dict; no ``tokens`` where none
        were given, so a result file written before there were any still matches)."""
        d = dataclasses.asdict(self)
        d["input_size"] = _listify(self.input_size)
        d["options"] = dict(self.options)
        if self.tokens is None:
            del d["tokens"]
        return d

    @property
    def on_meta(self) -> bool:
        """Counted on ``meta``: counting only, without ``amp`` (autocast acts on real devices
        alone, by each device's own rules: a counted configuration under ``amp`` runs on its
        ``device``, as ``profile(amp=...)`` needs)."""
        return not self.timing and dict(self.options).get("amp") in (None, False)

    @property
    def key(self) -> str:
        """Canonical JSON: what a result file is matched against."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def name(self) -> str:
        """File-name-safe id: readable parts plus a hash of the whole configuration."""
        digest = hashlib.sha1(self.key.encode()).hexdigest()[:10]
        kind = "timed" if self.timing else "count"
        model = re.split(r"[/\\]", self.model)[-1][-60:]  # a file spec: its file name
        stem = f"{model}_b{self.batch_size}_{self.dtype}_{self.mode}_{kind}"
        return f"{re.sub(r'[^A-Za-z0-9.+-]+', '_', stem).strip('_')}_{digest}"

    @property
    def model_name(self) -> str:
        """The model as ``profile`` names it, without building it (``models.load_spec``'s
        name): a file's factory by file and factory (``nets.py:wide`` -> ``nets_wide``), a saved
        file by its stem, ``timm:NAME`` and ``torchvision:NAME`` by ``NAME``."""
        spec = self.model.strip()
        path, sep, factory = spec.rpartition(":")
        if sep and path.endswith(".py"):
            return factory_name(path, factory)
        if spec.endswith((".pt", ".pth", ".pt2")):
            return Path(spec).stem
        prefix, _, rest = spec.partition(":")
        return rest if prefix in ("timm", "torchvision") and rest else spec

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepConfig:
        """Inverse of :meth:`to_dict` (a result file's ``config``)."""
        options = dict(data.get("options") or {})
        return cls(
            **{f: data[f] for f in ("model", "batch_size", "dtype", "mode", "timing", "device")},
            input_size=_tupleify(data.get("input_size")),
            options=tuple(sorted((k, _tupleify(v)) for k, v in options.items())),
            tokens=data.get("tokens"),
        )


#: ``check(config)``: refuses (a ``ModelProfError``) what the measure would refuse of one
#: configuration, so that it is refused before anything runs; its message is prefixed with the
#: entry (``grid 2``)
Check = Callable[["SweepConfig"], None]


def load_sweep(
    source: Any, *, options: Collection[str] | None = None, check: Check | None = None
) -> list[SweepConfig]:
    """The configurations of ``source`` (a ``.json``/``.toml`` path, a dict or a list of dicts)
    in expansion order, duplicates dropped; ``options``: the keywords a grid may use (None: any);
    ``check``: run on each configuration (:data:`Check`)."""
    origin = str(source) if isinstance(source, (str, Path)) else "sweep"
    try:
        data = _read_file(Path(source)) if isinstance(source, (str, Path)) else source
        return expand_grids(data, origin=origin, options=options, check=check)
    except RecursionError:  # lists in lists a hundred thousand deep: no grid is like that
        raise ModelProfError(
            f"sweep config {origin!r} is nested too deeply to be a sweep "
            "(a grid's values are numbers, strings or lists of them)"
        ) from None


def _read_file(path: Path) -> Any:
    if not path.is_file():
        raise ModelProfError(f"sweep config {str(path)!r} does not exist (or is not a file)")
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            return json.loads(path.read_text())
        if suffix == ".toml":
            import tomllib

            return tomllib.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, TOMLDecodeError
        raise ModelProfError(
            f"sweep config {str(path)!r} is not valid {suffix[1:].upper()}: {e}"
        ) from e
    raise ModelProfError(f"sweep config {str(path)!r}: use a .json or .toml file")


def expand_grids(
    data: Any,
    *,
    origin: str = "sweep",
    options: Collection[str] | None = None,
    check: Check | None = None,
) -> list[SweepConfig]:
    """Every configuration of one grid or a list of grids (see the module docstring), each
    new one given to ``check``."""
    grids = _grids(data, origin)
    configs: dict[SweepConfig, None] = {}
    for i, grid in enumerate(grids, 1):
        where = f"{origin}: grid {i}" if len(grids) > 1 else origin
        for config in _expand(grid, where, options):
            if check is not None and config not in configs:
                try:
                    check(config)
                except ModelProfError as e:
                    raise ModelProfError(f"{where}: {e}") from e
            configs.setdefault(config, None)
    return list(configs)


def _grids(data: Any, origin: str) -> list[Mapping[str, Any]]:
    if isinstance(data, Mapping) and set(data) == {"grid"}:
        data = data["grid"]  # TOML [[grid]] tables
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
        raise ModelProfError(
            f"{origin}: a sweep is a dict (one grid) or a list of dicts, not {type(data).__name__}"
        )
    if not data:
        raise ModelProfError(f"{origin}: the sweep has no grid; give at least 'models'")
    for i, grid in enumerate(data, 1):
        if not isinstance(grid, Mapping):
            raise ModelProfError(
                f"{origin}: grid {i} is {a_type(grid)}, not a dict "
                "such as {'models': ['resnet18'], 'batch_sizes': [1, 8]}"
            )
    return list(data)


def _expand(
    grid: Mapping[str, Any], where: str, known: Collection[str] | None
) -> list[SweepConfig]:
    """The configurations of one grid, models outermost, modes innermost."""
    for key in grid:
        if key not in _KNOWN:
            close = difflib.get_close_matches(str(key), _KNOWN, n=1)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(_KNOWN)}"
            )
            raise ModelProfError(f"{where}: unknown key {key!r}{hint}")
    axes = {one: _axis(grid, many, one, where) for many, one in _LIST_KEYS.items()}
    timing = grid.get("timing", False)
    if not isinstance(timing, bool):
        raise ModelProfError(f"{where}: timing={timing!r} must be true or false")
    device = _device(grid.get("device", "cpu"), timing, where)
    size = _input_size(grid.get("input_size"), where)
    tokens = grid.get("tokens")
    if tokens is not None:
        check_int(f"{where}: tokens", tokens, 1)
        if size is not None:
            raise ModelProfError(
                f"{where}: give input_size (a model's input shape) or tokens (a language "
                "model's sequence length), not both"
            )
    options = _options(grid.get("options", {}), where, known)
    step = [k for k, _ in options if k in STEP_OPTIONS]
    if step and not any(MODES[m].get("backward") for m in axes["mode"]):
        raise ModelProfError(
            f"{where}: options.{step[0]} sets the training step, which only the 'backward' "
            f"mode runs; modes are {axes['mode']}: add 'backward' or drop options.{step[0]}"
        )
    forward = tuple((k, v) for k, v in options if k not in STEP_OPTIONS)
    taken = {mode: options if MODES[mode].get("backward") else forward for mode in MODES}
    return [  # the axes in _LIST_KEYS's order: models outermost
        SweepConfig(m, b, d, mode, timing, device, size, taken[mode], tokens)
        for m, b, d, mode in itertools.product(*axes.values())
    ]


def _axis(grid: Mapping[str, Any], many: str, one: str, where: str) -> list[Any]:
    if many in grid and one in grid:
        raise ModelProfError(f"{where}: give {many!r} or {one!r}, not both")
    key = many if many in grid else one
    if key not in grid:
        if one == "model":
            raise ModelProfError(
                f"{where}: no 'models'; name at least one, e.g. models = ['resnet18']"
            )
        return list(_DEFAULTS[one])
    raw = grid[key]
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not values:
        raise ModelProfError(f"{where}: {key} is empty")
    check = {"model": _model, "batch_size": _batch, "dtype": _dtype, "mode": _mode}[one]
    return [check(v, f"{where}: {key}") for v in values]


def _model(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ModelProfError(
            f"{where}: model {brief(value)} must be a name such as 'resnet18', "
            "'timm:NAME' or 'file.py:factory'"
        )
    name = value.strip()
    if ":" not in name and not name.endswith((".py", ".pt", ".pth", ".pt2")):
        _check_torchvision_name(name, where)
    _check_model_file(name, where)
    return name


def _check_model_file(spec: str, where: str) -> None:
    """A model file (``file.py:factory``, a ``.pt``/``.pth``/``.pt2``) that is not there:
    refused before hours of sweeping, as ``compare`` refuses it, not a failed row per
    configuration. A path the system cannot check is left to ``load_model``, which says why."""
    path_part, sep, _ = spec.rpartition(":")
    if sep and path_part.endswith(".py"):
        path = Path(path_part)
    elif spec.endswith((".pt", ".pth", ".pt2")):
        path = Path(spec)
    else:
        return
    try:
        there, a_file = path.exists(), path.is_file()
    except (OSError, ValueError):
        return
    if not a_file:
        said = "is not a file" if there else "does not exist"
        raise ModelProfError(f"{where}: model file {str(path)!r} {said}")


def _check_torchvision_name(name: str, where: str) -> None:
    """A plain name is a torchvision model: refuse a typo before hours of sweeping."""
    try:
        from torchvision import models as tvm
    except ImportError:
        return  # load_model says so, per configuration
    available = tvm.list_models()
    if name not in available:
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelProfError(f"{where}: unknown model {name!r}{hint}")


def _batch(value: Any, where: str) -> int:
    """One batch size of a grid; ``where`` ends in the list's key (``batch_sizes``)."""
    return check_int(f"{where.rpartition(': ')[0]}: batch_size", value)


def _dtype(value: Any, where: str) -> str:
    key = value.lower().removeprefix("torch.") if isinstance(value, str) else None
    if key not in DTYPE_NAMES:
        raise ModelProfError(
            f"{where}: dtype {brief(value)} is not one of {', '.join(sorted(DTYPE_NAMES))}"
        )
    return str(DTYPE_NAMES[key]).removeprefix("torch.")


def _mode(value: Any, where: str) -> str:
    if value not in MODES:
        raise ModelProfError(f"{where}: mode {brief(value)} is not one of {', '.join(MODES)}")
    return str(value)


def _device(value: Any, timing: bool, where: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"(cpu|cuda|meta)(:\d+)?", value):
        raise ModelProfError(
            f"{where}: device {brief(value)} must be 'cpu', 'cuda', 'cuda:N' "
            "(or 'meta' for counting only)"
        )
    if timing and value.startswith("meta"):
        raise ModelProfError(f"{where}: timing=true needs a real device, not {brief(value)}")
    return value


def _input_size(value: Any, where: str) -> tuple[Any, ...] | None:
    if value is None:
        return None

    def shape(s: Any) -> bool:
        return (
            isinstance(s, (list, tuple))
            and bool(s)
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in s)
        )

    ok = shape(value) or (
        isinstance(value, (list, tuple)) and bool(value) and all(shape(s) for s in value)
    )
    if not ok:
        raise ModelProfError(
            f"{where}: input_size {brief(value)} must be a shape without the batch "
            "such as [3, 224, 224], or a list of such shapes"
        )
    return _tupleify(value)


#: profile() keywords a sweep sets itself, so a grid's ``options`` may not.
_RESERVED = (
    "model input_size inputs tokens batch_size device dtype timing backward progress".split()
)


def _options(value: Any, where: str, known: Collection[str] | None) -> tuple[tuple[str, Any], ...]:
    if not isinstance(value, Mapping):
        raise ModelProfError(
            f"{where}: options {brief(value)} must be a table/dict of profile() "
            "keywords such as {budget_s = 1}"
        )
    value = {k: _loss_name(v, where) if k == "loss_fn" else v for k, v in value.items()}
    for name, v in value.items():
        if known is not None and name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ModelProfError(f"{where}: options.{name} is not a profile() option{hint}")
        if name in _RESERVED:
            raise ModelProfError(
                f"{where}: options.{name} is set by the sweep itself; use the "
                "grid keys (models, batch_sizes, dtypes, modes, timing, device, input_size, "
                "tokens)"
            )
        if not _plain(v):
            raise ModelProfError(
                f"{where}: options.{name}={brief(v)} is not a plain value "
                "(a number, string, bool, or a list of them)"
            )
    return tuple(sorted((str(k), _tupleify(v)) for k, v in value.items()))


def _loss_name(value: Any, where: str) -> Any:
    """A ``torch.nn.functional`` loss given as the function (in Python): its name, which a result
    file can hold; any other value as it is (a name is checked by the measure's check)."""
    if not callable(value):
        return value
    for name, fn in functional_losses().items():
        if value is fn:
            return name
    raise ModelProfError(
        f"{where}: options.loss_fn={brief(value)} cannot be swept: a sweep's configurations are "
        "plain values, written into its result files and matched against them on a rerun (what "
        "resumes it), and a function cannot be written there. Name a torch.nn.functional loss "
        "of the output and a target (loss_fn='cross_entropy', or the function itself: "
        f"torch.nn.functional.cross_entropy), one of {sorted(functional_losses())}; for another "
        "loss, call modelprof.profile(model, backward=True, loss_fn=...)"
    )


def _plain(value: Any) -> bool:
    """A number, string, bool or None, or a list of such (a nested table would not hash)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _tupleify(value: Any) -> Any:
    return tuple(_tupleify(v) for v in value) if isinstance(value, (list, tuple)) else value


def _listify(value: Any) -> Any:
    return [_listify(v) for v in value] if isinstance(value, (list, tuple)) else value
