"""What a notebook shows of a generation report, a fit and a measurement (``_repr_html_``, which
Jupyter calls): their printed text, escaped, above their tables in the reports' HTML; without
the method a notebook showed the plain repr."""

from __future__ import annotations

import dataclasses
import html

import numpy as np
import pytest
from helpers import tiny_llama

from modelprof import profile_generation
from modelprof.fit import fit
from modelprof.render.units import format_bytes
from modelprof.step.timing import Phases
from modelprof.timing.measurement import Measurement, format_ms

transformers = pytest.importorskip("transformers")

NAME = "<b>x</b>"  # a model name a notebook must show as text, not as bold markup


def _shows_its_text(obj) -> str:
    """``obj``'s notebook HTML, checked to hold each line it prints, escaped, and no markup
    of the name."""
    shown = obj._repr_html_()
    assert shown.startswith("<div>") and NAME not in shown
    for line in repr(obj).splitlines():
        assert html.escape(line) in shown, line
    return shown


def test_a_generation_report_shows_its_summary_and_its_phase_table():
    report = profile_generation(
        tiny_llama(),
        prompt_len=6,
        new_tokens=3,
        repeat=2,
        warmup=1,
        layer_timing=False,
        warn=False,
    )
    shown = _shows_its_text(dataclasses.replace(report, model_name=NAME))
    assert html.escape(NAME) in shown
    ttft = report.timing.ttft  # the median as the summary prints it, ~ where it is rough
    mark = "~" if report.summary().iloc[0]["ttft_rough"] else ""
    assert f"TTFT {mark}{ttft.median_ms:.3f} ms" in shown
    assert report.phase_table()._repr_html_() in shown  # the table, one row a phase


def test_a_fit_shows_its_head_notes_and_table():
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=128,
    )
    report = dataclasses.replace(fit(config, device="H100 SXM", context=64), model=NAME)
    shown = report._repr_html_()
    assert f"model {html.escape(NAME)}, " in shown and NAME not in shown
    assert all(html.escape(f"note: {n}") in shown for n in report.notes)
    # the table: a row per component, each plan's bytes as to_text prints them
    assert str(report.export("html", standalone=False, caption=None)) in shown
    weights = format_bytes(int(report.table.loc["weights", "inference"]))
    assert weights in report.to_text() and f">{weights}</td>" in shown


def test_a_measurement_shows_its_median_interval_and_runs():
    m = Measurement(np.array([1.0, 1.1, 0.9, 1.05]), label=NAME)
    shown = _shows_its_text(m)
    lo, hi = m.median_ci_ms
    assert f"median {format_ms(m.median_ms)} (95% CI {format_ms(lo)}..{format_ms(hi)}" in shown
    assert f"n={m.n} in" in shown


def test_a_measurement_with_no_median_to_quote_says_so_in_the_notebook():
    # 3 runs where the budget wanted 10: its median is no figure to quote, and the box says so
    m = Measurement(np.array([1.0, 1.2, 1.1]), stop_reason="budget", min_samples=10)
    shown = _shows_its_text(m)
    assert "no median to quote" in shown and "UNDERSAMPLED" in shown
    assert f"median {format_ms(m.median_ms)}" in shown


def test_a_training_steps_phases_show_in_the_reports_html_table():
    """The phases' notebook display was a bare ``<table>`` of its own (no style, numbers
    left-aligned); it is the reports' table: names escaped text, the figures numbers."""
    forward = Measurement(np.array([1.0, 1.1, 0.9, 1.05]))
    phases = Phases({"forward": forward, NAME: Measurement(np.array([2.0, 2.2, 1.9]))})
    shown = phases._repr_html_()
    assert shown.startswith('<div class="modelprof"') and "<style>" in shown
    assert NAME not in shown and f'<td class="l">{html.escape(NAME)}</td>' in shown
    assert '<th class="l">phase</th><th class="r">median</th>' in shown
    lo, hi = forward.median_ci_ms  # the row as repr prints it, each figure right-aligned
    cells = [format_ms(forward.median_ms), f"{format_ms(lo)}..{format_ms(hi)}", str(forward.n)]
    assert all(c in repr(phases) for c in cells)
    row = '<td class="l">forward</td>' + "".join(f'<td class="r">{c}</td>' for c in cells)
    assert row in shown
