"""Rendering of a comparison (``modelprof.compare``, a numeric frame: one row per model, ``*_x``
ratios to the baseline): which columns a readable table shows, its caption, its export."""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from modelprof.errors import ModelProfError
from modelprof.render.formats import get_format
from modelprof.render.latex import latex_columns
from modelprof.render.options import ViewOptions, check_read_by
from modelprof.render.views import default_priority

__all__ = [
    "env_caption",
    "COMPACT_COMPARE_COLUMNS",
    "compact_compare_columns",
    "compare_caption",
    "input_caption",
    "compare_legend",
    "brief_error",
    "export_comparison",
    "failed_note",
    "rank_header",
]

COMPACT_COMPARE_COLUMNS: tuple[str, ...] = tuple(
    """model source input_shape device dtype params macs flops step_flops latency_median_ms
    latency_ci_low_ms latency_ci_high_ms cpu_work_median_ms fps throughput_samples_per_s
    throughput_batch_size params_x macs_x latency_x latency_x_ci_low latency_x_ci_high
    cpu_work_x cpu_work_x_ci_low cpu_work_x_ci_high throughput_x backward_latency_median_ms
    backward_latency_x
    backward_latency_x_ci_low backward_latency_x_ci_high backward_cpu_work_median_ms
    backward_cpu_work_x backward_cpu_work_x_ci_low backward_cpu_work_x_ci_high
    step_latency_median_ms step_latency_x step_latency_x_ci_low step_latency_x_ci_high ttft_ms
    ttft_ci_low_ms ttft_ci_high_ms tpot_ms tpot_ci_low_ms tpot_ci_high_ms end_to_end_ms
    end_to_end_ci_low_ms end_to_end_ci_high_ms tokens_per_s ttft_x ttft_x_ci_low ttft_x_ci_high
    tpot_x tpot_x_ci_low tpot_x_ci_high ttft_cpu_x ttft_cpu_x_ci_low ttft_cpu_x_ci_high
    tpot_cpu_x tpot_cpu_x_ci_low tpot_cpu_x_ci_high rank step_rank error""".split()
)
"""What a readable comparison (``compare``'s, ``compare_generation``'s) shows by default:
medians and ratios with their 95 % intervals, the CPU work only when the comparison ranks by
it (a training step's backward: when its note says to read it, ``attrs["backward_by"]``); the
rest with ``columns="all"``."""

#: a ratio's flag (it disagrees with its per-round ratios), shown where one is set
_ROUGH_RATIO_COLUMNS = tuple(
    f"{r}_rough"
    for r in """latency_x cpu_work_x backward_latency_x backward_cpu_work_x step_latency_x ttft_x
    tpot_x ttft_cpu_x tpot_cpu_x""".split()
)

_TIMED_RATIOS = frozenset(r.removesuffix("_rough") for r in _ROUGH_RATIO_COLUMNS)

_CPU_WORK_COLUMNS = frozenset(c for c in COMPACT_COMPARE_COLUMNS if "cpu" in c.split("_"))

# LaTeX keeps these longest when a comparison must lose columns to fit the page: a paper's
# efficiency table's params and MACs, the medians (a training step's whole step and backward
# before its forward's; up to the "|", what it keeps stepping down to \footnotesize), the FLOPs,
# the ranks, the ratios, then the intervals and the rest
_LATEX_PRIORITY = default_priority(
    """model params macs step_latency_median_ms backward_latency_median_ms latency_median_ms
    ttft_ms tpot_ms end_to_end_ms | flops step_flops backward_cpu_work_median_ms
    cpu_work_median_ms step_rank rank step_latency_x backward_cpu_work_x backward_latency_x
    cpu_work_x latency_x ttft_x tpot_x ttft_cpu_x tpot_cpu_x latency_ci_low_ms
    latency_ci_high_ms latency_x_ci_low latency_x_ci_high cpu_work_x_ci_low cpu_work_x_ci_high
    macs_x params_x fps throughput_samples_per_s throughput_x tokens_per_s ttft_x_ci_low
    ttft_x_ci_high tpot_x_ci_low tpot_x_ci_high"""
)

