"""A generation summary writes each figure's stability one way: a newcomer's Markdown read
``ttft stable yes`` beside ``tpot stable True`` (a column holding None beside True was objects,
rendered as text, where a column of bools reads yes and no)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from helpers import blocked, counted_step_generation

from modelprof.generation.report import GenerationReport
from modelprof.generation.timing import GenerationTiming, stable_flags
from modelprof.timing.measurement import Measurement


def _timing(batch: int, tpot: Measurement) -> GenerationTiming:
    steady = blocked([10.0, 10.0, 10.0])  # 3 blocks alike: judged stable
    steps = np.ones((3, 2))
    return GenerationTiming(batch, 4, 3, steady, steady, tpot, steps, np.array([4, 5]))


def test_the_markdown_summary_says_yes_no_or_nothing_in_every_stable_column():
    report = counted_step_generation(batch_size=[1, 2])
    # batch 1's TPOT judged stable; batch 2's from 3 runs in one block cannot be judged (None)
    one, two = blocked([1.0, 1.0, 1.0]), Measurement(np.ones(3))
    assert one.stable is True and two.stable is None
    report.timings = {1: _timing(1, one), 2: _timing(2, two)}
    summary = report.summary()
    assert summary["ttft_stable"].tolist() == [True, True]
    assert summary["tpot_stable"].iloc[0] and summary["tpot_stable"].isna().iloc[1]
    md = str(report.to_markdown())
    assert "True" not in md  # every stable cell: yes (or n/a where it cannot be judged)
    header, _, first, second = md.split("## Summary\n\n")[1].splitlines()[:4]
    at = [c.strip() for c in header.split("|")].index("tpot stable")
    assert [[c.strip() for c in row.split("|")][at] for row in (first, second)] == ["yes", "n/a"]


def test_stable_flags_keep_true_false_and_cannot_judge():
    df = stable_flags(pd.DataFrame({"tpot_stable": [True, None, False], "tpot_ms": [1.0, 2, 3]}))
    assert str(df["tpot_stable"].dtype) == "boolean" and df["tpot_ms"].dtype == float
    assert df["tpot_stable"].isna().tolist() == [False, True, False]


def test_the_markdown_document_writes_notes_and_names_as_text_not_markup(monkeypatch):
    report = counted_step_generation()
    report.model_name = "__main__.Net<v2>"
    notes = ["ttft *loaded*: <1 ms apart", "- not a list item"]  # as a timing note could say
    monkeypatch.setattr(GenerationReport, "timing_notes", property(lambda self: notes))
    md = str(report.to_markdown())
    # each character Markdown reads as markup escaped, as the per-layer document's notes are
    assert md.startswith("# \\_\\_main\\_\\_.Net\\<v2\\>: generation")
    assert "- ttft \\*loaded\\*: \\<1 ms apart\n" in md
    assert "- \\- not a list item\n" in md
