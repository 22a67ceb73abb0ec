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
                     precision (b < 4), optimizer state (a torch optimizer's own, sized from
                     the shapes of its real state after one step, ``step.optimizer_state``;
                     by name Adam: 2 states, SGD with momentum 1, plain SGD 0; fp32 under
                     mixed precision, plus Adam's 4-byte ``step`` per parameter tensor),
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

import dataclasses
import difflib
import inspect
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from modelprof.counting.formulas.quantized import module_packed_weights
from modelprof.errors import ModelProfError
from modelprof.generation.cache import closed_form_kv_bytes, model_dims
from modelprof.profile import profile
from modelprof.render._output import emit
from modelprof.render.units import format_bytes
from modelprof.runtime.device import mig_refusal, mig_slice
from modelprof.runtime.inputs import parse_dtype
from modelprof.runtime.tensors import PLAIN_TENSORS, tensor_nbytes
from modelprof.step.optimizer_state import OPTIMIZER_STATES, OptimizerState, optimizer_states
from modelprof.timing.memory_sizes import DEVICE_MEMORY_BYTES, device_memory, memory_variants

__all__ = ["FitReport", "OPTIMIZER_STATES", "fit", "optimizer_states"]

#: the largest count an option takes: exact in a float64, far beyond any plan
_MOST = 2**53
#: a forward taking one of these keeps a KV cache
_CACHE_ARGUMENTS = frozenset({"past_key_values", "cache", "use_cache"})
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
    ``device``: the datasheet entry taken, with ``matched_from`` the name given; ``model``:
    the class counted (the module given, or the one built from a config)."""

    table: pd.DataFrame
    device: str
    matched_from: str
    notes: tuple[str, ...]
    model: str = ""

    def fits(self, plan: str) -> bool:
        if plan not in self.table.columns:
            raise ModelProfError(f"plan={plan!r} is not one of {list(self.table.columns)}")
        return bool(self.table.loc["fits", plan])

    def to_text(self, path: str | os.PathLike[str] | None = None) -> str | Path:
        """The table in human units (IEC: 1 GiB = 2**30 B), yes/no per plan, then the notes;
        with ``path``, written there (and the path returned), as every ``to_text(path)``."""
        shown = self.table.drop(index="fits").map(format_bytes)
        shown.loc["fits"] = ["yes" if f else "no" for f in self.table.loc["fits"]]
        head = f"device {self.device}" + (
            f" (from {self.matched_from!r})" if self.matched_from != self.device else ""
        )
        head += f"; model {self.model}" if self.model else ""
        text = "\n".join([head, shown.to_string(), *(f"note: {n}" for n in self.notes)])
        return emit(text if path is None else text + "\n", path)

    def __repr__(self) -> str:
        return str(self.to_text())


@dataclasses.dataclass(frozen=True)
class _Spec:
    """``fit``'s options, checked."""

    dtype: torch.dtype
    batch_size: int
    context: int
    tp: int
    ranks: int
    optimizer: OptimizerState
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
    """Bytes per rank of ``model_or_config`` (an ``nn.Module``, counted as given; or a
    transformers config, a config class or a dict with ``model_type``, built on meta with the
    auto class that maps it, which ``FitReport.model`` names) for inference and, with ``training``, a step under each plan (see the module doc), against
    ``device`` (a datasheet name; ``memory_bytes`` overrides its memory). ``context``: tokens
    per sequence (the KV cache's length and the training sequence); ``batch_size`` per
    data-parallel rank; ``optimizer``: a name (``"adam"``, ``"adamw"``, ``"sgd"``,
    ``"sgd_momentum"``, or any ``torch.optim`` class's, ``"adafactor"``), a ``torch.optim``
    optimizer class, instance or factory, as ``profile`` takes (its state is sized from the
    shapes of its real state after one step); ``mixed_precision``: default on for 16-bit
    ``dtype``."""
    spec = _spec(dtype, batch_size, context, tp, ranks, optimizer, mixed_precision)
    key, memory = _memory(device, memory_bytes)
    model, config, built = _model(model_or_config)
    shapes, stored = _weights(model)
    counts = _counted(model, config, spec, training)
    counts["stored"] = stored
    cols = {"inference": _inference(model, config, spec, shapes, counts)}
    if training:
        for plan in PLANS[1:]:
            cols[plan] = _training(plan, spec, shapes, counts)
    table = pd.DataFrame(cols).reindex(COMPONENTS).fillna(0)
    if (table.sum() >= 2**62).any():  # no device holds it, and int64 could not add it up
        raise ModelProfError(
            f"batch_size={spec.batch_size} x context={spec.context} needs over 2**62 bytes a "
            "rank (4 EiB): no plan fits; ask for fewer tokens"
        )
    table = table.astype("int64")
    total = table.sum()
    table.loc["total"] = total
    table.loc["memory"] = memory
    table.loc["headroom"] = memory - total
    table.loc["fits"] = (total <= memory).astype("int64")
    return FitReport(
        table,
        key,
        device if isinstance(device, str) else key,
        _notes(spec, key, training, counts, built),
        type(model).__name__,
    )


def _spec(
    dtype: Any, batch: Any, context: Any, tp: Any, ranks: Any, optimizer: Any, mixed: Any
) -> _Spec:
    for name, v in (("batch_size", batch), ("context", context), ("tp", tp), ("ranks", ranks)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= _MOST:
            raise ModelProfError(f"{name}={v!r} must be a positive integer (at most 2**53)")
    batch, context, tp, ranks = int(batch), int(context), int(tp), int(ranks)
    if batch * context > _MOST:
        raise ModelProfError(
            f"batch_size={batch} x context={context} is {batch * context:.3g} tokens a rank; "
            "at most 2**53 can be counted"
        )
    dt = parse_dtype(dtype)
    if dt is None or not dt.is_floating_point:
        raise ModelProfError(f"dtype={dtype!r} must be a floating dtype")
    state = optimizer_states(optimizer)
    mixed = dt.itemsize < 4 if mixed is None else mixed
    if not isinstance(mixed, bool):
        raise ModelProfError(f"mixed_precision={mixed!r} must be True, False or None")
    return _Spec(dt, batch, context, tp, ranks, state, mixed)


def _memory(device: Any, memory_bytes: Any) -> tuple[str, int]:
    """The datasheet entry and its memory in bytes (or ``memory_bytes``, when given)."""
    if memory_bytes is not None:
        if (
            isinstance(memory_bytes, bool)
            or not isinstance(memory_bytes, numbers.Real)
            or not math.isfinite(memory_bytes)
            or not 1 <= memory_bytes < 2**63
        ):
            raise ModelProfError(
                f"memory_bytes={memory_bytes!r} must be a finite number of bytes, at least 1 "
                "and below 2**63"
            )
        return (device if isinstance(device, str) else "given"), int(memory_bytes)
    if mig_slice(device) is not None:
        raise mig_refusal(
            device,
            "device",
            "pass memory_bytes= (torch.cuda.get_device_properties(0).total_memory on the slice)",
        )
    return device_memory(device)


def _model(obj: Any) -> tuple[nn.Module, Any, str | None]:
    """The module to count and its transformers config (None for a plain module). A module is
    counted as given (its own head and adapters; the counting pass runs it on meta); a config
    (an instance, a config class, or a dict with ``model_type``) is built on meta, and the
    class built is named (the third item; None for a module)."""
    if isinstance(obj, nn.Module):
        config = getattr(obj, "config", None)
        return obj, (config if _is_config(config) else None), None
    config = _as_config(obj)
    model = _from_config(config)
    return model, config, type(model).__name__


def _is_config(obj: Any) -> bool:
    return hasattr(obj, "to_dict") and hasattr(obj, "model_type") and not isinstance(obj, type)


def _as_config(obj: Any) -> Any:
    """A transformers config from a config, a config class (its defaults) or a dict."""
    if _is_config(obj):
        return obj
    if isinstance(obj, type) and hasattr(obj, "model_type") and hasattr(obj, "to_dict"):
        return _built_config(obj.__name__, obj)
    if isinstance(obj, dict):
        kind = obj.get("model_type")
        if not isinstance(kind, str):
            raise ModelProfError(
                f"fit() of a dict config needs its 'model_type' (e.g. 'llama'); got keys "
                f"{sorted(map(str, obj))[:8]}"
            )
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if kind not in CONFIG_MAPPING:
            near = difflib.get_close_matches(kind, list(CONFIG_MAPPING.keys()), n=3)
            raise ModelProfError(
                f"fit(): model_type={kind!r} is not a transformers model type"
                + (f"; did you mean {', '.join(map(repr, near))}?" if near else "")
            )
        rest = {k: v for k, v in obj.items() if k != "model_type"}
        return _built_config(f"model_type={kind!r}", lambda: CONFIG_MAPPING[kind](**rest))
    raise ModelProfError(
        f"fit() takes an nn.Module or a transformers config (an instance, a class or a dict "
        f"with 'model_type'), got {type(obj).__name__}"
    )


def _built_config(what: str, make: Any) -> Any:
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - the config's own refusal, named
        raise ModelProfError(f"fit(): config {what} cannot be made: {_first_line(e)}") from e


def _first_line(error: BaseException) -> str:
    """The first line of the error at the root of ``error``'s causes, with its type."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


#: the transformers auto classes a config is built with, in order: an encoder-decoder as one
#: (speech, then text), anything else as a causal LM, then as its bare model
_AUTO_ENCODER_DECODER = ("AutoModelForSpeechSeq2Seq", "AutoModelForSeq2SeqLM")
_AUTO_DECODER = ("AutoModelForCausalLM",)
_AUTO_LAST = ("AutoModel",)


def _from_config(config: Any) -> nn.Module:
    """The model of ``config`` on meta: the first auto class of ``_AUTO_*`` that maps its
    config class; refused, named, when none does or the build fails."""
    # transformers is an optional extra: imported only for a config
    import transformers

    first = _AUTO_ENCODER_DECODER if getattr(config, "is_encoder_decoder", False) else _AUTO_DECODER
    for name in (*first, *_AUTO_LAST):
        auto = getattr(transformers, name, None)
        if auto is None or type(config) not in auto._model_mapping:
            continue
        with torch.device("meta"):
            try:
                return auto.from_config(config)
            except Exception as e:  # noqa: BLE001 - a config its class refuses, named
                raise ModelProfError(
                    f"fit(): {type(config).__name__} cannot build {name}: {_first_line(e)}"
                ) from e
    raise ModelProfError(
        f"fit(): transformers {transformers.__version__} has no model class for "
        f"{type(config).__name__} (tried {', '.join((*first, *_AUTO_LAST))}); pass the module"
    )


def _main_input(model: nn.Module) -> str:
    return str(getattr(model, "main_input_name", "input_ids"))


def _count_inputs(model: nn.Module, spec: _Spec, training: bool) -> dict[str, Any] | None:
    """The keyword inputs of the counted prefill (or, with ``training``, step): token ids of
    ``batch_size`` x ``context`` (an encoder-decoder's decoder: one start token for the
    prefill, ``context`` tokens for the step); the logits of the last token only when the
    forward can say so. None when the forward takes no ``input_ids``."""
    params = _forward_params(model)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if _main_input(model) != "input_ids" or ("input_ids" not in params and not takes_any):
        return None
    shape = (spec.batch_size, spec.context)
    inputs: dict[str, Any] = {"input_ids": torch.zeros(shape, dtype=torch.long, device="meta")}
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        decoder = shape if training else (spec.batch_size, 1)
        inputs["decoder_input_ids"] = torch.zeros(decoder, dtype=torch.long, device="meta")
    elif not training and "logits_to_keep" in params:
        inputs["logits_to_keep"] = 1
    return inputs


def _counted(model: nn.Module, config: Any, spec: _Spec, training: bool) -> dict[str, Any]:
    """The largest activation of a prefill, the bytes saved for the backward and, of those,
    the ones saved by rows that ran attention as matmuls and a softmax: counted on meta at
    ``batch_size`` x ``context`` tokens. None counted for a model without a config or whose
    forward takes no token ids (``skipped`` says why), nor when the forward fails there."""
    counts: dict[str, Any] = {"activation": 0, "saved": 0, "saved_attention": 0, "skipped": None}
    prefill_inputs = _count_inputs(model, spec, training=False)
    if config is None or prefill_inputs is None:
        counts["skipped"] = (
            "a module without a transformers config: no KV cache and no activations "
            "counted (weights and training state only)"
            if config is None
            else f"{type(model).__name__} reads {_main_input(model)!r}, not the token ids "
            "fit makes: no activations counted"
            if _main_input(model) != "input_ids"
            else f"{type(model).__name__}.forward takes no input_ids: no activations counted"
        )
        return counts

    def count(inputs: dict[str, Any], backward: bool) -> Any:
        return profile(
            model, inputs=inputs, device="meta", dtype=spec.dtype, timing=False, backward=backward
        )

    try:
        prefill = count(prefill_inputs, backward=False)
        counts["activation"] = int(prefill.memory.working_set_bytes)
        if training:
            step = count(_count_inputs(model, spec, training=True) or {}, backward=True)
            counts["saved"] = int(step.totals["saved_bytes"])
            counts["saved_attention"] = sum(
                int(r.saved_bytes or 0)
                for r in step.rows
                if r.leaf and _SOFTMAX & {op.split(".")[1] for op in r.ops if "." in op}
            )
    except ModelProfError as e:
        counts.update(activation=0, saved=0, saved_attention=0)
        counts["skipped"] = (
            f"no activations counted: {type(model).__name__}'s forward failed on meta at "
            f"batch {spec.batch_size} x context {spec.context} ({_first_line(e)})"
        )
    return counts


def _weights(model: nn.Module) -> tuple[list[tuple[int, ...]], int]:
    """The shapes of the floating parameters (held at ``dtype``, trained), and the bytes of
    the weights held as stored: integer and quantized parameters (a tensor subclass: its
    inner tensors) and the packed weights of quantized layers, which are no parameters."""
    shapes: list[tuple[int, ...]] = []
    stored = module_packed_weights(model)[1]
    for p in {id(p): p for p in model.parameters()}.values():
        if p.is_floating_point() and type(p) in PLAIN_TENSORS:
            shapes.append(tuple(p.shape))
        else:
            stored += tensor_nbytes(p)
    return shapes, stored


def _inference(
    model: nn.Module, config: Any, spec: _Spec, shapes: list, counts: dict[str, int]
) -> dict[str, int]:
    elements = sum(math.prod(s) for s in shapes)
    kv = 0
    if config is not None and _caches(model):
        kv = closed_form_kv_bytes(config, spec.dtype, spec.context, spec.batch_size) or 0
        kv_heads = model_dims(config)["kv_heads"] or 1
        kv = -(-kv // min(spec.tp, kv_heads))
    return {
        "weights": -(-elements * spec.dtype.itemsize // spec.tp) + -(-counts["stored"] // spec.tp),
        "kv_cache": kv,
        "activation": counts["activation"],
    }


def _caches(model: nn.Module) -> bool:
    """Whether ``model``'s forward keeps a KV cache: it takes one (``past_key_values``, or
    ``cache``/``use_cache`` as transformers 5 names them; every decoder and encoder-decoder
    does, an encoder such as ViT or BERT's classifier none)."""
    params = _forward_params(model)
    if _CACHE_ARGUMENTS & set(params):
        return True
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_any or _is_hf_model(model):  # a transformers model says for itself
        return False
    # a wrapper passing everything on (forward(*args, **kwargs)): the model it wraps decides
    inner = next((m for m in model.modules() if m is not model and _is_hf_model(m)), None)
    return inner is not None and bool(_CACHE_ARGUMENTS & set(_forward_params(inner)))


def _is_hf_model(module: nn.Module) -> bool:
    """A transformers model (its class names a ``base_model_prefix``, with a config)."""
    return hasattr(type(module), "base_model_prefix") and _is_config(
        getattr(module, "config", None)
    )


def _forward_params(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}


def _training(plan: str, spec: _Spec, shapes: list, counts: dict[str, int]) -> dict[str, int]:
    """One training plan's components per rank."""
    stage = {"data parallel": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3 (FSDP)": 3}[plan]

    def elements(sharded: bool) -> int:
        n = spec.ranks if sharded else 1
        return sum(-(-s[0] // n) * math.prod(s[1:]) if s else 1 for s in shapes)

    def per_rank(sharded: bool, size: int) -> int:
        return -(-elements(sharded) * size // spec.tp)

    b, state_size = spec.dtype.itemsize, 4 if spec.mixed else spec.dtype.itemsize
    return {
        "weights": per_rank(stage >= 3, b) + -(-counts["stored"] // spec.tp),
        "master_weights": per_rank(stage >= 1, 4) if spec.mixed else 0,
        "gradients": per_rank(stage >= 2, b),
        "optimizer_state": _state_bytes(spec, shapes, stage >= 1, state_size),
        "saved_activations": -(-counts["saved"] // spec.tp),
    }


def _state_bytes(spec: _Spec, shapes: list, sharded: bool, state_size: int) -> int:
    """The optimizer's state per rank: sized from each parameter's shape (its shard's, dim 0
    split as FSDP2 splits it, when ``sharded``); what scales with the parameter / tp, the fixed
    bytes (Adam's ``step``) once per tensor."""
    n = spec.ranks if sharded else 1
    scaled = fixed = 0
    for s in shapes:
        a, f = spec.optimizer.nbytes((-(-s[0] // n), *s[1:]) if s else s, state_size)
        scaled, fixed = scaled + a, fixed + f
    return -(-scaled // spec.tp) + fixed


def _notes(
    spec: _Spec, key: str, training: bool, counts: dict[str, Any], built: str | None
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
    if built is not None:
        notes.insert(
            0,
            f"counted {built}, built from the config on meta (pass a module to count "
            "another head or your own additions)",
        )
    if counts["skipped"] is not None:
        notes.insert(0, counts["skipped"])
    if counts["stored"]:
        notes.append(
            f"{format_bytes(counts['stored'])} of weights are quantized or packed: counted as "
            "stored, in every plan, and neither trained nor sharded (no gradients, optimizer "
            "state or master copy)"
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