#: The caption's short word on how the ratios are estimated (attrs["ratio_estimator"] in full).
RATIO_NOTE_SHORT = "ratios: ratio of medians"
RATIO_NOTE = f"{RATIO_NOTE_SHORT}, 95 % CI paired by round"


def _latex_priority(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """:data:`_LATEX_PRIORITY`, with the CPU work's median and ratio in their place (each beside
    the wall clock's) where the table ranks by them (its notes tell the reader to quote them),
    the backward's where its note says to read it; after every other column elsewhere."""
    said = {"": attrs.get("ranked_by") == "cpu_work" and not attrs.get("unranked")}
    said["backward_"] = attrs.get("backward_by") == "cpu_work"
    unsaid = [f"{phase}{c}" for phase, read in said.items() if not read for c in _CPU_FIGURES]
    return (*(c for c in _LATEX_PRIORITY if c not in unsaid), *unsaid)


_CPU_FIGURES = ("cpu_work_median_ms", "cpu_work_x")


def compact_compare_columns(df: pd.DataFrame) -> list[str]:
    """The :data:`COMPACT_COMPARE_COLUMNS` that ``df`` has (the index counts as ``model``), a set
    ratio flag before ``rank``."""
    present = set(map(str, df.columns)) | {str(df.index.name)}
    cpu = df.attrs.get("ranked_by") == "cpu_work"
    backward = cpu or df.attrs.get("backward_by") == "cpu_work"
    shown = [
        c
        for c in COMPACT_COMPARE_COLUMNS
        if c in present
        and (c not in _CPU_WORK_COLUMNS or (backward if c.startswith("backward_") else cpu))
    ]
    flags = [c for c in _ROUGH_RATIO_COLUMNS if c in present and df[c].fillna(False).any()]
    at = shown.index("rank") if "rank" in shown else len(shown)
    return shown[:at] + flags + shown[at:]


def _default_columns(df: pd.DataFrame, raw: bool = False) -> list[str] | str:
    """The columns a comparison shows unless told (:func:`compact_compare_columns`; ``raw``:
    those of its columns, the index aside); every one (``"all"``) where it has none of them
    but ``model`` (a selection of other columns, a transposed table)."""
    shown = [c for c in compact_compare_columns(df) if not raw or c in df.columns]
    return shown if set(shown) & set(map(str, df.columns)) else "all"


def env_caption(env: Mapping[str, Any]) -> str:
    """``cpu (AMD EPYC), float32, batch 1, torch 2.x`` from whatever keys the env has; the
    dtype as a comparison's models' reports word it where it has them (``dtype_words``:
    ``float32 under bfloat16 autocast``, where ``dtype`` is the autocast's)."""
    parts = []
    device = env.get("device")
    name = env.get("device_name")
    if device is not None:
        parts.append(f"{device} ({name})" if name and name != device else str(device))
    elif name:
        parts.append(str(name))
    dtype = "dtype_words" if env.get("dtype_words") else "dtype"
    keys = ("generation", ""), (dtype, ""), ("batch_size", "batch "), ("torch_version", "torch ")
    for key, label in keys:
        if env.get(key) is not None:
            parts.append(f"{label}{str(env[key]).removeprefix('torch.')}")
    return ", ".join(parts)


def compare_caption(
    attrs: Mapping[str, Any],
    shown: Collection[str] | None = None,
    inputs: Mapping[str, Any] | pd.Series | None = None,
    table: pd.DataFrame | None = None,
) -> str:
    """``baseline resnet18; input 1x3x224x224; cpu (AMD EPYC), float32, batch 1, torch 2.x``,
    then how the ratios are estimated and what the rank follows (:func:`compare_legend`), or
    that latency was not measured; the rows that failed. ``shown``: the columns a table keeps,
    where it keeps fewer (a LaTeX table fitted to the page): their intervals only if shown.
    ``inputs``: each model's input shape (the table's ``input_shape`` column, None where it
    has none: a generation comparison's; see :func:`input_caption`). ``table``: the frame,
    whose per-row ``source``, ``device`` and ``dtype`` the caption says where ``shown`` leaves
    them out."""
    env = env_caption(attrs.get("env") or {})
    baseline = attrs.get("baseline")
    parts = [f"baseline {baseline}"] if baseline is not None else []
    said = input_caption({} if inputs is None else inputs, shown)
    parts += ([said] if said else []) + ([env] if env else [])
    for column in (
        "source",
        "device",
        "dtype",
    ):  # each row's, where the table has it but leaves it out
        if table is not None and column in table.columns and column not in (shown or [column]):
            rows = ", ".join(f"{n} = {v}" for n, v in table[column].items() if isinstance(v, str))
            parts.append(f"{column}s: {rows}")
    legend = compare_legend(attrs, shown)
    parts += [legend] if legend else []
    if baseline is not None and not attrs.get("unranked") and attrs.get("ranked_by") is None:
        parts.append("latency not measured (timing off)")
    counts = attrs.get("training_counts")
    if counts:  # compare(backward=True): a paper table says it too
        parts.append(
            "MACs, FLOPs and bytes: the model's forward; step FLOPs: forward, loss"
            + (", backward and optimizer step" if counts == "optimizer" else " and backward")
        )
    failed = attrs.get("failed") or {}
    parts += [failed_note(n) for n in failed] if _error_shown(shown) else _failures(attrs)
    return "; ".join(parts)


def _error_shown(shown: Collection[str] | None) -> bool:
    return shown is None or "error" in shown


def _failures(attrs: Mapping[str, Any]) -> list[str]:
    """Why each failed model's row is empty, where the table leaves out its ``error`` column
    (a page drops it first): as briefly as a caption can say it (:func:`brief_error`)."""
    failed = attrs.get("failed") or {}
    return [f"{n} failed and is not compared: {brief_error(e)}" for n, e in failed.items()]


def failed_note(name: str) -> str:
    """What a comparison's notes (and a caption over its ``error`` column) say of a model that
    failed: its row is empty, and the column says why."""
    return f"{name} failed and is not compared (its error column says why)"


#: the exception a failure's message ends with (``RuntimeError: mat1 and mat2 shapes ...``)
_RAISED = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Interrupt): ")
_BRIEF_CHARS = 100


