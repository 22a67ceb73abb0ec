"""``fit``: does a model fit a device — bytes per rank for inference and for a training step
under plain data parallel and ZeRO-1/2/3 (FSDP), with a tensor-parallel degree, counted from
shapes on the meta device (a config of a 70B model answers in seconds).

Per rank, with ``tp`` tensor-parallel and ``ranks`` data-parallel ranks (Psi = parameter
elements; a tensor-parallel rank holds 1/tp of every parameter and of the saved activations,
as Megatron with sequence parallelism does; KV heads split across at most ``kv_heads`` ranks):

    inference        weights Psi x b / tp + KV cache (2 x layers x kv_heads x head_dim x b x
                     context x batch) / min(tp, kv_heads) + the largest activation of a prefill
                     (one leaf call's inputs + outputs, as counted; not divided)
    training         weights Psi x b, gradients Psi x b, fp32 master weights 4 Psi under mixed
                     precision (b < 4), optimizer state (a torch optimizer's own, read from one
                     step of it; by name Adam: 2 states, SGD with momentum 1, plain SGD 0; fp32
                     under mixed precision, plus Adam's 4-byte ``step`` per parameter tensor),
                     and the tensors saved for the backward as counted by
                     ``profile(..., backward=True)`` on meta; each / tp, then sharded over
                     ``ranks``: ZeRO-1 the optimizer state and master weights, ZeRO-2 also the
                     gradients, ZeRO-3 (FSDP) also the weights. A sharded tensor is split as
                     FSDP2 splits it: dim 0 in ``ranks`` chunks of ceil(dim 0 / ranks) rows
                     (the last ones padded), so a rank holds sum(ceil(d0 / N) x rest) elements.

The numbers are in bytes in ``FitReport.table`` (numeric); ``str(report)`` renders them in human
units with a yes/no per plan and the headroom. What is not in them: the CUDA context and the
allocator's fragmentation (a few GB in practice), FSDP's all-gathered unit and communication
buffers, and temporaries of the backward beyond the saved tensors.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pandas as pd
import torch
from torch import nn

from modelprof.errors import ModelProfError
from modelprof.generation.cache import closed_form_kv_bytes, model_dims
from modelprof.profile import profile
from modelprof.render.units import format_bytes
from modelprof.runtime.inputs import parse_dtype
from modelprof.timing.memory_sizes import DEVICE_MEMORY_BYTES, device_memory, memory_variants

__all__ = ["FitReport", "OPTIMIZER_STATES", "fit", "optimizer_states"]

#: optimizer state tensors per parameter element, and bytes of scalar state per tensor
OPTIMIZER_STATES: dict[str, tuple[int, int]] = {
    "adam": (2, 4),
    "adamw": (2, 4),
    "sgd": (0, 0),
    "sgd_momentum": (1, 0),
}
_SOFTMAX = frozenset({"_softmax", "_safe_softmax", "softmax"})
PLANS = ("inference", "data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)")
COMPONENTS = (
    "weights",
    "kv_cache",
    "activation",
    "master_weights",
    "gradients",
    "optimizer_state",
    "saved_activations",
)


@dataclasses.dataclass(frozen=True)
class FitReport:
    """``table``: bytes per rank, one column per plan, rows the components, then ``total``,
    ``memory`` (the device's), ``headroom`` (memory - total) and ``fits`` (1 yes, 0 no).
    ``device``: the datasheet entry taken, with ``matched_from`` the name given."""

    table: pd.DataFrame
    device: str
    matched_from: str
    notes: tuple[str, ...]

    def fits(self, plan: str) -> bool:
        if plan not in self.table.columns:
            raise ModelProfError(f"plan={plan!r} is not one of {list(self.table.columns)}")
        return bool(self.table.loc["fits", plan])

    def to_text(self) -> str:
        """The table in human units (IEC: 1 GiB = 2**30 B), yes/no per plan, then the notes."""
        shown = self.table.drop(index="fits").map(format_bytes)
        shown.loc["fits"] = ["yes" if f else "no" for f in self.table.loc["fits"]]
        head = f"device {self.device}" + (
            f" (from {self.matched_from!r})" if self.matched_from != self.device else ""
        )
        return "\n".join([head, shown.to_string(), *(f"note: {n}" for n in self.notes)])

    def __repr__(self) -> str:
        return self.to_text()


@dataclasses.dataclass(frozen=True)
class _Spec:
    """``fit``'s options, checked."""

    dtype: torch.dtype
    batch_size: int
    context: int
    tp: int
    ranks: int
    states: int
    step_scalars: int  # bytes of scalar state per parameter tensor (Adam's ``step``)
    mixed: bool


def fit(
    model_or_config: Any,
    *,
    device: str = "H100 SXM",
    memory_bytes: int | None = None,
    dtype: Any = torch.bfloat16,
    batch_size: int = 1,
    context: int = 2048,
    tp: int = 1,
    ranks: int = 1,
    optimizer: Any = "adam",
    mixed_precision: bool | None = None,
    training: bool = True,
) -> FitReport:
    """Bytes per rank of ``model_or_config`` (an ``nn.Module`` or a transformers config) for
    inference and, with ``training``, a step under each plan (see the module doc), against
    ``device`` (a datasheet name; ``memory_bytes`` overrides its memory). ``context``: tokens
    per sequence (the KV cache's length and the training sequence); ``batch_size`` per
    data-parallel rank; ``optimizer``: a name (``"adam"``, ``"adamw"``, ``"sgd"``,
    ``"sgd_momentum"``) or a ``torch.optim`` optimizer class or instance (its state is read
    from one step); ``mixed_precision``: default on for 16-bit ``dtype``."""
    spec = _spec(dtype, batch_size, context, tp, ranks, optimizer, mixed_precision)
    key, memory = _memory(device, memory_bytes)
    model, config = _meta_model(model_or_config)
    shapes = [tuple(p.shape) for p in {id(p): p for p in model.parameters()}.values()]
    counts = _counted(model, config, spec, training)
    cols = {"inference": _inference(model, config, spec, shapes, counts)}
    if training:
        for plan in PLANS[1:]:
            cols[plan] = _training(plan, spec, shapes, counts)
    table = pd.DataFrame(cols).reindex(COMPONENTS).fillna(0).astype("int64")
    total = table.sum()
    table.loc["total"] = total
    table.loc["memory"] = memory
    table.loc["headroom"] = memory - total
    table.loc["fits"] = (total <= memory).astype("int64")
    return FitReport(
        table,
        key,
        device if isinstance(device, str) else key,
        _notes(spec, key, training, counts, config is None),
    )


def _spec(
    dtype: Any, batch: Any, context: Any, tp: Any, ranks: Any, optimizer: Any, mixed: Any
) -> _Spec:
    for name, v in (("batch_size", batch), ("context", context), ("tp", tp), ("ranks", ranks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelProfError(f"{name}={v!r} must be a positive integer")
    dt = parse_dtype(dtype)
    if dt is None or not dt.is_floating_point:
        raise ModelProfError(f"dtype={dtype!r} must be a floating dtype")
    states, scalars = optimizer_states(optimizer)
    mixed = dt.itemsize < 4 if mixed is None else mixed
    if not isinstance(mixed, bool):
        raise ModelProfError(f"mixed_precision={mixed!r} must be True, False or None")
    return _Spec(dt, batch, context, tp, ranks, states, scalars, mixed)


def optimizer_states(optimizer: Any) -> tuple[int, int]:
    """(state tensors per parameter element, bytes of scalar state per parameter tensor) of
    ``optimizer``: a name of :data:`OPTIMIZER_STATES`, or a ``torch.optim.Optimizer`` class or
    instance, whose state is read from one step of it on a 3-element float32 parameter (with
    the instance's options)."""
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZER_STATES:
            raise ModelProfError(
                f"optimizer={optimizer!r} is not one of "
                f"{sorted(OPTIMIZER_STATES)}, nor a torch optimizer"
            )
        return OPTIMIZER_STATES[optimizer]
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    if not issubclass(cls, torch.optim.Optimizer):
        raise ModelProfError(
            f"optimizer={optimizer!r} must be a name or a torch.optim optimizer (class or instance)"
        )
    options = (
        {}
        if isinstance(optimizer, type)
        else {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    )
    p = torch.zeros(3, requires_grad=True)
    p.grad = torch.ones(3)
    probe = cls([p], **options)
    probe.step()
    state = [t for t in probe.state[p].values() if isinstance(t, torch.Tensor)]
    return (
        sum(t.numel() == 3 for t in state),
        sum(t.element_size() for t in state if t.numel() == 1),
    )


def _memory(device: Any, memory_bytes: Any) -> tuple[str, int]:
    """The datasheet entry and its memory in bytes (or ``memory_bytes``, when given)."""
    if memory_bytes is not None:
        if (
            isinstance(memory_bytes, bool)
            or not isinstance(memory_bytes, (int, float))
            or memory_bytes <= 0
        ):
            raise ModelProfError(f"memory_bytes={memory_bytes!r} must be a positive number")
        return (device if isinstance(device, str) else "given"), int(memory_bytes)
    return device_memory(device)


def _meta_model(obj: Any) -> tuple[nn.Module, Any]:
    """A meta-device model and its config (None for a plain module)."""
    if isinstance(obj, nn.Module):
        config = getattr(obj, "config", None)
        if all(p.device.type == "meta" for p in obj.parameters()):
            return obj, config
        with torch.device("meta"):
            model = _from_config(config) if config is not None else copy.deepcopy(obj).to("meta")
            return model, config
    if hasattr(obj, "to_dict") and hasattr(obj, "model_type"):
        with torch.device("meta"):
            return _from_config(obj), obj
    raise ModelProfError(
        f"fit() takes an nn.Module or a transformers config, got {type(obj).__name__}"
    )


def _from_config(config: Any) -> nn.Module:
    # transformers is an optional extra: imported only for a config
    import transformers

    return transformers.AutoModelForCausalLM.from_config(config)


def _counted(model: nn.Module, config: Any, spec: _Spec, training: bool) -> dict[str, int]:
    """The largest activation of a prefill, the bytes saved for the backward and, of those,
    the ones saved by rows that ran attention as matmuls and a softmax: counted on meta at
    ``batch_size`` x ``context`` tokens (a model without a config: none counted)."""
    if config is None:
        return {"activation": 0, "saved": 0, "saved_attention": 0}
    ids = torch.zeros(spec.batch_size, spec.context, dtype=torch.long, device="meta")

    def count(inputs: dict[str, Any], backward: bool) -> Any:
        return profile(
            model, inputs=inputs, device="meta", dtype=spec.dtype, timing=False, backward=backward
        )

    prefill = count({"input_ids": ids, "logits_to_keep": 1}, backward=False)
    saved = attention = 0
    if training:
        step = count({"input_ids": ids}, backward=True)
        saved = int(step.totals["saved_bytes"])
        attention = sum(
            int(r.saved_bytes or 0)
            for r in step.rows
            if r.leaf and _SOFTMAX & {op.split(".")[1] for op in r.ops if "." in op}
        )
    return {
        "activation": int(prefill.memory.working_set_bytes),
        "saved": saved,
        "saved_attention": attention,
    }


def _inference(
    model: nn.Module, config: Any, spec: _Spec, shapes: list, counts: dict[str, int]
) -> dict[str, int]:
    elements = sum(math.prod(s) for s in shapes)
    kv = 0
    if config is not None:
        kv = closed_form_kv_bytes(config, spec.dtype, spec.context, spec.batch_size) or 0
        kv_heads = model_dims(config)["kv_heads"] or 1
        kv = -(-kv // min(spec.tp, kv_heads))
    return {
        "weights": -(-elements * spec.dtype.itemsize // spec.tp),
        "kv_cache": kv,
        "activation": counts["activation"],
    }


def _training(plan: str, spec: _Spec, shapes: list, counts: dict[str, int]) -> dict[str, int]:
    """One training plan's components per rank."""
    stage = {"data parallel": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3 (FSDP)": 3}[plan]

    def elements(sharded: bool) -> int:
        n = spec.ranks if sharded else 1
        return sum(-(-s[0] // n) * math.prod(s[1:]) if s else 1 for s in shapes)

    def per_rank(sharded: bool, size: int) -> int:
        return -(-elements(sharded) * size // spec.tp)

    b, state_size = spec.dtype.itemsize, 4 if spec.mixed else spec.dtype.itemsize
    step = spec.step_scalars * len(shapes)  # Adam's step: a float32 per tensor
    return {
        "weights": per_rank(stage >= 3, b),
        "master_weights": per_rank(stage >= 1, 4) if spec.mixed else 0,
        "gradients": per_rank(stage >= 2, b),
        "optimizer_state": spec.states * per_rank(stage >= 1, state_size) + step,
        "saved_activations": -(-counts["saved"] // spec.tp),
    }


def _notes(
    spec: _Spec, key: str, training: bool, counts: dict[str, int], plain: bool
) -> tuple[str, ...]:
    """What the table assumes and leaves out, in words."""
    notes = [
        f"per rank: tensor parallel {spec.tp}, data parallel {spec.ranks}; "
        f"{spec.dtype}, batch {spec.batch_size} x context {spec.context}"
        + (
            "; fp32 master weights and optimizer state (mixed precision)"
            if spec.mixed and training
            else ""
        )
    ]
    if plain:
        notes.insert(
            0,
            "a module without a transformers config: no KV cache and no "
            "activations counted (weights and training state only)",
        )
    if counts["saved_attention"]:
        notes.append(
            f"of the saved activations, "
            f"{format_bytes(counts['saved_attention'] / spec.tp)} are in rows that ran "
            "attention as matmuls and a softmax, which keep the T x T probabilities "
            "(a fused attention kernel keeps Q, K, V, the output and the log-sum-exp "
            "instead)"
        )
    others = memory_variants(key) if key in DEVICE_MEMORY_BYTES else {}
    if others:
        notes.append(
            f"memory of {key} taken; other variants: "
            + ", ".join(f"{k} ({format_bytes(v)})" for k, v in others.items())
            + " (name one, or pass memory_bytes=)"
        )
    notes.append(
        "not included: CUDA context, allocator fragmentation, FSDP's gathered unit "
        "and communication buffers, backward temporaries"
    )
    return tuple(notes)
