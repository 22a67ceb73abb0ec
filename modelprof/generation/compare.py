"""``compare_generation``: language models generating side by side in interleaved rounds (a
block of every model per round, in a fresh random order, so the machine's drift reaches all
alike), with TTFT and TPOT ratios to the first model estimated, ranked and guarded as
``compare``'s ``latency_x`` (``stats.RATIO_ESTIMATOR``, ``timing.agreement.judge_ratio``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from modelprof.errors import ModelProfError, a_type, check_int
from modelprof.generation.cache import closed_form_kv_per_token, model_dims
from modelprof.generation.encoder import complete_encoder_inputs, source_length
from modelprof.generation.lm import language_model, outputs_by_name
from modelprof.generation.profile import model_device_dtype
from modelprof.generation.prompt import PromptInputs
from modelprof.generation.spec import GenerationSpec, counts_last_token
from modelprof.generation.timing import (
    generation_sampler,
    rate_flags,
    stable_flags,
    timing_from,
)
from modelprof.report.comparison import (
    Comparison,
    every_model_failed,
    note_failed,
    warn_failed,
)
from modelprof.runtime import compat
from modelprof.runtime.env import collect_env
from modelprof.runtime.execution import RunMode, running
from modelprof.runtime.guard import preserved_state
from modelprof.timing.agreement import judge_ratio
from modelprof.timing.interleave import (
    cpu_work_note,
    disagreeing,
    floor_notes,
    interval_columns,
    loaded_latency_notes,
    rough_flags,
    round_ratio,
    shaken_attrs,
    tied_ranks,
    unranked_note,
)
from modelprof.timing.measurement import Measurement, unquotable
from modelprof.timing.options import TimingOptions, check_option_names, keyword_names
from modelprof.timing.runner import Runner, sample_interleaved
from modelprof.timing.stats import RATIO_ESTIMATOR

__all__ = ["compare_generation"]


def compare_generation(
    models: Mapping[str, Any],
    prompt_len: int = 128,
    new_tokens: int = 32,
    batch_size: int = 1,
    *,
    cache: Any = "dynamic",
    seed: int = 0,
    baseline: str | None = None,
    options: TimingOptions | None = None,
    **timing_options: Any,
) -> Comparison:
    """One row per model (a :class:`~modelprof.report.comparison.Comparison`, so that
    ``.render.to_latex()`` and its siblings give the humanised table): TTFT, TPOT and
    end-to-end medians with intervals, tokens/s, counted decode MACs and KV bytes per token
    (self-attention's: a note names an encoder-decoder's cross-attention cache), and
    ``ttft_x``/``tpot_x`` ratios to ``baseline`` (default: the first model; one that fails: the
    first that ran) with ``*_ci_low``/``*_ci_high``; on the CPU each figure's CPU
    work beside it (``*_cpu_ms``, ``*_cpu_x``; ``wall_over_cpu``: the largest of the figures',
    ``loaded``: any of them). ``rank`` (1 = fastest end to end; ties where the rounds cannot
    order two) follows
    ``attrs["ranked_by"]``: CPU work on a loaded machine (``Measurement.loaded``) where it is
    one thread's (``cpu_holds``), else latency;
    none when a model is undersampled or the ranked ratio disagrees with its rounds
    (``<ratio>_rough``, ``attrs["notes"]``). ``models`` maps names to HuggingFace causal LMs or
    encoder-decoders (their encoder's inputs built from the config); a model that fails gets
    its error in its row, and a warning as in ``compare``."""
    if not isinstance(models, Mapping) or len(models) < 1:
        raise ModelProfError(
            f"models= must be a non-empty dict of name -> model, got {_described(models)}; name "
            "each, e.g. {'small': model_a, 'large': model_b}"
        )
    if isinstance(batch_size, (list, tuple)):  # every model's generations at one batch size
        raise ModelProfError(
            f"batch_size={batch_size!r}: compare_generation times the models at one batch size; "
            "call it once per batch size (profile_generation takes a list, one model's)"
        )
    batch_size, seed = check_int("batch_size", batch_size), check_int("seed", seed, 0)
    check_option_names(timing_options, own=_KEYWORDS)
    order = list(models)  # the rows'; the baseline is timed and judged first
    models = _baseline_first(models, baseline)
    opts = TimingOptions.parse(options, **timing_options)
    lms, failed = [], {}
    for name, value in models.items():
        try:
            lms.append(_prepared(name, value, prompt_len, new_tokens, batch_size, cache))
        except Exception as e:
            failed[name] = _error_text(e)
    while True:
        if not lms:
            raise every_model_failed(failed)
        try:
            runners, sampled = _sampled(lms, opts, batch_size, seed)
            break
        except _CandidateFailed as e:  # drop it, time the others again
            failed[e.name] = _error_text(e.__cause__)
            lms = [x for x in lms if x[0] != e.name]
    timings = [
        timing_from(runner, runner.run, s, spec)
        for s, runner, (_, _, spec, _) in zip(sampled, runners, lms)
    ]
    if opts.warn:  # as compare()'s: a row alone is easy to miss
        warn_failed(failed)
    df = _with_failed(_table(lms, timings, opts), failed, list(models)).reindex(order)
    name, lm, spec, _ = lms[0]  # the caption's: the baseline's run, as compare()'s
    env = collect_env(lm.device, dtype=lm.dtype, batch_size=batch_size)
    env["generation"] = f"{spec.prompt_len} prompt + {spec.new_tokens} new tokens"
    df.attrs.update(env=env, baseline=name)
    out = Comparison(df)
    out.attrs = dict(df.attrs)
    return out


def _baseline_first(models: Mapping[str, Any], baseline: Any) -> dict[str, Any]:
    if baseline is None:
        return dict(models)
    if not isinstance(baseline, str) or baseline not in models:
        raise ModelProfError(f"baseline={baseline!r} is not one of the models: {list(models)}")
    return {baseline: models[baseline], **{k: v for k, v in models.items() if k != baseline}}


#: compare_generation()'s own keywords, for the nearest-name hint of a misspelt one
_KEYWORDS = keyword_names(compare_generation)


def _described(models: Any) -> str:
    """``models`` as an error names it: its type, and each element's with its index (a model's
    repr runs to thousands of characters)."""
    if isinstance(models, Mapping):
        return "an empty dict"
    if not isinstance(models, (list, tuple)):
        return a_type(models)
    items = [f"[{i}] {type(m).__name__}" for i, m in enumerate(models[:8])]
    more = [f"... {len(models) - 8} more"] if len(models) > 8 else []
    return f"{a_type(models)} of {len(models)} ({', '.join([*items, *more])})"


def _prepared(
    name: str, value: Any, prompt_len: int, new_tokens: int, batch_size: int, cache: Any
) -> tuple:
    """(name, language model, spec, closed-form KV bytes per token) of one candidate."""
    model, step = value if isinstance(value, tuple) and len(value) == 2 else (value, None)
    dev, dt = model_device_dtype(model, None, None)
    config = getattr(model, "config", None)  # (None: every dimension and closed form None)
    positions = model_dims(config)["max_positions"]
    whole = counts_last_token(config)
    spec = GenerationSpec.parse(
        prompt_len, new_tokens, batch_size, None, cache, positions, whole=whole
    )
    lm = language_model(model, step, spec.cache, dev, dt)
    if lm.encoder is not None:  # an encoder-decoder's encoder inputs, from its config
        source = source_length(model, {}, spec.prompt_len)
        lm.prompt_inputs = PromptInputs(None, complete_encoder_inputs(model, {}, source))
    return name, lm, spec, closed_form_kv_per_token(config, dt)


class _CandidateFailed(Exception):
    """A candidate's generation raised (the cause: its error)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Generations(Runner):
    """One candidate's generations: warmed up and sampled block by block, a failure of its
    own raised as ``_CandidateFailed`` (its error the cause)."""

    def __init__(
        self, opts: TimingOptions, name: str, lm: Any, spec: GenerationSpec, batch: int, seed: int
    ) -> None:
        super().__init__(opts, lm.device, lm.name, batch)
        self.name = name
        self.run = generation_sampler(lm, spec, batch, torch.Generator().manual_seed(seed))

    def __enter__(self) -> _Generations:
        with _named(self.name):
            return super().__enter__()

    def warm(self) -> float | None:
        with _named(self.name):
            est = self.warm_with(self.run)
        self.run.clear()
        return est

    def sample_block(self, k: int) -> Any:
        with _named(self.name):
            return self.run.block(k)


