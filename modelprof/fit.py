"""``fit``: does a model fit a device — bytes per rank for inference and for a training step
under plain data parallel and ZeRO-1/2/3 (FSDP), with a tensor-parallel degree, counted from
shapes on the meta device (a config of a 70B model answers in seconds).

Per rank, with ``tp`` tensor-parallel and ``ranks`` data-parallel ranks (b = bytes of
``dtype``; parameters as rank 0 holds them under ``tp``: :func:`_tp_shape`):

- inference: weights x b + buffers (floating ones at ``dtype``, as ``model.to(dtype)`` casts
  them; integer ones as stored) + the inputs (token ids, or ``input_size``'s tensors) + KV cache
  (``closed_form_kv_bytes``, an encoder-decoder's cross-attention included) / min(tp, kv_heads)
  + a recurrent (Mamba) state per sequence x batch / tp + the largest activation of a prefill
  (one leaf call's inputs + outputs beyond the model's inputs, which their own row holds; not
  divided by tp: a rank holds a column-parallel layer's share, but the whole of a norm's or a
  row-parallel layer's hidden-sized output, and which one is the largest per rank is not known
  here; the saved activations below assume sequence parallelism, which splits those);
- training: weights x b, buffers and the step's inputs as above, gradients x b, fp32 master
  weights under mixed precision (b < 4), optimizer state (``step.optimizer_state``; fp32 under
  mixed precision) and the tensors saved for the backward, beyond the model's inputs, as
  ``profile(..., backward=True)`` counts them (trained on the model's own loss where its forward
  takes ``labels`` a token: an LM or token-classification head), / tp (Megatron with sequence
  parallelism; ``checkpointing``: :func:`_saved`). ZeRO-1 shards the optimizer state and master
  weights over ``ranks`` as FSDP2 splits dim 0, ZeRO-2 also the gradients, ZeRO-3 (FSDP) also
  the weights: the ZeRO paper's accounting (a note gives DeepSpeed's extra terms).

Against ``report.memory_estimate()`` (``modelprof.report.memory``) of the same model, batch,
dtype and optimizer: inference is the same sum, component by component (``weights`` its
``parameters``, ``activation`` its ``activations``); a training plan holds no ``activation``
row, where its training step adds the largest leaf working set again: fit follows the ZeRO
and Korthikanti et al. accounting, model states + the saved tensors, which already hold most
of that working set (a layer's input and output are what its backward saves), and which is
what checkpointing and tp change. Mixed precision (master weights, fp32 state), sharding and
tp are fit's alone.

Quantized weights (integer parameters, packed weights, a quantized layer's buffers) count as
stored, / tp, neither sharded nor trained. Not counted: the CUDA context and allocator
fragmentation (a few GB in practice), FSDP's all-gathered unit and communication buffers, and
backward temporaries beyond the saved tensors.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import difflib
import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from modelprof.counting.formulas.quantized import module_packed_weights
from modelprof.counting.forward import TOKEN_IDS_ADVICE
from modelprof.errors import (
    ModelProfError,
    ModelProfWarning,
    check_flag,
    error_line,
    is_int,
    keywords_named,
    warn_user,
)
from modelprof.generation.cache import closed_form_kv_bytes, model_dims, text_config
from modelprof.generation.encoder import source_length
from modelprof.generation.lm import encoder_only, inner_hf_model, is_config, is_hf_model
from modelprof.generation.profile import profile_generation
from modelprof.generation.specs import check_counts, lm_auto_class
from modelprof.profile import profile
from modelprof.render._output import emit
from modelprof.render.formats import Exports, get_format
from modelprof.render.html import html_notebook
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.units import format_bytes
from modelprof.render.views import select_columns
from modelprof.runtime.device import mig_refusal, mig_slice
from modelprof.runtime.inputs import (
    forward_parameters,
    memory_bytes_arg,
    parse_dtype,
    parse_input_size,
)
from modelprof.runtime.tensors import PLAIN_TENSORS, tensor_bytes, tensor_nbytes
from modelprof.step.optimizer_state import OPTIMIZER_STATES, OptimizerState, optimizer_states
from modelprof.timing.memory_sizes import DEVICE_MEMORY_BYTES, device_memory, memory_variants

__all__ = ["FitReport", "OPTIMIZER_STATES", "fit", "optimizer_states", "takes_token_ids"]

#: the largest count an option takes: exact in a float64, far beyond any plan
_MOST = 2**53
#: a forward taking one of these keeps a KV cache
_CACHE_ARGUMENTS = frozenset({"past_key_values", "cache", "use_cache"})
_SOFTMAX = frozenset({"_softmax", "_safe_softmax", "softmax"})
_LAYER = re.compile(r"\.\d+$")
CHECKPOINTING = ("none", "full", "selective")
#: the ``fits`` row in words: -1 where the activations were not counted and the rest fits
_VERDICTS = {1: "yes", 0: "no", -1: "weights and states only"}
#: a per-layer table's view options, which a fit's table (a component a row) does not take
_LAYER_VIEWS = ("style", "group_by", "units", "depth", "leaf_only", "top_k", "sort_by")
PLANS = ("inference", "data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)")
COMPONENTS = tuple(
    "weights buffers inputs kv_cache activation master_weights gradients optimizer_state "
    "saved_activations".split()
)


@dataclasses.dataclass(frozen=True)
class FitReport(Exports):
    """``table``: bytes per rank, one column per plan, rows the components, then ``total``,
    ``memory`` (the device's), ``headroom`` (memory - total) and ``fits`` (1 yes, 0 no, -1
    unknown: the activations were not counted and the rest fits; ``activations`` False).
    ``device``: the datasheet entry taken, with ``matched_from`` the name given (with
    ``memory_given``, the name given as it is, "" for none: the memory is ``memory_bytes``);
    ``model``: the class counted (the module given, or the one built from a config);
    ``parameters``: its parameter elements (packed and quantized ones included); ``tp`` and
    ``ranks``: the tensor- and data-parallel degrees, :attr:`gpus` the devices a plan uses."""

    table: pd.DataFrame
    device: str
    matched_from: str
    notes: tuple[str, ...]
    model: str = ""
    parameters: int = 0
    tp: int = 1
    ranks: int = 1
    activations: bool = True
    memory_given: bool = False

    @property
    def gpus(self) -> int:
        """The devices a plan uses: ``tp`` x ``ranks``."""
        return self.tp * self.ranks

    def fits(self, plan: str) -> bool:
        """Whether ``plan``'s total fits the memory; refused where the activations were not
        counted and the rest fits (the answer depends on them)."""
        if plan not in self.table.columns:
            raise ModelProfError(f"plan={plan!r} is not one of {list(self.table.columns)}")
        verdict = int(self.table.loc["fits", plan])
        if verdict < 0:
            raise ModelProfError(
                f"plan={plan!r}: its weights and states fit, but no activations were counted "
                f"for {self.model or 'this model'}, so fit cannot say whether the plan does "
                "(pass input_size=, batch excluded, for a model that takes no token ids)"
            )
        return bool(verdict)

    def to_text(self, path: str | os.PathLike[str] | None = None) -> str | Path:
        """The table in human units (IEC: 1 GiB = 2**30 B), yes/no per plan, then the notes;
        with ``path``, written there (and the path returned), as every ``to_text(path)``."""
        text = "\n".join([self._head(), self._shown().to_string(), *self._notes()])
        return emit(text if path is None else text + "\n", path)

    def export(self, format: str, path: str | Path | None = None, **view: Any) -> str | Path:
        """The table in any registered format (``to_csv``, ``to_markdown``, ``to_latex``...):
        a raw one (CSV, JSON) its bytes and ``fits`` as 1/0/-1, a row per component (column
        ``component``), JSON with the device, the model and the notes as its environment; a
        human one as :meth:`to_text` shows it, the head line its caption and on a page (HTML,
        Markdown, unless ``standalone=False``) the notes below; LaTeX keeps every plan and
        scales. Text is :meth:`to_text`'s. ``columns`` picks plans (``component`` is kept); a
        per-layer table's views (``depth``, ``style``, ``units``...) are refused."""
        fmt = get_format(format)
        check_read_by(fmt.name, view)
        given = ViewOptions.parse(view.pop("view", None), **view)
        differ = given.changed()
        asked = [k for k in differ if k in _LAYER_VIEWS]
        if asked:
            raise ModelProfError(
                f"{', '.join(f'{k}={getattr(given, k)!r}' for k in asked)}: a fit's table is a "
                "component a row, its bytes as printed; columns= picks plans"
            )
        if fmt.name == "text":
            if differ:  # (by keyword or in view=)
                raise ModelProfError(
                    f"{', '.join(f'{k}={getattr(given, k)!r}' for k in differ)}: a fit's text "
                    "is to_text's, which takes no view options"
                )
            return self.to_text(path)
        frame = (self._worded() if fmt.human else self.table).rename_axis("component")
        frame, plans = frame.reset_index(), given.columns
        if isinstance(plans, str) and plans not in ("all", "compact"):
            plans = (plans,)  # one plan
        if isinstance(plans, tuple):  # picked by name here: a human table's get a unit below
            frame = select_columns(frame, plans if "component" in plans else ("component", *plans))
        if fmt.human:  # its plans in bytes (the rule shows them in IEC units, right-aligned)
            frame = frame.rename(columns={p: f"{p}_bytes" for p in self.table.columns})
        head = self._head()
        given = given.with_defaults(
            view,
            caption=head,
            title=head,
            summary=(head, *self._notes()),
            standalone=True,
            show_totals=False,
            # every plan kept: a paper's table scales to the width (a longtable, which cannot,
            # is laid out at its own)
            **({"width": None} if given.long else {"fit": "scale"}),
            # one unit a column (LaTeX's default) would show 800 B beside 80 GiB as "<0.01"
        ).replace(columns="all", units="human")
        env = None
        if not fmt.human:
            fields = (
                *("device", "matched_from", "model", "parameters"),
                *("tp", "ranks", "gpus", "memory_given"),
            )
            env = {k: getattr(self, k) for k in fields} | {"notes": list(self.notes)}
        return fmt.write(frame, None, env=env, path=path, view=given)

    def _worded(self) -> pd.DataFrame:
        """The table, its ``fits`` row in words (yes/no per plan)."""
        worded = self.table.astype(object)
        worded.loc["fits"] = [_VERDICTS[int(f)] for f in self.table.loc["fits"]]
        return worded

    def _shown(self) -> pd.DataFrame:
        """The table in IEC units, yes/no per plan."""
        return self._worded().map(lambda v: v if isinstance(v, str) else format_bytes(v))

    def _notes(self) -> list[str]:
        return [f"note: {n}" for n in self.notes]

    def _head(self) -> str:
        """The line above the table: the device (or the memory given), model, GPUs a plan."""
        head = f"device {self.device}" + (
            f" (from {self.matched_from!r})" if self.matched_from != self.device else ""
        )
        if self.memory_given:  # no datasheet entry taken: say the memory that was
            memory = int(self.table.loc["memory"].iloc[0])
            head = (f"device {self.device}, " if self.device else "") + (
                f"memory {format_bytes(memory)} ({memory:,} B) given"
            )
        head += f"; model {self.model}" if self.model else ""
        head += f", {_count_text(self.parameters)} parameters" if self.parameters else ""
        ranks = f"{self.ranks} rank{'s' if self.ranks > 1 else ''}"
        gpus = f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        return head + f"; {gpus} per plan (tp {self.tp} x {ranks})"

    def __repr__(self) -> str:
        return str(self.to_text())

    def _repr_html_(self) -> str:
        """The notebook display: the head line and the notes, then the table."""
        table = self.export("html", standalone=False, caption=None)
        return html_notebook([self._head(), *self._notes()], str(table))


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
    checkpointing: str = "none"
    #: the shapes (batch excluded) a model that takes no token ids is counted at
    input_size: tuple[tuple[int, ...], ...] | None = None


