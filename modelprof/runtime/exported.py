"""Exported programs (``torch.export``) with their layers back.

``ExportedProgram.module()`` runs one flat graph (one hooked call); ``torch.export.unflatten``
builds a module per layer from the nodes' module paths, which modelprof profiles, each typed by
the eager module's class (``Conv2d``, not ``InterpreterModule``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError, ModelProfWarning, warn_user
from modelprof.runtime import compat
from modelprof.runtime.tensors import shape_str

__all__ = [
    "arranged",
    "check_recorded",
    "exported_layers",
    "input_names",
    "is_flat_export",
    "runnable",
]


def runnable(model: Any) -> Any:
    """What running ``model`` means: an ``ExportedProgram``'s ``module()`` (the flat graph; a
    program cannot be called), anything else as it is."""
    if isinstance(model, torch.export.ExportedProgram):
        return model.module()
    return model


def input_names(program: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The names of a program's positional inputs, in order, and of its keyword inputs (the
    forward's names, as its placeholders keep them); None where an input is a nested structure
    (a list, a dict of tensors), is not a tensor (an int, None: the program holds its value) or
    the program's call spec cannot be read."""
    layout = compat.call_layout(program)
    if layout is None:
        return None
    positional, keywords = layout
    names = list(program.graph_signature.user_inputs)
    leaves = [*positional, *(n for _, n in keywords)]
    if any(n != 1 for n in leaves) or len(names) != len(leaves):
        return None
    # a non-tensor input is its value (3, None, a str) in user_inputs, no placeholder's name
    tensors = {
        n.name
        for n in program.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    if not all(isinstance(n, str) and n in tensors for n in names):
        return None
    return tuple(names[: len(positional)]), tuple(k for k, _ in keywords)


def arranged(
    names: tuple[tuple[str, ...], tuple[str, ...]], given: dict[str, Any], source: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inputs ``given`` by name as a program with these :func:`input_names` takes them:
    ``(args, kwargs)``, its positional inputs in order and its keyword inputs by name (it takes
    no other layout). A name it does not take, or one it takes left out, is refused, naming
    ``source`` (where the names came from)."""
    positional, keywords = names
    unknown = [n for n in given if n not in positional and n not in keywords]
    missing = [n for n in (*positional, *keywords) if n not in given]
    if unknown or missing:
        takes = " and ".join(
            f"{', '.join(n)} {how}"
            for n, how in ((positional, "positionally"), (keywords, "by keyword"))
            if n
        )
        wrong = [f"no input {', '.join(unknown)}"] if unknown else []
        wrong += [f"{', '.join(missing)} missing"] if missing else []
        raise ModelProfError(
            f"{source}: the exported program takes {takes or 'no inputs'} (the inputs it was "
            f"exported with); {'; '.join(wrong)}"
        )
    return tuple(given[n] for n in positional), {n: given[n] for n in keywords}


def check_recorded(program: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """Refuse inputs an ``ExportedProgram`` was not recorded for, before it runs: a tensor
    whose rank, a static dimension or a dynamic one outside its range differs from what the
    program recorded (its guards would refuse it mid-run, naming their own module, after a
    default batch of 1 ran unsaid). Anything else (not a program, inputs laid out otherwise,
    which :func:`arranged` or the call refuses) passes."""
    names = input_names(program) if isinstance(program, torch.export.ExportedProgram) else None
    if names is None or len(args) != len(names[0]) or set(kwargs) != set(names[1]):
        return
    given = [*args, *(kwargs[k] for k in names[1])]
    vals = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    recorded = [vals[n] for n in program.graph_signature.user_inputs]
    pairs = [(g, r) for g, r in zip(given, recorded) if isinstance(g, torch.Tensor)]
    if all(_fits(program, g, r) for g, r in pairs):
        return
    raise ModelProfError(
        "the exported program takes inputs of shape "
        f"{', '.join(_dims(program, r) for _, r in pairs)} (as recorded); given "
        f"{shape_str([g for g, _ in pairs])}. "
        "Pass inputs of the recorded shape (a .pt2 without --input-size runs on the inputs it "
        "recorded), or export with a dynamic dimension (torch.export.Dim)"
    )


def _fits(program: Any, given: torch.Tensor, recorded: torch.Tensor) -> bool:
    """Whether ``given`` has ``recorded``'s rank, its static sizes and a dynamic dimension's
    size up to its bound (:func:`_sizes`; not its least: torch's ranges start at 2 where the
    program runs 0 and 1 too, ``Dim.AUTO`` at batch 1)."""
    return given.dim() == recorded.dim() and all(
        g == lo if isinstance(d, int) else hi is None or g <= hi
        for g, d, (lo, hi) in zip(given.shape, recorded.shape, _sizes(program, recorded))
    )


def _sizes(program: Any, recorded: torch.Tensor) -> list[tuple[int, int | None]]:
    """Each dimension's sizes ``(low, high)`` a program takes: one for a static dimension, its
    range for a dynamic one (``(0, None)`` where the program keys none)."""
    return [
        (d, d) if isinstance(d, int) else compat.dim_range(program, d) or (0, None)
        for d in recorded.shape
    ]


def _dims(program: Any, recorded: torch.Tensor) -> str:
    """``4x64``; a dynamic dimension as its range, ``[2..16]x64`` (``[2..]`` unbounded)."""
    text = "x".join(
        str(lo) if lo == hi else f"[{lo}..{'' if hi is None else hi}]"
        for lo, hi in _sizes(program, recorded)
    )
    return text or "()"  # a 0-d tensor, as shape_str writes it


def is_flat_export(model: Any) -> bool:
    """Whether ``model`` is a flat ``GraphModule`` whose nodes name modules it does not call."""
    if not isinstance(model, torch.fx.GraphModule):
        return False
    paths = set(_module_types(model.graph)) - {""}
    called = {n.target for n in model.graph.nodes if n.op == "call_module"}
    return bool(paths) and paths.isdisjoint(called)


def exported_layers(model: Any, inputs: tuple[tuple, dict] | None = None) -> Any:
    """``model`` with its layers: an ``ExportedProgram`` unflattened; with ``inputs``
    (``(args, kwargs)``), a flat graph exported again on them and unflattened (one flat row,
    with a warning, where that fails). Anything else comes back as it is."""
    if isinstance(model, torch.export.ExportedProgram):
        return _unflattened(model)
    if inputs is None or not is_flat_export(model):
        return model
    try:
        program = torch.export.export(model, tuple(inputs[0]), dict(inputs[1]))
        return _unflattened(program)
    except Exception as e:  # noqa: BLE001 - profiled as it is, one row, and said so
        warn_user(
            f"modelprof: the exported graph {type(model).__name__} could not be "
            f"exported again to recover its layers ({type(e).__name__}: {e}); it is "
            "profiled as one flat graph. Pass the ExportedProgram itself to keep "
            "them",
            ModelProfWarning,
        )
        return model


def _unflattened(program: Any) -> nn.Module:
    """``torch.export.unflatten(program)``, each module typed by its exported class."""
    module = torch.export.unflatten(program)
    types = _module_types(program.graph)
    for path, sub in module.named_modules():
        name = types.get(path)
        if name is not None and name != type(sub).__name__:
            sub.__class__ = _typed(type(sub), name)
    return module


def _module_types(graph: torch.fx.Graph) -> dict[str, str]:
    """Module path -> its class name when exported, from the nodes' ``nn_module_stack``."""
    found: dict[str, str] = {}
    for node in graph.nodes:
        for path, kind in (node.meta.get("nn_module_stack") or {}).values():
            found.setdefault(path, compat.module_stack_type_name(kind))
    return found


@functools.cache
def _typed(base: type, name: str) -> type:
    """A subclass of ``base`` named ``name`` (one per pair)."""
    return type(name, (base,), {"__module__": base.__module__})
