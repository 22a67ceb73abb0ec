"""``profile_generation``: a language model as its users run it, counted per phase and layer,
measured end to end, its KV cache and memory, and bounded on a named device."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from modelprof.errors import ModelProfError, check_callback, check_flag, check_int
from modelprof.generation.bound import resolve_target
from modelprof.generation.cache import model_dims
from modelprof.generation.encoder import complete_encoder_inputs, is_encoder_decoder, source_length
from modelprof.generation.lm import LanguageModel, language_model, outputs_by_name
from modelprof.generation.memory import (
    MemoryPlan,
    activation_bytes,
    cache_terms,
    check_run_fits,
    weights_bytes,
)
from modelprof.generation.moe import moe_info
from modelprof.generation.phases import count_phases
from modelprof.generation.prompt import PromptInputs, prompt_inputs
from modelprof.generation.report import GenerationReport
from modelprof.generation.spec import GenerationSpec, counts_last_token
from modelprof.generation.timing import measure_generation
from modelprof.profile import profile
from modelprof.runtime import compat
from modelprof.runtime.env import collect_env
from modelprof.runtime.execution import RunMode, random_kept, running
from modelprof.runtime.guard import preserved_state
from modelprof.runtime.inputs import parse_device, parse_dtype
from modelprof.runtime.placement import meta_copy, model_placement
from modelprof.runtime.snapshot import snapshot_of
from modelprof.timing.options import (
    TimingOptions,
    check_option_names,
    keyword_names,
    warn_unused_without_timing,
)

__all__ = ["model_device_dtype", "profile_generation"]


def profile_generation(
    model: nn.Module | None = None,
    prompt_len: int | None = None,
    new_tokens: int = 32,
    batch_size: int | list[int] = 1,
    *,
    step: Any = None,
    inputs: Any = None,
    cache: Any = "dynamic",
    contexts: Any = None,
    device: Any = None,
    dtype: Any = None,
    timing: bool | None = None,
    layer_timing: bool = True,
    target: Any = None,
    seed: int = 0,
    options: TimingOptions | None = None,
    on_step: Callable[[str], None] | None = None,
    **timing_options: Any,
) -> GenerationReport:
    """Profile greedy generation of exactly ``new_tokens`` after a ``prompt_len`` prompt
    (default 128 tokens).

    ``model``: a HuggingFace causal LM (run by its own ``generate``; ``cache="dynamic"``,
    ``"static"``, or ``None`` to recompute the prefix every step), or with ``step(tokens, cache)
    -> (logits, cache)`` any model (``model`` then names the module whose layers get the rows).
    Per batch size (one or a list): the prefill and a decode step at each of ``contexts``
    (default: the first, middle and last step) counted per layer, timed per layer when
    ``layer_timing``; TTFT, TPOT, end to end and tokens/s over whole generations when ``timing``
    (default: unless ``device="meta"``). ``target="H100 SXM"``: the roofline bound of every row
    and phase at the model's dtype. ``inputs={...}``: the prompt's other keyword inputs
    (``pixel_values``) and its own ``input_ids``, for the prompt's forward only. Timing options
    as for ``profile``; ``on_step`` gets a line as each batch size is done. The model and its
    configs come back as they went in.
    """
    check_option_names(timing_options, own=_KEYWORDS)
    seed, on_step = check_int("seed", seed, 0), check_callback("on_step", on_step)
    opts = TimingOptions.parse(options, **timing_options)
    dev, dt = model_device_dtype(model, device, dtype)
    timing = check_flag("timing", dev.type != "meta" if timing is None else timing)
    check_flag("layer_timing", layer_timing)
    if timing and dev.type == "meta":
        raise ModelProfError(
            "device='meta' has no clock: pass timing=False to count from "
            "shapes alone (with target= for a device's roofline bound)"
        )
    if not timing:
        warn_unused_without_timing(timing_options)
    config = getattr(model, "config", None)
    given, prompt_len = prompt_inputs(inputs, model, step, prompt_len)
    encoded = step is None and is_encoder_decoder(model)
    spec = GenerationSpec.parse(
        prompt_len,
        new_tokens,
        batch_size,
        contexts,
        cache,
        max_positions=model_dims(config)["max_positions"],
        positions=_positions(config) if encoded else "positions",
        whole=counts_last_token(config),
    )
    source = source_length(model, given.extras, spec.prompt_len) if encoded else None
    check_run_fits(spec, model, dt, dev, source_len=source)
    peaks = resolve_target(target, dt)
    lm = language_model(model, step, spec.cache, dev, dt)
    if source is not None:
        given = PromptInputs(given.ids, complete_encoder_inputs(model, given.extras, source))
    lm.prompt_inputs = _checked_prompt(given, spec)
    if timing:
        _check_runnable(lm)
    guard = preserved_state(model) if model is not None else contextlib.nullcontext()
    # the configs, which a step function may change: put back as they were
    configs = [getattr(model, k, None) for k in ("config", "generation_config")]
    with (
        guard,
        snapshot_of(*configs),
        outputs_by_name(model) if lm.hf else contextlib.nullcontext(),
        compat.static_cache_per_run(model),
        running(lm.root, RunMode(device=dev)),
        random_kept(dev),
    ):
        return _run(lm, spec, opts, (timing, layer_timing), peaks, seed, on_step)


#: profile_generation()'s own keywords, for the nearest-name hint of a misspelt one
_KEYWORDS = keyword_names(profile_generation)


def _run(
    lm: LanguageModel,
    spec: GenerationSpec,
    opts: TimingOptions,
    timed: tuple[bool, bool],
    peaks: Any,
    seed: int,
    on_step: Callable[[str], None] | None,
) -> GenerationReport:
    """``timed``: (whole generations, per-layer passes)."""
    timing, layer_timing = timed
    say = on_step if on_step is not None else (lambda line: None)
    phases, timings = {}, {}
    for b in spec.batch_sizes:
        phases[b] = count_phases(lm, spec, b, seed, opts if timing and layer_timing else None)
        encoder = "encoder, " if lm.encoder is not None else ""
        say(
            f"batch {b}: {encoder}prefill and {len(spec.contexts)} decode steps "
            f"{'counted and timed per layer' if timing and layer_timing else 'counted'}"
        )
        if timing:
            timings[b] = measure_generation(lm, spec, b, opts, torch.Generator().manual_seed(seed))
            say(f"batch {b}: {timings[b].end_to_end.n} generations timed")
    first = phases[spec.batch_sizes[0]]
    # a static cache: the generation's, not the one of its own a context past it is counted on
    held = [p for p in first if p.name != "decode" or p.context not in spec.past_static_cache]
    kv = next((p.kv for p in reversed(held) if p.kv is not None), None)
    memory = _memory(lm, spec, first, kv)
    moe = None
    if lm.hf:
        prompt = lm.tokens(1, spec.prompt_len, torch.Generator().manual_seed(seed))
        # routing is read from a forward over the prompt's ids alone (no encoder-decoder)
        routed = lm.device.type != "meta" and lm.encoder is None
        moe = moe_info(lm.model, prompt if routed else None)
    env = collect_env(
        lm.device,
        lm.dtype,
        spec.batch_sizes[0],
        cache=spec.cache.value,
        generation=True,
        **opts.flags(),
    )
    dtype = str(lm.dtype).removeprefix("torch.")
    return GenerationReport(
        lm.name,
        spec,
        str(lm.device),
        dtype,
        phases,
        timings,
        kv,
        memory,
        peaks,
        moe,
        env,
        warn=opts.warn,
    )


def _memory(lm: LanguageModel, spec: GenerationSpec, phases: list, kv: Any) -> MemoryPlan:
    b = phases[0].batch_size
    act: dict[str, float] = {}
    for p in phases:  # by phase; decode: the largest step's
        act[p.name] = max(act.get(p.name, 0.0), activation_bytes(p.records) / b)
    states = kv.constant_bytes / kv.batch_size if kv is not None else 0.0
    terms = cache_terms(kv, lm.config, lm.dtype)
    # the plan's cache at prompt + new tokens, one more than a generation holds (the last token
    # is never fed), so at the positions' limit (spec.parse: p + n - 1) it is held at the limit
    limit = terms["max_positions"]
    context = spec.total_len if limit is None else min(spec.total_len, limit)
    # the ids a sequence holds, a token each: the prompt's the run fed (given ones as given)
    # joined by the decode steps' (random int64 ones), as generate() concatenates them
    gen = torch.Generator()
    ids = torch.promote_types(lm.prompt(b, 1, gen).dtype, lm.tokens(b, 1, gen).dtype)
    return MemoryPlan(
        weights_bytes(lm.model, lm.dtype),
        activation_per_seq_bytes=act,
        batch_size=b,
        context=context,
        state_per_seq_bytes=float(states),
        prompt_len=spec.prompt_len,
        ids_per_token_bytes=float(ids.itemsize),
        count_prefill=_prefill_counter(lm),
        **terms,
    )


def _prefill_counter(lm: LanguageModel) -> PrefillCounter | None:
    """A :class:`PrefillCounter` of ``lm``'s model, None for a step function or an
    encoder-decoder, fed otherwise, or a model that cannot be copied."""
    if not lm.hf or lm.encoder is not None:
        return None
    model = meta_copy(lm.model)
    return None if model is None else PrefillCounter(model, lm.dtype, lm.logits_to_keep)


class PrefillCounter:
    """One sequence's largest activation (one leaf call's inputs + outputs) in a prefill of a
    given number of tokens, counted on meta as ``fit`` counts it (token ids alone, the last
    token's logits where the forward can say so); None where that fails (a forward meta cannot
    run). ``model``: a copy on meta (the structure, no weights: a report keeps none alive, and
    pickles with it)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, logits_to_keep: bool) -> None:
        self.model, self.dtype, self.logits_to_keep = model, dtype, logits_to_keep

    def __call__(self, tokens: int) -> float | None:
        inputs: dict[str, Any] = {
            "input_ids": torch.zeros((1, tokens), dtype=torch.long, device="meta")
        }
        if self.logits_to_keep:
            inputs["logits_to_keep"] = 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (the run's own warnings were said)
                counted = profile(
                    self.model, inputs=inputs, device="meta", dtype=self.dtype, timing=False
                )
        except (ModelProfError, RuntimeError, NotImplementedError):
            return None
        return float(counted.memory.working_set_bytes)


def _positions(config: Any) -> str:
    """How an encoder-decoder's config names its decoder's positions, for an error."""
    name = next(
        (n for n in ("max_target_positions", "max_position_embeddings") if hasattr(config, n)), None
    )
    return f"decoder positions ({name})" if name else "decoder positions"


def _checked_prompt(given: PromptInputs, spec: GenerationSpec) -> PromptInputs:
    """No decode context may be shorter than a given prompt."""
    short = [c for c in spec.contexts if c < spec.prompt_len]
    if given.ids is not None and short:
        raise ModelProfError(
            f"contexts={list(spec.contexts)}: {short[0]} is shorter than the "
            f"prompt given in inputs= ({spec.prompt_len} tokens)"
        )
    return given


def model_device_dtype(model: Any, device: Any, dtype: Any) -> tuple[torch.device, torch.dtype]:
    """``device``/``dtype`` as asked, else the model's (else CPU and the default dtype)."""
    dev, dt = parse_device(device), parse_dtype(dtype)
    if isinstance(model, nn.Module) and next(iter(model.parameters()), None) is not None:
        m_dev, m_dt = model_placement(model)
        return dev or m_dev, dt or m_dt
    return dev or torch.device("cpu"), dt or torch.get_default_dtype()


def _check_runnable(lm: LanguageModel) -> None:
    """Generation is timed on the model as it is: its device and dtype (``runs_as_is``)."""
    if not lm.runs_as_is:
        m_dev, m_dt = model_placement(lm.model)
        asked = {"device": (lm.device, m_dev), "dtype": (lm.dtype, m_dt)}
        differ = {k: v for k, v in asked.items() if v[0] != v[1]} or asked
        said = " and ".join(f"{k}={a} (the model's: {m})" for k, (a, m) in differ.items())
        raise ModelProfError(
            f"{said}: timing runs the model as it is; move or cast it first (model.to(...)), "
            f"or pass timing=False to count at another {'/'.join(differ)}"
        )
