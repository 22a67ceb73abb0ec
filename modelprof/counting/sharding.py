"""Per-rank or global: which numbers a sharded model's table shows. The default, this rank's
view, counts the local shards (a DTensor's local part, FSDP2's shard) and DTensor ops on their
local shapes; the global view counts the model as one logical whole, as if unsharded.
Communication is what this rank runs in both."""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.group import fsdp_modules
from modelprof.runtime.tensors import is_dtensor_type

__all__ = ["ParamView", "ShardView", "current_view", "held", "shard_view"]


class ShardView(str, enum.Enum):
    RANK = "rank"
    GLOBAL = "global"

    @classmethod
    def parse(cls, value: Any) -> ShardView:
        try:
            return cls(value.value if isinstance(value, cls) else value)
        except ValueError:
            raise ModelProfError(
                f"view={value!r} must be one of {', '.join(repr(v.value) for v in cls)}"
            ) from None


_VIEW: contextvars.ContextVar[ShardView] = contextvars.ContextVar(
    "modelprof_view", default=ShardView.RANK
)


def current_view() -> ShardView:
    return _VIEW.get()


@contextlib.contextmanager
def shard_view(view: ShardView) -> Iterator[None]:
    """The view the counting passes of the block use."""
    token = _VIEW.set(view)
    try:
        yield
    finally:
        _VIEW.reset(token)


def held(t: torch.Tensor) -> torch.Tensor:
    """What the current view counts of ``t``: per rank a DTensor's local shard (what this rank
    holds), globally the whole tensor; any other tensor is itself."""
    return compat.local_tensor(t) if _VIEW.get() is ShardView.RANK else t


def _local_numel(p: torch.Tensor) -> int:
    return compat.local_tensor(p).numel()


class ParamView:
    """How the scope charges a parameter of a sharded model. FSDP2's unsharded parameter
    (swapped in around a module's forward) is charged as its sharded original (:meth:`canonical`),
    so a parameter is counted once and by its shard."""

    def __init__(self, model: nn.Module, view: ShardView) -> None:
        self.view = view
        # FSDP2's ``FSDPParam`` objects of every ``fully_shard``-ed module of ``model``
        groups = [compat.fsdp_param_group(m) for m in fsdp_modules(model)]
        self._fsdp = [fp for group in groups if group is not None for fp in group.fsdp_params]
        self._sharded = {id(fp.sharded_param) for fp in self._fsdp}
        self._canonical: dict[int, torch.Tensor] = {}
        self._refresh()

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        parameters: Iterable[torch.Tensor] | None = None,
        modules: Iterable[nn.Module] | None = None,
    ) -> ParamView | None:
        """A view for ``model``, or None for a model with no DTensor and no FSDP2.
        ``parameters``/``modules``: ``model.parameters()``/``model.modules()`` where the caller
        has them already."""
        parameters = model.parameters() if parameters is None else parameters
        modules = model.modules() if modules is None else modules
        if not any(map(is_dtensor_type, set(map(type, parameters)))) and not any(
            kind.__name__.startswith("FSDP") for kind in set(map(type, modules))
        ):
            return None
        return cls(model, current_view())

    def _refresh(self) -> None:
        for fp in self._fsdp:
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None:
                self._canonical[id(unsharded)] = fp.sharded_param

    def canonical(self, p: torch.Tensor) -> torch.Tensor:
        """The parameter ``p`` stands for: FSDP2's sharded original of an unsharded one."""
        if not self._fsdp or id(p) in self._sharded:
            return p
        found = self._canonical.get(id(p))
        if found is None:
            self._refresh()
            found = self._canonical.get(id(p), p)
        return found

    def count(self, p: torch.Tensor) -> int:
        """Elements of ``p`` in this view: the local shard per rank, the whole globally."""
        return _local_numel(p) if self.view is ShardView.RANK else p.numel()

    def read_bytes(self, p: torch.Tensor) -> int:
        """Bytes a call reads of ``p``: FSDP2 computes on the gathered parameter (its whole
        size); a tensor-parallel shard is read locally (its local part per rank)."""
        if id(p) in self._sharded or self.view is ShardView.GLOBAL:
            return p.numel() * p.element_size()
        return _local_numel(p) * p.element_size()