def brief_error(error: str, limit: int = _BRIEF_CHARS) -> str:
    """A failure's message for a caption: the exception it ends with, without the module path,
    inputs and hints before and after it (``RuntimeError: mat1 and mat2 shapes cannot be
    multiplied (192x64 and 10x10)``), its first line otherwise; over ``limit`` characters cut at
    a word, ``...`` after it."""
    line = str(error).strip().split("\n", 1)[0]
    raised = _RAISED.search(line)  # (the first: its message may name another)
    text = line[raised.start() :] if raised else line
    if len(text) <= limit:
        return text
    head = text[: limit - 3]
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(" ,;:.(") + "..."


def input_caption(
    inputs: Mapping[str, Any] | pd.Series, shown: Collection[str] | None = None
) -> str:
    """``input 1x3x64x64`` where every model that has one was fed that shape (the counts
    depend on it, as a report's caption says its input); where they differ, each model's
    (``inputs 1x3x64x64 (resnet18), 1x3x224x224 (vit)``) unless the table shows its
    ``input_shape`` column; nothing where no model has one (a failed model's is missing)."""
    given = {str(n): str(s) for n, s in inputs.items() if isinstance(s, str) and s}
    shapes = list(dict.fromkeys(given.values()))
    if len(shapes) == 1:
        return f"input {shapes[0]}"
    if not shapes or (shown is not None and "input_shape" in shown):
        return ""
    return "inputs " + ", ".join(f"{s} ({n})" for n, s in given.items())


