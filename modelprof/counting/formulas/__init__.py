"""Cost formulas, one module per family; importing this package fills ``REGISTRY``."""

from __future__ import annotations

from modelprof.counting.formulas import (  # noqa: F401
    attention,
    backward,
    conv,
    loss,
    matmul,
    memory,
    norm,
    optim,
    pointwise,
    pool,
    quantized,
    rnn,
    spectral,
    torchstat,
)
from modelprof.counting.formulas.registry import REGISTRY, Cost, FormulaRegistry, register_formula

__all__ = ["Cost", "FormulaRegistry", "REGISTRY", "register_formula"]