@keywords_named
def fit(
    model_or_config: Any,
    *,
    device: str | None = None,
    memory_bytes: int | None = None,
    dtype: Any = torch.bfloat16,
    batch_size: int = 1,
    context: int = 2048,
    input_size: Any = None,
    tp: int = 1,
    ranks: int = 1,
    optimizer: Any = "adam",
    mixed_precision: bool | None = None,
    training: bool = True,
    checkpointing: str = "none",
) -> FitReport:
    """Bytes per rank of ``model_or_config`` (an ``nn.Module``, counted as given, or a
    transformers config, config class or dict with ``model_type``, built on meta with the auto
    class ``FitReport.model`` names) for inference and, with ``training``, a step under each
    plan (the module doc), against ``device`` (a datasheet name, ``"H100 SXM"`` when none is
    given) or ``memory_bytes`` (the memory; a ``device`` named beside it is only a label).
    ``context``: tokens per sequence (KV cache and training sequence); ``input_size``:
    the input shape, batch excluded (``(3, 224, 224)``), at which a model that takes no token
    ids (a plain module, ViT) has its activations counted (without it none are, and ``fits``
    says "weights and states only" where the rest fits; a forward that fails at it is refused,
    as ``profile`` refuses it); ``batch_size``: per data-parallel
    rank; ``optimizer``: a name (``"adam"``, ``"adamw"``, ``"sgd"``,
    ``"sgd_momentum"``, any ``torch.optim`` class's, ``"adafactor"``) or a ``torch.optim``
    class, instance or factory, as ``profile`` takes; ``mixed_precision``: default on for a
    16-bit ``dtype``; ``checkpointing`` of the training plans: ``"none"``, ``"full"`` or
    ``"selective"``. Refused: a ``tp`` that neither divides the heads nor splits or replicates
    whole KV heads, a ``context`` past the model's positions, a non-integer head dim."""
    check_flag("training", training)
    spec = _spec(dtype, batch_size, context, tp, ranks, optimizer, mixed_precision, checkpointing)
    if input_size is not None:
        spec = dataclasses.replace(spec, input_size=tuple(parse_input_size(input_size)))
    key, memory = _memory(device, memory_bytes)
    model, config, built = _model(model_or_config)
    _check_plan(model, config, spec)
    shapes, stored, buffers, parameters = _weights(model, spec.dtype, _heads(config, spec.tp))
    shapes, trained = [s for s, _ in shapes], [s for s, t in shapes if t]
    counts = _counted(model, config, spec, training)
    counts["stored"], counts["trained"], counts["buffers"] = stored, trained, buffers
    counts["frozen"] = len(shapes) - len(trained)
    counts["state"], counts["state_skipped"] = _recurrent_state(model, config, spec)
    counts["deepspeed"] = _deepspeed_terms(model, spec, trained)
    counts["source"] = _source_tokens(model, config, spec)
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
    counted = counts["skipped"] is None
    table.loc["fits"] = (total <= memory).astype("int64") * (1 if counted else -1)
    if not counted:
        warn_user(
            f"fit: {counts['skipped']}; the fits row says only whether the rest fits",
            ModelProfWarning,
        )
    given = memory_bytes is not None  # no datasheet entry: its variants are no concern
    return FitReport(
        table,
        key,
        device if isinstance(device, str) else key,
        _notes(spec, "" if given else key, training, counts, built)
        + _way_forward(spec, shapes, counts, table),
        type(model).__name__,
        parameters,
        tp=spec.tp,
        ranks=spec.ranks,
        activations=counted,
        memory_given=given,
    )


