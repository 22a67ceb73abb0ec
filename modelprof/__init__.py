"""modelprof: per-layer cost (params, MACs, FLOPs, memory traffic) and measured latency of
PyTorch models, in one table."""
from __future__ import annotations

from .errors import ModelProfError
from .formulas import Cost, register_formula
from .profile import ModelProfWarning, profile
from .report import Report

__version__ = "0.1.0"

__all__ = ["Cost", "ModelProfError", "ModelProfWarning", "Report", "__version__", "profile",
           "register_formula"]