def compare_legend(attrs: Mapping[str, Any], shown: Collection[str] | None = None) -> str:
    """The caption's account of the timing: how the ratios are estimated, what the rank
    follows, what made it less sure (a loaded machine, drift, ties); what a caption of the
    user's own keeps. ``shown``: as :func:`compare_caption`'s."""
    parts: list[str] = []
    ranked_by = attrs.get("ranked_by")
    if attrs.get("unranked"):
        parts.append("not ranked: too few runs for an interval")
    elif ranked_by is not None:
        intervals = shown is None or any("_x_ci_" in c for c in shown)
        ratios = shown is None or bool(_TIMED_RATIOS & set(shown))
        if ratios:
            parts.append(RATIO_NOTE if intervals else RATIO_NOTE_SHORT)
        if attrs.get("rough_ratios"):  # compare: a ratio of medians its rounds disagree with
            parts.append(
                "rough, the ratio of medians outside its per-round ratios' interval: "
                + ", ".join(attrs["rough_ratios"])
            )
        if attrs.get("ratios_disagree"):
            parts.append(str(attrs["ratios_disagree"]))
        if ranked_by == "cpu_work":
            why = attrs.get("ranked_by_why", "the machine was loaded")
            parts.append(
                f"ranked by CPU work: {why}; CPU work equals latency "
                "only for a single-threaded model on an idle core"
            )
        if attrs.get("backward_by") == "cpu_work":  # why the backward's CPU work is shown
            parts.append(
                "training steps on a loaded machine: the backward's CPU work beside its wall clock"
            )
        if attrs.get("loaded"):
            moved = "the ratios moved with it" if ratios else "the latencies moved with it"
            parts.append(f"timed on a loaded machine ({attrs['loaded']}): {moved}")
        if attrs.get("drifted"):
            parts.append(f"drifted while timed: {', '.join(attrs['drifted'])}")
        if attrs.get("tied") and (shown is None or "rank" in shown):
            parts.append(str(attrs["tied"]))
        if attrs.get("step_tied") and (shown is None or "step_rank" in shown):
            parts.append(str(attrs["step_tied"]))
    return "; ".join(parts + _marked(attrs, shown))


#: the columns a model's ``latency_rough`` marks (``fps``: 1 / its median)
_LATENCY_FIGURES = frozenset(
    """latency_median_ms latency_ci_low_ms latency_ci_high_ms latency_p90_ms latency_std_ms
    fps""".split()
)

#: the columns a generation comparison's ``ttft_rough``, ``tpot_rough`` and
#: ``end_to_end_rough`` mark, with the tokens/s computed from them (``tokens_per_s_rough``...)
_GENERATION_FIGURES = frozenset(
    [
        *(
            f"{kind}{suffix}"
            for kind in ("ttft", "tpot", "end_to_end")
            for suffix in ("_ms", "_ci_low_ms", "_ci_high_ms")
        ),
        *"tokens_per_s batch_tokens_per_s end_to_end_tokens_per_s".split(),
    ]
)

#: the columns a training step's ``backward_latency_rough``, ``step_latency_rough`` and
#: ``optimizer_latency_rough`` mark (compare(backward=True))
_STEP_FIGURES = frozenset(
    """backward_latency_median_ms backward_latency_ci_low_ms backward_latency_ci_high_ms
    step_latency_median_ms optimizer_latency_median_ms""".split()
)


