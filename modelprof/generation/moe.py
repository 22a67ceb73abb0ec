"""Mixture of experts: parameters active per token against the total, and the tokens each
expert received in a forward over the prompt. An *experts* module holds ``num_experts`` experts
(as parameters of first dimension ``num_experts``, or a ``ModuleList``); its *router*, a sibling
with ``top_k``, returns the chosen expert indices last. Per token a layer runs ``top_k`` of its
experts: ``active = total - sum over layers of (1 - top_k / num_experts) x expert parameters``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from modelprof.runtime.hooks import module_hooks

__all__ = ["MoEInfo", "MoELayer", "find_moe_layers", "moe_info"]


@dataclasses.dataclass
class MoELayer:
    name: str  # the experts module
    num_experts: int
    top_k: int
    expert_params: int  # parameters of all experts of the layer
    router: nn.Module | None = dataclasses.field(default=None, repr=False)
    tokens_per_expert: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field but the router module, as plain values."""
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "router"
        }
        if self.tokens_per_expert is not None:
            out["tokens_per_expert"] = self.tokens_per_expert.tolist()
        return out


@dataclasses.dataclass
class MoEInfo:
    total_params: int
    active_params: int  # per token
    layers: list[MoELayer]

    def tokens_per_expert(self) -> Any:
        """Tokens routed to each expert (columns) of each layer (rows), once per choice."""
        rows = {
            layer.name: layer.tokens_per_expert
            for layer in self.layers
            if layer.tokens_per_expert is not None
        }
        return pd.DataFrame.from_dict(rows, orient="index").rename_axis("layer")

    def to_dict(self) -> dict[str, Any]:
        out = {"total_params": self.total_params, "active_params": self.active_params}
        return out | {"layers": [lay.to_dict() for lay in self.layers]}


def _experts_params(module: nn.Module, n: int) -> int | None:
    experts, params = list(module.children()), list(module.parameters())
    # a ModuleList of experts, or a module of n experts of one class (Switch Transformers')
    listed = len(experts) == n and len({type(e) for e in experts}) == 1
    if listed or (params and all(p.dim() >= 2 and p.shape[0] == n for p in params)):
        return sum(p.numel() for p in params)
    return None


def find_moe_layers(model: nn.Module) -> list[MoELayer]:
    """The experts modules of ``model`` with their router (a sibling with ``top_k``)."""
    found = []
    for name, module in model.named_modules():
        if not name.endswith("experts") or name.endswith("shared_experts"):
            continue
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        router = next(
            (m for m in parent.children() if m is not module and (hasattr(m, "top_k") or _top1(m))),
            None,
        )
        n = (
            getattr(module, "num_experts", None)
            or getattr(router, "num_experts", None)
            or (len(module) if isinstance(module, nn.ModuleList) else None)
        )
        k = getattr(router, "top_k", None) or getattr(parent, "top_k", None) or _top1(router)
        if not n or not k:
            continue
        params = _experts_params(module, int(n))
        if params is not None:
            found.append(MoELayer(name, int(n), int(k), params, router))
    return found


def _top1(router: Any) -> int | None:
    """1 for a top-1 router that keeps no ``top_k`` (Switch Transformers'), else None."""
    return 1 if router is not None and "Top1Router" in type(router).__name__ else None


def moe_info(model: nn.Module, prompt: torch.Tensor | None = None) -> MoEInfo | None:
    """Active vs total parameters, and with ``prompt`` (not on meta) the tokens each expert
    received in a forward over it; None without experts."""
    layers = find_moe_layers(model)
    if not layers:
        return None
    total = sum(p.numel() for p in model.parameters())
    inactive = sum(round(lay.expert_params * (1 - lay.top_k / lay.num_experts)) for lay in layers)
    if prompt is not None and prompt.device.type != "meta":
        _route(model, layers, prompt)
    return MoEInfo(total, total - inactive, layers)


def _route(model: nn.Module, layers: list[MoELayer], prompt: torch.Tensor) -> None:
    by_router = {lay.router: lay for lay in layers if lay.router is not None}
    for lay in layers:
        lay.tokens_per_expert = np.zeros(lay.num_experts, dtype=np.int64)
    names = {r: lay.name for r, lay in by_router.items()}

    def post(module: nn.Module, output: Any) -> None:
        lay = by_router.get(module)
        idx = output[-1] if isinstance(output, (tuple, list)) else None
        if lay is not None and isinstance(idx, torch.Tensor) and not idx.is_floating_point():
            lay.tokens_per_expert += np.bincount(
                idx.reshape(-1).cpu().numpy(), minlength=lay.num_experts
            )[: lay.num_experts]

    with torch.no_grad(), module_hooks(model, lambda *a: None, post, names):
        model(input_ids=prompt, use_cache=False)