def _sampled(lms: list, opts: TimingOptions, batch_size: int, seed: int) -> tuple:
    """Every candidate warmed up, then sampled in interleaved rounds; (runners, sampled)."""
    runners = [_Generations(opts, name, lm, spec, batch_size, seed) for name, lm, spec, _ in lms]
    with contextlib.ExitStack() as stack:
        for context in (
            [preserved_state(lm.root) for _, lm, _, _ in lms]
            + [outputs_by_name(lm.model) for _, lm, _, _ in lms if lm.hf]
            + [compat.static_cache_per_run(lm.model) for _, lm, _, _ in lms if lm.hf]
            + [running(lm.root, RunMode(device=lm.device)) for _, lm, _, _ in lms]
        ):
            stack.enter_context(context)
        sampled = sample_interleaved(runners, opts, "generations compared")
    return runners, sampled


@contextlib.contextmanager
def _named(name: str) -> Any:
    try:
        yield
    except _CandidateFailed:
        raise
    except Exception as e:  # (a KeyboardInterrupt is no Exception: it stops the comparison)
        raise _CandidateFailed(name) from e


def _error_text(e: BaseException | None) -> str:
    """A failure as its row says it: modelprof's own sentence, else the type and message."""
    if isinstance(e, ModelProfError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def _with_failed(df: pd.DataFrame, failed: dict[str, str], order: list[str]) -> pd.DataFrame:
    """``df`` with a row per failed model, in the order given, its error in ``error``."""
    if not failed:
        return df
    out = df.reindex(order)
    out["error"] = pd.Series(failed, dtype=object).reindex(order)
    out.index.name = df.index.name
    out.attrs = dict(df.attrs)
    first = [f"the ratios are to {df.index[0]}, the first model that ran"]
    note_failed(out.attrs, failed, *(first if order[0] in failed else ()))
    return out


def _ratio(
    name: str, m: Measurement | None, base: Measurement | None, confidence: float, unranked: bool
) -> dict[str, float]:
    """``name``: ``median(m) / median(base)``, ``name_ci_low``/``_ci_high``: the paired interval
    of the rounds both took; NaN when unranked; none when either was not measured."""
    if m is None or base is None:
        return {}
    ratio = (math.nan,) * 3 if unranked else round_ratio(m, base, confidence)
    return interval_columns(name, ratio)


def _measured(t: Any) -> list[Measurement]:
    return [m for m in (t.end_to_end, t.ttft, t.tpot) if m is not None]


def _cpu_columns(t: Any, base: Any, confidence: float, unranked: bool) -> dict[str, Any]:
    """On the CPU: wall/CPU and the CPU ratios (each figure's CPU work, median and interval,
    is in the timing's summary)."""
    if t.end_to_end.cpu is None:
        return {}
    out: dict[str, Any] = {}
    for kind in ("ttft", "tpot"):
        m, base_m = getattr(t, kind), getattr(base, kind)
        if m is not None and m.cpu is not None:
            base_cpu = getattr(base_m, "cpu", None)
            out.update(_ratio(f"{kind}_cpu_x", m.cpu, base_cpu, confidence, unranked))
    out["wall_over_cpu"] = max(m.wall_over_cpu for m in _measured(t))
    out["loaded"] = any(m.loaded for m in _measured(t))
    return out


def _checks(lms: list, timings: list, unranked: bool) -> dict[str, list]:
    """Each model's ratios to the first judged against its per-round ratios (``judge_ratio``)."""
    if unranked:
        return {}
    base_name, base = lms[0][0], timings[0]
    out: dict[str, list] = {}
    for (name, *_), t in zip(lms[1:], timings[1:]):
        found = out.setdefault(name, [])
        for kind in ("ttft", "tpot", "end_to_end"):
            m, b = getattr(t, kind), getattr(base, kind)
            if m is None or b is None:
                continue
            found.append(judge_ratio(f"{kind}_x", name, base_name, m, b))
            if m.cpu is not None and b.cpu is not None:
                found.append(judge_ratio(f"{kind}_cpu_x", name, base_name, m.cpu, b.cpu))
    return out


def _table(lms: list, timings: list, opts: TimingOptions) -> pd.DataFrame:
    rows = []
    base = timings[0]
    # a model's generations, TTFT or TPOT too few for an interval (or below the floor)
    short = [any(m.undersampled for m in _measured(t)) for t in timings]
    unranked = unranked_note(
        {name: t.end_to_end.n for (name, *_), t, s in zip(lms, timings, short) if s}
    )
    checks = _checks(lms, timings, bool(unranked))
    ratio_args = (opts.stop.confidence, bool(unranked))
    for (name, lm, spec, kv), t in zip(lms, timings):
        row = {
            "model": name,
            **{k: v for k, v in t.summary().items() if k not in ("prompt_len", "new_tokens")},
            "kv_bytes_per_token": kv,
        }
        for kind in ("ttft", "tpot"):
            row.update(_ratio(f"{kind}_x", getattr(t, kind), getattr(base, kind), *ratio_args))
        row.update(_cpu_columns(t, base, *ratio_args))
        rough_flags(checks.get(name, []), row, ("ttft_x", "tpot_x", "ttft_cpu_x", "tpot_cpu_x"))
        row.update({f"{kind}_rough": bool(why) for kind, why in _unquotable(t).items()})
        row.update(rate_flags(row))  # tokens/s: rough with the TPOT or end to end it is over
        rows.append(row)
    df = stable_flags(pd.DataFrame(rows)).set_index("model")
    measured = [m for t in timings for m in _measured(t)]
    # ranked by CPU work when every figure has one thread's CPU time and any was loaded
    on_cpu = all(m.cpu_holds for m in measured) and any(m.loaded for m in measured)
    notes = [f"ttft_x, tpot_x: {RATIO_ESTIMATOR}", *_cross_attention_note(lms)]
    notes += floor_notes(t.end_to_end for t in timings)
    df.attrs.update(ratio_estimator=RATIO_ESTIMATOR, ranked_by="cpu_work" if on_cpu else "latency")
    ranking = "end_to_end_cpu_x" if on_cpu else "end_to_end_x"
    disagreeing(checks, ranking, "the end-to-end time", df.attrs, notes, opts.warn)
    df["rank"] = pd.array([pd.NA] * len(df), dtype="Int64")
    if not unranked and "ratios_disagree" not in df.attrs:  # a tie where rounds cannot order two
        ends = {name: t.end_to_end for (name, *_), t in zip(lms, timings)}
        figures = {n: m.cpu if on_cpu else m for n, m in ends.items()}
        ranks, tied = tied_ranks(figures, ends if on_cpu else None)  # loaded: the wall's too
        df["rank"] = pd.array([ranks[name] for name in df.index], dtype="Int64")
        notes += [tied] if tied else []
        if tied:  # the caption's too
            df.attrs["tied"] = tied
    if unranked:
        df.attrs["unranked"] = unranked
        notes.append(unranked)
    elif on_cpu:
        advice = "ttft_cpu_x and tpot_cpu_x are not stretched by waiting for a core. "
        notes.append(cpu_work_note(measured, what="generation", advice=advice))
    else:
        notes += loaded_latency_notes(measured)
    by_model = {name: _measured(t) for (name, *_), t in zip(lms, timings)}
    df.attrs.update(shaken_attrs(by_model, loaded=not on_cpu and not unranked))
    df.attrs["notes"] = notes
    said = {
        f"{name} {_FIGURE_NAMES[kind]}": why
        for (name, *_), t in zip(lms, timings)
        for kind, why in _unquotable(t).items()
        if why
    }
    if said:  # for the caption: which figures are marked ~, and why
        df.attrs["unquotable_generation"] = said
    return df


def _cross_attention_note(lms: list) -> list[str]:
    """The note that ``kv_bytes_per_token`` leaves out the encoder-decoders' cross-attention
    cache (T5's read as GPT-2's, though it holds as much again per source token)."""
    crossed = [name for name, lm, *_ in lms if getattr(lm, "encoder", None) is not None]
    return [
        f"kv_bytes_per_token: the decoder's self-attention cache; {', '.join(crossed)} also "
        "keep a cross-attention cache of the encoded source, fixed at its length, not in it "
        "(profile_generation(...).kv.cross_bytes)"
    ] * bool(crossed)


_FIGURE_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "end_to_end": "end to end"}


def _unquotable(t: Any) -> dict[str, str | None]:
    """Why each of a model's measured TTFT, TPOT and end to end is no figure to quote, as a
    report's summary flags them (``ttft_rough``...: :func:`unquotable`, read on a loaded machine
    or from too few runs); None where it is one."""
    measured = {kind: getattr(t, kind) for kind in _FIGURE_NAMES}
    return {k: "; ".join(unquotable(m)) or None for k, m in measured.items() if m is not None}