def _marked(attrs: Mapping[str, Any], shown: Collection[str] | None) -> list[str]:
    """What the ``~`` on a model's latency and throughput mean, where a table shows them: its
    wall-clock median is no figure to quote (as a report's end-to-end row says it; a training
    step's backward and step medians by the same rule), its best throughput point was loaded or
    slower than a bigger batch."""
    out = []
    unquotable = attrs.get("unquotable") or {}
    if unquotable and (shown is None or _LATENCY_FIGURES & set(shown)):
        by_reason: dict[str, list[str]] = {}
        for name, why in unquotable.items():
            by_reason.setdefault(why, []).append(name)
        said = "; ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items())
        out.append(f"latency marked ~ is no figure to quote: {said}")
    figures = attrs.get("unquotable_generation") or {}  # compare_generation's, by one rule
    if figures and (shown is None or _GENERATION_FIGURES & set(shown)):
        said = "; ".join(f"{what} ({why})" for what, why in figures.items())
        out.append(
            f"TTFT, TPOT and end to end marked ~ are no figure to quote: {said}; nor is a "
            "tokens/s over one of them"
        )
    step = attrs.get("unquotable_step") or {}
    if step and (shown is None or _STEP_FIGURES & set(shown)):  # by the forward's rule
        said = "; ".join(f"{what} ({why})" for what, why in step.items())
        out.append(f"training-step medians marked ~ are no figure to quote: {said}")
    tp = attrs.get("rough_throughput")
    if tp and (shown is None or {"throughput_samples_per_s", "throughput_x"} & set(shown)):
        out.append(
            f"throughput marked ~ is rough: {', '.join(tp)} (its best batch size read on a "
            "loaded machine or slower than a bigger one)"
        )
    return out


def rank_header(attrs: Mapping[str, Any], column: str = "rank") -> str:
    """The ``rank`` (or ``step_rank``: a training step's) column's human header, saying which
    way it runs."""
    if column == "step_rank":
        by = "CPU work" if attrs.get("step_ranked_by") == "cpu_work" else "latency"
        return f"step rank (1 = lowest step {by})"
    by = "CPU work" if attrs.get("ranked_by") == "cpu_work" else "latency"
    if (attrs.get("env") or {}).get("generation"):  # compare_generation ranks whole generations
        by = f"end-to-end {by}"
    return f"rank (1 = lowest {by})"


def _rank_said(df: pd.DataFrame, columns: Any) -> tuple[pd.DataFrame, Any]:
    """A copy of ``df`` with its ``rank`` and ``step_rank`` columns headed by
    :func:`rank_header`."""
    headers = {c: rank_header(df.attrs, c) for c in ("rank", "step_rank") if c in df.columns}
    if not headers:
        return df, columns
    out = df.rename(columns=headers)
    out.attrs = dict(df.attrs)
    if isinstance(columns, str) or columns is None:
        return out, columns
    return out, [headers.get(c, c) for c in columns]


def _check_columns(df: pd.DataFrame) -> None:
    """A comparison's exporters read one column per name: a table with two of a name (two
    tables side by side) or with MultiIndex columns is refused, naming them."""
    if isinstance(df.columns, pd.MultiIndex):
        raise ModelProfError(
            "a comparison's exporters need one level of column names, not "
            f"{df.columns.nlevels} (MultiIndex columns): flatten them first (df.columns = [...])"
        )
    unnamed = [c for c in df.columns if not isinstance(c, str)]
    if unnamed:  # (a transposed table's model numbers)
        raise ModelProfError(
            f"a comparison's exporters read columns by name; {unnamed[:3]} are not names "
            "(a transposed or reindexed table): give them names first (df.columns = [...])"
        )
    twice = sorted({str(c) for c in df.columns[df.columns.duplicated()]})
    if twice:
        raise ModelProfError(
            f"a comparison's exporters need one column per name; {twice} appear more than "
            "once: rename or drop the copies first"
        )


def _shown(df: pd.DataFrame, columns: Iterable[str] | str) -> list[str]:
    """The columns a human table of ``df`` shows for ``columns`` (``"all"``: every one), the
    index (``model``) among them."""
    if isinstance(columns, str):
        picked = list(map(str, df.columns)) if columns == "all" else [columns]
    else:
        picked = list(columns)
    return [str(df.index.name), *picked]


