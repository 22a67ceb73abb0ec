"""A training step's phase table says when the step's median is not its phases' medians summed:
a trial on a loaded machine read forward 0.567 + loss 0.047 + backward 0.861 + optimizer 1.862
= 3.34 ms beside step 7.708 ms (5.98-10.46) with no word why (each sampled step is its phases
summed, but load slowed a different phase in most steps, so the median of the sums is not the
sum of the medians). Built from fixed samples: no timing."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import blocked

from modelprof.step.table import TrainingStep
from modelprof.step.timing import Phases

WORDS = "under load the medians of parts need not add up"


def _phases(step_ms: float) -> Phases:
    # constant samples in 3 blocks: each median's interval is the constant itself
    parts = {"forward": 0.5, "loss": 0.1, "backward": 1.0, "optimizer": 1.5}
    named = {k: blocked([v] * 3) for k, v in {**parts, "step": step_ms}.items()}
    return Phases(named)


def test_a_step_median_beyond_its_phases_summed_is_noted_where_the_table_shows():
    # the phases sum to 0.5 + 0.1 + 1.0 + 1.5 = 3.1 ms (interval 3.1..3.1); the step's 7.0 ms
    # (7.0..7.0) lies beyond it
    phases = _phases(7.0)
    assert phases["step"].median_ci_ms == (7.0, 7.0)
    note = phases.note
    assert note is not None and WORDS in note
    assert "step's median 7.000 ms" in note and "summed, 3.100 ms (3.100 ms..3.100 ms)" in note
    assert repr(phases).splitlines()[-1] == f"note: {note}"
    assert f"<caption>{note.replace(chr(39), '&#x27;')}</caption>" in phases._repr_html_()
    # the training step's summary line of medians carries it too
    timing = SimpleNamespace(
        phases=lambda: phases,
        peak_memory_bytes=None,
        backward=phases["backward"],
        rows_ms=1.0,
        coverage=1.0,
        overhead=1.0,
    )
    cost = SimpleNamespace(
        loss_name="sum",
        optimizer=None,
        backward_macs=0,
        backward_flops=0,
        saved_bytes=[],
        loss_saved_bytes=0,
    )
    assert f"\nnote: {note}" in TrainingStep(cost, timing).summary()


def test_a_step_within_its_phases_summed_has_no_note():
    # 3.1 ms: exactly the phases' medians summed
    phases = _phases(3.1)
    assert phases.note is None
    assert "note" not in repr(phases) and "<caption>" not in phases._repr_html_()
