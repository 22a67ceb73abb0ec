"""The static pass: one forward under module hooks (scope) and the op counter (cost). The model
comes back as it went in (parameters, buffers, ``training`` flags; no hooks, nothing patched),
also when the forward raises or is interrupted."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from modelprof.counting.counter import OpCounter, OpStats
from modelprof.counting.formulas.quantized import held_packed_weights
from modelprof.counting.formulas.registry import FormulaRegistry
from modelprof.counting.meta_sdpa import FusedMetaSDPA, attention_as_on_cpu
from modelprof.counting.scope import CallRecord, Tracker
from modelprof.counting.sharding import ParamView
from modelprof.errors import ModelProfError
from modelprof.runtime import compat
from modelprof.runtime.compiled import eager_module, eager_view
from modelprof.runtime.device import MemoryStats
from modelprof.runtime.execution import RunMode, completed, running
from modelprof.runtime.failure import module_path
from modelprof.runtime.guard import preserved_state
from modelprof.runtime.hooks import module_hooks
from modelprof.runtime.inputs import ModelInputs, shape_as_inputs_hint, unread_key_hint
from modelprof.runtime.placement import refuse_valueless, runs_as_is
from modelprof.runtime.tensors import iter_tensors, shape_str

__all__ = ["TOKEN_IDS_ADVICE", "StaticResult", "analyze", "counted_module", "meta_attention"]

#: how an Embedding given floats is fed token ids (fit, which takes none of these, says its own)
TOKEN_IDS_ADVICE = (
    "for a language model pass inputs=modelprof.token_inputs(model, seq_len), "
    "--tokens N on the command line, or tokens = N in a sweep's grid"
)


@dataclasses.dataclass
class StaticResult:
    records: list[CallRecord]
    unsupported: Counter
    by_op: dict[str, OpStats]
    model_params: int  # every distinct parameter of the model, used or not
    # on meta: ops that raised and that the forward caught (taking another branch than a device)
    caught: tuple[str, ...] = ()


def _state_for(
    model: nn.Module, inputs: ModelInputs, mode: RunMode
) -> dict[str, torch.Tensor] | None:
    """Parameters/buffers to run with instead of the model's own, or None to run it as it is:
    converted copies for another device/dtype, buffers cloned in train mode (batch-norm running
    statistics of the user's model stay)."""
    dtype_requested, memory_format = mode.dtype, mode.memory_format
    convert = memory_format is not None or not runs_as_is(model, inputs.device, dtype_requested)
    if not convert and not mode.training:
        return None
    if convert:
        refuse_valueless(model, inputs.device)

    done: dict[int, torch.Tensor] = {}  # one converted tensor per original: ties stay tied

    def conv(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in done:
            cast = dtype_requested if t.is_floating_point() else None
            new = t.to(device=inputs.device, dtype=cast) if convert else t.clone()
            if (
                new.dtype == t.dtype
                and new.requires_grad != t.requires_grad
                and inputs.device.type == "meta"
                and not torch.is_inference_mode_enabled()
            ):
                # (on the model's device, ``to`` would have returned ``t`` itself: a meta
                # stand-in made under no_grad keeps its trainable flag, as ``t`` would)
                new.requires_grad_(t.requires_grad)
            if memory_format is not None and new.dim() == 4:
                new = new.contiguous(memory_format=memory_format)
            done[id(t)] = new
        return done[id(t)]

    params = model.named_parameters(remove_duplicate=False) if convert else ()
    return {n: conv(t) for n, t in (*params, *model.named_buffers(remove_duplicate=False))}


def counted_module(model: nn.Module, inputs: ModelInputs, amp: torch.dtype | None) -> nn.Module:
    """The module a counting pass runs (a ``torch.compile``'d model's original), after refusing
    ``amp`` on the meta device (autocast acts on real devices only)."""
    if amp is not None and inputs.device.type == "meta":
        raise ModelProfError(
            f"amp={amp} cannot be emulated on device='meta' (autocast acts on "
            "real devices only): count on 'cpu' with amp=, or pass dtype= to "
            "count the whole model in that dtype"
        )
    return eager_module(model)  # torch.compile'd: count the original module


def analyze(
    model: nn.Module,
    inputs: ModelInputs,
    mode: RunMode = RunMode(),
    registry: FormulaRegistry | None = None,
    watch: Any = None,
) -> StaticResult:
    """Run one forward of ``model`` on ``inputs`` as ``mode`` says (its ``amp`` and
    ``memory_format`` too: the forward the timed passes run) and return one record per module
    call. ``watch``: told of every tensor an op is about to write, before the write (a
    ``Snapshot`` taken with ``copy_on_write=True``)."""
    mode = mode.on(inputs.device)
    model = counted_module(model, inputs, mode.amp)
    # the guard (the caller's when profile() holds one) copies on first write before each op,
    # uncounted; its one walk of the model gives the names, parameters and packed weights too;
    # compiled modules run their eager code, which the hooks see (``eager_view``)
    with eager_view(model) as model, preserved_state(model) as guard:
        refuse_lazy(guard.lazy)
        names = guard.names
        tracker = Tracker(
            names,
            registry,
            memory_stats=MemoryStats.for_device(inputs.device),
            has_children=guard.has_children,
            parameters=guard.parameters,
            root=model,
        )
        tracker.param_view = view = ParamView.for_model(model, guard.parameters, names)
        counter = OpCounter(
            tracker,
            registry,
            before_op=guard.write_hook(*(() if watch is None else (watch,))),
            meta_sdpa=inputs.device.type == "meta",
        )
        try:
            state = _state_for(model, inputs, mode)
            if state is not None:  # the forward sees converted copies, not these parameters
                tracker.root_parameters = None
            with (
                running(model, mode, modules=list(names)),
                meta_attention(inputs.device, names, counter.meta_sdpa),
                module_hooks(model, tracker.pre, tracker.post, names, post_with_inputs=True),
                counter,
            ):
                if state is None:
                    output = model(*inputs.args, **inputs.kwargs)
                else:
                    output = torch.func.functional_call(
                        model, state, inputs.args, inputs.kwargs, strict=False, tie_weights=True
                    )
            completed(output)  # the collectives it started waited for, outside the counter
        except ModelProfError:
            raise
        except Exception as e:
            raise forward_error(e, tracker, inputs) from e
    records = tracker.final_records(model, inputs.args, inputs.kwargs, output)
    count = torch.Tensor.numel if view is None else view.count  # (guard.parameters are distinct)
    model_params = sum(map(count, guard.parameters)) + held_packed_weights(guard.script_attrs)[0]
    caught = tuple(counter.raised_on_meta)
    return StaticResult(records, counter.unsupported, counter.by_op, model_params, caught)


def meta_attention(
    device: torch.device, modules: Iterable[nn.Module], mode_on: bool
) -> contextlib.AbstractContextManager:
    """On meta, attention counted as the CPU runs it (``counting.meta_sdpa``; the SDPA mode
    unless ``mode_on`` says the counter enters it); elsewhere nothing. Entered before the module
    hooks, whose post hooks must see the outputs as the CPU's."""
    if device.type != "meta":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    if not mode_on:
        stack.enter_context(FusedMetaSDPA())
    stack.enter_context(attention_as_on_cpu(modules))
    return stack


def refuse_lazy(lazy: list[str], what: str = "parameters or buffers") -> None:
    """A forward would materialise lazy ``what`` (these names) in the model."""
    if lazy:
        raise ModelProfError(
            f"the model has uninitialised lazy {what} "
            f"({lazy[0]!r}{' and more' if len(lazy) > 1 else ''}): run one "
            "forward first, so that profiling does not materialise them in "
            "your model"
        )


def _embedding_hint(e: Exception, module: Any, inputs: ModelInputs, model: Any) -> str:
    """What an ``nn.Embedding`` that refused its input needed: integer ids below its rows; a
    ``model`` whose main input is ``input_ids`` (a transformers text model), given floats: ids."""
    ids = [t for t in iter_tensors((inputs.args, inputs.kwargs)) if not t.is_floating_point()]
    embeds = isinstance(module, nn.Embedding)
    if not ids and (embeds or getattr(model, "main_input_name", None) == "input_ids"):
        return (
            f" ({'an Embedding' if embeds else type(model).__name__} takes integer token ids, "
            f"and every input here is floating point: {TOKEN_IDS_ADVICE})"
        )
    dense = [t for t in ids if t.numel() and t.layout == torch.strided]
    if embeds and isinstance(e, IndexError) and dense and inputs.device.type != "meta":
        top = max(int(t.max()) for t in dense)
        return f" (the Embedding has {module.num_embeddings} rows; the integer inputs reach {top})"
    return ""


def _valueless_hint(e: Exception, inputs: ModelInputs, modules: Any) -> str:
    """A forward on meta that read a tensor's value (``.item()``, a data-dependent branch)."""
    if inputs.device.type != "meta" or "on meta tensors" not in str(e):
        return ""
    hf = any(type(m).__module__.startswith("transformers.") for m in modules)
    masked = hf and "attention_mask" in inputs.kwargs  # (an encoder has no cache to turn on)
    return (
        "\nhint: meta tensors have shapes but no values, and this model's code reads one; count "
        "it on the CPU (device='cpu', the same shapes)"
        + ("; the attention_mask given is read for its values (a padded one: an all-ones mask "
           "is left out on meta): leave it out to count full attention here" if masked else
           "; a transformers model's masks read values on meta without a cache: "
           "use_cache=True runs there" if hf else "")
    )  # fmt: skip


def _mode_or_dtype_hint(e: Exception, model: Any, inputs: ModelInputs) -> str:
    """What a forward needed that refused a batch of one in train mode (batch norm's statistics
    over the batch) or inputs of a floating dtype not its parameters'."""
    if "more than 1 value per channel when training" in str(e):
        return (
            "\nhint: the model ran in train mode (a training step or count: backward=True, "
            "training=True, fit's training plans), where batch norm takes its statistics over "
            "the batch and needs more than one value per channel: pass batch_size=2 or more "
            "(inputs given as tensors: a batch of 2 or more)"
        )
    held = (
        {p.dtype for p in model.parameters() if p.is_floating_point()}
        if model is not None
        else set()
    )
    given = {t.dtype for t in iter_tensors((inputs.args, inputs.kwargs)) if t.is_floating_point()}
    said = re.search(r"dtype|scalar type|Input type", str(e))
    if len(held) != 1 or not given or given == held or said is None:
        return ""
    want = str(next(iter(held))).removeprefix("torch.")
    got = " and ".join(sorted(str(d).removeprefix("torch.") for d in given))
    return (
        f"\nhint: the inputs are {got} and the model's parameters {want}: pass "
        f"dtype=torch.{want} (it casts the floating inputs, and parameters, to it), or cast the "
        "inputs or the model to match"
    )


def _hooked(e: Exception, running: list, done: list) -> Any:
    """The finished call whose forward hooks raised ``e``: the innermost module call ``e`` was
    raised in had returned (modelprof's hooks, global, run before a module's own); else None."""
    module = compat.innermost_call(e)
    if module is None or any(r.module_id == id(module) for r in running):
        return None
    return next((r for r in reversed(done) if r.module_id == id(module)), None)


def forward_error(e: Exception, tracker: Tracker, inputs: ModelInputs) -> ModelProfError:
    running, done = tracker.failure or (tracker.stack, tracker.finished)
    hooked = _hooked(e, running, done)
    if hooked is not None:  # that call did not finish: its hooks raised
        running, done = [*running, hooked], [r for r in done if r is not hooked]
    where, hint = "before any module ran", ""
    root = next((m for m, n in tracker.names.items() if n == ""), None)
    if running:
        inner = running[-1]
        module = next((m for m, n in tracker.names.items() if n == inner.name), None)
        # the hooks saw its positional inputs; its keyword ones (BertEmbeddings' input_ids=)
        keywords = compat.call_kwargs(e, module) if module is not None else {}
        shapes = [
            *("x".join(map(str, s)) for s in inner.input_shapes),
            *(f"{k}={shape_str(v)}" for k, v in keywords.items() if shape_str(v)),
        ]
        path = module_path([r.name for r in running])
        hook, after = ("a forward hook on ", ", after its forward returned") if hooked else ("", "")
        where = (
            f"in {hook}module {inner.name or '(root)'!r} ({inner.type}, input "
            f"{', '.join(shapes) or 'no tensors'}){after}; running: {path}"
        )
        hint = _embedding_hint(e, module, inputs, root)
        if not shapes:  # the module that failed was given no tensor: the ints?
            hint = shape_as_inputs_hint(e, inputs.args, inputs.kwargs) or hint
    hint = hint or unread_key_hint(root, inputs.kwargs) or _mode_or_dtype_hint(e, root, inputs)
    before = ", ".join(r.name or "(root)" for r in done[-8:])
    more = f"{len(done) - 8} more, then " if len(done) > 8 else ""
    ran = (
        f"; modules that ran before it: {more}{before}"
        if done
        else "; no module finished before it"
    )
    error = ModelProfError(
        f"the forward pass failed {where}{ran}. Inputs were "
        f"{shape_str((inputs.args, inputs.kwargs), dtypes=True) or 'no tensors'}. "
        f"{type(e).__name__}: {e}{hint}{compat.meta_failure_hint(e, inputs.device)}"
        f"{_valueless_hint(e, inputs, tracker.names)}"
    )
    error.in_forward = True  # the model's own forward failed (profile's batch hint reads it)
    return error