def _spec(
    dtype: Any, batch: Any, context: Any, tp: Any, ranks: Any, optimizer: Any, mixed: Any, ckpt: Any
) -> _Spec:
    for name, v in (("batch_size", batch), ("context", context), ("tp", tp), ("ranks", ranks)):
        if not is_int(v) or not 1 <= v <= _MOST:
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
    if mixed and dt.itemsize >= 4:
        raise ModelProfError(
            f"mixed_precision=True with dtype={dtype!r}: the weights are already float32 or "
            "wider, so an fp32 master copy would hold them twice; pass a 16-bit dtype, or "
            "mixed_precision=False"
        )
    if not isinstance(ckpt, str) or ckpt not in CHECKPOINTING:
        raise ModelProfError(
            f"checkpointing={ckpt!r} must be one of {', '.join(map(repr, CHECKPOINTING))}"
        )
    return _Spec(dt, batch, context, tp, ranks, state, mixed, ckpt)


def _count_text(n: int) -> str:
    """A parameter count as people say it: ``70.55 B (70,553,706,496)``."""
    for size, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n:,})"
    return f"{n:,}"


def _check_plan(model: nn.Module, config: Any, spec: _Spec) -> None:
    """Refuse a plan no real run makes: a non-integer head dim, a ``tp`` :func:`_check_tp`
    refuses, a ``context`` past the positions of a model fit feeds token ids, a ``tp`` for a
    model without a config (its activations would be divided as if sharded)."""
    if config is None:
        if spec.tp > 1:
            raise ModelProfError(
                f"tp={spec.tp}: fit shards a model by its transformers config (its heads and "
                f"hidden size); {type(model).__name__} has none, so it makes no tensor-parallel "
                "plan for it (ranks= plans data parallelism)"
            )
        return
    d = model_dims(config)
    heads, hidden = d["heads"], d["hidden"]
    text = text_config(config)
    explicit = any(getattr(text, n, None) for n in ("head_dim", "d_kv"))
    if heads and hidden and not explicit and hidden % heads:
        raise ModelProfError(
            f"{type(config).__name__}: hidden size {hidden} / {heads} attention heads = "
            f"{hidden / heads:g} is not an integer head dim; no attention layer has it"
        )
    _check_tp(model, {**d, "kv_heads": _heads(config, spec.tp).kv}, spec)
    limit = d["max_positions"]
    takes_ids = _takes_ids(model) or _caches(model)
    if limit and takes_ids and spec.context > limit:
        raise ModelProfError(
            f"context={spec.context} is past the {limit} positions of {type(model).__name__} "
            f"({_positions_name(text, limit)}={limit}"
            + (
                ": learned position embeddings, no row past it)"
                if _learned_positions(model, limit)
                else "; raise it, with RoPE scaling, to plan longer)"
            )
        )