def _raw_columns(df: pd.DataFrame, name: str, columns: Any) -> Any:
    """A raw format's columns: the compact ones for ``"compact"``; in a CSV of a comparison in
    which a model failed, its ``error`` column too (a CSV holds no dtypes: it is what tells
    ``read_csv`` that the whole numbers are Int64 and the flags True/False/None, as in the
    table, a table filtered to the models that ran included)."""
    if isinstance(columns, str) and columns == "compact":
        columns = _default_columns(df, raw=True)
    if name != "csv" or "error" not in df.columns or columns is None or columns == "all":
        return columns
    picked = [columns] if isinstance(columns, str) else list(columns)
    return picked if "error" in picked else [*picked, "error"]


def export_comparison(
    df: pd.DataFrame,
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    columns: Iterable[str] | str | None = None,
    **view: Any,
) -> str | Path:
    """The comparison in a registered format: human formats show the compact columns unless
    ``columns`` says, :func:`compare_caption` as caption or title, and on an HTML page (or in a
    Markdown document, below the table) the notes;
    raw formats every column (the index as ``model``), JSON with the environment."""
    fmt = get_format(name)
    check_read_by(fmt.name, view)
    _check_columns(df)
    env = {**(df.attrs.get("env") or {}), "baseline": df.attrs.get("baseline")}
    # (JSON keeps them: read_json's env gives back the notes, the ties, what the rank follows)
    env["attrs"] = {k: v for k, v in df.attrs.items() if k not in ("env", "baseline")}
    given = ViewOptions.parse(view.pop("view", None), **view)
    for option, own in (("style", "modelprof"), ("group_by", None)):
        if getattr(given, option) != own:  # a row per model, no layers to group or restyle
            raise ModelProfError(
                f"{option}={getattr(given, option)!r} is a per-layer table's view; a "
                "comparison's rows are its models (profile one model for its layers)"
            )
    columns = given.columns if columns is None else columns  # a view's, as a keyword's
    compact = isinstance(columns, str) and columns == "compact"
    if not fmt.human:  # (the index, model, is written as ever)
        columns = _raw_columns(df, fmt.name, columns)
    else:
        given = given.fit_for(columns, view)
        columns = _default_columns(df) if columns is None or compact else columns
        shown = _shown(df, columns)  # the caption speaks of the columns the table shows
        if fmt.name == "latex":  # (those the page keeps)
            fitting = given.with_defaults(view, priority=_latex_priority(df.attrs))
            shown = latex_columns(df, fitting.replace(columns=columns))
        caption = compare_caption(df.attrs, shown, df.get("input_shape"), df) or None
        legend = compare_legend(df.attrs, shown)
        if not _error_shown(shown):  # a caption of the user's own says why a row is empty
            legend = "; ".join(c for c in (legend, *_failures(df.attrs)) if c)
        if fmt.name == "latex":  # the rank's direction goes in the caption, where the
            # column is kept (as a header it widened the column)
            ranks = [rank_header(df.attrs, c) for c in ("rank", "step_rank") if c in shown]
            caption = "; ".join(c for c in (caption, *ranks) if c) or None  # none: no \caption
            legend = "; ".join(c for c in (legend, *ranks) if c)
        else:
            df, columns = _rank_said(df, columns)
        given = given.with_defaults(
            view, caption=caption, title=caption, priority=_latex_priority(df.attrs)
        )
        if legend and given.caption not in (None, caption) and legend not in given.caption:
            # a caption of the user's own keeps what the rank follows and what is rough
            given = given.replace(caption=f"{given.caption.rstrip('. ')}. {legend}")
        if given.standalone is None:  # the caller's default: a page (a document)
            given = given.replace(standalone=True)
        if given.standalone:  # a page shows its summary lines
            caption = given.caption or ""  # (a note it already says, once: a tie)
            # a failed model's note points to its error column: none where it is left out
            failed = () if _error_shown(shown) else df.attrs.get("failed") or ()
            pointless = {failed_note(n) for n in failed}
            notes = [
                n for n in df.attrs.get("notes") or () if n not in caption and n not in pointless
            ]
            given = given.with_defaults(view, summary=tuple(c for c in (caption, *notes) if c))
    if columns is not None:
        given = given.replace(columns=columns)
    return fmt.write(df, None, env=env, path=path, view=given)
