"""``backward_latency_pct``: each row's backward median over the median instrumented backward
pass (each pass's stamped stretches summed, the loss's included), not over the rows' sum. The
README said "share of the instrumented backward (the rows' sum)", while a trial's leaf rows
summed to 85.1 %: a median of sums is not a sum of medians."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch import nn

from modelprof import profile

pytestmark = pytest.mark.filterwarnings("ignore::modelprof.errors.ModelProfWarning")

README = Path(__file__).resolve().parents[1] / "README.md"


def _row(column: str) -> str:
    """The README's column-table row that defines ``column`` (its first cell names it)."""
    (line,) = [ln for ln in README.read_text().splitlines() if ln.startswith(f"| `{column}`")]
    return line


def test_the_readme_defines_the_backward_share_over_the_median_instrumented_pass():
    row = _row("backward_latency_ms")
    assert "the rows' sum" not in row  # the wrong denominator
    assert "median instrumented backward pass" in row
    assert "need not add up to 100" in row  # what a reader summing the rows must expect


def test_the_backward_share_is_over_the_median_of_each_pass_summed():
    r = profile(
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)),
        (8,),
        backward=True,
        repeat=6,
        warmup=1,
        roofline=False,
        warn=False,
    )
    t = r.training_step.timing
    # the README's denominator: per instrumented pass, every stretch (the (loss)'s, the last
    # column, included) summed; then the median over the passes
    total = float(np.median(t.calls_ms.sum(axis=1)))
    df = r.to_dataframe().set_index("module")
    timed = df["backward_latency_ms"].notna()
    np.testing.assert_allclose(
        df.loc[timed, "backward_latency_pct"],
        100.0 * df.loc[timed, "backward_latency_ms"] / total,
        rtol=1e-12,
    )