def _check_tp(model: nn.Module, d: dict[str, Any], spec: _Spec) -> None:
    """Refuse a ``tp`` that splits no whole attention heads (Megatron and vLLM ask
    ``heads % tp == 0``) or whose ranks cannot hold whole KV heads (``kv_heads % tp == 0``
    splits them, ``tp % kv_heads == 0`` replicates one on each rank)."""
    heads, hidden = d["heads"], d["hidden"]
    if heads and heads % spec.tp:
        ok = [t for t in range(1, heads + 1) if heads % t == 0]
        raise ModelProfError(
            f"tp={spec.tp} does not split the {heads} attention heads of {type(model).__name__}"
            f" (hidden size {hidden}) into whole heads per rank"
            + (" (more ranks than heads)" if spec.tp > heads else "")
            + f": a tensor-parallel plan needs heads % tp == 0; tp in {ok[-8:]} does"
        )
    kv = d["kv_heads"]
    if heads and kv and kv != heads and kv % spec.tp and spec.tp % kv:
        ok = [t for t in range(1, heads + 1) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        raise ModelProfError(
            f"tp={spec.tp} neither splits the {kv} KV heads of {type(model).__name__} into whole "
            f"heads per rank nor gives each rank one whole (a tensor-parallel plan needs "
            f"kv_heads % tp == 0, or tp % kv_heads == 0 to replicate them); tp in {ok[-8:]} does"
        )


def _positions_name(config: Any, limit: int) -> str:
    names = ("n_positions", "max_position_embeddings", "n_ctx", "max_target_positions")
    return next((n for n in names if getattr(config, n, None) == limit), "positions")


def _learned_positions(model: nn.Module, limit: int) -> bool:
    """A table of positions: an embedding other than the token ids' of ``limit`` rows or a
    few more (BART's offset of 2)."""
    get, tokens = getattr(model, "get_input_embeddings", None), None
    with contextlib.suppress(NotImplementedError, AttributeError):
        tokens = get() if callable(get) else None
    return any(
        isinstance(m, nn.Embedding) and m is not tokens and limit <= m.num_embeddings <= limit + 2
        for m in model.modules()
    )


def _memory(device: Any, memory_bytes: Any) -> tuple[str, int]:
    """The datasheet entry and its memory in bytes (or ``memory_bytes``, when given)."""
    if memory_bytes is not None:
        return (device if isinstance(device, str) else ""), memory_bytes_arg(memory_bytes)
    device = "H100 SXM" if device is None else device
    if mig_slice(device) is not None:
        raise mig_refusal(
            device,
            "device",
            "pass its memory, memory_bytes= (--memory on the command line; "
            "torch.cuda.get_device_properties(0).total_memory on the slice)",
        )
    return device_memory(device)


def _model(obj: Any) -> tuple[nn.Module, Any, str | None]:
    """The module to count, its transformers config (for a user's module around a
    transformers model, that model's; None for a plain module) and, for a config built on
    meta, the class built."""
    if isinstance(obj, nn.Module):
        config = getattr(obj, "config", None)
        if not is_config(config):
            config = getattr(inner_hf_model(obj), "config", None)
        return obj, config, None
    config = check_counts(_as_config(obj), f"fit(): {type(obj).__name__}")
    model = _from_config(config)
    return model, config, type(model).__name__


def _as_config(obj: Any) -> Any:
    """A transformers config from a config, a config class (its defaults) or a dict."""
    if is_config(obj):
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
        raise ModelProfError(f"fit(): config {what} cannot be made: {error_line(e)}") from e


def _from_config(config: Any) -> nn.Module:
    """The model of ``config`` on meta, of the class ``modelprof generate`` builds for it
    (else ``AutoModel``'s); ``AutoModel``'s too where that class's layers say they do not
    decode (a BERT config without ``is_decoder``: an encoder, not a causal LM)."""
    import transformers

    name, auto = lm_auto_class(config, "fit()", "pass the module", "AutoModel")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # (BERT's causal LM asks for is_decoder=True)
    try:
        model = _build(config, name, auto)
    finally:
        transformers.logging.set_verbosity(verbosity)
    if name != "AutoModel" and encoder_only(model):
        with contextlib.suppress(ModelProfError):  # (a class AutoModel maps, or the one built)
            model = _build(config, "AutoModel", transformers.AutoModel)
    return model


def _build(config: Any, name: str, auto: Any) -> nn.Module:
    with torch.device("meta"):
        try:
            return auto.from_config(config)
        except Exception as e:  # noqa: BLE001 - a config its class refuses, named
            raise ModelProfError(
                f"fit(): {type(config).__name__} cannot build {name}: {error_line(e)}"
            ) from e


def _main_input(model: nn.Module) -> str:
    return str(getattr(model, "main_input_name", "input_ids"))


def takes_token_ids(model: nn.Module) -> bool:
    """``fit`` feeds ``model`` token ids (it finds a transformers config, the model's or the
    one of a transformers model inside it, and its forward takes ``input_ids``); otherwise it
    counts it at an ``input_size``."""
    return _model(model)[1] is not None and _takes_ids(model)


def _takes_ids(model: nn.Module) -> bool:
    """The forward takes ``input_ids`` (named, or through ``**kwargs``) as its main input."""
    params = forward_parameters(model)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return _main_input(model) == "input_ids" and ("input_ids" in params or takes_any)


def _count_inputs(model: nn.Module, spec: _Spec, training: bool) -> dict[str, Any] | None:
    """The keyword inputs of the counted prefill (or, with ``training``, step): token ids of
    ``batch_size`` x ``context`` (an encoder-decoder's decoder: one start token for the
    prefill); the last token's logits only, when the forward can say so. None when the
    forward takes no ``input_ids``."""
    if not _takes_ids(model):
        return None
    params = forward_parameters(model)
    shape = (spec.batch_size, spec.context)
    inputs: dict[str, Any] = {"input_ids": torch.zeros(shape, dtype=torch.long, device="meta")}
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        decoder = shape if training else (spec.batch_size, 1)
        inputs["decoder_input_ids"] = torch.zeros(decoder, dtype=torch.long, device="meta")
    elif not training and "logits_to_keep" in params:
        inputs["logits_to_keep"] = 1
    if training and "labels" in params and _token_head(model):
        # a language model's own loss, over every token, saves its fp32 log-softmax
        inputs["labels"] = inputs.get("decoder_input_ids", inputs["input_ids"])
    return inputs


#: what ``_counted`` counts on meta: 0 where it counts nothing
_ACTIVATIONS = ("inputs", "step_inputs", "activation", "saved", "saved_attention")

#: transformers heads that label every position (a token classifier, ELECTRA's discriminator)
_TOKEN_LABELS = ("ForTokenClassification", "ForPreTraining")


def _token_head(model: nn.Module) -> bool:
    """The model labels every position (an LM head, with output embeddings, or a token
    classifier), so its ``labels`` are shaped as its token ids; a sequence classifier's are
    one a sequence, and it is counted on the sum of its outputs."""
    if type(model).__name__.endswith(_TOKEN_LABELS):
        return True
    get = getattr(model, "get_output_embeddings", None)
    try:
        return callable(get) and get() is not None
    except Exception:  # noqa: BLE001 - a model's own accessor that cannot answer: no head known
        return False


def _counted(model: nn.Module, config: Any, spec: _Spec, training: bool) -> dict[str, Any]:
    """The largest activation of a prefill (or, at ``spec.input_size``, of a forward), the
    bytes saved for the backward and, of those, the ones of rows that ran attention as matmuls
    and a softmax, counted on meta; zeros with ``skipped`` saying why when the model takes no
    token ids and no ``input_size`` was given, or fails at its token ids (a forward that fails
    at ``input_size`` is refused)."""
    counts: dict[str, Any] = dict.fromkeys(_ACTIVATIONS, 0) | {"skipped": None}
    prefill_inputs = _count_inputs(model, spec, training=False)
    ids = config is not None and prefill_inputs is not None
    counts["fed"] = _fed_text(spec, ids)
    counts["sharded"] = config is not None  # a tensor-parallel plan exists (heads to split)
    if ids and spec.input_size is not None:
        raise ModelProfError(
            f"input_size={_shapes_text(spec.input_size)} is for a model that takes no token ids; "
            f"{type(model).__name__} is fed batch_size x context token ids: leave it out"
        )
    if not ids and spec.input_size is None:
        counts["skipped"] = _uncounted(model, config)
        return counts

    def count(inputs: dict[str, Any] | None, backward: bool) -> Any:
        sized = {"inputs": inputs} if ids else _sized_inputs(spec)
        return profile(
            model, **sized, device="meta", dtype=spec.dtype, timing=False, backward=backward
        )

    try:
        prefill = count(prefill_inputs, backward=False)
        # the inputs in their own row, as memory_estimate holds them: beside the activations
        # and the saved tensors, not in them
        counts["inputs"] = prefill.memory.input_bytes
        counts["activation"] = prefill.memory.working_set_beyond_inputs_bytes
        if training:
            step = count(_count_inputs(model, spec, training=True) or {}, backward=True)
            counts["step_inputs"] = step.memory.input_bytes
            counts["saved"] = int(step.totals["saved_bytes"]) - step.memory.saved_inputs_bytes
            counts["saved_attention"] = sum(
                int(r.saved_bytes or 0)
                for r in step.rows
                if r.leaf and _SOFTMAX & {op.split(".")[1] for op in r.ops if "." in op}
            )
            counts["layer_saved"] = _layer_saved(step.rows)
            counts["hidden"] = model_dims(config)["hidden"] if ids else None
    except ModelProfError as e:
        if spec.input_size is not None and TOKEN_IDS_ADVICE in str(e):
            refused = ModelProfError(
                f"input_size={_shapes_text(spec.input_size)}: {type(model).__name__} takes "
                f"integer token ids: {_FIT_TOKEN_IDS}"
            )
            refused.forward_failed = str(refused)  # (a spec's own size: its weights alone)
            raise refused from e
        if spec.input_size is not None:  # activations asked for: refused as profile refuses
            refused = ModelProfError(
                f"input_size={', '.join(map(str, spec.input_size))} (batch excluded): fit counts "
                f"activations with profile on meta, which refused it: {e}"
            )
            refused.forward_failed = str(e)  # (the command line's spec size: not asked for)
            raise refused from e.__cause__
        counts.update(dict.fromkeys(_ACTIVATIONS, 0))
        counts["skipped"] = (
            f"no activations counted: {type(model).__name__}'s forward failed on meta at "
            f"{counts['fed']} ({error_line(e)})"
        )
    return counts


#: fit's way to an Embedding's token ids: a transformers config (fed batch_size x context ids)
_FIT_TOKEN_IDS = (
    "fit feeds token ids to a model with a transformers config alone (a config SPEC, or a "
    "factory's transformers model) and counts any other at input_size=, in floats, so it "
    "cannot size this model's activations: leave input_size= out to count its weights and "
    "training state alone, and count its activations in Python, with memory_estimate() of a "
    "training step's profile fed modelprof.token_inputs(model, seq_len)"
)


def _uncounted(model: nn.Module, config: Any) -> str:
    """Why no activations are counted for a model fed no token ids and given no input size."""
    why = (
        "a module without a transformers config: no KV cache and no activations counted"
        if config is None
        else f"{type(model).__name__} reads {_main_input(model)!r}, not the token ids fit "
        "makes: no activations counted"
        if _main_input(model) != "input_ids"
        else f"{type(model).__name__}.forward takes no input_ids: no activations counted"
    )
    return why + " (weights and training state only; pass input_size=, batch excluded)"


def _sized_inputs(spec: _Spec) -> dict[str, Any]:
    """``profile``'s keywords for inputs of ``spec.input_size`` at ``spec.batch_size``."""
    shapes = spec.input_size or ()
    return {
        "input_size": shapes[0] if len(shapes) == 1 else list(shapes),
        "batch_size": spec.batch_size,
    }


def _shapes_text(shapes: tuple[tuple[int, ...], ...]) -> str:
    return ", ".join(map(str, shapes))  # (400,), (3, 224, 224)


def _fed_text(spec: _Spec, ids: bool) -> str:
    """What the counted forward was fed, in words: ``batch 32 x context 2048`` (token ids),
    ``batch 32 of input (3, 224, 224)`` (``input_size``) or ``batch 32`` (nothing counted: no
    context either, which only token ids have)."""
    if ids:
        return f"batch {spec.batch_size} x context {spec.context}"
    if spec.input_size is None:
        return f"batch {spec.batch_size}"
    inputs = "inputs" if len(spec.input_size) > 1 else "input"
    return f"batch {spec.batch_size} of {inputs} {_shapes_text(spec.input_size)}"


#: what a recurrent layer's class or a config's state size is called (Mamba, Mamba2, Jamba,
#: Falcon-H1, Zamba, Bamba, RWKV, Qwen3-Next's gated delta net, RecurrentGemma, xLSTM)
_RECURRENT_NAMES = ("mamba", "ssm", "rwkv", "gateddelta", "linearattention", "recurrent", "xlstm")
_STATE_SIZES = ("state_size", "ssm_state_size", "mamba_d_state", "d_state", "linear_key_head_dim")
_ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})


