"""Cost formulas, one module per family; importing this package fills ``REGISTRY``."""
from __future__ import annotations

from . import (  # noqa: F401
    attention, conv, matmul, memory, norm, pointwise, pool, quantized, rnn, torchstat,
)
from . import backward, loss, optim  # noqa: F401
from .registry import REGISTRY, Cost, FormulaRegistry, register_formula

__all__ = ["Cost", "FormulaRegistry", "REGISTRY", "register_formula"]
