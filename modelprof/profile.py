"""``profile``: static cost and measured time of a model, joined in one ``Report``."""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from .errors import ModelProfError
from .formulas.registry import FormulaRegistry
from .inputs import make_inputs, parse_dtype
from .report import Report
from .static import analyze
from .table import build_rows

__all__ = ["ModelProfWarning", "profile"]


class ModelProfWarning(UserWarning):
    """Something the numbers do not cover (ops with no formula), said once per profile."""


def profile(model: nn.Module, input_size: Any = None, *, inputs: Any = None,
            batch_size: int | None = None, device: torch.device | str | None = None,
            dtype: torch.dtype | str | None = None, timing: bool = True,
            training: bool = False, no_grad: bool = True,
            registry: FormulaRegistry | None = None, **timing_options: Any) -> Report:
    """Profile ``model`` on one input: one row per module call with shapes, params, MACs,
    FLOPs, MAdd and memory traffic, plus measured latency when ``timing`` is on.

    ``input_size`` excludes the batch (``(3, 224, 224)``); ``inputs=`` takes a tensor, a tuple
    of positional arguments or a dict of keyword arguments instead. ``device``/``dtype``
    default to the model's (``device="meta"`` analyses shapes alone, no memory or compute).
    The model runs in eval mode under ``torch.no_grad()`` unless ``training``/``no_grad`` say
    otherwise, and comes back exactly as it went in.
    """
    if not isinstance(model, nn.Module):
        raise ModelProfError(f"model={type(model).__name__} is not a torch.nn.Module; "
                             "use measure_latency() to time any callable")
    dtype_requested = parse_dtype(dtype)
    mi = make_inputs(model, input_size, inputs=inputs, batch_size=batch_size, device=device,
                     dtype=dtype_requested)
    static = analyze(model, mi, training=training, no_grad=no_grad,
                     dtype_requested=dtype_requested, registry=registry)
    if static.unsupported:
        ops = ", ".join(f"{k} ({v} call{'s' if v > 1 else ''})"
                        for k, v in sorted(static.unsupported.items()))
        warnings.warn(f"modelprof: {len(static.unsupported)} op type(s) have no formula and "
                      f"were counted as 0 FLOPs: {ops}. See Report.unsupported; add one with "
                      "modelprof.register_formula.", ModelProfWarning, stacklevel=2)
    rows = build_rows(static.records)
    return Report(rows, model_name=type(model).__name__, input_shape=mi.shapes(),
                  batch_size=mi.batch_size, device=str(mi.device),
                  dtype=str(mi.dtype).removeprefix("torch."), unsupported=static.unsupported,
                  by_op=static.by_op, model_params=static.model_params,
                  options={"training": training, "no_grad": no_grad})