def _recurrent(model: nn.Module, config: Any) -> bool:
    """Whether ``model`` has layers that keep a recurrent state: a module class named so, a
    config with a state size, or a layer kind other than attention in ``layer_types``."""
    text = text_config(config)
    kinds = set(getattr(text, "layer_types", None) or ())
    names = {type(m).__name__.lower() for m in model.modules()}
    return (
        bool(kinds - _ATTENTION_KINDS)
        or any(getattr(text, a, None) for a in _STATE_SIZES)
        or any(k in n for n in names for k in _RECURRENT_NAMES)
    )


def _deepspeed_terms(model: nn.Module, spec: _Spec, shapes: list) -> tuple[int, int]:
    """What DeepSpeed's estimators add per rank to the ZeRO paper's accounting: an fp32
    gradient partition at ZeRO-2 and 3 (``2Ψ + 18Ψ/N`` against the paper's ``2Ψ + 14Ψ/N``),
    and at ZeRO-3 the largest module's own parameters gathered whole (16-bit weights and
    gradients: 4 bytes each, / tp)."""
    largest = max(
        (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0
    )
    return 4 * _elements(shapes, spec.ranks), -(-4 * largest // spec.tp)


def _layer_saved(rows: list) -> list[int]:
    """The saved bytes of each repeated layer (the shallowest calls named like
    ``model.layers.3``), what full checkpointing recomputes one at a time."""
    layers = [r for r in rows if not r.is_self and _LAYER.search(r.module)]
    depth = min((r.depth for r in layers), default=0)
    return [int(r.saved_bytes or 0) for r in layers if r.depth == depth]


def _weights(
    model: nn.Module, dtype: torch.dtype, heads: _Heads
) -> tuple[list[tuple[tuple[int, ...], bool]], int, int, int]:
    """Rank 0's shapes of the floating parameters (held at ``dtype``), each with whether it is
    trained (``requires_grad``), the bytes of the weights held as stored (integer, quantized
    and packed ones, a tensor subclass by its inner tensors, a quantized layer's buffers), the
    bytes of the other buffers (BatchNorm's running statistics, rotary frequencies, masks),
    floating ones at ``dtype`` as ``model.to(dtype)`` casts them, the rest as stored (an int64
    ``num_batches_tracked``), whole on every rank, and the model's parameter elements."""
    shapes: list[tuple[tuple[int, ...], bool]] = []
    elements, stored = module_packed_weights(model)
    seen: set[int] = set()
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            elements += p.numel()
            if _plain_float(p):
                shape = _tp_shape(tuple(p.shape), module, name, pname, heads)
                shapes.append((shape, p.requires_grad))
            else:
                stored += tensor_nbytes(p)
        stored += _quantized_buffers(module, seen, dtype)
    buffers = tensor_bytes([b for b in model.buffers() if id(b) not in seen], dtype)
    return shapes, stored, buffers, elements


def _plain_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() and type(t) in PLAIN_TENSORS


def _quantized_buffers(module: nn.Module, seen: set[int], dtype: torch.dtype) -> int:
    """Bytes of the buffers of a quantized layer (one with an integer or quantized parameter,
    or with no parameters and such a buffer: GPTQ's ``qweight``), which hold its weights: each
    once, integer ones as stored, floating ones (scales, bias) at ``dtype``. A float layer's
    buffers (rotary frequencies, position ids) stay out, as in the closed forms, and so does a
    boolean buffer: a mask, never a weight (GPTBigCode's causal ``bias``), nor an int64 one
    alone: indices (BERT's embeddings hold ``position_ids`` and ``token_type_ids``), where
    packed weights are held in 8 or 32 bits (GPTQ's int32 ``qweight``, BitNet's uint8)."""
    params = list(module.parameters(recurse=False))
    index = (torch.bool, torch.int64)
    held = params or [b for b in module.buffers(recurse=False) if b.dtype not in index]
    if all(_plain_float(t) for t in held):
        return 0
    total = 0
    for b in module.buffers(recurse=False):
        if id(b) not in seen and b.dtype != torch.bool:
            seen.add(id(b))
            total += b.numel() * dtype.itemsize if _plain_float(b) else tensor_nbytes(b)
    return total


#: Megatron's row-parallel layers (attention's output projection, the MLP's second), split by
#: their input; their bias is added after the reduction, whole on every rank
ROW_PARALLEL = frozenset("o_proj out_proj down_proj c_proj fc2 dense_4h_to_h wo".split())

#: the blocks whose ``dense`` layer is row-parallel (its output goes into the residual)
_ROW_DENSE_PARENTS = frozenset({"self_attention", "attention", "output"})

#: a grouped-query attention's key and value projections, whose rows are whole KV heads
KV_PROJECTIONS = frozenset({"k_proj", "v_proj"})


#: fused query-key-value projections (GPT-2's c_attn, Falcon's and GPT-NeoX's
#: query_key_value, Phi-3's qkv_proj, MPT's Wqkv, Baichuan's W_pack), taken as fused only
#: when their output is (heads + 2 x kv_heads) x head_dim as well
FUSED_QKV = frozenset({"c_attn", "query_key_value", "qkv_proj", "wqkv", "w_pack", "qkv"})


@dataclasses.dataclass(frozen=True)
class _Heads:
    """Attention under ``tp`` (None: unknown). ``kv_ranks``: the ranks a KV head's rows split
    over, ``min(tp, kv_heads)``; past the KV heads each rank holds one whole."""

    tp: int
    heads: int | None = None
    kv: int | None = None
    head_dim: int | None = None

    @property
    def kv_ranks(self) -> int:
        return min(self.tp, self.kv) if self.kv else self.tp


def _heads(config: Any, tp: int) -> _Heads:
    """``config``'s heads under ``tp``, the KV heads as the weights hold them: Falcon's
    ``new_decoder_architecture`` has ``num_kv_heads`` whatever the cache's count says."""
    if config is None:
        return _Heads(tp)
    d = model_dims(config)
    kv = d["kv_heads"]
    text = text_config(config)
    if getattr(text, "new_decoder_architecture", False) and getattr(text, "num_kv_heads", None):
        kv = text.num_kv_heads
    return _Heads(tp, d["heads"], kv, d["head_dim"])


def _fused_qkv_rows(
    s: tuple[int, ...], module: nn.Module, name: str, heads: _Heads
) -> tuple[int, int] | None:
    """The dim of a fused QKV parameter's output rows (dim 1 of GPT-2's Conv1D, else 0) and
    rank 0's share, (heads / tp + 2 x kv_heads / kv_ranks) x head_dim; None if no fused QKV."""
    h, kv, d = heads.heads, heads.kv, heads.head_dim
    if name.rsplit(".", 1)[-1].lower() not in FUSED_QKV or not (h and kv and d):
        return None
    dim = 1 if len(s) == 2 and type(module).__name__ == "Conv1D" else 0
    if s[dim] != (h + 2 * kv) * d:
        return None
    return dim, (-(-h // heads.tp) + 2 * -(-kv // heads.kv_ranks)) * d


def _tp_shape(
    s: tuple[int, ...], module: nn.Module, name: str, pname: str, heads: _Heads
) -> tuple[int, ...]:
    """Rank 0's shape of parameter ``pname`` of ``module`` (``name``) under ``heads.tp``, as a
    real plan splits it: whole (a norm's; a row-parallel layer's bias), by the input (a
    row-parallel weight: dim 1 of a Linear's, dim 0 of GPT-2's [in, out] Conv1D), by the output
    (dim 1 of a column-parallel Conv1D) or along dim 0, rank 0 taking an odd dimension's extra
    rows. A key or value projection splits over ``heads.kv_ranks`` only; a fused QKV holds
    its query heads' share and whole KV heads."""
    tp = heads.tp
    if tp == 1 or "norm" in type(module).__name__.lower() or not s:
        return s
    if name.rsplit(".", 1)[-1] in KV_PROJECTIONS:
        return _shard(s, heads.kv_ranks)
    fused = _fused_qkv_rows(s, module, name, heads)
    if fused is not None:
        dim, rows = fused
        return (*s[:dim], rows, *s[dim + 1 :])
    row = _row_parallel(name)
    if row and pname == "bias":
        return s
    conv1d = type(module).__name__ == "Conv1D"  # GPT-2's [in, out]
    if len(s) == 2 and (isinstance(module, nn.Linear) if row else conv1d):
        return (s[0], -(-s[1] // tp))
    return _shard(s, tp)


def _shard(s: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Rank 0's part of shape ``s`` split along dim 0 over ``n`` ranks: ceil(dim 0 / n) rows,
    as FSDP2 and a tensor-parallel plan split it."""
    return (-(-s[0] // n), *s[1:]) if s else s


def _elements(shapes: list, n: int = 1) -> int:
    """The elements of rank 0's parts of ``shapes`` split over ``n`` ranks (:func:`_shard`)."""
    return sum(math.prod(_shard(s, n)) for s in shapes)


def _row_parallel(name: str) -> bool:
    """``ROW_PARALLEL`` by its own name, or a ``dense`` right under an attention or output
    block (Falcon's ``self_attention.dense``, BERT's ``output.dense``; not BERT's
    ``intermediate.dense``)."""
    parts = name.split(".")
    if parts[-1] in ROW_PARALLEL:
        return True
    return parts[-1] == "dense" and len(parts) > 1 and parts[-2] in _ROW_DENSE_PARENTS


def _inference(
    model: nn.Module, config: Any, spec: _Spec, shapes: list, counts: dict[str, Any]
) -> dict[str, int]:
    kv = 0
    if config is not None and _caches(model):
        kv = closed_form_kv_bytes(config, spec.dtype, spec.context, spec.batch_size) or 0
        if counts["source"]:  # an encoder-decoder's cross-attention keys and values
            kv += closed_form_kv_bytes(config, spec.dtype, counts["source"], spec.batch_size) or 0
        kv_heads = model_dims(config)["kv_heads"] or 1
        kv = -(-kv // min(spec.tp, kv_heads))
        # a recurrent (SSM) state: per sequence, any context; its channels split over tp
        kv += -(-counts["state"] * spec.batch_size // spec.tp)
    return {
        "weights": _elements(shapes) * spec.dtype.itemsize + -(-counts["stored"] // spec.tp),
        "buffers": counts["buffers"],
        "inputs": counts["inputs"],
        "kv_cache": kv,
        "activation": counts["activation"],
    }


def _recurrent_state(model: nn.Module, config: Any, spec: _Spec) -> tuple[int, str | None]:
    """Bytes of recurrent state (Mamba's conv and SSM states) one sequence's cache holds, read
    as ``profile_generation``'s memory plan reads them from the cache built on meta (a state
    kept in float32 counts so); ``(0, why)`` when the cache could not be built."""
    if config is None or not _caches(model) or not _recurrent(model, config):
        return 0, None
    try:
        report = profile_generation(
            model, prompt_len=1, new_tokens=2, device="meta", dtype=spec.dtype, timing=False
        )
    except ModelProfError as e:
        return 0, f"no recurrent state read: its cache was not built on meta ({error_line(e)})"
    kv = report.kv
    return (kv.state_bytes // kv.batch_size if kv is not None else 0), None


def _source_tokens(model: nn.Module, config: Any, spec: _Spec) -> int:
    """An encoder-decoder's encoded tokens, which its cross-attention cache holds: ``context``
    token ids or Whisper's ``max_source_positions`` frames; 0 otherwise."""
    if not getattr(config, "is_encoder_decoder", False) or not _caches(model):
        return 0
    try:
        return source_length(model, {}, spec.context)
    except ModelProfError:  # a source fit cannot size (not token ids, no positions)
        return 0


def _caches(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes a KV cache (``_CACHE_ARGUMENTS``: every decoder and
    encoder-decoder does, an encoder such as ViT none; BERT's takes one that it keeps only
    as a decoder)."""
    if encoder_only(model):
        return False
    params = forward_parameters(model)
    if _CACHE_ARGUMENTS & set(params):
        return True
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if not takes_any or is_hf_model(model):  # a transformers model says for itself
        return False
    # a wrapper passing everything on (forward(*args, **kwargs)): the model it wraps decides
    inner = inner_hf_model(model)
    return inner is not None and bool(_CACHE_ARGUMENTS & set(forward_parameters(inner)))


def _training(plan: str, spec: _Spec, shapes: list, counts: dict[str, int]) -> dict[str, int]:
    """One training plan's components per rank: the weights of every floating parameter
    (ZeRO-3 shards frozen ones too, as FSDP does); master weights, gradients and optimizer
    state of the trained ones only."""
    stage = PLANS.index(plan) - 1  # data parallel 0, ZeRO-1 to 3
    trained = counts["trained"]

    def per_rank(of: list, sharded: bool, size: int) -> int:
        return size * _elements(of, spec.ranks if sharded else 1)

    b, state_size = spec.dtype.itemsize, 4 if spec.mixed else spec.dtype.itemsize
    return {
        "weights": per_rank(shapes, stage >= 3, b) + -(-counts["stored"] // spec.tp),
        "buffers": counts["buffers"],
        "inputs": counts["step_inputs"],
        "master_weights": per_rank(trained, stage >= 1, 4) if spec.mixed else 0,
        "gradients": per_rank(trained, stage >= 2, b),
        "optimizer_state": _state_bytes(spec, trained, stage >= 1, state_size),
        "saved_activations": -(-_saved(spec, counts) // spec.tp),
    }


def _saved(spec: _Spec, counts: dict[str, Any]) -> int:
    """The bytes saved for the backward under ``spec.checkpointing`` (Korthikanti et al.
    2022): ``none`` as counted; ``selective`` without the rows that ran attention as matmuls
    and a softmax (their T x T core is recomputed; a fused kernel does already); ``full`` each
    layer's input (s x b x h x bytes), what runs outside the layers as counted, and the
    largest layer's saved bytes, live while it is recomputed."""
    saved = counts["saved"]
    if spec.checkpointing == "selective":
        return saved - counts["saved_attention"]
    layers = counts.get("layer_saved") or []
    if spec.checkpointing != "full" or not layers or not counts.get("hidden"):
        return saved
    inputs = len(layers) * spec.batch_size * spec.context * counts["hidden"] * spec.dtype.itemsize
    return saved - sum(layers) + inputs + max(layers)


def _state_bytes(spec: _Spec, shapes: list, sharded: bool, state_size: int) -> int:
    """The optimizer's state per rank, sized from each shape (its shard when ``sharded``); the
    fixed bytes (Adam's ``step``) once per tensor, or once in all for a shared state (LBFGS)."""
    n = spec.ranks if sharded else 1
    total = fixed = 0
    for s in shapes:
        a, f = spec.optimizer.nbytes(_shard(s, n), state_size)
        total, fixed = total + a, max(f, fixed) if spec.optimizer.shared() else fixed + f
    return total + fixed


def _zero3_ranks(spec: _Spec, shapes: list, counts: dict[str, Any], memory: int) -> int | None:
    """The fewest data-parallel ranks above ``spec.ranks`` at which the ZeRO-3 plan fits
    ``memory`` (a binary search: its total only falls as ranks grow), or None when not even
    2**20 do."""

    def fits(n: int) -> bool:
        plan = _training(PLANS[-1], dataclasses.replace(spec, ranks=n), shapes, counts)
        return sum(plan.values()) <= memory

    if not fits(2**20):
        return None
    ranks = range(spec.ranks + 1, 2**20 + 1)
    return ranks[bisect.bisect_left(ranks, True, key=fits)]


def _way_forward(
    spec: _Spec, shapes: list, counts: dict[str, Any], table: pd.DataFrame
) -> tuple[str, ...]:
    """When no training plan fits: the ranks from which ZeRO-3 would (and with full
    checkpointing, when not asked and it would help), or why none would."""
    trained = [p for p in PLANS[1:] if p in table.columns]
    if not trained or table.loc["fits", trained].any():
        return ()
    memory = int(table.loc["memory", trained[0]])
    options = [spec] + (
        [dataclasses.replace(spec, checkpointing="full")]
        if spec.checkpointing == "none" and counts.get("layer_saved") and counts.get("hidden")
        else []
    )
    said = []
    for option in options:
        n = _zero3_ranks(option, shapes, counts, memory)
        how = "" if option is spec else " with checkpointing='full'"
        said.append(
            f"from {n} ranks{how} ({n * spec.tp} GPUs at tp={spec.tp})"
            if n is not None
            else f"at no number of ranks{how}: its saved activations alone are "
            f"{format_bytes(_saved(option, counts) / spec.tp)} a rank"
        )
    return (
        f"no training plan fits on {spec.ranks} rank{'s' if spec.ranks > 1 else ''}: ZeRO-3 (FSDP) "
        f"would fit {'; '.join(said)}; "
        + ("a larger tp or " if counts.get("sharded") else "")
        + "a smaller batch"
        + (" or context" if "context" in counts["fed"] else "")
        + " lower it too",
    )


def _checkpointing_note(spec: _Spec, counts: dict[str, Any]) -> str:
    """What ``checkpointing`` changed of the saved activations, in words."""
    if spec.checkpointing == "selective":
        return (
            f"selective checkpointing: the attention core is recomputed, "
            f"{format_bytes(counts['saved_attention'] / spec.tp)} of rows that ran attention "
            "as matmuls and a softmax not saved (a fused kernel recomputes it already)"
        )
    layers = counts.get("layer_saved") or []
    if not layers or not counts.get("hidden"):
        return "full checkpointing asked, but no repeated layers were found: saved as counted"
    return (
        f"full checkpointing: each of {len(layers)} layers saves its input, and the largest "
        f"layer's {format_bytes(max(layers) / spec.tp)} are live while it is recomputed"
    )


def _plan_notes(spec: _Spec, training: bool, counts: dict[str, Any]) -> list[str]:
    """The notes of the recurrent state, checkpointing and the ZeRO accounting."""
    notes: list[str] = []
    if counts["state"]:
        notes.append(
            f"kv_cache holds {format_bytes(counts['state'])} of recurrent (conv and SSM) state "
            "a sequence, the same at every context, read from the cache the model builds on "
            "meta as profile_generation's memory plan reads it"
            + (
                " (a 16-bit Mamba keeps its SSM state in float32 there, as transformers' "
                "scan computes it)"
                if spec.dtype.itemsize < 4
                else ""
            )
        )
    if counts["state_skipped"]:
        notes.append(counts["state_skipped"])
    if training and spec.checkpointing != "none":
        notes.append(_checkpointing_note(spec, counts))
    if training and spec.mixed:
        grads, gathered = counts["deepspeed"]
        notes.append(
            "the ZeRO columns follow the ZeRO paper (Rajbhandari et al. 2020); DeepSpeed's "
            f"estimators add an fp32 gradient partition at ZeRO-2 and 3 (+{format_bytes(grads)}"
            f" a rank here) and, at ZeRO-3, the largest layer gathered whole "
            f"(+{format_bytes(gathered)})"
        )
    return notes


def _notes(
    spec: _Spec, key: str, training: bool, counts: dict[str, Any], built: str | None
) -> tuple[str, ...]:
    """What the table assumes and leaves out, in words."""
    notes = [counts["skipped"]] if counts["skipped"] is not None else []
    if built is not None:
        notes.append(
            f"counted {built}, built from the config on meta (pass a module, on the command "
            "line file.py:FACTORY, to count another head or your own additions)"
        )
    notes.append(
        f"per rank: tensor parallel {spec.tp}, data parallel {spec.ranks}; "
        f"{spec.dtype}, {counts['fed']}"
        + (
            "; fp32 master weights and optimizer state (mixed precision)"
            if spec.mixed and training
            else ""
        )
    )
    notes += _plan_notes(spec, training, counts)
    if counts["stored"]:
        notes.append(
            f"{format_bytes(counts['stored'])} of weights are quantized or packed: counted as "
            "stored, in every plan, and neither trained nor sharded (no gradients, optimizer "
            "state or master copy)"
        )
    if counts["frozen"] and training:
        notes.append(
            f"{counts['frozen']} parameter tensors are frozen (requires_grad=False, as under an "
            "adapter): held as weights, without gradients, optimizer state or master copy"
        )
    if counts["saved_attention"]:
        notes.append(
            f"of the saved activations, {format_bytes(counts['saved_attention'] / spec.tp)} are in "
            "rows that ran attention as matmuls and a softmax, which keep the T x T probabilities "
            "(a fused attention kernel keeps Q, K, V, the output and the log-sum-exp instead)"
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
