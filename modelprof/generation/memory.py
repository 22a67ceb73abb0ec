"""Memory to fit a generation: weights + KV cache at (batch, context) + the activations of a
step, per phase; and the largest batch (or context) that fits a memory size.

The activation term is an estimate from the counted table: the largest inputs + outputs of one
leaf call of the phase (what must be live together at its peak, beyond weights and cache). On
CUDA the allocator's measured peak of a generation sits beside it (``GenerationTiming``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime.tensors import tensor_nbytes

__all__ = ["MemoryPlan", "activation_bytes", "weights_bytes"]


def weights_bytes(model: nn.Module | None, dtype: torch.dtype) -> int:
    """Parameters and buffers (each tensor once), floating ones at ``dtype``, quantized ones
    as stored."""
    if model is None:
        return 0
    seen: set[int] = set()
    total = 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.is_floating_point() and type(t) in (torch.Tensor, nn.Parameter):
            total += t.numel() * torch.empty((), dtype=dtype).element_size()
        else:   # integers as they are; a quantized weight (a tensor subclass) as it is stored
            total += tensor_nbytes(t)
    return total


def activation_bytes(records: list[Any]) -> int:
    """The largest inputs + outputs of one leaf call (parameters not included)."""
    return max((r.input_bytes + r.output_bytes for r in records if not r.children), default=0)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes to hold a generation of ``batch_size`` sequences of ``context`` tokens."""

    weights_bytes: int
    kv_per_token_bytes: float       # one sequence
    activation_per_seq_bytes: dict[str, float]   # by phase, for one sequence
    batch_size: int
    context: int

    def kv_bytes(self, batch: int | None = None, context: int | None = None) -> float:
        return self.kv_per_token_bytes * (batch or self.batch_size) * (context or self.context)

    def total_bytes(self, phase: str, batch: int | None = None,
                    context: int | None = None) -> float:
        b = batch or self.batch_size
        return self.weights_bytes + self.kv_bytes(b, context) + \
            b * self.activation_per_seq_bytes[phase]

    def table(self) -> Any:
        import pandas as pd
        return pd.DataFrame([{"phase": p, "weights_bytes": self.weights_bytes,
                              "kv_cache_bytes": self.kv_bytes(),
                              "activation_bytes": self.batch_size * a,
                              "total_bytes": self.total_bytes(p)}
                             for p, a in self.activation_per_seq_bytes.items()])

    def _per_seq(self) -> float:
        return max(self.activation_per_seq_bytes.values(), default=0.0)

    def max_batch(self, memory_bytes: float, context: int | None = None) -> int:
        """The largest batch whose weights + KV at ``context`` + activations fit."""
        _check_memory(memory_bytes)
        ctx = context or self.context
        free = memory_bytes - self.weights_bytes
        per = self.kv_per_token_bytes * ctx + self._per_seq()
        return max(int(free // per), 0) if per > 0 else 0

    def max_context(self, memory_bytes: float, batch: int | None = None) -> int:
        """The longest context at which ``batch`` sequences fit."""
        _check_memory(memory_bytes)
        b = batch or self.batch_size
        free = memory_bytes - self.weights_bytes - b * self._per_seq()
        per = self.kv_per_token_bytes * b
        return max(int(free // per), 0) if per > 0 else 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_memory(memory_bytes: Any) -> None:
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, (int, float)) or \
            memory_bytes <= 0:
        raise ModelProfError(f"memory_bytes={memory_bytes!r} must be a positive number of bytes")
